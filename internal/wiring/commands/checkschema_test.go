package commands_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
)

// check-schema, the Server pod's init container, on SQLite: a data dir with
// no database passes and stays empty (serve creates the file); the binary's
// schema passes; a schema behind or ahead is refused with what to do (exit
// 1) and the database is left as it was.
func TestCheckSchemaCommandOnSQLite(t *testing.T) {
	wanted := store.SchemaVersionWanted()
	empty := t.TempDir()
	code, stdout, stderr := runServer(t, nil, "check-schema", "--data-dir", empty)
	want := fmt.Sprintf("the SQLite database %s does not exist yet: serve creates it at schema version %d\n", filepath.Join(empty, "compass.db"), wanted)
	if code != 0 || stdout != want || stderr != "" {
		t.Fatalf("check-schema on an empty data dir: code %d, stdout %q, stderr %q; want 0 and %q", code, stdout, stderr, want)
	}
	if names := listDir(t, empty); len(names) != 0 {
		t.Fatalf("check-schema created %v", names)
	}

	current := migrated(t)
	code, stdout, _ = runServer(t, nil, "check-schema", "--data-dir", current)
	want = fmt.Sprintf("the SQLite database %s is at schema version %d, this binary's\n", filepath.Join(current, "compass.db"), wanted)
	if code != 0 || stdout != want {
		t.Fatalf("check-schema at the binary's schema: code %d, stdout %q; want 0 and %q", code, stdout, want)
	}

	for _, tc := range []struct {
		name    string
		version int
		make    func(dir string)
		want    string
	}{
		{"an empty database file", 0, func(dir string) { writeFile(t, filepath.Join(dir, "compass.db"), "") },
			fmt.Sprintf("has no schema yet (version 0) and this binary wants %d: run compass-server migrate (back up the database first: docs/store.md, Upgrading)", wanted)},
		{"a newer release's schema", wanted + 1, func(dir string) {
			if code, _, stderr := runServer(t, nil, "migrate", "--data-dir", dir); code != 0 {
				t.Fatalf("migrate: %s", stderr)
			}
			setSchema(t, dir, wanted+1)
		}, fmt.Sprintf("is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary", wanted+1, wanted)},
	} {
		dir := t.TempDir()
		tc.make(dir)
		before := 0
		if tc.version > 0 {
			before = schemaRows(t, dir)
		}
		code, stdout, stderr := runServer(t, nil, "check-schema", "--data-dir", dir)
		want := "compass-server: server: check-schema: store: the sqlite database " + tc.want + "\n"
		if code != 1 || stdout != "" || stderr != want {
			t.Fatalf("check-schema on %s: code %d, stdout %q, stderr %q; want 1 and %q", tc.name, code, stdout, stderr, want)
		}
		if tc.version == 0 {
			// Opening an empty file gives it SQLite's header (WAL mode), no
			// schema: the same check still finds none.
			if code, _, again := runServer(t, nil, "check-schema", "--data-dir", dir); code != 1 || again != stderr {
				t.Fatalf("check-schema again on %s: code %d, stderr %q", tc.name, code, again)
			}
		} else if n := schemaRows(t, dir); n != before {
			t.Fatalf("check-schema on %s changed schema_migrations: %d rows, had %d", tc.name, n, before)
		}
	}
}

// check-schema on PostgreSQL: an empty database is refused (migrate runs
// before the first Server), a migrated one passes.
func TestCheckSchemaCommandOnPostgres(t *testing.T) {
	wanted := store.SchemaVersionWanted()
	url := storetest.PostgresSchema(t, "checkschema")
	code, stdout, stderr := runServer(t, nil, "check-schema", "--database-url", url)
	want := fmt.Sprintf("has no schema yet (version 0) and this binary wants %d: run compass-server migrate (back up the database first: docs/store.md, Upgrading)\n", wanted)
	if code != 1 || stdout != "" || !strings.HasSuffix(stderr, want) || strings.Contains(stderr, "postgres@") {
		t.Fatalf("check-schema on an empty database: code %d, stdout %q, stderr %q; want 1 and ...%q", code, stdout, stderr, want)
	}
	if code, _, stderr := runServer(t, nil, "migrate", "--database-url", url); code != 0 {
		t.Fatalf("migrate: %s", stderr)
	}
	code, stdout, _ = runServer(t, nil, "check-schema", "--database-url", url)
	if code != 0 || !strings.HasSuffix(stdout, fmt.Sprintf(" is at schema version %d, this binary's\n", wanted)) {
		t.Fatalf("check-schema after migrate: code %d, stdout %q", code, stdout)
	}
}
