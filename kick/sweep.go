package kick

// Sweeps: every live Runner connection listed, judged by the Policy in force,
// and the refused ones ended.

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/nats-io/nkeys"
)

// calloutUser reports whether c is a user the callout issued, the only
// connections the kicker judges. Its issuer must be one of the callout's
// (Config.Issuers), but that alone does not tell: in operator mode another
// user (compass-server's JWT user) may be signed by the same signing key,
// and in server-config mode a config user's issuer is the account's name,
// like the callout's users. What does tell is the user name nats-server
// reports: the callout names each user it issues by its Runner ID, which is
// never a NATS user key (verifier.CheckSubjectID refuses one, and so does
// the callout), while a user that connected with a key of its own (a JWT or
// an nkey) is shown by that key. A password user has no issuer at all.
func (k *Kicker) calloutUser(c Conn) bool {
	return slices.Contains(k.cfg.Issuers, c.Issuer) && !nkeys.IsValidPublicUserKey(c.User)
}

// target is a connection to end and why.
type target struct {
	c      Conn
	reason Reason
	cause  string
	// displaced, for a duplicate, is reported to Config.Displaced once the
	// kick ended it.
	displaced *Displacement
}

// sweep asks the policy about every live connection and ends those refused.
// With list it lists them from every server (and rebuilds the events'
// index from that); without, it judges the index, asking no server
// anything but the kicks. It reports whether everything it had to do was
// done.
func (k *Kicker) sweep(ctx context.Context, causes string, list bool) bool {
	if !list {
		return k.judge(ctx, causes, k.ix.conns(), 0, nil, "index")
	}
	heard := k.l.servers
	if k.ix != nil {
		k.ix.beginListing()
	}
	start := k.cfg.Now()
	conns, servers, err := k.l.list(ctx, "", true)
	k.m.listings.Inc()
	if err == nil && servers >= heard {
		k.listedAt = start
	}
	var mine []Conn
	for _, c := range conns {
		if k.calloutUser(c) {
			mine = append(mine, c)
		}
	}
	if k.ix != nil {
		// Whole only if every server that answered the last listing
		// answered this one: a server missed would hide its connections.
		k.ix.endListing(mine, k.l.ids, err == nil && servers >= heard)
	}
	return k.judge(ctx, causes, mine, servers, err, "listing")
}

// judge is a sweep's second half: conns, the callout-issued connections
// (from a listing of servers servers that failed with err, or from the
// index), judged, the refused ended, the grants of connections gone
// forgotten.
func (k *Kicker) judge(ctx context.Context, causes string, conns []Conn, servers int, err error, by string) bool {
	var admit Admit
	var partial error
	if err == nil {
		if admit, partial = k.cfg.Policy.Admitter(ctx); admit == nil {
			err = partial
		}
	}
	if err != nil {
		k.m.sweeps.WithLabelValues("failed").Inc()
		k.m.failing.Set(1)
		k.log.Warn("kick: sweep failed; retrying", "trigger", causes, "error", err)
		return false
	}
	now := k.cfg.Now()
	live := make(map[key]bool, len(conns))
	var targets []target
	runners := 0
	k.mu.Lock()
	for _, c := range conns {
		runners++
		live[c.key()] = true
		g := k.grants[c.key()]
		if g != nil && g.RunnerID != c.User {
			g = nil // not the connection this grant was for
		}
		if err := admit(c, g); err != nil {
			targets = append(targets, target{c: c, reason: ReasonOf(err), cause: err.Error()})
		}
	}
	for kk, g := range k.grants {
		if !live[kk] && (now.Sub(g.at) > grantSettle || !now.Before(g.Expiry)) {
			delete(k.grants, kk)
		}
	}
	k.mu.Unlock()
	k.m.live.Set(float64(runners))
	failed := k.kickAll(ctx, targets, causes)
	if partial != nil {
		k.m.sweeps.WithLabelValues("failed").Inc()
		k.m.failing.Set(1)
		k.log.Warn("kick: sweep judged only part of the connections; retrying", "trigger", causes, "error", partial)
		return false
	}
	k.m.sweeps.WithLabelValues("ok").Inc()
	if failed > 0 {
		k.m.failing.Set(1)
		k.log.Warn("kick: connections not ended; retrying", "failed", failed, "trigger", causes)
		return false
	}
	k.m.failing.Set(0)
	k.log.Debug("kick: sweep", "trigger", causes, "by", by, "servers", servers, "runner_connections", runners, "ended", len(targets))
	return true
}

