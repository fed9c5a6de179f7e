package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
)

// Ready passes on a store that answers, and fails with one line naming the
// backend on one whose deadline has passed and on one that is closed.
func TestReady(t *testing.T) {
	ctx := t.Context()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "ready.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Ready(ctx, st, time.Second); err != nil {
		t.Fatalf("Ready on an open store: %v", err)
	}
	past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if err := store.Ready(past, st, time.Second); err == nil || err.Error() != "store: the sqlite database did not answer within 1s" {
		t.Fatalf("Ready past its deadline: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.Ready(ctx, st, time.Second); err == nil || err.Error() != "store: the sqlite database does not answer: store: schema version: sql: database is closed" {
		t.Fatalf("Ready on a closed store: %v", err)
	}
}
