package callout

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/clusterfile"
	"github.com/compass-runner/identity/verifier/keymetrics"
)

// Serve runs compass-callout until ctx ends, then drains: no new requests
// are taken, queued ones are answered, and it returns.
func Serve(ctx context.Context, cfg ServeConfig) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if u := cfg.plaintextNATSURL(); u != "" { // Check passed: AllowPlaintextNATS is set
		log.Warn("callout: --allow-plaintext-nats: NATS requests are neither TLS nor sealed (no --xkey-seed-file): every Runner's token crosses the network in clear text", "nats_url", u)
	}
	started := time.Now()
	if cfg.Connections == 0 {
		cfg.Connections = DefaultConnections
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}

	// The kicker exists once NATS is connected; a cluster file applied
	// before then is swept by its first sweep.
	var kicker atomic.Pointer[kick.Kicker]
	sweep := func(cause string) {
		if k := kicker.Load(); k != nil {
			k.Sweep(cause)
		}
	}
	// A pod gone concerns only the grants naming it, which are this
	// process's: no listing of the account (issue 35).
	sweepGrants := func(cause string) {
		if k := kicker.Load(); k != nil {
			k.SweepGrants(cause)
		}
	}
	resolver, clusters, st, closeStore, err := openResolver(ctx, cfg, log, func() { sweep("cluster_file") }, func(string) { sweepGrants("pod_deleted") })
	if err != nil {
		return err
	}
	defer closeStore()
	var v *verifier.RunnerVerifier
	if clusters != nil {
		v = clusters.Verifier()
		v.Start(ctx)
		go clusters.Run(ctx)
	}
	ccfg, err := responderConfig(cfg, resolver, log)
	if err != nil {
		return err
	}

	// Metrics and health.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var status func() []verifier.ClusterStatus
	var cacheStats func() (hits, misses uint64)
	if v != nil {
		status, cacheStats = v.Status, v.CacheStats
	}
	if err := keymetrics.Register(reg, "compass-callout", keymetrics.New(status, started, nil).WithCacheStats(cacheStats)); err != nil {
		return fmt.Errorf("callout: metrics: %w", err)
	}
	if clusters != nil {
		if err := reg.Register(clusters); err != nil {
			return fmt.Errorf("callout: metrics: %w", err)
		}
	}
	var responder atomic.Pointer[Responder]
	metrics, err := NewMetrics(reg, func() int64 {
		if r := responder.Load(); r != nil {
			return r.InFlight()
		}
		return 0
	}, func() time.Duration {
		if r := responder.Load(); r != nil {
			return r.NATSLag()
		}
		return 0
	})
	if err != nil {
		return fmt.Errorf("callout: metrics: %w", err)
	}
	q, closeWriter, err := openQuarantine(ctx, cfg, st, reg, log)
	if err != nil {
		return err
	}
	defer closeWriter()
	ccfg.Quarantine = q
	ccfg.Observe = func(ev Event) {
		metrics.Observe(ev)
		if ev.Outcome == OutcomeAuthorized {
			if k := kicker.Load(); k != nil {
				k.Authorized(GrantOf(ev))
			}
		}
	}
	r, err := New(ccfg)
	if err != nil {
		return err
	}
	responder.Store(r)
	metrics.HoldKeys(r.HeldKeys())

	// Health first: /healthz answers while the callout waits for NATS.
	health := &readiness{clusters: v, store: st}
	srv, metricsAddr, err := serveHealth(cfg.MetricsAddr, reg, health.Check, log)
	if err != nil {
		return err
	}
	if srv != nil {
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.DrainTimeout)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}

	nm, err := natsretry.NewMetrics(reg, "compass_callout_nats", "the callout", true)
	if err != nil {
		return fmt.Errorf("callout: metrics: %w", err)
	}
	conns, err := connect(ctx, cfg, nm, log)
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	if err != nil {
		return err
	}
	health.conns.Store(&conns)

	// The kicker and the revocation watch stop before Serve returns, on
	// any path.
	var background sync.WaitGroup
	defer background.Wait()
	bctx, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	// Before the first answer: a restarted callout refuses a quarantined ID
	// from its first connect on.
	if err := q.Refresh(ctx); err != nil {
		log.Warn("callout: cannot read quarantined runner IDs; retrying every --revocation-poll", "error", err)
	}
	if !cfg.NoKick {
		k, err := startKicker(bctx, cfg, r, v, st, q, reg, nm, log, &background)
		if err != nil {
			return err
		}
		kicker.Store(k)
	} else {
		log.Warn("callout: --no-kick: a denied node, a removed cluster or a revoked token keeps its live NATS connections until their user JWTs expire",
			"max_user_jwt_lifetime", ccfg.MaxLifetime)
		if st != nil {
			startWatch(bctx, cfg, st, nil, q, log, &background)
		}
	}

	if err := r.Start(ctx, conns...); err != nil {
		return err
	}
	health.subscribed.Store(true)
	var names string
	if v != nil {
		names = strings.Join(v.Clusters(), ",")
	}
	log.Info("compass-callout answering", "mode", ccfg.Mode.String(), "connections", len(conns), "workers", ccfg.Workers,
		"xkey", ccfg.XKey != nil, "keys", keyList(r.HeldKeys()), "clusters", names, "minted_tokens", cfg.DatabaseURL != "",
		"max_user_jwt_lifetime", ccfg.MaxLifetime, "answer_horizon", r.cfg.AnswerHorizon, "metrics_addr", metricsAddr,
		"quarantine_after", quarantineAfter(q), "quarantine_window", quarantineWindow(q))
	if cfg.Ready != nil {
		cfg.Ready(metricsAddr)
	}

	<-ctx.Done()
	health.subscribed.Store(false)
	log.Info("compass-callout draining")
	var drainErr error
	select {
	case <-r.Done():
	case <-time.After(cfg.DrainTimeout):
		drainErr = fmt.Errorf("callout: drain: %d requests still in flight after %s", r.InFlight(), cfg.DrainTimeout)
	}
	log.Info("compass-callout stopped")
	return drainErr
}

