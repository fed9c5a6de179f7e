package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/compass-runner/identity/store"
)

// How compass-server's commands open the database (docs/store.md):
//
//   - migrate is the one command that migrates a shared database;
//   - the operator commands (mint-*, revoke-token, list-tokens, runners)
//     open it only at exactly this binary's schema and never create or
//     migrate one: a database behind is "run compass-server migrate", one
//     ahead is "upgrade this binary", and an empty data dir stays empty;
//   - serve migrates an SQLite database on start (the Server's own file on
//     its own host: the upgrade is the restart), and on PostgreSQL, shared
//     with other Servers and callouts, refuses to start on a schema behind it
//     until migrate has run. On either it refuses a schema ahead of it.

// DatabaseURL is the database URL, or the SQLite default in the data dir. It
// creates nothing.
func DatabaseURL(url, dataDir string) string {
	if url != "" {
		return url
	}
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	return "sqlite://" + filepath.Join(dataDir, "compass.db")
}

// OpenStore opens the database for an operator command: only at the schema
// this binary wants, never creating or migrating it.
func OpenStore(ctx context.Context, url, dataDir string) (store.Store, error) {
	st, err := store.OpenCurrent(ctx, DatabaseURL(url, dataDir))
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return st, nil
}

// openServeStore opens the database for serve (and dev): SQLite is migrated
// first, PostgreSQL must already be current.
func openServeStore(ctx context.Context, url, dataDir string, log *slog.Logger) (store.Store, error) {
	u := DatabaseURL(url, dataDir)
	backend, err := store.BackendOf(u)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if backend == "sqlite" {
		res, err := store.Migrate(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		if res.From != res.To {
			log.Info("server: migrated the database", "database", DescribeDatabase(u), "from", res.From, "to", res.To)
		}
	}
	// Never a restored backup that compass-server restore has not
	// reconciled: the tokens revoked after it would be live again.
	st, err := store.OpenServing(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return st, nil
}

// DescribeDatabase names a database for output: an SQLite file's path, or a
// PostgreSQL database's name and host, never its user or password.
func DescribeDatabase(u string) string {
	backend, err := store.BackendOf(u)
	if err != nil {
		return "the database"
	}
	if backend == "sqlite" {
		path := strings.TrimPrefix(strings.TrimPrefix(u, "sqlite://"), "sqlite:")
		return "the SQLite database " + path
	}
	pu, err := url.Parse(u)
	if err != nil || pu.Host == "" {
		return "the PostgreSQL database"
	}
	return fmt.Sprintf("the PostgreSQL database %s on %s", strings.TrimPrefix(pu.Path, "/"), pu.Host)
}
