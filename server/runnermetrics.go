package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/store"
)

// RunnerSeenWindows are the windows of compass_server_runners_seen: a Runner
// publishes a heartbeat every 30 s and last_seen is written at most every
// TouchEvery, so a Runner up and connected is always seen within 5 minutes;
// an hour shows the ones that went quiet recently.
var RunnerSeenWindows = []struct {
	Label  string
	Within time.Duration
}{{"5m", 5 * time.Minute}, {"1h", time.Hour}}

const (
	// runnerCountsMaxAge is how long one reading of the registry answers
	// scrapes: every Server replica and every Prometheus scraping it would
	// otherwise read the whole registry each time.
	runnerCountsMaxAge = 15 * time.Second
	// runnerCountsTimeout bounds one reading; a scrape must not hang on a
	// slow database.
	runnerCountsTimeout = 5 * time.Second
)

var (
	descRunnersEnrolled = prometheus.NewDesc("compass_server_runners_enrolled",
		"Runners in the registry: every Runner ID that ever enrolled.", nil, nil)
	descRunnersSeen = prometheus.NewDesc("compass_server_runners_seen",
		"Runners whose last event (a heartbeat, any event on NATS) is within the window (5m, 1h), by the registry's last_seen.",
		[]string{"window"}, nil)
)

// runnerCounts is the collector of compass_server_runners_enrolled and
// compass_server_runners_seen, read from the store at scrape time and kept
// runnerCountsMaxAge. A reading that fails exports neither family (an alert
// on them sees them absent) and is logged.
type runnerCounts struct {
	// ctx is Serve's: a scrape's reading ends with the Server.
	ctx  context.Context
	list func(ctx context.Context) ([]store.Runner, error)
	now  func() time.Time
	log  *slog.Logger

	mu       sync.Mutex
	readAt   time.Time
	ok       bool
	enrolled int
	seen     []int // by RunnerSeenWindows
}

func newRunnerCounts(ctx context.Context, list func(ctx context.Context) ([]store.Runner, error), now func() time.Time, log *slog.Logger) *runnerCounts {
	if now == nil {
		now = time.Now
	}
	return &runnerCounts{ctx: ctx, list: list, now: now, log: log}
}

func (c *runnerCounts) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRunnersEnrolled
	ch <- descRunnersSeen
}

func (c *runnerCounts) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.readAt.IsZero() || now.Sub(c.readAt) >= runnerCountsMaxAge || now.Before(c.readAt) {
		c.read(now)
	}
	if !c.ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(descRunnersEnrolled, prometheus.GaugeValue, float64(c.enrolled))
	for i, w := range RunnerSeenWindows {
		ch <- prometheus.MustNewConstMetric(descRunnersSeen, prometheus.GaugeValue, float64(c.seen[i]), w.Label)
	}
}

func (c *runnerCounts) read(now time.Time) {
	c.readAt = now
	ctx, cancel := context.WithTimeout(c.ctx, runnerCountsTimeout)
	defer cancel()
	runners, err := c.list(ctx)
	if err != nil {
		c.ok = false
		c.log.Warn("server: metrics: reading the Runner registry failed; compass_server_runners_* are not exported until it succeeds", "err", err)
		return
	}
	c.ok, c.enrolled, c.seen = true, len(runners), make([]int, len(RunnerSeenWindows))
	for _, r := range runners {
		if r.LastSeenAt.IsZero() {
			continue
		}
		for i, w := range RunnerSeenWindows {
			if now.Sub(r.LastSeenAt) <= w.Within {
				c.seen[i]++
			}
		}
	}
}
