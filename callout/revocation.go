package callout

// Revocation of live connections: the kick identity's NATS connection, the
// policy that judges each live Runner connection against the clusters, deny
// lists and minted tokens in force, and the watch on the store that turns a
// revocation made by another process (compass-server revoke-token) into a
// sweep. The mechanics (listing, kicking, duplicates) are package kick.

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

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// DefaultRevocationPoll is how often the callout reads the store's minted
// tokens for a revocation made by another process: revoke-token writes the
// store and returns, and the connection it revokes must end within 2 s of
// that (docs/threat-model.md, "Revocation"). One read of the tokens table a
// second is nothing to PostgreSQL.
const DefaultRevocationPoll = time.Second

// TokenLister is what the revocation policy and the watch need of the
// store (store.Store has it).
type TokenLister interface {
	ListTokens(ctx context.Context) ([]store.TokenInfo, error)
}

// RevocationPolicy is the kick.Policy compass-callout sweeps with: the
// clusters, deny lists and key sets of v (nil: no cluster registered) and the
// minted tokens of tokens (nil: no store), at now (nil: time.Now).
func RevocationPolicy(v *verifier.RunnerVerifier, tokens TokenLister, now func() time.Time) kick.Policy {
	if now == nil {
		now = time.Now
	}
	return revocationPolicy{v: v, tokens: tokens, now: now}
}

// revocationPolicy judges live Runner connections (kick.Policy).
type revocationPolicy struct {
	v      *verifier.RunnerVerifier // nil: no cluster registered
	tokens TokenLister              // nil: no store
	now    func() time.Time
	q      *Quarantine // nil: no quarantine
}

// Admitter reads the minted tokens once for the sweep. When the store cannot
// be read it still judges projected connections, leaves minted ones alone,
// and returns the error too, so the sweep is retried.
func (p revocationPolicy) Admitter(ctx context.Context) (kick.Admit, error) {
	now := p.now()
	// byID and liveIDs stay nil (minted connections not judged) without a
	// store, or when it cannot be read.
	var byID map[string]store.TokenInfo
	var liveIDs map[string]bool
	var storeErr error
	if p.tokens != nil {
		if list, err := p.tokens.ListTokens(ctx); err != nil {
			storeErr = fmt.Errorf("callout: minted tokens: %w", err)
		} else {
			byID = make(map[string]store.TokenInfo, len(list))
			liveIDs = map[string]bool{}
			for _, t := range list {
				byID[t.ID] = t
				if t.Kind == verifier.SubjectRunner && !t.Revoked() && !t.Expired(now) {
					liveIDs[t.SubjectID] = true
				}
			}
		}
	}
	return func(c kick.Conn, g *kick.Grant) error {
		if p.q != nil {
			if rec, ok := p.q.Quarantined(c.User); ok {
				return kick.Refuse(kick.ReasonQuarantined, quarantinedErr(rec))
			}
		}
		switch {
		case g != nil && g.Cluster != "":
			if err := p.node(g.Cluster, g.Node, g.NodeUID); err != nil {
				return err
			}
			if g.KeyID != "" && p.v != nil {
				if err := p.v.CheckKey(g.Cluster, g.KeyID); err != nil {
					return kick.Refuse(kick.ReasonKeyRemoved, err)
				}
			}
			if g.PodUID != "" && p.v != nil {
				// The cluster's pod watch (tokenReview.watchPods) saw the
				// token's pod go; only this replica's grant names the pod,
				// so another replica's connection of the same Runner ID
				// (the replacement pod's) is never judged by it.
				if err := p.v.CheckPod(g.Cluster, g.PodUID); err != nil {
					return kick.Refuse(kick.ReasonPodDeleted, err)
				}
			}
			return nil
		case g != nil && g.TokenID != "":
			if byID == nil {
				return nil // no store here: the user JWT's expiry bounds it
			}
			t, ok := byID[g.TokenID]
			switch {
			case !ok:
				return kick.Refuse(kick.ReasonTokenRevoked, fmt.Errorf("minted token %s is no longer in the store", g.TokenID))
			case t.Revoked():
				return kick.Refuse(kick.ReasonTokenRevoked, fmt.Errorf("minted token %s revoked", g.TokenID))
			case t.Expired(now):
				return kick.Refuse(kick.ReasonTokenExpired, fmt.Errorf("minted token %s expired", g.TokenID))
			}
			return nil
		}
		// Another replica's grant, or this one's before a restart: the Runner
		// ID names the cluster and node, not the node UID or the token.
		if cluster, node, ok := verifier.SplitWorkloadRunnerID(c.User); ok {
			return p.node(cluster, node, "")
		}
		if liveIDs != nil && !liveIDs[c.User] {
			return kick.Refuse(kick.ReasonTokenRevoked, errors.New("no live minted token for this Runner ID"))
		}
		return nil
	}, storeErr
}

func (p revocationPolicy) node(cluster, node, uid string) error {
	if p.v == nil {
		// No cluster file here (a store-only callout): another replica's
		// projected grants are not this one's to judge.
		return nil
	}
	err := p.v.CheckNode(cluster, node, uid)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, verifier.ErrNodeDenied):
		return kick.Refuse(kick.ReasonNodeDenied, err)
	case errors.Is(err, verifier.ErrClusterNotRegistered):
		return kick.Refuse(kick.ReasonClusterRemoved, err)
	}
	return kick.Refuse(kick.ReasonRefused, err)
}

