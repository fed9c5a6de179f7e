package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Ready is the readiness check of a daemon that uses s (compass-server's and
// compass-callout's /readyz): s answers SchemaVersion, one indexed read of a
// table of a few rows that both backends answer only with the schema in
// place, within timeout. The error names the backend and stays on one line;
// it holds the database's own message, never its URL (which may carry a
// password).
func Ready(ctx context.Context, s Store, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := s.SchemaVersion(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("store: the %s database did not answer within %s", s.Backend(), timeout)
	default:
		return fmt.Errorf("store: the %s database does not answer: %s", s.Backend(), strings.Join(strings.Fields(err.Error()), " "))
	}
}
