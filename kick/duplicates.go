package kick

// Duplicates: one live connection per Runner ID. A Runner ID is one node, so
// two live connections for one ID are a reconnect race or a copied token; the
// callout that authorized the newer one looks for older ones after the grace.

import (
	"context"
	"slices"
	"time"
)

type dupCheck struct {
	g        *Grant
	at       time.Time
	attempts int
}

// Authorized records a connection the callout just authorized and schedules
// its duplicate check. It does not block.
func (k *Kicker) Authorized(g Grant) {
	g.at = k.cfg.Now()
	k.mu.Lock()
	if len(k.grants) < MaxGrants {
		k.grants[key{g.ServerID, g.CID}] = &g
	} else if !k.full {
		k.full = true
		k.log.Warn("kick: grant table full; further connections are judged by their Runner ID alone", "max", MaxGrants)
	}
	k.due = append(k.due, dupCheck{g: &g, at: g.at.Add(k.cfg.DuplicateGrace)})
	k.mu.Unlock()
	k.poke()
}

// checkDuplicates runs the duplicate checks that are due.
func (k *Kicker) checkDuplicates(ctx context.Context) {
	now := k.cfg.Now()
	k.mu.Lock()
	var due []dupCheck
	for len(k.due) > 0 && !k.due[0].at.After(now) {
		due = append(due, k.due[0])
		k.due = k.due[1:]
	}
	k.mu.Unlock()
	if len(due) == 0 {
		return
	}
	due = k.settleByEvents(due)
	if len(due) == 0 {
		return
	}
	k.m.dupChecks.WithLabelValues("listing").Add(float64(len(due)))
	byUser, err := k.listUsers(ctx, due)
	if err != nil {
		k.log.Warn("kick: duplicate check failed", "runners", len(due), "error", err)
		k.requeue(due, now)
		return
	}
	var targets []target
	found := 0
	defer func() {
		k.log.Debug("kick: duplicate checks done", "checked", len(due), "with_older", found)
	}()
	for _, d := range due {
		conns := byUser[d.g.RunnerID]
		i := slices.IndexFunc(conns, func(c Conn) bool { return c.key() == key{d.g.ServerID, d.g.CID} })
		if i < 0 {
			continue // the newest is gone already: nothing to decide
		}
		mine := conns[i]
		var older []Conn
		for _, c := range conns {
			if c.key() != mine.key() && !c.Start.After(mine.Start) {
				older = append(older, c)
			}
		}
		if len(older) == 0 {
			continue
		}
		found++
		addrs := make([]string, len(older))
		for j, c := range older {
			addrs[j] = c.Addr
		}
		action := "kicked"
		if k.cfg.Duplicates == DuplicatesKeep {
			action = "kept"
		}
		// The listing's address has the port (the grant's, from the
		// authorization request, is the host alone): two clients behind one
		// NAT differ only by it.
		k.log.Warn("kick: runner ID has more than one live connection (a reconnect race or a copied token)",
			"runner_id", d.g.RunnerID, "client", mine.Addr, "server", mine.ServerName, "older_clients", addrs, "older", action)
		k.m.duplicates.WithLabelValues(action).Add(float64(len(older)))
		if k.cfg.Duplicates == DuplicatesKickOlder {
			for _, c := range older {
				targets = append(targets, target{c: c, reason: ReasonDuplicate,
					cause:     "a newer connection authenticated as the same Runner ID from " + mine.Addr,
					displaced: &Displacement{RunnerID: d.g.RunnerID, Newer: mine.Addr, Older: c.Addr}})
			}
		}
	}
	if k.kickAll(ctx, targets, "duplicate") > 0 {
		// Check them again: the listing sees what the failed kicks left.
		k.requeue(due, now)
	}
}

// settleByEvents takes out the checks the events' index settles (no older
// connection of the Runner ID) and returns the rest, for a listing. An
// index that is no longer whole settles none and asks for the full listing
// that makes it whole again.
func (k *Kicker) settleByEvents(due []dupCheck) []dupCheck {
	if k.ix == nil || !k.indexWhole(true) {
		return due
	}
	rest := due[:0:0]
	settled := 0
	for _, d := range due {
		if k.ix.settles(d.g) {
			settled++
			continue
		}
		rest = append(rest, d)
	}
	k.m.dupChecks.WithLabelValues("events").Add(float64(settled))
	return rest
}

// indexWhole reports whether the events' index is whole. When it has just
// stopped being so it says so, once, and with ask asks for the full listing
// that makes it whole again (a sweep about to list need not ask).
func (k *Kicker) indexWhole(ask bool) bool {
	if k.ix.usable() {
		k.ixWhole = true
		return true
	}
	if k.ixWhole {
		k.log.Warn("kick: the connect and disconnect events' index may be missing connections; duplicate checks and sweeps list the servers until the next full listing, asked for now", "why", k.ix.why())
		if ask {
			k.Sweep("events_lost")
		}
	}
	k.ixWhole = false
	return false
}

// requeue schedules duplicate checks again, each at most dupAttempts times.
func (k *Kicker) requeue(due []dupCheck, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, d := range due {
		if d.attempts+1 < dupAttempts {
			d.attempts++
			d.at = now.Add(retryMin << d.attempts)
			k.due = append(k.due, d)
		}
	}
	slices.SortFunc(k.due, func(a, b dupCheck) int { return a.at.Compare(b.at) })
}

// listUsers lists the connections of the due checks' Runner IDs.
func (k *Kicker) listUsers(ctx context.Context, due []dupCheck) (map[string][]Conn, error) {
	var conns []Conn
	if len(due) > dupBatch {
		var err error
		if conns, _, err = k.l.list(ctx, "", false); err != nil {
			return nil, err
		}
	} else {
		seen := map[string]bool{}
		for _, d := range due {
			if seen[d.g.RunnerID] {
				continue
			}
			seen[d.g.RunnerID] = true
			cs, _, err := k.l.list(ctx, d.g.RunnerID, false)
			if err != nil {
				return nil, err
			}
			conns = append(conns, cs...)
		}
	}
	byUser := map[string][]Conn{}
	for _, c := range conns {
		if k.calloutUser(c) {
			byUser[c.User] = append(byUser[c.User], c)
		}
	}
	return byUser, nil
}
