package store_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// A database as the release before minted-token expiry left it (schema 2,
// with a token and a Runner) is refused by OpenCurrent until migrated, and
// keeps its rows through Migrate: the token resolves and never expires.
func TestUpgradeKeepsTokensAndRunners(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testUpgrade(t, sqliteBackend()) })
	t.Run("postgres", func(t *testing.T) { testUpgrade(t, postgresBackend(postgresURL(t))) })
}

// hashLiteral is a 32-byte hash as an SQL literal of b's dialect.
func hashLiteral(backend string, h [32]byte) string {
	if backend == "postgres" {
		return fmt.Sprintf(`'\x%s'::bytea`, hex.EncodeToString(h[:]))
	}
	return fmt.Sprintf(`X'%s'`, hex.EncodeToString(h[:]))
}

func testUpgrade(t *testing.T, b storetest.Backend) {
	t.Helper()
	ctx := t.Context()
	url := b.NewURL(t)
	wanted := store.SchemaVersionWanted()
	const from = 2
	old, err := store.Open(ctx, url, store.WithMigrationsUpTo(from))
	if err != nil {
		t.Fatalf("Open up to schema %d: %v", from, err)
	}
	if v, err := old.SchemaVersion(ctx); err != nil || v != from {
		t.Fatalf("the old database is at %d (%v), want %d", v, err, from)
	}
	if _, err := old.RecordEnrollment(ctx, store.Enrollment{RunnerID: "build-01", Method: store.MethodMinted, Version: "v1.0.0"}); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	// A token row as schema 2 has it: no expires_at column yet.
	tok, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	b.Exec(t, url, fmt.Sprintf(`INSERT INTO tokens (id, hash, subject_kind, subject_id, tenant_id, created_at)
		SELECT '00000000000000b1', %s, 2, 'build-01', id, '2026-01-01T00:00:00.000000Z' FROM tenants WHERE bootstrap = true`,
		hashLiteral(b.Name, verifier.HashToken(tok))))

	_, err = store.OpenCurrent(ctx, url)
	want := fmt.Sprintf("store: the %s database is at schema version %d and this binary wants %d: run compass-server migrate", b.Name, from, wanted)
	if !errors.Is(err, store.ErrSchemaBehind) || err.Error() != want {
		t.Fatalf("OpenCurrent before the migration: %v, want %q", err, want)
	}
	res, err := store.Migrate(ctx, url)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if res != (store.MigrateResult{Backend: b.Name, From: from, To: wanted}) {
		t.Fatalf("Migrate = %+v, want from %d to %d", res, from, wanted)
	}
	st, err := store.OpenCurrent(ctx, url)
	if err != nil {
		t.Fatalf("OpenCurrent after the migration: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	toks, err := st.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantTok := store.TokenInfo{ID: "00000000000000b1", Kind: verifier.SubjectRunner, SubjectID: "build-01", Tenant: "bootstrap",
		CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if len(toks) != 1 || toks[0] != wantTok {
		t.Fatalf("tokens after the upgrade = %+v, want %+v (no expiry)", toks, wantTok)
	}
	subj, err := verifier.NewResolver(nil, st).Resolve(ctx, tok, verifier.SubjectRunner)
	if err != nil || subj.ID != "build-01" || !subj.NotAfter.IsZero() {
		t.Fatalf("Resolve(token from schema %d) = %+v, %v", from, subj, err)
	}
	rn, err := st.GetRunner(ctx, "build-01")
	if err != nil || rn.Version != "v1.0.0" {
		t.Fatalf("runner after the upgrade = %+v, %v", rn, err)
	}
}
