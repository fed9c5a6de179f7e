package storetest

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/verifier"
)

// RawSQLite opens the file behind a sqlite:// URL directly, outside the
// store, for rows the API refuses to write. It is closed when t ends.
func RawSQLite(t *testing.T, url string) *sql.DB {
	t.Helper()
	path, ok := strings.CutPrefix(url, "sqlite://")
	if !ok {
		t.Fatalf("storetest: %q is not a sqlite:// URL", url)
	}
	db, err := sql.Open("sqlite", fmt.Sprintf("%s?_busy_timeout=5000&_foreign_keys=1", path))
	if err != nil {
		t.Fatalf("storetest: open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// SQLiteTime formats t as the SQLite backend stores times.
func SQLiteTime(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format("2006-01-02T15:04:05.000000Z")
}

// SQLiteInsertToken writes a token row straight into the SQLite database at
// url, stamped with the bootstrap tenant, bypassing every check of the API.
func SQLiteInsertToken(t *testing.T, url string, r TokenRow) {
	t.Helper()
	var revoked, expires any
	if !r.RevokedAt.IsZero() {
		revoked = SQLiteTime(r.RevokedAt)
	}
	if !r.ExpiresAt.IsZero() {
		expires = SQLiteTime(r.ExpiresAt)
	}
	_, err := RawSQLite(t, url).ExecContext(t.Context(), `INSERT INTO tokens
		(id, hash, subject_kind, subject_id, tenant_id, created_at, revoked_at, expires_at)
		SELECT ?, ?, ?, ?, id, ?, ?, ? FROM tenants WHERE bootstrap = 1`,
		r.PublicID, r.Hash[:], int(r.Kind), r.SubjectID, SQLiteTime(r.CreatedAt), revoked, expires)
	if err != nil {
		t.Fatalf("storetest: insert token row: %v", err)
	}
}

// InsertLegacyRunnerToken writes a live (or revoked) minted Runner token for
// id into the SQLite database at url, bypassing the API's refusal of "/" in
// Runner IDs: a row minted before "/" was reserved for workload Runner IDs.
// It returns the token.
func InsertLegacyRunnerToken(t *testing.T, url, id string, revoked bool) string {
	t.Helper()
	tok, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	h := verifier.HashToken(tok)
	now := time.Now()
	row := TokenRow{PublicID: fmt.Sprintf("%x", h[:8]), Hash: h, Kind: verifier.SubjectRunner, SubjectID: id, CreatedAt: now}
	if revoked {
		row.RevokedAt = now
	}
	SQLiteInsertToken(t, url, row)
	return tok
}
