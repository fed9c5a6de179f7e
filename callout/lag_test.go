package callout

import (
	"testing"
	"time"
)

// The lane's lag at the moments that decide it: before any probe, with a
// PING out, when it comes back, while the next is out, and once the
// connection stops probing (lagFresh, at its boundary).
func TestLaneLag(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	l := &lane{now: func() time.Time { return now }}
	at := func(d time.Duration, want time.Duration) {
		t.Helper()
		now = t0.Add(d)
		if got := l.lag(); got != want {
			t.Fatalf("at +%v: lag %v, want %v", d, got, want)
		}
	}
	at(0, 0) // nothing measured: no lag
	l.sent(t0)
	at(1500*time.Millisecond, 1500*time.Millisecond) // the PING in flight's time out
	l.back(t0, t0.Add(2500*time.Millisecond))
	at(2500*time.Millisecond, 2500*time.Millisecond) // the round trip
	l.sent(t0.Add(2600 * time.Millisecond))
	// The next PING is out: the last round trip stands until it is back,
	// however long that takes, and its own time out once longer.
	at(4*time.Second, 2500*time.Millisecond)
	at(5200*time.Millisecond, 2600*time.Millisecond)
	l.back(t0.Add(2600*time.Millisecond), t0.Add(2610*time.Millisecond))
	at(2700*time.Millisecond, 10*time.Millisecond) // the server caught up
	// No PING out (a failed flush): the round trip stands for lagFresh.
	l.sentAt.Store(0)
	at(2610*time.Millisecond+lagFresh, 10*time.Millisecond)
	at(2610*time.Millisecond+lagFresh+time.Nanosecond, 0)
	var none *lane
	if none.lag() != 0 {
		t.Fatal("a nil lane has lag")
	}
}
