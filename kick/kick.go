// Package kick ends the live NATS connections of Runners that the doors no
// longer accept: a node denied by name or UID, a cluster removed from the
// cluster file, a minted token revoked or expired, and the older of two live
// connections that authenticated as one Runner ID.
//
// A NATS server checks a client's credentials once, at CONNECT; the user JWT
// the callout grants then lasts until it expires (up to the token's own
// expiry). Without a kick, a Runner whose node the operator denies because it
// is compromised stays on the command plane for up to the user JWT's
// lifetime. The attacker is a Runner (or a copy of its token) that is still
// connected when the operator revokes it.
//
// The Kicker is stateless towards NATS: it asks every server for the live
// connections of the Runners' account ($SYS.REQ.SERVER.PING.CONNZ), asks a
// Policy about each, and ends those refused ($SYS.REQ.SERVER.<id>.KICK). It
// does this on every change the daemon learns of (Sweep), every
// SweepInterval as a safety net, and again after a failure until it
// succeeds. Any number of callout replicas may run one: a kick is
// idempotent, and a connection already gone counts as ended.
package kick

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults and limits, each with its reason.
const (
	// DefaultSweepInterval: the safety net under the triggered sweeps (a kick
	// lost with a server restart, a replica that missed a change). While the
	// events' index is whole a sweep judges it and asks no server anything
	// (see DefaultListInterval); otherwise it is a full listing, which costs
	// each server some tens of milliseconds per 10,000 connections.
	DefaultSweepInterval = 30 * time.Second
	// DefaultListInterval is how often, at most, a sweep lists every
	// connection of the account from the servers while the events' index is
	// whole; the sweeps between judge the index. A full listing is what
	// grows with the fleet on every server (docs/scale.md), and every replica
	// makes its own: at 30 s each, two replicas kept each server listing a
	// whole account every 15 s. The index stands in for it between: it
	// stops being whole at any sign of a lost event (the connection's
	// reconnect, a subscription's drop), after which the next sweep lists at
	// once. What a listing still catches is what no sign shows: the events
	// of a connection never sent. Five minutes bounds that, ten times fewer
	// listings than before.
	DefaultListInterval = 5 * time.Minute
	// DefaultDuplicateGrace is how long a second live connection of one
	// Runner ID may overlap the first before it counts as a copy: a Runner's
	// own handover opens its new connection, keeps both subscriptions for
	// runner.DefaultHandoverOverlap (0.5 s, so a NATS cluster's other nodes
	// learn of the new one first), then drains the old one, which takes up
	// to runner.DrainTimeout (10 s) with commands in flight: 10.5 s at most.
	DefaultDuplicateGrace = 12 * time.Second
	// MinDuplicateGrace keeps a Runner's normal handover from being taken
	// for a copy (its new connection subscribes, the overlap passes, then the
	// old one drains); above runner.DefaultHandoverOverlap.
	MinDuplicateGrace = time.Second
	// retryMin and retryMax bound the backoff of a failed sweep: soon enough
	// to meet the revocation bound after a lost request, slow enough not to
	// press a server that is failing.
	retryMin, retryMax = 250 * time.Millisecond, 30 * time.Second
	// kickConcurrency bounds the kick requests in flight at once.
	kickConcurrency = 16
	// dupBatch: more due duplicate checks than this take one listing of the
	// account instead of one filtered listing each (a reconnect storm).
	dupBatch = 8
	// dupAttempts bounds the retries of a duplicate check whose listing failed.
	dupAttempts = 3
	// MaxGrants bounds the authorizations a Kicker remembers. Past it, new
	// ones are judged by their Runner ID alone (Grant says why that is less).
	MaxGrants = 200_000
	// grantSettle is how long a grant is kept although no listing shows its
	// connection: the answer is published before the server registers the
	// connection in the Runners' account.
	grantSettle = 5 * time.Second
)

// Reason is why a connection was ended; it is a metric label.
type Reason string

const (
	ReasonNodeDenied     Reason = "node_denied"
	ReasonClusterRemoved Reason = "cluster_removed"
	ReasonTokenRevoked   Reason = "token_revoked"
	ReasonTokenExpired   Reason = "token_expired"
	ReasonKeyRemoved     Reason = "key_removed"
	ReasonDuplicate      Reason = "duplicate"
	ReasonQuarantined    Reason = "quarantined" // the Runner ID is quarantined (DL-459)
	ReasonPodDeleted     Reason = "pod_deleted" // the token's pod went away (a cluster's pod watch)
	ReasonRefused        Reason = "refused"     // any other refusal by the Policy
)

