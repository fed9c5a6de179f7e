package callout

// Lag: how late nats-server handles what the callout sends on a connection.
//
// nats-server reads a connection's messages in order, on one goroutine, and
// handles an answer there (it opens it, checks two signatures, registers the
// user) before it reads the next. When the server is short of CPU (a
// reconnect storm on a busy node) answers wait in that queue, and one
// published well inside the horizon can still reach the server after the
// client's first PING has ended its CONNECT. The callout cannot see that
// queue, but a PING sent on the connection waits in it too: the PONG comes
// back only after the server has handled everything sent before it. So each
// connection keeps a PING in flight, and the time that PING has been out (or
// the last round trip, when it is back) is the connection's lag. A request
// arriving on a lagging connection is aged by that lag: it is as old as if
// it had arrived that much earlier, and one whose answer would reach the
// server past the horizon is dropped before any verification, which spares
// the callout's CPU and the server's (it then handles no answer at all).

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// lagProbeInterval is how often each connection sends its PING. A tenth of
// the default horizon: a lag that grows past the horizon is seen within
// about that much, for one PING and PONG per connection and interval.
const lagProbeInterval = 100 * time.Millisecond

// lagFresh bounds how long a round trip stands for the lag once no PING is
// in flight (the connection is reconnecting, or the probe has stopped): past
// it the lag is unknown, and unknown lag never drops a request. While a PING
// is in flight the last round trip stands until that PING comes back with a
// newer one.
const lagFresh = time.Second

// lane is one connection's lag.
type lane struct {
	now    func() time.Time
	sentAt atomic.Int64 // unix nanoseconds of the PING in flight; 0 when none
	rtt    atomic.Int64 // the last round trip, nanoseconds
	rttAt  atomic.Int64 // when it came back, unix nanoseconds; 0 before the first
}

// lag is the connection's lag now: with a PING in flight, the longer of its
// time out and the last round trip; with none, the last round trip while it
// is fresh; else zero.
func (l *lane) lag() time.Duration {
	if l == nil {
		return 0
	}
	now := l.now().UnixNano()
	sent, rtt, at := l.sentAt.Load(), l.rtt.Load(), l.rttAt.Load()
	var d int64
	switch {
	case sent != 0:
		d = now - sent
		if at != 0 {
			d = max(d, rtt)
		}
	case at != 0 && now-at <= int64(lagFresh):
		d = rtt
	}
	return time.Duration(max(d, 0))
}

// sent and back record a probe's PING and its PONG.
func (l *lane) sent(at time.Time) { l.sentAt.Store(at.UnixNano()) }

func (l *lane) back(sent, at time.Time) {
	l.rtt.Store(int64(at.Sub(sent)))
	l.rttAt.Store(at.UnixNano())
	l.sentAt.Store(0)
}

// probe keeps a PING in flight on nc every lagProbeInterval until ctx ends.
// A PING that fails (the connection is down or closing) records nothing; the
// lane then goes stale and counts as no lag.
//
// No PING is sent while the connection is down: nats.go would hold it in its
// reconnect buffer and send it after the reconnect, and its round trip would
// then be the outage, not the server's lag, and drop every request of the
// reconnected connection as past the horizon. A PING whose round trip spans
// a reconnect all the same (one sent as the connection dropped) is
// discarded the moment nats.go reports the connection down, not when its
// Flush returns: that may come after the reconnect, when the reconnected
// connection's first requests have already read the outage as lag.
func (l *lane) probe(ctx context.Context, nc *nats.Conn) {
	tick := time.NewTicker(lagProbeInterval)
	defer tick.Stop()
	down := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING)
	forgot := make(chan struct{})
	go func() {
		defer close(forgot)
		for range down { // closed by RemoveStatusListener below
			l.sentAt.Store(0)
		}
	}()
	defer func() { nc.RemoveStatusListener(down); <-forgot }()
	for {
		if nc.IsConnected() {
			reconnects := nc.Stats().Reconnects
			sent := l.now()
			l.sent(sent)
			// A PING that never comes back is bounded by the horizon's use:
			// past a few seconds every request is dropped anyway.
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := nc.FlushWithContext(pctx)
			cancel()
			if err == nil && nc.Stats().Reconnects == reconnects {
				l.back(sent, l.now())
			} else {
				l.sentAt.Store(0)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
