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
// migrate: the deliberate step) or ErrSchemaTooNew (upgrade this binary). A
// backup that compass-server restore has not reconciled is refused as
// OpenServing refuses it (ErrUnrestoredBackup), so the pod's init container
// says so, rather than serve failing after it.
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
	if err := checkGuard(ctx, st); err != nil {
		return v, err
	}
	return v, nil
}
