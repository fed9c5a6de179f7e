// Command compass-callout is the NATS auth-callout service of Compass (DL-316):
// a Runner connects to NATS with nothing but its token and gets a user JWT that
// lets it touch only its own subjects.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/flagenv"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

const help = `Usage: compass-callout [flags]

Answers the NATS server's authorization requests ($SYS.REQ.USER.AUTH). For
each CONNECT it takes the client's auth_token, verifies it with the shared
Compass verifier (a Kubernetes projected token against the registered
clusters' keys, or a minted Runner token from the database) and answers with a
user JWT for the Runner's account: named after the Runner ID, allowed only the
Runner's own subjects, expiring no later than the token (and at most
--max-user-jwt-lifetime). Anything else is answered "not authorized", or
"runner cluster keys unavailable" when a registered cluster's keys cannot be
used; the cause is logged with the cluster name, never the token.

Two NATS auth modes (see docs/callout.md and deploy/nats/):
  --mode server-config  authorization { auth_callout { issuer, auth_users,
                        account, xkey } }: --issuer-seed-file is the issuer
                        account seed, --account the Runners' account name.
  --mode operator       the callout account JWT carries authorization
                        { auth_users, allowed_accounts, xkey }: --issuer-seed-file
                        is the callout account seed or one of its signing
                        keys (then --callout-account is the account),
                        --user-signing-seed-file the Runners' account seed or a
                        signing key of it, --account that account's public key.

With --xkey-seed-file every request must be sealed to that key and answers are
sealed to the server; without it sealed requests are refused. Replicas share
the load as one queue group; --connections spreads one replica's answers over
several connections (the server handles each answer on the read loop of the
connection it came from). SIGTERM drains: no new requests are taken, queued
ones are answered, then it exits.

Secrets are read from files, never from flags. Every flag not given falls back
to its environment variable.
`

// config is everything main parses; run acts on it.
type config struct {
	NATSURLs        string
	NATSCreds       string
	NATSNkey        string
	NATSUser        string
	NATSPassword    string // COMPASS_NATS_PASSWORD only
	NATSPassFile    string
	NATSCAFile      string
	Mode            string
	IssuerSeedFile  string
	CalloutAccount  string
	UserSeedFile    string
	Account         string
	XKeySeedFile    string
	RunnerClusters  string
	DatabaseURL     string // COMPASS_DATABASE_URL as well; it may hold a password
	MaxUserLifetime time.Duration
	Connections     int
	Workers         int
	MetricsAddr     string
	LogLevel        string
	DrainTimeout    time.Duration
}

// envOf maps each flag to its environment variable.
var envOf = map[string]string{
	"nats-url":               "COMPASS_NATS_URL",
	"nats-creds":             "COMPASS_NATS_CREDS",
	"nats-nkey":              "COMPASS_NATS_NKEY",
	"nats-user":              "COMPASS_NATS_USER",
	"nats-password-file":     "COMPASS_NATS_PASSWORD_FILE",
	"nats-ca-file":           "COMPASS_NATS_CA_FILE",
	"mode":                   "COMPASS_AUTH_MODE",
	"issuer-seed-file":       "COMPASS_ISSUER_SEED_FILE",
	"callout-account":        "COMPASS_CALLOUT_ACCOUNT",
	"user-signing-seed-file": "COMPASS_USER_SIGNING_SEED_FILE",
	"account":                "COMPASS_ACCOUNT",
	"xkey-seed-file":         "COMPASS_XKEY_SEED_FILE",
	"runner-clusters":        "COMPASS_RUNNER_CLUSTERS",
	"database-url":           "COMPASS_DATABASE_URL",
	"max-user-jwt-lifetime":  "COMPASS_CALLOUT_MAX_USER_JWT_LIFETIME",
	"connections":            "COMPASS_CALLOUT_CONNECTIONS",
	"workers":                "COMPASS_CALLOUT_WORKERS",
	"metrics-addr":           "COMPASS_METRICS_ADDR",
	"log-level":              "COMPASS_LOG_LEVEL",
	"drain-timeout":          "COMPASS_DRAIN_TIMEOUT",
}

