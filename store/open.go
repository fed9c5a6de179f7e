package store

import (
	"context"
	"fmt"
	"strings"
)

// Open opens the store a URL names and applies pending migrations:
//
//	postgres://... or postgresql://...   PostgreSQL
//	sqlite:///var/lib/compass/compass.db SQLite, absolute path
//	sqlite:data/compass.db               SQLite, relative path
//	/var/lib/compass/compass.db          SQLite (a plain path)
//
// Any other scheme is an error. Errors never contain a password.
func Open(ctx context.Context, url string, opts ...Option) (Store, error) {
	if rest, ok := strings.CutPrefix(url, "sqlite://"); ok {
		return OpenSQLite(ctx, rest, opts...)
	}
	if rest, ok := strings.CutPrefix(url, "sqlite:"); ok {
		return OpenSQLite(ctx, rest, opts...)
	}
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		return OpenPostgres(ctx, url, opts...)
	}
	if scheme, _, ok := strings.Cut(url, "://"); ok {
		return nil, fmt.Errorf("%w: unknown scheme %q (want postgres://, postgresql:// or sqlite://)", ErrInvalidURL, scheme)
	}
	return OpenSQLite(ctx, url, opts...)
}
