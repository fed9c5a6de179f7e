package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// openMode is how an opener treats the schema.
type openMode int

const (
	// modeMigrate creates the database (SQLite) and applies pending migrations.
	modeMigrate openMode = iota
	// modeCurrent never creates or migrates: the database must exist and be
	// at exactly SchemaVersionWanted.
	modeCurrent
	// modeAsIs never creates, migrates or checks: restore reads the database
	// it replaces at whatever schema it is, and checks a restored copy itself.
	modeAsIs
)

// parseURL tells which backend url names, and what to hand it:
//
//	postgres://... or postgresql://...   PostgreSQL
//	sqlite:///var/lib/compass/compass.db SQLite, absolute path
//	sqlite:data/compass.db               SQLite, relative path
//	/var/lib/compass/compass.db          SQLite (a plain path)
//
// Any other scheme is ErrInvalidURL. Errors never contain a password.
func parseURL(url string) (backend, target string, err error) {
	if rest, ok := strings.CutPrefix(url, "sqlite://"); ok {
		return "sqlite", rest, nil
	}
	if rest, ok := strings.CutPrefix(url, "sqlite:"); ok {
		return "sqlite", rest, nil
	}
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		return "postgres", url, nil
	}
	if scheme, _, ok := strings.Cut(url, "://"); ok {
		return "", "", fmt.Errorf("%w: unknown scheme %q (want postgres://, postgresql:// or sqlite://)", ErrInvalidURL, scheme)
	}
	return "sqlite", url, nil
}

// BackendOf names the backend a URL is for, "sqlite" or "postgres", without
// opening anything.
func BackendOf(url string) (string, error) {
	backend, _, err := parseURL(url)
	return backend, err
}

var errReadOnlyMigrate = errors.New("store: a read-only store cannot be created or migrated")

// open opens url in mode and returns the store and the schema version found
// before any migration.
func open(ctx context.Context, url string, mode openMode, opts []Option) (Store, int, error) {
	backend, target, err := parseURL(url)
	if err != nil {
		return nil, 0, err
	}
	if backend == "postgres" {
		return openPostgres(ctx, target, mode, opts)
	}
	return openSQLite(ctx, target, mode, opts)
}

// Open opens the store a URL names (see BackendOf for the forms), creating
// an SQLite file if there is none, and applies pending migrations. A
// database at a newer schema than this binary's fails with a *SchemaError
// wrapping ErrSchemaTooNew.
func Open(ctx context.Context, url string, opts ...Option) (Store, error) {
	st, _, err := open(ctx, url, modeMigrate, opts)
	return st, err
}

// OpenCurrent opens the store a URL names only if its schema is exactly the
// one this binary wants. It never creates a database or applies a migration:
// a missing SQLite file is ErrNoDatabase (and no file or directory is made),
// and any other version is a *SchemaError wrapping ErrSchemaBehind (run
// Migrate) or ErrSchemaTooNew (upgrade the binary).
func OpenCurrent(ctx context.Context, url string, opts ...Option) (Store, error) {
	st, _, err := open(ctx, url, modeCurrent, opts)
	return st, err
}

// Migrate applies the pending migrations to the database a URL names,
// creating an SQLite file if there is none, and says from which version to
// which. A database at a newer schema fails with a *SchemaError wrapping
// ErrSchemaTooNew and is left alone. Concurrent Migrates (and Opens) of one
// database apply each migration once.
func Migrate(ctx context.Context, url string, opts ...Option) (MigrateResult, error) {
	st, from, err := open(ctx, url, modeMigrate, opts)
	if err != nil {
		return MigrateResult{}, err
	}
	defer st.Close()
	to, err := st.SchemaVersion(ctx)
	if err != nil {
		return MigrateResult{}, err
	}
	return MigrateResult{Backend: st.Backend(), From: from, To: to}, nil
}
