package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/compass-runner/identity/store"
)

// How compass-server's commands open the database (docs/store.md, one
// migration policy: back up, migrate deliberately, never as a side effect):
//
//   - migrate is the one command that moves an existing schema, run by an
//     operator (in a cluster: the rendered migrate Job) after a backup;
//   - check-schema (the Server pod's init container) and serve accept
//     exactly this binary's schema: a database behind is "back up, then run
//     compass-server migrate", one ahead is "upgrade this binary";
//   - the operator commands (mint-*, revoke-token, list-tokens, runners)
//     likewise, and never create a database: an empty data dir stays empty;
//   - the one thing serve makes on its own is a new SQLite database where
//     there is no file (a first start: nothing to back up, nothing to lose);
//   - dev, whose database is throwaway, migrates it on start.

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

// openServeStore opens the database for serve (and dev): at exactly this
// binary's schema, creating an SQLite database where there is no file. With
// migrate (dev only) an SQLite database behind is migrated first.
func openServeStore(ctx context.Context, url, dataDir string, migrate bool, log *slog.Logger) (store.Store, error) {
	u := DatabaseURL(url, dataDir)
	backend, err := store.BackendOf(u)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if backend == "sqlite" {
		_, err := store.CheckSchema(ctx, u)
		switch {
		case errors.Is(err, store.ErrNoDatabase), migrate && errors.Is(err, store.ErrSchemaBehind):
			res, err := store.Migrate(ctx, u)
			if err != nil {
				return nil, fmt.Errorf("server: %w", err)
			}
			if res.From == 0 {
				log.Info("server: created the database", "database", DescribeDatabase(u), "schema_version", res.To)
			} else if res.From != res.To {
				log.Info("server: migrated the database", "database", DescribeDatabase(u), "from", res.From, "to", res.To)
			}
		case errors.Is(err, store.ErrSchemaBehind):
			return nil, fmt.Errorf("server: %w (back up the database first: docs/store.md, Upgrading)", err)
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
