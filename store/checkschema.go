package store

import (
	"context"
	"fmt"
)

// CheckSchema reports whether the database a URL names is at exactly
// SchemaVersionWanted, and returns that version. It is the check a Server's
// pod runs before serve (compass-server check-schema): it never creates a
// database or applies a migration, and leaves the database as it found it.
// A missing SQLite file is ErrNoDatabase; any other version is a
// *SchemaError wrapping ErrSchemaBehind (back up, then run compass-server
// migrate: the deliberate step) or ErrSchemaTooNew (upgrade this binary).
func CheckSchema(ctx context.Context, url string, opts ...Option) (int, error) {
	st, err := OpenCurrent(ctx, url, opts...)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	v, err := st.SchemaVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: check schema: %w", err)
	}
	return v, nil
}