// sweepGrants judges this process's grants alone, each as the connection it
// names (its server ID, client ID, Runner ID and address), and ends those
// refused. It reports whether everything it had to do was done; what was
// not is retried by a full sweep.
func (k *Kicker) sweepGrants(ctx context.Context, causes string) bool {
	admit, partial := k.cfg.Policy.Admitter(ctx)
	if admit == nil {
		k.m.sweeps.WithLabelValues("failed").Inc()
		k.m.failing.Set(1)
		k.log.Warn("kick: sweep of the grants failed; retrying as a full sweep", "trigger", causes, "error", partial)
		return false
	}
	now := k.cfg.Now()
	var targets []target
	k.mu.Lock()
	for _, g := range k.grants {
		if !now.Before(g.Expiry) {
			continue // its server has ended it
		}
		// The grant is the callout's own: no listing needed to tell. The
		// server's name is not in a grant; its ID stands in for it.
		c := Conn{ServerID: g.ServerID, ServerName: g.ServerID, CID: g.CID, User: g.RunnerID, Addr: g.Addr}
		if err := admit(c, g); err != nil {
			targets = append(targets, target{c: c, reason: ReasonOf(err), cause: err.Error()})
		}
	}
	k.mu.Unlock()
	failed := k.kickAll(ctx, targets, causes)
	if partial != nil || failed > 0 {
		k.m.sweeps.WithLabelValues("failed").Inc()
		k.m.failing.Set(1)
		k.log.Warn("kick: sweep of the grants incomplete; retrying as a full sweep", "trigger", causes, "failed", failed, "error", partial)
		return false
	}
	k.m.sweeps.WithLabelValues("ok").Inc()
	k.log.Debug("kick: sweep of the grants", "trigger", causes, "ended", len(targets))
	return true
}

// kickAll ends the targets, a few at a time, and returns how many failed.
func (k *Kicker) kickAll(ctx context.Context, targets []target, trigger string) int {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
		sem    = make(chan struct{}, kickConcurrency)
	)
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := k.kickOne(ctx, t, trigger); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

func (k *Kicker) kickOne(ctx context.Context, t target, trigger string) error {
	err := k.l.kick(ctx, t.c)
	attrs := []any{"runner_id", t.c.User, "reason", string(t.reason), "cause", t.cause,
		"server", t.c.ServerName, "cid", t.c.CID, "client", t.c.Addr, "trigger", trigger}
	switch {
	// Logged before counted: whoever sees the count finds the log line.
	case err == nil:
		k.log.Info("kick: runner connection ended", attrs...)
		k.m.kicks.WithLabelValues(string(t.reason), "kicked").Inc()
		if t.displaced != nil && k.cfg.Displaced != nil {
			d := *t.displaced
			d.At = k.cfg.Now()
			k.cfg.Displaced.Displaced(ctx, d)
		}
		return nil
	case errors.Is(err, errGone):
		k.log.Debug("kick: runner connection already closed", attrs...)
		k.m.kicks.WithLabelValues(string(t.reason), "gone").Inc()
		return nil
	default:
		k.log.Error("kick: could not end runner connection; retrying", append(attrs, "error", err)...)
		k.m.kicks.WithLabelValues(string(t.reason), "failed").Inc()
		return err
	}
}
