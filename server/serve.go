// Package server is the Compass Server: Serve runs the door over TLS (with
// certificate reload), the store (OpenStore and the rules of who migrates),
// the NATS connection with last_seen from Runner events, and health.
// compass-server's command line is internal/wiring/commands.Server; its dev stack,
// which runs Serve beside an embedded nats-server, is internal/wiring/devstack.
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/compass-runner/identity/door"
	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/clusterfile"
	"github.com/compass-runner/identity/verifier/keymetrics"
)

// DefaultDataDir is where the SQLite database (and dev mode's files) live
// when no --database-url names another database.
const DefaultDataDir = ".data"

// ErrSlashRunnerTokens is verifier.ErrReservedRunnerIDs, which Serve
// returns when it refuses to start.
var ErrSlashRunnerTokens = verifier.ErrReservedRunnerIDs

// ServeConfig configures Serve.
type ServeConfig struct {
	Listen         string // door address
	TLSCert        string // PEM certificate chain file
	TLSKey         string // PEM private key file
	TLSConfig      *tls.Config
	RunnerClusters string // cluster file; empty: Clusters (none: no cluster is trusted)
	Clusters       []verifier.RunnerCluster
	DatabaseURL    string // empty: SQLite in DataDir
	DataDir        string
	// MigrateOnStart migrates an SQLite database behind this binary before
	// serving. dev only: its database is throwaway. serve never does
	// (docs/store.md: back up, migrate deliberately, never as a side effect).
	MigrateOnStart bool
	NATS           NATSConfig // URL empty: no NATS (PingRunner answers Unavailable, no last_seen)
	RunnerNATSURL  string     // what Enroll tells Runners (default NATS.URL)
	MetricsAddr    string     // /metrics, /healthz, /readyz; empty: none
	// ServerVersion is what Enroll tells Runners (server_version): the
	// binary's build version, which the command line reads from the link
	// (cli.BuildInfo). Empty: "(devel)", never a made-up release.
	ServerVersion string
	// ClusterFilePoll is how often the cluster file is checked for a change
	// (0: clusterfile.DefaultPollInterval). ReloadSignals, for tests,
	// replaces SIGHUP as the forced reload.
	ClusterFilePoll time.Duration
	ReloadSignals   <-chan os.Signal

	Logger *slog.Logger
	Now    func() time.Time
	// HTTPClient is the transport for JWKS fetches (nil: the default).
	HTTPClient *http.Client
	// Ready, if set, is called once the door listens. An error stops the
	// Server and is returned by Serve.
	Ready func(ctx context.Context, info ServeInfo) error
}

// ServeInfo is what a running Server tells Ready.
type ServeInfo struct {
	DoorAddr    string
	MetricsAddr string
	Verifier    *verifier.RunnerVerifier
	Resolver    *verifier.Resolver
	Store       store.Store
}

