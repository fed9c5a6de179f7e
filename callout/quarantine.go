package callout

// Duplicates and quarantine (docs/designs/DECISIONS.md, DL-459). The kicker
// ends the older of two live connections of one Runner ID; a copied token
// then ping-pongs with the original for ever. Each such displacement is
// counted in the store, shared by every replica; past --quarantine-after
// within --quarantine-window the Runner ID is quarantined: every connection
// of it is ended, connects and Enroll are refused, until an operator runs
// compass-server clear-quarantine.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/store"
)

// Defaults of the quarantine, each with its reason (DL-459).
const (
	// DefaultQuarantineAfter: a Runner ID displaced more than this many
	// times within DefaultQuarantineWindow is quarantined. A Runner's own
	// handover never displaces (the duplicate grace covers it); a reconnect
	// whose old connection the server still holds (a half-open TCP
	// connection after a network change) displaces once. A copied token
	// displaces once per duplicate grace and reconnect, about every 12 s:
	// 49 times in 10 minutes; the fourth displacement, about 50 s after the
	// copy first connects, quarantines it.
	DefaultQuarantineAfter = 3
	// DefaultQuarantineWindow: four half-open reconnects of one Runner in 10
	// minutes is a Runner that does no work anyway; a longer window would
	// count unrelated network trouble together.
	DefaultQuarantineWindow = 10 * time.Minute
	// MinQuarantineWindow is above a duplicate grace and a reconnect, so a
	// window can hold two displacements at all.
	MinQuarantineWindow = 2 * kick.MinDuplicateGrace
	// quarantineResweep: a quarantine is swept at once and once more this
	// much later. A connect of the ID authorized just before the quarantine
	// was known here (answered, but not yet in the servers' listings when
	// the first sweep listed them) is then live, and only a later sweep
	// ends it; two seconds is past a CONNECT's whole path (the first PING
	// comes at about two).
	quarantineResweep = 2 * time.Second
)

// ErrQuarantined marks a connect refused because its Runner ID is
// quarantined.
var ErrQuarantined = errors.New("callout: runner ID quarantined")

// QuarantineLister is what the quarantine reads of the store (store.Store
// has it).
type QuarantineLister interface {
	ListQuarantined(ctx context.Context) ([]store.Quarantine, error)
}

// Sweeper asks for a sweep of the live connections (*kick.Kicker has it).
type Sweeper interface {
	Sweep(cause string)
}

// QuarantineConfig configures a Quarantine.
type QuarantineConfig struct {
	// Store reads the quarantined IDs (nil: none are ever refused).
	Store QuarantineLister
	// Writer counts displacements (nil: this replica counts none, and
	// quarantines none itself: --quarantine-after 0, --duplicates keep or
	// no store). Policy is its threshold and window.
	Writer store.QuarantineWriter
	Policy store.QuarantinePolicy
	Logger *slog.Logger
	// Registerer takes the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Quarantine counts displacements (kick.DisplacementRecorder), holds the
// quarantined Runner IDs as last read from the store, and refuses them.
type Quarantine struct {
	cfg QuarantineConfig
	log *slog.Logger

	ids     atomic.Pointer[map[string]store.Quarantine]
	mu      sync.Mutex // serializes updates of ids
	sweeper atomic.Pointer[Sweeper]

	started  prometheus.Counter
	refusals prometheus.Counter
	records  *prometheus.CounterVec
}

// NewQuarantine returns a Quarantine with no ID quarantined until Refresh
// reads the store.
func NewQuarantine(cfg QuarantineConfig) (*Quarantine, error) {
	if cfg.Writer != nil && (cfg.Policy.After < 1 || cfg.Policy.Window < MinQuarantineWindow) {
		return nil, fmt.Errorf("callout: quarantine after %d within %s: want at least 1 within at least %s", cfg.Policy.After, cfg.Policy.Window, MinQuarantineWindow)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q := &Quarantine{cfg: cfg, log: log,
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_callout_quarantines_total",
			Help: "Runner IDs this callout quarantined: displaced (an older live connection ended as a duplicate) more than --quarantine-after times within --quarantine-window, a copied token (DL-459).",
		}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "compass_callout_quarantine_refusals_total",
			Help: "Connects refused because their Runner ID is quarantined (counted also as denied in compass_callout_decisions_total).",
		}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compass_callout_displacements_total",
			Help: "Displacements (older live connections ended as duplicates) counted in the store towards a quarantine, by result (recorded; failed: the store refused the write, logged at ERROR).",
		}, []string{"result"}),
	}
	empty := map[string]store.Quarantine{}
	q.ids.Store(&empty)
	for _, r := range []string{"recorded", "failed"} {
		q.records.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{q.started, q.refusals, q.records,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "compass_callout_runners_quarantined",
				Help: "Runner IDs in quarantine, as last read from the store (every --revocation-poll): each stays until compass-server clear-quarantine.",
			}, func() float64 { return float64(len(*q.ids.Load())) }),
		} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("callout: metrics: %w", err)
			}
		}
	}
	return q, nil
}