// Refusal is a Policy's answer for a connection that may not stay.
type Refusal struct {
	Reason Reason
	Cause  error // safe to log: never a token
}

func (r *Refusal) Error() string { return fmt.Sprintf("%s: %v", r.Reason, r.Cause) }
func (r *Refusal) Unwrap() error { return r.Cause }

// Refuse returns a Refusal for reason with its cause.
func Refuse(reason Reason, cause error) error { return &Refusal{Reason: reason, Cause: cause} }

// ReasonOf is the Reason of a Policy's error (ReasonRefused when it is not a
// Refusal).
func ReasonOf(err error) Reason {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason
	}
	return ReasonRefused
}

// Grant is what the callout knew when it authorized a connection. A Policy
// gets it for the connections this process authorized; for others (another
// replica's, or this replica's before a restart) it gets nil and can judge
// by the Runner ID alone, which names the cluster and node but not the node
// UID or the minted token.
type Grant struct {
	RunnerID string
	// Cluster, Node, NodeUID, PodUID (the pod the token is bound to) and
	// KeyID (the kid that signed the token) are set for projected tokens.
	Cluster, Node, NodeUID, PodUID, KeyID string
	// TokenID is a minted token's public ID.
	TokenID string
	// Where the connection is: the server's ID and its client ID there, and
	// the client's address.
	ServerID string
	CID      uint64
	Addr     string
	// Expiry is the user JWT's exp: the server ends the connection then.
	Expiry time.Time
	at     time.Time
}

// Admit decides about one live connection: nil when it may stay, else an
// error (preferably a Refusal) saying why not. g is nil when this process
// did not authorize the connection.
type Admit func(c Conn, g *Grant) error

// Policy gives the Admit in force for one sweep: it may read what it needs
// (a store's revocations) once per sweep. With an error and a non-nil Admit
// it could read only part of it: the sweep ends what that Admit refuses and
// is retried.
type Policy interface {
	Admitter(ctx context.Context) (Admit, error)
}

// Displacement is one older live connection the Kicker ended as a
// duplicate of a newer one of the same Runner ID.
type Displacement struct {
	RunnerID string
	// Newer and Older are the client host:port of the connection that
	// authenticated last and of the one ended.
	Newer, Older string
	At           time.Time // on Config.Now
}

// DisplacementRecorder is told of each displacement (compass-callout counts
// them towards a quarantine). It is called on the kick's goroutine and may
// block for as long as ctx allows.
type DisplacementRecorder interface {
	Displaced(ctx context.Context, d Displacement)
}

// Duplicates says what to do when one Runner ID has two live connections.
type Duplicates int

const (
	// DuplicatesKickOlder ends the older connection (newest wins).
	DuplicatesKickOlder Duplicates = iota
	// DuplicatesKeep only logs and counts it (detection only).
	DuplicatesKeep
)

// String is the flag spelling of d.
func (d Duplicates) String() string {
	if d == DuplicatesKeep {
		return "keep"
	}
	return "kick-older"
}

// Set parses "kick-older" or "keep", so a *Duplicates is a flag.Value.
func (d *Duplicates) Set(s string) error {
	switch s {
	case "kick-older":
		*d = DuplicatesKickOlder
	case "keep":
		*d = DuplicatesKeep
	default:
		return errors.New("want kick-older or keep")
	}
	return nil
}

// Config configures a Kicker.
type Config struct {
	// Conn is a connection to the NATS system account whose user may
	// publish SubjectConnzAll, SubjectConnzOne and SubjectKick and nothing
	// else (and subscribe to its reply inboxes).
	Conn *nats.Conn
	// Account is the Runners' account: its name (server-config mode) or
	// public key (operator mode).
	Account string
	// Issuers are the keys (or, in server-config mode, the account name)
	// that a NATS server reports as the issuer of the callout's users. Other
	// users of the account (compass-server's own) are never judged.
	Issuers []string
	Policy  Policy

	Duplicates     Duplicates
	DuplicateGrace time.Duration // 0: DefaultDuplicateGrace
	// Displaced, if set, is told of every older connection ended as a
	// duplicate (kicked, not found gone): with DuplicatesKeep, never.
	Displaced     DisplacementRecorder
	SweepInterval time.Duration // 0: DefaultSweepInterval
	// ListInterval is how long a sweep judges the events' index, while it is
	// whole, before it lists the servers again (0: DefaultListInterval; a
	// nanosecond: every sweep lists).
	ListInterval time.Duration
	// PageSize is the connections asked of a server at once (0: PageSize;
	// tests make it small to page).
	PageSize int

	Now        func() time.Time // default time.Now
	Logger     *slog.Logger     // default: discarded
	Registerer prometheus.Registerer
}