// openQuarantine opens the quarantine and, when this replica counts
// displacements, its writer: a second handle on the store that may write
// runner_quarantine alone (DL-459). Without a store it quarantines and
// refuses nothing, and its metrics stay at zero. closeWriter is never nil.
func openQuarantine(ctx context.Context, cfg ServeConfig, st store.Store, reg prometheus.Registerer, log *slog.Logger) (_ *Quarantine, closeWriter func(), _ error) {
	closeWriter = func() {}
	counts := cfg.QuarantineAfter > 0 && !cfg.NoKick && cfg.Duplicates == kick.DuplicatesKickOlder
	qc := QuarantineConfig{Logger: log, Registerer: reg}
	if st == nil && counts {
		log.Info("callout: no --database-url: duplicates are kicked but never quarantined (the count needs the shared store)")
	}
	if st != nil {
		qc.Store = st
	}
	if st != nil && counts {
		w, err := store.OpenQuarantineWriter(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, closeWriter, fmt.Errorf("callout: --database-url: the quarantine's writer: %w", err)
		}
		closeWriter = func() { _ = w.Close() }
		window := cfg.QuarantineWindow
		if window == 0 {
			window = DefaultQuarantineWindow
		}
		qc.Writer, qc.Policy = w, store.QuarantinePolicy{After: cfg.QuarantineAfter, Window: window}
	}
	q, err := NewQuarantine(qc)
	if err != nil {
		closeWriter()
		return nil, func() {}, err
	}
	return q, closeWriter, nil
}

// quarantineAfter and quarantineWindow are q's policy for the start-up log:
// 0 when this replica counts no displacement.
func quarantineAfter(q *Quarantine) int {
	if q.cfg.Writer == nil {
		return 0
	}
	return q.cfg.Policy.After
}

func quarantineWindow(q *Quarantine) time.Duration {
	if q.cfg.Writer == nil {
		return 0
	}
	return q.cfg.Policy.Window
}

// keyList shows the public keys the responder holds, current first, for the
// start-up log: during a rotation it says that both generations are held.
func keyList(held map[string][]string) string {
	var parts []string
	for _, role := range []string{KeyRoleXKey, KeyRoleIssuer, KeyRoleUserSigner} {
		if ks := held[role]; len(ks) > 0 {
			parts = append(parts, role+"="+strings.Join(ks, "+"))
		}
	}
	return strings.Join(parts, " ")
}

