package runner

import (
	"time"

	"github.com/compass-runner/identity/internal/lib/natsretry"
)

// DefaultMaxReconnectJitter caps the reconnect jitter window, which doubles
// after every failed attempt in a row. A fleet that reconnects at once (a NATS
// restart, a network partition healing) against a callout with less capacity
// than the fleet's CONNECT rate would otherwise hold it above capacity for
// good: each attempt queues behind the others, times out after the callout
// has done its work, and is retried a few seconds later. Doubling the window
// halves the fleet's rate each round until attempts get in; the cap bounds
// how long a Runner waits once NATS is healthy again.
const DefaultMaxReconnectJitter = 60 * time.Second

// ReconnectDelay is compass-runner's reconnect policy for nats.go's
// CustomReconnectDelay: before attempt n (1, 2, ...) of one outage it waits
// wait plus a uniformly random part of a window that starts at jitter and
// doubles with each failed attempt, up to maxJitter. The first attempt is
// therefore what nats.ReconnectWait(wait) with nats.ReconnectJitter(jitter)
// would do; only repeated failures back off. It is the daemons' backoff
// (internal/lib/natsretry), with the fleet's larger window.
func ReconnectDelay(wait, jitter, maxJitter time.Duration) func(attempts int) time.Duration {
	return natsretry.Delay(wait, jitter, maxJitter)
}