// Kicker ends the connections its Policy refuses. Create it with New, run
// it with Run.
type Kicker struct {
	cfg Config
	l   lister
	log *slog.Logger
	m   *metrics

	mu     sync.Mutex
	grants map[key]*Grant
	causes []string // pending sweep causes
	// grantCauses are pending causes of a sweep of this process's own
	// grants alone (SweepGrants).
	grantCauses []string
	due         []dupCheck
	wake        chan struct{}
	full        bool // the grant table hit MaxGrants (logged once)

	// ix is the account's live connections from the servers' events (nil:
	// the kick identity may not follow them, and every duplicate check
	// lists); only Run's goroutine reads the field. ixWhole is whether it
	// was whole at the last duplicate check.
	ix      *index
	ixWhole bool
	// listedAt is when the last full listing succeeded (zero: never); only
	// Run's goroutine reads and writes it.
	listedAt time.Time
	// silent: the last sweep listed because a grant was never announced
	// (logged once per episode).
	silent bool
}

// New checks cfg and returns a Kicker.
func New(cfg Config) (*Kicker, error) {
	switch {
	case cfg.Conn == nil:
		return nil, errors.New("kick: no NATS connection")
	case cfg.Account == "":
		return nil, errors.New("kick: no Runners' account")
	case len(cfg.Issuers) == 0:
		return nil, errors.New("kick: no issuer of the callout's users")
	case cfg.Policy == nil:
		return nil, errors.New("kick: no policy")
	case cfg.Duplicates != DuplicatesKickOlder && cfg.Duplicates != DuplicatesKeep:
		return nil, fmt.Errorf("kick: unknown duplicates policy %d", cfg.Duplicates)
	case cfg.DuplicateGrace != 0 && cfg.DuplicateGrace < MinDuplicateGrace:
		return nil, fmt.Errorf("kick: duplicate grace %s is under the minimum %s", cfg.DuplicateGrace, MinDuplicateGrace)
	case cfg.PageSize < 0:
		return nil, fmt.Errorf("kick: page size %d is negative", cfg.PageSize)
	case cfg.SweepInterval < 0:
		return nil, fmt.Errorf("kick: sweep interval %s is negative", cfg.SweepInterval)
	case cfg.ListInterval < 0:
		return nil, fmt.Errorf("kick: listing interval %s is negative", cfg.ListInterval)
	}
	if cfg.DuplicateGrace == 0 {
		cfg.DuplicateGrace = DefaultDuplicateGrace
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.ListInterval == 0 {
		cfg.ListInterval = DefaultListInterval
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = PageSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Kicker{
		cfg: cfg, l: lister{nc: cfg.Conn, account: cfg.Account, pageSize: cfg.PageSize}, log: log, m: m,
		grants: map[key]*Grant{}, wake: make(chan struct{}, 1),
	}, nil
}

// Sweep asks for a sweep now, naming its cause ("cluster_file",
// "token_revoked", ...). It does not block; sweeps asked for while one runs
// are merged into the next.
func (k *Kicker) Sweep(cause string) {
	k.mu.Lock()
	if !slices.Contains(k.causes, cause) {
		k.causes = append(k.causes, cause)
	}
	k.mu.Unlock()
	k.poke()
}

// SweepGrants asks for a sweep of the connections this process authorized
// alone (its grants), judged by the Policy and ended by their server and
// client ID, with no listing of the account: for a change only a grant can
// concern (a pod gone, which only the grant of the replica that authorized
// its token names). Its cost grows with this process's grants, not with the
// account's connections on every server, and nothing is asked of a server
// but the kicks. It does not block; a full Sweep pending at the same time
// covers it. A grants sweep that fails is retried as a full sweep.
func (k *Kicker) SweepGrants(cause string) {
	k.mu.Lock()
	if !slices.Contains(k.grantCauses, cause) {
		k.grantCauses = append(k.grantCauses, cause)
	}
	k.mu.Unlock()
	k.poke()
}

func (k *Kicker) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Run sweeps at once, then on every Sweep, every SweepInterval and after a
// failure, and checks duplicates as they fall due, until ctx ends.
func (k *Kicker) Run(ctx context.Context) {
	if ix, err := k.followEvents(); err != nil {
		k.log.Warn("kick: not following the Runners' account's connect and disconnect events; each duplicate check lists the servers' connections instead (grant the kick identity subscribe on them: docs/self-host.md, \"The kick identity\")",
			"connect", fmt.Sprintf(SubjectConnectEvents, k.cfg.Account), "disconnect", fmt.Sprintf(SubjectDisconnectEvents, k.cfg.Account), "error", err)
	} else {
		k.ix = ix
		defer ix.stop()
	}
	k.Sweep("start")
	tick := time.NewTicker(k.cfg.SweepInterval)
	defer tick.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoff := time.Duration(0)
	var retry, settle <-chan time.Time
	for {
		// The next duplicate check due.
		var next <-chan time.Time
		k.mu.Lock()
		if len(k.due) > 0 {
			timer.Reset(max(0, k.due[0].at.Sub(k.cfg.Now())))
			next = timer.C
		}
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-tick.C:
			k.Sweep("periodic")
		case <-retry:
			retry = nil
			k.Sweep("retry")
		case <-settle:
			settle = nil
			k.Sweep("settle")
		case <-next:
		}
		k.mu.Lock()
		causes, grantCauses := k.causes, k.grantCauses
		k.causes, k.grantCauses = nil, nil
		k.mu.Unlock()
		if len(causes) > 0 {
			// A full sweep judges every grant too.
			if k.sweep(ctx, strings.Join(append(causes, grantCauses...), ","), k.mustList(causes)) {
				backoff = 0
			} else if ctx.Err() == nil {
				backoff = min(retryMax, max(retryMin, 2*backoff))
				retry = time.After(backoff)
			}
			if changed(causes) {
				// A connection authorized before the change may reach the
				// servers' accounts (and the index) a little after it: judge
				// again once they all have.
				settle = time.After(grantSettle)
			}
		} else if len(grantCauses) > 0 && !k.sweepGrants(ctx, strings.Join(grantCauses, ",")) && ctx.Err() == nil {
			backoff = min(retryMax, max(retryMin, 2*backoff))
			retry = time.After(backoff)
		}
		k.checkDuplicates(ctx)
	}
}

// mustList reports whether a sweep for causes lists every connection from
// the servers, rather than judging the events' index: without an index, one
// not whole, at the start and after a failure, and once ListInterval has
// passed since the last listing.
func (k *Kicker) mustList(causes []string) bool {
	if k.ix == nil || k.listedAt.IsZero() || !k.indexWhole(false) {
		return true
	}
	for _, c := range causes {
		switch c {
		case "start", "retry", "events_lost":
			return true
		}
	}
	if k.cfg.Now().Sub(k.listedAt) >= k.cfg.ListInterval {
		return true
	}
	if id, ok := k.unannounced(); !ok {
		if !k.silent {
			k.silent = true
			k.log.Warn("kick: a connection this callout authorized was never announced by the servers' connect events; sweeps list the servers until the events show it",
				"runner_id", id)
		}
		return true
	}
	k.silent = false
	return false
}

// unannounced checks the events against this process's own grants: every
// connection it authorized since the last listing, more than grantSettle
// ago and not yet expired, must have been announced by its CONNECT event.
// One that was not (the servers' events do not reach the kick identity, or
// not from every server, and nothing showed it) makes the index
// untrustworthy; the listing that follows settles it, and moves the
// listing's time past that grant. It returns the first such grant's Runner
// ID and false.
func (k *Kicker) unannounced() (string, bool) {
	now := k.cfg.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	for kk, g := range k.grants {
		if g.at.Before(k.listedAt) || now.Sub(g.at) < grantSettle || !now.Before(g.Expiry) {
			continue
		}
		if !k.ix.wasAnnounced(kk) {
			return g.RunnerID, false
		}
	}
	return "", true
}

// changed reports whether causes include a change of what the policy
// refuses (not only the clock: a periodic sweep, a retry, a settle).
func changed(causes []string) bool {
	for _, c := range causes {
		switch c {
		case "periodic", "retry", "settle", "start", "events_lost":
		default:
			return true
		}
	}
	return false
}
