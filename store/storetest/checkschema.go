package storetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/compass-runner/identity/store"
)

// CheckSchema is the conformance test of store.CheckSchema on b: a database
// at the binary's schema passes with its version; one behind or ahead is
// refused with the SchemaError that says what to do; neither refusal nor
// pass changes schema_migrations; and once Migrate has run, the database
// that was behind passes. It is the migration policy's gate (docs/store.md):
// the check never migrates, so only the deliberate migrate moves a schema.
// migrateUpTo makes the database at url as a release whose last migration
// was n left it (store's test-only option), and with n 0 an empty database
// (an empty SQLite file, an empty PostgreSQL schema).
func CheckSchema(t *testing.T, b Backend, migrateUpTo func(t *testing.T, url string, n int)) {
	ctx := t.Context()
	wanted := store.SchemaVersionWanted()
	for _, tc := range []struct {
		name    string
		version int // the highest schema_migrations row left or added
		want    string
		is      error
	}{
		{"current", wanted, "", nil},
		{"one behind", wanted - 1,
			fmt.Sprintf("store: the %s database is at schema version %d and this binary wants %d: run compass-server migrate", b.Name, wanted-1, wanted),
			store.ErrSchemaBehind},
		{"no schema", 0,
			fmt.Sprintf("store: the %s database has no schema yet (version 0) and this binary wants %d: run compass-server migrate", b.Name, wanted),
			store.ErrSchemaBehind},
		{"one ahead", wanted + 1,
			fmt.Sprintf("store: the %s database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary", b.Name, wanted+1, wanted),
			store.ErrSchemaTooNew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := b.NewURL(t)
			if tc.version < wanted {
				migrateUpTo(t, url, tc.version)
			} else if _, err := store.Migrate(ctx, url); err != nil {
				t.Fatal(err)
			}
			if tc.version > wanted {
				b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'from_the_future', '2030-01-01T00:00:00.000000Z')", tc.version))
			}
			// The rows before the check (an empty database has no table: the
			// Migrate below, from 0, shows the check left it so).
			var rows int64
			if tc.version > 0 {
				rows = b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations")
			}
			v, err := store.CheckSchema(ctx, url)
			if tc.is == nil {
				if err != nil || v != wanted {
					t.Fatalf("CheckSchema = %d, %v; want %d", v, err, wanted)
				}
			} else if !errors.Is(err, tc.is) || err.Error() != tc.want || v != 0 {
				t.Fatalf("CheckSchema = %d, %v; want %q", v, err, tc.want)
			}
			if tc.version > 0 {
				if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != rows {
					t.Fatalf("CheckSchema changed schema_migrations: %d rows, had %d", n, rows)
				}
			}
			if tc.version >= wanted {
				return
			}
			// The deliberate step, and the check passes.
			res, err := store.Migrate(ctx, url)
			if err != nil || res.From != tc.version || res.To != wanted {
				t.Fatalf("Migrate = %+v, %v; want from %d to %d", res, err, tc.version, wanted)
			}
			if v, err := store.CheckSchema(ctx, url); err != nil || v != wanted {
				t.Fatalf("CheckSchema after Migrate = %d, %v", v, err)
			}
		})
	}
}