// Defaults, each with its reason.
const (
	// defaultConnections: enough to spread the server's answer handling over
	// the read loops of a small server; more add little on two cores.
	defaultConnections = 4
	// maxConnections bounds --connections: each is a NATS client connection.
	maxConnections = 64
	// defaultDrainTimeout bounds a SIGTERM drain: longer than any queued
	// request's expiry (the server's auth timeout, 2 s by default).
	defaultDrainTimeout = 10 * time.Second
)

var errHelp = flag.ErrHelp

// parseConfig reads flags, then COMPASS_* variables for the flags not given.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("compass-callout", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.NATSURLs, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated")
	fs.StringVar(&c.NATSCreds, "nats-creds", "", "credentials file of the callout user (operator mode: a user of the callout account listed in auth_users)")
	fs.StringVar(&c.NATSNkey, "nats-nkey", "", "nkey seed file of the callout user (server-config mode, an nkey user in auth_users)")
	fs.StringVar(&c.NATSUser, "nats-user", "", "user name of the callout user (server-config mode), with --nats-password-file\nor COMPASS_NATS_PASSWORD")
	fs.StringVar(&c.NATSPassFile, "nats-password-file", "", "file holding the password of --nats-user")
	fs.StringVar(&c.NATSCAFile, "nats-ca-file", "", "PEM CA for a tls:// NATS server (default: system roots)")
	fs.StringVar(&c.Mode, "mode", "server-config", "NATS auth mode: server-config or operator")
	fs.StringVar(&c.IssuerSeedFile, "issuer-seed-file", "", "account seed that signs answers (server-config: the auth_callout issuer, which also signs\nuser JWTs; operator: the callout account or one of its signing keys)")
	fs.StringVar(&c.CalloutAccount, "callout-account", "", "operator mode: the callout account's public key, when --issuer-seed-file is a signing key of it")
	fs.StringVar(&c.UserSeedFile, "user-signing-seed-file", "", "operator mode: seed of the Runners' account or of one of its signing keys")
	fs.StringVar(&c.Account, "account", "", "the Runners' account: its name (server-config mode) or public key (operator mode;\ndefault: the key of --user-signing-seed-file)")
	fs.StringVar(&c.XKeySeedFile, "xkey-seed-file", "", "curve (xkey) seed whose public key is the server's xkey setting; requests must then be sealed")
	fs.StringVar(&c.RunnerClusters, "runner-clusters", "", "cluster file (DL-440): the Kubernetes clusters whose projected tokens are accepted")
	fs.StringVar(&c.DatabaseURL, "database-url", "", "store with minted Runner tokens (postgres://..., sqlite:...); without it only projected tokens are accepted")
	fs.DurationVar(&c.MaxUserLifetime, "max-user-jwt-lifetime", callout.DefaultMaxLifetime, "cap on a user JWT's lifetime; it never outlives the token either")
	fs.IntVar(&c.Connections, "connections", defaultConnections, "NATS connections to answer on (one queue group)")
	fs.IntVar(&c.Workers, "workers", 4*runtime.GOMAXPROCS(0), "requests handled at once")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":9090", "address for /metrics, /healthz and /readyz (empty disables)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", defaultDrainTimeout, "longest a SIGTERM drain waits for queued requests")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(fs, stderr)
			return c, errHelp
		}
		return c, fmt.Errorf("compass-callout: %w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("compass-callout: unexpected argument %q (see --help)", fs.Arg(0))
	}
	if err := flagenv.Apply(fs, envOf, getenv); err != nil {
		return c, fmt.Errorf("compass-callout: %w", err)
	}
	c.NATSPassword = getenv("COMPASS_NATS_PASSWORD")
	if c.NATSPassFile != "" {
		if c.NATSPassword != "" {
			return c, errors.New("compass-callout: set --nats-password-file or COMPASS_NATS_PASSWORD, not both")
		}
		b, err := os.ReadFile(c.NATSPassFile)
		if err != nil {
			return c, fmt.Errorf("compass-callout: --nats-password-file: %w", err)
		}
		c.NATSPassword = strings.TrimRight(string(b), "\r\n")
	}
	return c, c.check()
}

