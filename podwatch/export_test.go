package podwatch

import (
	"context"
	"errors"
	"io"
	"time"
)

// Event is an event as parseEvent decodes it, for the tests.
type Event struct {
	Type, UID, Name, Node, RV string
	Terminating               bool
	Code                      int
	Reason, Message           string
}

// ParseEvent is parseEvent, for the fuzz target.
func ParseEvent(data []byte) (Event, error) {
	ev, err := parseEvent(data)
	return Event{Type: ev.typ, UID: ev.pod.uid, Name: ev.pod.name, Node: ev.pod.node, RV: ev.pod.rv,
		Terminating: ev.pod.terminating, Code: ev.code, Reason: ev.reason, Message: ev.message}, err
}

// ParsePage is parsePage: the list's resourceVersion, continue token and
// number of pods.
func ParsePage(r io.Reader, limit int) (rv, next string, pods int, err error) {
	pg, err := parsePage(r, limit)
	return pg.rv, pg.next, len(pg.pods), err
}

// Stream decodes the values of r, each at most max bytes, until an error,
// which it returns (io.EOF at a clean end).
func Stream(r io.Reader, max int) (values int, err error) {
	s := newStream(r, max)
	for {
		var v any
		if err := s.value(&v); err != nil {
			return values, err
		}
		values++
	}
}

// IsMalformed reports whether err is a malformed answer or event.
func IsMalformed(err error) bool { return errors.Is(err, errMalformed) }

// SetTimeouts replaces RequestTimeout, WatchIdleTimeout and WatchTimeout
// for w.
func (w *Watcher) SetTimeouts(request, idle, watch time.Duration) {
	w.requestTimeout, w.idleTimeout, w.watchTimeout = request, idle, watch
	w.listClient.Timeout = request
}

// SetMaxTracked replaces MaxTrackedPods for w.
func (w *Watcher) SetMaxTracked(n int) { w.maxTracked = n }

// SetSleep replaces how w waits out a backoff.
func (w *Watcher) SetSleep(f func(ctx context.Context, d time.Duration) error) { w.sleep = f }

// Backoff is w's wait after the n-th failure in a row.
func (w *Watcher) Backoff(n int) time.Duration { return w.backoff(n) }

// Tracked is how many pods w remembers; not while Run runs.
func (w *Watcher) Tracked() int { return len(w.pods) }

// SleepCtx is the default sleep.
var SleepCtx = sleepCtx
