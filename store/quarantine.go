package store

// Duplicates and quarantine (docs/designs/DECISIONS.md, DL-459): the
// displacements compass-callout counts per Runner ID, and the quarantine it
// puts an ID in once they pass its threshold. The count is shared by every
// callout replica and both doors, and outlives a callout's restart.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/compass-runner/identity/verifier"
)

// MaxClientAddrLen bounds a client address recorded with a displacement: a
// host:port is at most an IPv6 address in brackets and a port (about 50
// bytes); the rest is room, not a use.
const MaxClientAddrLen = 256

// Quarantine is one Runner ID's displacement record.
type Quarantine struct {
	RunnerID string
	// WindowStart is the first displacement of the current window and
	// Displacements the displacements since then (for a quarantined ID: up to
	// the one that quarantined it).
	WindowStart   time.Time
	Displacements int
	LastAt        time.Time // the latest displacement
	// NewerClient and OlderClient are the host:port of the connection that
	// displaced the older one, and of the one it ended, at the latest
	// displacement.
	NewerClient, OlderClient string
	QuarantinedAt            time.Time // zero: not quarantined
}

// Quarantined reports whether the ID is in quarantine.
func (q Quarantine) Quarantined() bool { return !q.QuarantinedAt.IsZero() }

// Displacement is one older live connection of a Runner ID that
// compass-callout ended as a duplicate of a newer one.
type Displacement struct {
	RunnerID string
	// Newer and Older are the two connections' client host:port.
	Newer, Older string
	At           time.Time // zero: the store's clock
}

// QuarantinePolicy is when displacements quarantine a Runner ID: more than
// After of them within Window of the first. After 0 only counts.
type QuarantinePolicy struct {
	After  int
	Window time.Duration
}

// QuarantineWriter records displacements: compass-callout's one write to the
// store, through a handle of its own beside its read-only Store
// (OpenQuarantineWriter).
type QuarantineWriter interface {
	// RecordDisplacement counts d against its Runner ID, atomically across
	// every process sharing the database: a displacement more than
	// p.Window after the current window's first starts a new window; the
	// one that makes the count exceed p.After quarantines the ID (started
	// is then true, for that call alone). A quarantined ID's record is not
	// changed.
	RecordDisplacement(ctx context.Context, d Displacement, p QuarantinePolicy) (q Quarantine, started bool, err error)
	Close() error
}

// displacementRecorder is a backend's RecordDisplacement.
type displacementRecorder interface {
	recordDisplacement(ctx context.Context, d Displacement, p QuarantinePolicy) (Quarantine, bool, error)
}

// quarantineWriter is a Store narrowed to RecordDisplacement: the handle
// can write, but its owner is given no other write.
type quarantineWriter struct {
	st  Store
	rec displacementRecorder
}

func (w quarantineWriter) RecordDisplacement(ctx context.Context, d Displacement, p QuarantinePolicy) (Quarantine, bool, error) {
	return w.rec.recordDisplacement(ctx, d, p)
}

func (w quarantineWriter) Close() error { return w.st.Close() }

var errWriterReadOnly = errors.New("store: a quarantine writer cannot be read-only")

// OpenQuarantineWriter opens the database a URL names, at exactly the schema
// this binary wants (it never creates or migrates), for RecordDisplacement
// alone. On PostgreSQL the role in the URL needs INSERT and UPDATE on
// runner_quarantine only (docs/store.md); on SQLite it is a second,
// read-write handle on the file.
func OpenQuarantineWriter(ctx context.Context, url string, opts ...Option) (QuarantineWriter, error) {
	if buildOptions(opts).readOnly {
		return nil, errWriterReadOnly
	}
	st, _, err := open(ctx, url, modeCurrent, opts)
	if err != nil {
		return nil, err
	}
	rec, ok := st.(displacementRecorder)
	if !ok {
		_ = st.Close()
		return nil, fmt.Errorf("store: %s backend cannot record displacements", st.Backend())
	}
	return quarantineWriter{st: st, rec: rec}, nil
}

// checkDisplacement validates d and p and fills in d's time.
func checkDisplacement(d *Displacement, p QuarantinePolicy, now func() time.Time) error {
	switch {
	case d.RunnerID == "" || len(d.RunnerID) > MaxRunnerIDLen:
		return fmt.Errorf("store: record displacement: %w: runner ID empty or longer than %d bytes", verifier.ErrInvalidArgument, MaxRunnerIDLen)
	case len(d.Newer) > MaxClientAddrLen || len(d.Older) > MaxClientAddrLen:
		return fmt.Errorf("store: record displacement: %w: client address longer than %d bytes", verifier.ErrInvalidArgument, MaxClientAddrLen)
	case p.After < 0:
		return fmt.Errorf("store: record displacement: %w: threshold %d is negative", verifier.ErrInvalidArgument, p.After)
	case p.After > 0 && p.Window <= 0:
		return fmt.Errorf("store: record displacement: %w: window %s is not positive", verifier.ErrInvalidArgument, p.Window)
	}
	if d.At.IsZero() {
		d.At = now()
	}
	d.At = normTime(d.At)
	return nil
}

// nextQuarantine is the record after d, from prev (found: there was one).
// changed is false when the record stays as it is (a quarantined ID).
func nextQuarantine(prev Quarantine, found bool, d Displacement, p QuarantinePolicy) (next Quarantine, started, changed bool) {
	if found && prev.Quarantined() {
		return prev, false, false
	}
	next = Quarantine{RunnerID: d.RunnerID, WindowStart: prev.WindowStart, Displacements: prev.Displacements + 1,
		LastAt: d.At, NewerClient: d.Newer, OlderClient: d.Older}
	if !found || prev.Displacements == 0 || d.At.Before(prev.WindowStart) || d.At.Sub(prev.WindowStart) > p.Window {
		next.WindowStart, next.Displacements = d.At, 1
	}
	if p.After > 0 && next.Displacements > p.After {
		next.QuarantinedAt = d.At
		started = true
	}
	return next, started, true
}