func (c config) check() error {
	creds := 0
	for _, s := range []string{c.NATSCreds, c.NATSNkey, c.NATSUser} {
		if s != "" {
			creds++
		}
	}
	switch {
	case creds > 1:
		return errors.New("compass-callout: set one of --nats-creds, --nats-nkey and --nats-user")
	case c.NATSUser != "" && c.NATSPassword == "":
		return errors.New("compass-callout: --nats-user needs --nats-password-file or COMPASS_NATS_PASSWORD")
	case c.IssuerSeedFile == "":
		return errors.New("compass-callout: --issuer-seed-file is required")
	case c.Mode != "server-config" && c.Mode != "operator":
		return fmt.Errorf("compass-callout: --mode %q: want server-config or operator", c.Mode)
	case c.Mode == "server-config" && c.Account == "":
		return errors.New("compass-callout: --account (the Runners' account name) is required in server-config mode")
	case c.Mode == "operator" && c.UserSeedFile == "":
		return errors.New("compass-callout: --user-signing-seed-file is required in operator mode")
	case c.Mode == "server-config" && (c.UserSeedFile != "" || c.CalloutAccount != ""):
		return errors.New("compass-callout: --user-signing-seed-file and --callout-account are operator-mode flags")
	case c.Connections < 1 || c.Connections > maxConnections:
		return fmt.Errorf("compass-callout: --connections %d: want 1 to %d", c.Connections, maxConnections)
	case c.Workers < 1:
		return fmt.Errorf("compass-callout: --workers %d: want at least 1", c.Workers)
	case c.RunnerClusters == "" && c.DatabaseURL == "":
		return errors.New("compass-callout: nothing to accept: set --runner-clusters, --database-url or both")
	}
	return nil
}

func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, help)
	fmt.Fprintln(w, "\nFlags:")
	flagenv.PrintFlags(w, fs, func(name string) string { return envOf[name] })
	fmt.Fprintln(w, "\nEnvironment only:\n  COMPASS_NATS_PASSWORD  password of --nats-user")
}

// hooks lets tests observe run; main passes the zero value.
type hooks struct {
	// ready is called with the metrics listener's address once the responder
	// answers requests.
	ready func(metricsAddr string)
}