// openResolver opens the store, then the cluster registry (verifier/clusterfile:
// the cluster file read, the start-up guard both daemons share, and the
// verifier, not yet started). reg is nil without --runner-clusters, st
// without --database-url; closeStore is never nil.
// onPodGone is told of each pod a cluster's pod watch saw go.
func openResolver(ctx context.Context, cfg ServeConfig, log *slog.Logger, onApply func(), onPodGone func(cluster string)) (_ *verifier.Resolver, _ *clusterfile.Registry, st store.Store, closeStore func(), _ error) {
	closeStore = func() {}
	var tokens verifier.TokenStore
	var slash verifier.SlashIDCounter
	if cfg.DatabaseURL != "" {
		// The callout reads the store and never migrates it: compass-server
		// migrate does, before callouts are rolled (docs/store.md). Nor does
		// it serve a restored backup that compass-server restore has not
		// reconciled: the tokens revoked after the backup would be live.
		var err error
		if st, err = store.OpenServing(ctx, cfg.DatabaseURL, store.ReadOnly()); err != nil {
			return nil, nil, nil, closeStore, fmt.Errorf("callout: --database-url: %w", err)
		}
		closeStore = func() { _ = st.Close() }
		tokens, slash = st, st
	}
	if cfg.RunnerClusters == "" {
		return verifier.NewResolver(nil, tokens), nil, st, closeStore, nil
	}
	// The tenant is not read by the callout: Runners are shared across tenants.
	opts := []verifier.Option{verifier.WithLogger(log), verifier.WithPodGone(onPodGone)}
	if cfg.LoadHook != nil {
		opts = append(opts, verifier.WithLoadHook(cfg.LoadHook))
	}
	reg, err := clusterfile.Open(ctx, clusterfile.Config{
		Path: cfg.RunnerClusters, Store: slash, Options: opts, Logger: log,
		PollInterval: cfg.ClusterFilePoll, Signals: cfg.ReloadSignals, OnApply: onApply,
	})
	if err != nil {
		return nil, nil, st, closeStore, fmt.Errorf("callout: --runner-clusters: %w", err)
	}
	return verifier.NewResolver(reg.Verifier(), tokens), reg, st, closeStore, nil
}

// responderConfig reads the NATS-side keys.
func responderConfig(cfg ServeConfig, resolver Resolver, log *slog.Logger) (Config, error) {
	c := Config{Resolver: resolver, MaxLifetime: cfg.MaxUserLifetime, AnswerHorizon: cfg.AnswerHorizon,
		Workers: cfg.Workers, Logger: log, Mode: cfg.Mode, Account: cfg.Account}
	var err error
	if c.ResponseSigner, err = ReadSigner(cfg.IssuerSeedFile, nkeys.PrefixByteAccount); err != nil {
		return c, fmt.Errorf("callout: --issuer-seed-file: %w", err)
	}
	if cfg.XKeySeedFile != "" {
		if c.XKey, err = ReadXKey(cfg.XKeySeedFile); err != nil {
			return c, fmt.Errorf("callout: --xkey-seed-file: %w", err)
		}
	}
	if cfg.Mode == ModeOperator {
		c.CalloutAccount = cfg.CalloutAccount
		if c.UserSigner, err = ReadSigner(cfg.UserSeedFile, nkeys.PrefixByteAccount); err != nil {
			return c, fmt.Errorf("callout: --user-signing-seed-file: %w", err)
		}
	}
	if cfg.NextXKeySeedFile != "" || cfg.NextIssuerSeedFile != "" || cfg.NextUserSeedFile != "" {
		n := &NextKeys{}
		if cfg.NextXKeySeedFile != "" {
			if n.XKey, err = ReadXKey(cfg.NextXKeySeedFile); err != nil {
				return c, fmt.Errorf("callout: --next-xkey-seed-file: %w", err)
			}
		}
		if cfg.NextIssuerSeedFile != "" {
			if n.ResponseSigner, err = ReadSigner(cfg.NextIssuerSeedFile, nkeys.PrefixByteAccount); err != nil {
				return c, fmt.Errorf("callout: --next-issuer-seed-file: %w", err)
			}
		}
		if cfg.NextUserSeedFile != "" {
			if n.UserSigner, err = ReadSigner(cfg.NextUserSeedFile, nkeys.PrefixByteAccount); err != nil {
				return c, fmt.Errorf("callout: --next-user-signing-seed-file: %w", err)
			}
		}
		c.Next = n
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = DefaultMaxLifetime
	}
	return c, nil
}