// Serve runs the Server until ctx ends, then shuts down gracefully.
func Serve(ctx context.Context, cfg ServeConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	started := cfg.Now()
	runnerNATS := cfg.RunnerNATSURL
	if runnerNATS == "" {
		runnerNATS = cfg.NATS.URL
	}
	// Runners send their token in CONNECT: never tell them to do that in
	// clear text across a network (the Runner refuses such a URL too).
	if err := natsurl.CheckSealed(runnerNATS); err != nil {
		return fmt.Errorf("server: the NATS URL Enroll tells Runners (--runner-nats-url, default --nats-url): %w", err)
	}
	// Every enrolling Runner learns this URL: never credentials with it. A
	// Runner authenticates with its own token; --nats-url's user part is the
	// Server's own NATS user (or token).
	stripped, hadUser := natsurl.StripUser(runnerNATS)
	if hadUser && cfg.RunnerNATSURL != "" {
		return errors.New("server: --runner-nats-url carries credentials (a user part before @), which Enroll would hand to every Runner: give it without them; Runners authenticate with their own token")
	}
	runnerNATS = stripped
	tlsConfig := cfg.TLSConfig
	if tlsConfig == nil {
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return errors.New("server: the door is TLS only: --tls-cert and --tls-key are required")
		}
		cr, err := newCertReloader(cfg.TLSCert, cfg.TLSKey, cfg.Now, log)
		if err != nil {
			return err
		}
		tlsConfig = &tls.Config{GetCertificate: cr.GetCertificate, MinVersion: tls.VersionTLS12}
	}
	st, err := openServeStore(ctx, cfg.DatabaseURL, cfg.DataDir, cfg.MigrateOnStart, log)
	if err != nil {
		return err
	}
	defer st.Close()
	tenant, err := st.BootstrapTenant(ctx)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	// The cluster file, the start-up guard on minted IDs with "/" and the
	// reloads: the same code as compass-callout's (verifier/clusterfile).
	clusters, err := clusterfile.Open(ctx, clusterfile.Config{
		Path: cfg.RunnerClusters, Clusters: cfg.Clusters, Store: st, Tenant: tenant,
		HTTPClient: cfg.HTTPClient, Now: cfg.Now, Options: []verifier.Option{verifier.WithLogger(log)},
		Logger: log, PollInterval: cfg.ClusterFilePoll, Signals: cfg.ReloadSignals,
	})
	if err != nil {
		if cfg.RunnerClusters != "" {
			return fmt.Errorf("server: --runner-clusters: %w", err)
		}
		return fmt.Errorf("server: %w", err)
	}
	v := clusters.Verifier()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v.Start(ctx)
	go clusters.Run(ctx)
	log.Info("server: runner clusters", "clusters", v.Clusters(), "store", st.Backend())

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := keymetrics.Register(reg, "compass-server", keymetrics.New(v.Status, started, cfg.Now).WithCacheStats(v.CacheStats)); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	if err := reg.Register(clusters); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	if err := reg.Register(newRunnerCounts(ctx, st.ListRunners, cfg.Now, log)); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}

	var nc *nats.Conn
	var requester door.Requester
	if cfg.NATS.URL != "" {
		if cfg.NATS.Name == "" {
			cfg.NATS.Name = "compass-server"
		}
		nm, err := natsretry.NewMetrics(reg, "compass_server_nats", "the Server", false)
		if err != nil {
			return fmt.Errorf("server: metrics: %w", err)
		}
		natsClosed := make(chan struct{})
		nc, err = connectNATS(cfg.NATS, nm, log, natsClosed)
		if err != nil {
			return err
		}
		defer func() {
			// Drain: in-flight event handlers finish before the store closes.
			if err := nc.Drain(); err != nil {
				nc.Close()
			}
			select {
			case <-natsClosed:
			case <-time.After(natsDrainTimeout + time.Second):
				log.Warn("server: nats drain did not finish", "timeout", natsDrainTimeout)
				nc.Close()
			}
		}()
		requester = door.NATSRequester{Conn: nc}
		if err := NewLastSeen(st, cfg.Now, log).Subscribe(ctx, nc); err != nil {
			return err
		}
	} else {
		log.Warn("server: no --nats-url: ping-runner answers Unavailable and last_seen is not kept")
	}
	resolver := verifier.NewResolver(v, st)
	// One readiness for /readyz and the door's grpc.health.v1: the door's
	// parts only. NATS is reported apart (a metric, a /healthz line).
	ready := newReadiness(st, tlsConfig, cfg.Now, log)
	nh := natsHealth{nc: nc}
	if err := nh.register(reg); err != nil {
		return err
	}
	h, err := door.NewHandler(door.Config{
		Resolver: resolver, Enroller: st, Runners: st, Quarantines: st, Requester: requester,
		NATSURL: runnerNATS, ServerVersion: cmp.Or(cfg.ServerVersion, "(devel)"), Logger: log, Metrics: reg, Now: cfg.Now,
		Ready: ready.Check,
	})
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("server: listen: %w", err)
	}
	info := ServeInfo{DoorAddr: ln.Addr().String(), Verifier: v, Resolver: resolver, Store: st}
	g, gctx := errgroup.WithContext(ctx)
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("server: metrics listen: %w", err)
		}
		info.MetricsAddr = mln.Addr().String()
		g.Go(func() error { return serveMetrics(gctx, mln, reg, ready.Check, nh) })
	}
	srv := door.NewServer(h, tlsConfig, log)
	g.Go(func() error { return door.ServeTLS(gctx, srv, ln) })
	log.Info("server: door listening (TLS)", "addr", info.DoorAddr, "metrics", info.MetricsAddr, "nats", natsurl.Redact(cfg.NATS.URL))
	if cfg.Ready != nil {
		g.Go(func() error {
			if err := cfg.Ready(gctx, info); err != nil {
				return fmt.Errorf("server: %w", err)
			}
			return nil
		})
	}
	err = g.Wait()
	log.Info("server: stopped")
	return err
}

// metricsReadTimeout bounds a metrics scrape's request.
const metricsReadTimeout = 10 * time.Second

// serveMetrics serves /metrics, /healthz and /readyz on ln until ctx ends.
func serveMetrics(ctx context.Context, ln net.Listener, reg *prometheus.Registry, ready func(context.Context) error, nh natsHealth) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	handleHealth(mux, ready, nh)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("server: metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), door.ShutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}