// GrantOf is the kick.Grant of an authorized request's Event: what the
// kicker remembers of a connection this process authorized.
func GrantOf(ev Event) kick.Grant {
	return kick.Grant{
		RunnerID: ev.RunnerID, Cluster: ev.Cluster, Node: ev.NodeName, NodeUID: ev.NodeUID, PodUID: ev.PodUID, KeyID: ev.KeyID, TokenID: ev.TokenID,
		ServerID: ev.ServerID, CID: ev.ClientID, Addr: ev.ClientHost, Expiry: ev.UserJWTExpiry,
	}
}

// WatchRevocations reads the store every interval and asks k for a sweep
// when the set of revoked tokens changed (a revoke-token run by another
// process), until ctx ends. With q it also reads the quarantined Runner IDs
// (Quarantine.Refresh): one made by another replica is swept here within
// an interval, and one cleared is let connect again. k is nil without a
// kick identity (--no-kick): only q is refreshed.
func WatchRevocations(ctx context.Context, tokens TokenLister, interval time.Duration, k *kick.Kicker, q *Quarantine, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last string
	failing, qFailing := false, false
	for {
		if q != nil {
			switch err := q.Refresh(ctx); {
			case err != nil && ctx.Err() == nil:
				if !qFailing {
					log.Warn("callout: cannot read quarantined runner IDs; retrying", "error", err)
				}
				qFailing = true
			case err == nil:
				qFailing = false
			}
		}
		if k == nil {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				continue
			}
		}
		list, err := tokens.ListTokens(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				log.Warn("callout: cannot read minted tokens for revocations; retrying", "error", err)
			}
			failing = true
		case err == nil:
			failing = false
			var revoked []string
			for _, t := range list {
				if t.Revoked() {
					revoked = append(revoked, t.ID)
				}
			}
			slices.Sort(revoked)
			if cur := strings.Join(revoked, ","); cur != last {
				if last != "" || len(revoked) > 0 {
					k.Sweep("token_revoked")
				}
				last = cur
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// connectKick opens the kick identity's NATS connection. It does not wait
// for a server: until one is up, sweeps fail and are retried. It retries for
// ever, refused credentials included: once the kick identity's password or
// credentials are fixed, revocation resumes by itself.
func connectKick(cfg ServeConfig, nm *natsretry.Metrics, log *slog.Logger) (*nats.Conn, error) {
	w := nm.Watch("kick", natsretry.Config{Prefix: "callout: kick identity", Attrs: []any{"connection", "kick"}, Logger: log})
	opts := append([]nats.Option{nats.Name("compass-callout-kick")}, w.Options()...)
	switch {
	case cfg.KickCreds != "":
		opts = append(opts, nats.UserCredentials(cfg.KickCreds))
	case cfg.KickNkeyFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.KickNkeyFile)
		if err != nil {
			return nil, fmt.Errorf("callout: --kick-nkey: %w", err)
		}
		opts = append(opts, o)
	case cfg.KickUser != "":
		opts = append(opts, nats.UserInfo(cfg.KickUser, cfg.KickPassword))
	}
	if cfg.NATSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSCAFile))
	}
	urls := strings.Join(splitURLs(cfg.NATSURLs), ",")
	opts = append(opts, natsurl.TLSServerName(urls))
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		return nil, fmt.Errorf("callout: kick identity's NATS connection: %w", err)
	}
	w.Bind(nc)
	return nc, nil
}

// startKicker connects the kick identity and runs the kicker (and, with a
// store, the revocation watch) until ctx ends; wg tracks both. v and st may be
// nil (no clusters, no store).
func startKicker(ctx context.Context, cfg ServeConfig, r *Responder, v *verifier.RunnerVerifier, st store.Store, q *Quarantine,
	reg prometheus.Registerer, nm *natsretry.Metrics, log *slog.Logger, wg *sync.WaitGroup) (*kick.Kicker, error) {
	nc, err := connectKick(cfg, nm, log)
	if err != nil {
		return nil, err
	}
	account, _ := r.RunnerAccount()
	var tokens TokenLister
	if st != nil {
		tokens = st
	}
	pol := revocationPolicy{v: v, tokens: tokens, now: r.cfg.Now, q: q}
	if pol.now == nil {
		pol.now = time.Now
	}
	kcfg := kick.Config{
		Conn: nc, Account: account, Issuers: r.RunnerIssuers(), Policy: pol,
		Duplicates: cfg.Duplicates, DuplicateGrace: cfg.DuplicateGrace, SweepInterval: cfg.SweepInterval,
		ListInterval: cfg.ListInterval, Now: r.cfg.Now, Logger: log, Registerer: reg,
	}
	if q != nil {
		kcfg.Displaced = q
	}
	k, err := kick.New(kcfg)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("callout: %w", err)
	}
	if q != nil {
		q.SetSweeper(k)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer nc.Close()
		k.Run(ctx)
	}()
	if st != nil {
		startWatch(ctx, cfg, st, k, q, log, wg)
	}
	return k, nil
}

// startWatch runs WatchRevocations until ctx ends; wg tracks it.
func startWatch(ctx context.Context, cfg ServeConfig, st store.Store, k *kick.Kicker, q *Quarantine, log *slog.Logger, wg *sync.WaitGroup) {
	poll := cfg.RevocationPoll
	if poll == 0 {
		poll = DefaultRevocationPoll
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		WatchRevocations(ctx, st, poll, k, q, log)
	}()
}