// SetSweeper sets whom a new quarantine asks to end the ID's connections.
func (q *Quarantine) SetSweeper(s Sweeper) { q.sweeper.Store(&s) }

func (q *Quarantine) sweep() {
	if s := q.sweeper.Load(); s != nil {
		(*s).Sweep("quarantined")
		time.AfterFunc(quarantineResweep, func() { (*s).Sweep("quarantined") })
	}
}

// Quarantined returns the record of a quarantined Runner ID.
func (q *Quarantine) Quarantined(runnerID string) (store.Quarantine, bool) {
	rec, ok := (*q.ids.Load())[runnerID]
	return rec, ok
}

// CheckConnect refuses a connect of a quarantined Runner ID with an error
// wrapping ErrQuarantined.
func (q *Quarantine) CheckConnect(runnerID string) error {
	rec, ok := q.Quarantined(runnerID)
	if !ok {
		return nil
	}
	q.refusals.Inc()
	return quarantinedErr(rec)
}

func quarantinedErr(rec store.Quarantine) error {
	return fmt.Errorf("%w since %s (displaced %d times; newer client %s, older %s): compass-server clear-quarantine --runner-id %s lifts it",
		ErrQuarantined, rec.QuarantinedAt.UTC().Format(time.RFC3339), rec.Displacements, rec.NewerClient, rec.OlderClient, rec.RunnerID)
}

// Displaced counts a displacement in the store (kick.DisplacementRecorder)
// and quarantines the ID past the threshold.
func (q *Quarantine) Displaced(ctx context.Context, d kick.Displacement) {
	if q.cfg.Writer == nil {
		return
	}
	rec, started, err := q.cfg.Writer.RecordDisplacement(ctx,
		store.Displacement{RunnerID: d.RunnerID, Newer: d.Newer, Older: d.Older, At: d.At}, q.cfg.Policy)
	if err != nil {
		q.records.WithLabelValues("failed").Inc()
		q.log.Error("callout: a displacement could not be counted towards a quarantine",
			"runner_id", d.RunnerID, "newer_client", d.Newer, "older_client", d.Older, "error", err)
		return
	}
	q.records.WithLabelValues("recorded").Inc()
	if !rec.Quarantined() {
		return
	}
	q.add(rec)
	if started {
		// Logged before counted: whoever sees the count finds the line.
		q.log.Error("callout: runner ID quarantined: its connections kept displacing each other (a copied token); every connection is ended and connects and Enroll are refused until compass-server clear-quarantine",
			"runner_id", rec.RunnerID, "newer_client", rec.NewerClient, "older_client", rec.OlderClient,
			"displacements", rec.Displacements, "window_start", rec.WindowStart, "window", q.cfg.Policy.Window)
		q.started.Inc()
	}
	q.sweep()
}

// add records one quarantined ID at once, before the next read of the store.
func (q *Quarantine) add(rec store.Quarantine) {
	q.mu.Lock()
	defer q.mu.Unlock()
	cur := *q.ids.Load()
	if _, ok := cur[rec.RunnerID]; ok {
		return
	}
	next := maps.Clone(cur)
	next[rec.RunnerID] = rec
	q.ids.Store(&next)
}

// Refresh reads the quarantined IDs from the store. It asks for a sweep
// when an ID was quarantined elsewhere (another replica), and logs the
// quarantines learned and cleared.
func (q *Quarantine) Refresh(ctx context.Context) error {
	if q.cfg.Store == nil {
		return nil
	}
	// Read under the lock: a quarantine this replica starts (add) meanwhile
	// is in the store before add, so it is in this read or waits for it.
	q.mu.Lock()
	list, err := q.cfg.Store.ListQuarantined(ctx)
	if err != nil {
		q.mu.Unlock()
		return fmt.Errorf("callout: quarantined runner IDs: %w", err)
	}
	next := make(map[string]store.Quarantine, len(list))
	for _, rec := range list {
		next[rec.RunnerID] = rec
	}
	cur := *q.ids.Load()
	q.ids.Store(&next)
	q.mu.Unlock()
	var learned, cleared []string
	for id := range next {
		if _, ok := cur[id]; !ok {
			learned = append(learned, id)
		}
	}
	for id := range cur {
		if _, ok := next[id]; !ok {
			cleared = append(cleared, id)
		}
	}
	slices.Sort(learned)
	slices.Sort(cleared)
	for _, id := range learned {
		rec := next[id]
		q.log.Warn("callout: runner ID in quarantine (read from the store); its connections are ended and refused",
			"runner_id", id, "since", rec.QuarantinedAt, "newer_client", rec.NewerClient, "older_client", rec.OlderClient)
	}
	for _, id := range cleared {
		q.log.Info("callout: runner ID's quarantine cleared; it may connect again", "runner_id", id)
	}
	if len(learned) > 0 {
		q.sweep()
	}
	return nil
}
