package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// The SQL docs/store.md gives a database administrator for compass-callout's
// role, with the role's name, its password, the database, the schema and the
// Server's owning role filled in.
func calloutRoleSQL(role, password, database, schema, owner string) []string {
	return []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD '" + password + "'",
		"GRANT CONNECT ON DATABASE " + database + " TO " + role,
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT SELECT ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"ALTER DEFAULT PRIVILEGES FOR ROLE " + owner + " IN SCHEMA " + schema + " GRANT SELECT ON TABLES TO " + role,
		"GRANT INSERT, UPDATE ON " + schema + ".runner_quarantine TO " + role,
	}
}

// TestPostgresCalloutRoleReadsAndCannotWrite: compass-callout serves the
// Server's database through a role granted SELECT, and INSERT and UPDATE on
// runner_quarantine alone (docs/store.md, DL-459), and that role's
// credentials cannot write anything else, even from a session that turns
// store.ReadOnly's default_transaction_read_only off: a compromised callout
// cannot insert a token's hash, un-revoke one, or clear a quarantine. Its
// quarantine writer counts displacements as the role.
func TestPostgresCalloutRoleReadsAndCannotWrite(t *testing.T) {
	ownerURL := storetest.PostgresSchema(t, "calloutrole")
	ctx := t.Context()
	st := storetest.Open(t, ownerURL)
	if _, err := store.Migrate(ctx, ownerURL); err != nil {
		t.Fatal(err)
	}
	tok, info, err := st.Mint(ctx, verifier.SubjectRunner, "runner-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Revoke(ctx, info.ID); err != nil {
		t.Fatal(err)
	}

	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	schema, database, owner := u.Query().Get("search_path"), u.Path[1:], u.User.Username()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	role, password := "compass_callout_"+hex.EncodeToString(b[:]), hex.EncodeToString(b[:])+"-pw"
	admin := rawPostgres(t, storetest.PostgresURL(t))
	for _, q := range calloutRoleSQL(role, password, database, schema, owner) {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, storetest.PostgresURL(t))
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
			return
		}
		defer func() { _ = c.Close(ctx) }()
		for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	readerURL := *u
	readerURL.User = url.UserPassword(role, password)

	// The callout's open: serving, read-only, as the role.
	ro, err := store.OpenServing(ctx, readerURL.String(), store.ReadOnly())
	if err != nil {
		t.Fatalf("OpenServing as %s: %v", role, err)
	}
	t.Cleanup(func() { _ = ro.Close() })
	m, err := ro.LookupTokenHash(ctx, verifier.HashToken(tok))
	if err != nil || !m.Revoked {
		t.Fatalf("LookupTokenHash as the role = %+v, %v; want the revoked token", m, err)
	}
	if _, err := ro.ListTokens(ctx); err != nil {
		t.Fatalf("ListTokens as the role: %v", err)
	}

	// The role's own session, read-only turned off: every write is refused
	// for want of privilege.
	c := rawPostgres(t, readerURL.String())
	if _, err := c.Exec(ctx, "SET default_transaction_read_only = off"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"UPDATE tokens SET revoked_at = NULL",
		"INSERT INTO tokens (hash, id, subject_kind, subject_id, tenant_id, created_at) SELECT hash, 'ffffffffffffffff', subject_kind, 'intruder', tenant_id, created_at FROM tokens",
		"DELETE FROM restore_guard",
		"UPDATE restore_guard SET backup_taken_at = now()",
		"DELETE FROM runner_quarantine",
		"UPDATE runners SET last_seen_at = now()",
		"INSERT INTO tenants (id, name) VALUES ('intruder', 'intruder')",
		"TRUNCATE runner_quarantine",
	} {
		_, err := c.Exec(ctx, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as %s: %v; want insufficient_privilege (42501)", q, role, err)
		}
	}
	if m, err := st.LookupTokenHash(ctx, verifier.HashToken(tok)); err != nil || !m.Revoked {
		t.Fatalf("after the refused writes: %+v, %v; want the token still revoked", m, err)
	}

	// The callout's quarantine writer, as the role: it counts and
	// quarantines; the quarantine is read back through the read-only store
	// and only the Server's role clears it.
	w, err := store.OpenQuarantineWriter(ctx, readerURL.String())
	if err != nil {
		t.Fatalf("OpenQuarantineWriter as %s: %v", role, err)
	}
	t.Cleanup(func() { _ = w.Close() })
	p := store.QuarantinePolicy{After: 1, Window: time.Minute}
	for i, wantStarted := range []bool{false, true} {
		if _, started, err := w.RecordDisplacement(ctx, store.Displacement{RunnerID: "runner-1", Newer: "10.0.0.2:1", Older: "10.0.0.1:1"}, p); err != nil || started != wantStarted {
			t.Fatalf("RecordDisplacement #%d as %s: started %v, %v; want %v", i+1, role, started, err, wantStarted)
		}
	}
	if qs, err := ro.ListQuarantined(ctx); err != nil || len(qs) != 1 || qs[0].RunnerID != "runner-1" {
		t.Fatalf("ListQuarantined as %s = %+v, %v; want runner-1", role, qs, err)
	}
	if _, err := ro.ClearQuarantine(ctx, "runner-1"); err == nil {
		t.Fatalf("ClearQuarantine as %s succeeded", role)
	}
	if _, err := st.ClearQuarantine(ctx, "runner-1"); err != nil {
		t.Fatalf("ClearQuarantine as the Server's role: %v", err)
	}
}
