package callout_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/store"
)

// compass-callout does not serve a restored backup that compass-server
// restore has not reconciled (the tokens revoked after the backup would be
// live again): Serve stops with the store's reason, saying what to run.
// Once restored, it gets as far as NATS.
func TestServeRefusesABackupNotRestored(t *testing.T) {
	dir := t.TempDir()
	live := "sqlite://" + filepath.Join(dir, "live", "compass.db")
	if _, err := store.Migrate(t.Context(), live); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(dir, "compass-backup.db")
	if _, err := store.Backup(t.Context(), live, backup); err != nil {
		t.Fatal(err)
	}
	issuer, _ := nkeys.CreateAccount()
	cfg := callout.ServeConfig{
		NATSURLs: "nats://127.0.0.1:1", Mode: callout.ModeServerConfig, Account: "RUNNERS", NoKick: true,
		IssuerSeedFile: writeSeed(t, dir, "issuer.nk", issuer), DatabaseURL: "sqlite://" + backup,
	}
	// A broken guard would serve (and wait for NATS) forever: bound it, and
	// fail by name.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := callout.Serve(ctx, cfg)
	if ctx.Err() != nil {
		t.Fatalf("Serve on a backup was still running after 30s, where it should have refused: %v", err)
	}
	if !errors.Is(err, store.ErrUnrestoredBackup) || !strings.HasPrefix(err.Error(), "callout: --database-url: ") ||
		!strings.Contains(err.Error(), "compass-server restore") {
		t.Fatalf("Serve on a backup = %v, want store.ErrUnrestoredBackup saying what to run", err)
	}

	f, err := os.Open(backup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := store.Restore(t.Context(), live, f, store.RestoreOptions{}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	cfg.DatabaseURL = live
	if err := serveUntilWaitingForNATS(t, cfg); err == nil || !strings.Contains(err.Error(), "callout: NATS connection 0") {
		t.Fatalf("Serve on the restored database = %v, want the NATS connection error", err)
	}
}