// run starts the callout and serves until ctx ends, then drains.
func run(ctx context.Context, cfg config, log *slog.Logger, h hooks) error {
	// Keys and the resolver.
	var clusters []verifier.RunnerCluster
	if cfg.RunnerClusters != "" {
		var err error
		if clusters, err = verifier.ReadClusterFile(cfg.RunnerClusters); err != nil {
			return fmt.Errorf("compass-callout: --runner-clusters: %w", err)
		}
	}
	var tokens verifier.TokenStore
	if cfg.DatabaseURL != "" {
		st, err := store.Open(ctx, cfg.DatabaseURL)
		if err != nil {
			return fmt.Errorf("compass-callout: --database-url: %w", err)
		}
		defer st.Close()
		// The same start-up guard as compass-server's: with clusters
		// registered, no live minted Runner ID may contain "/".
		if err := verifier.CheckReservedRunnerIDs(ctx, st, len(clusters)); err != nil {
			return fmt.Errorf("compass-callout: %w", err)
		}
		tokens = st
	}
	var v *verifier.RunnerVerifier
	if cfg.RunnerClusters != "" {
		var err error
		// The tenant is not read by the callout: Runners are shared across tenants.
		if v, err = verifier.NewRunnerVerifier(clusters, "", nil, nil, verifier.WithLogger(log)); err != nil {
			return fmt.Errorf("compass-callout: %w", err)
		}
		v.Start(ctx)
	}
	resolver := verifier.NewResolver(v, tokens)

	// Keys of the NATS side.
	ccfg := callout.Config{Resolver: resolver, MaxLifetime: cfg.MaxUserLifetime, Workers: cfg.Workers, Logger: log}
	var err error
	if ccfg.ResponseSigner, err = callout.ReadSigner(cfg.IssuerSeedFile, nkeys.PrefixByteAccount); err != nil {
		return fmt.Errorf("compass-callout: --issuer-seed-file: %w", err)
	}
	if cfg.XKeySeedFile != "" {
		if ccfg.XKey, err = callout.ReadXKey(cfg.XKeySeedFile); err != nil {
			return fmt.Errorf("compass-callout: --xkey-seed-file: %w", err)
		}
	}
	switch cfg.Mode {
	case "server-config":
		ccfg.Mode, ccfg.Account = callout.ModeServerConfig, cfg.Account
	case "operator":
		ccfg.Mode, ccfg.Account, ccfg.CalloutAccount = callout.ModeOperator, cfg.Account, cfg.CalloutAccount
		if ccfg.UserSigner, err = callout.ReadSigner(cfg.UserSeedFile, nkeys.PrefixByteAccount); err != nil {
			return fmt.Errorf("compass-callout: --user-signing-seed-file: %w", err)
		}
	}

	// Metrics and health.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var responder atomic.Pointer[callout.Responder]
	var status func() []verifier.ClusterStatus
	if v != nil {
		status = v.Status
	}
	metrics, err := callout.NewMetrics(reg, func() int64 {
		if r := responder.Load(); r != nil {
			return r.InFlight()
		}
		return 0
	}, status, nil)
	if err != nil {
		return fmt.Errorf("compass-callout: metrics: %w", err)
	}
	ccfg.Observe = metrics.Observe
	r, err := callout.New(ccfg)
	if err != nil {
		return err
	}
	responder.Store(r)

	// NATS.
	opts := []nats.Option{
		nats.Name("compass-callout"),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Error("NATS error", "error", err) }),
	}
	switch {
	case cfg.NATSCreds != "":
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	case cfg.NATSNkey != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNkey)
		if err != nil {
			return fmt.Errorf("compass-callout: --nats-nkey: %w", err)
		}
		opts = append(opts, o)
	case cfg.NATSUser != "":
		opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	}
	if cfg.NATSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSCAFile))
	}
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for i := range cfg.Connections {
		nc, err := nats.Connect(cfg.NATSURLs, opts...)
		if err != nil {
			return fmt.Errorf("compass-callout: NATS connection %d: %w", i, err)
		}
		conns = append(conns, nc)
	}

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		// Ready: answering, and every NATS connection is up.
		if !ready.Load() {
			http.Error(w, "not subscribed", http.StatusServiceUnavailable)
			return
		}
		for _, nc := range conns {
			if !nc.IsConnected() {
				http.Error(w, "NATS connection down", http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	var srv *http.Server
	metricsAddr := ""
	if cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("compass-callout: --metrics-addr: %w", err)
		}
		metricsAddr = ln.Addr().String()
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "error", err)
			}
		}()
	}

	if err := r.Start(ctx, conns...); err != nil {
		return err
	}
	ready.Store(true)
	log.Info("compass-callout answering", "mode", ccfg.Mode.String(), "connections", len(conns), "workers", cfg.Workers,
		"xkey", ccfg.XKey != nil, "clusters", clusterNames(v), "minted_tokens", tokens != nil,
		"max_user_jwt_lifetime", cfg.MaxUserLifetime, "metrics_addr", metricsAddr)
	if h.ready != nil {
		h.ready(metricsAddr)
	}

	<-ctx.Done()
	ready.Store(false)
	log.Info("draining")
	drainErr := error(nil)
	select {
	case <-r.Done():
	case <-time.After(cfg.DrainTimeout):
		drainErr = fmt.Errorf("compass-callout: drain: %d requests still in flight after %s", r.InFlight(), cfg.DrainTimeout)
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.DrainTimeout)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}
	log.Info("stopped")
	return drainErr
}

func clusterNames(v *verifier.RunnerVerifier) string {
	if v == nil {
		return ""
	}
	return strings.Join(v.Clusters(), ",")
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("compass-callout: --log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, errHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	log, err := newLogger(cfg.LogLevel, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log, hooks{}); err != nil {
		log.Error("compass-callout failed", "error", err)
		os.Exit(1)
	}
}
