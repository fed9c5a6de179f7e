// Command compass-runner is the Compass Runner: it enrolls with the Server
// using its token (a projected ServiceAccount token file on Kubernetes, or a
// minted token), connects to NATS with the same token, and serves commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/compass-runner/identity/internal/flagenv"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/nats-io/nats.go"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

const help = `Usage: compass-runner [flags]

Runs a Compass Runner. It authenticates with one token everywhere:

  - on Kubernetes, the projected ServiceAccount token named by --token-file
    (audience compass-runner; the kubelet rotates it). The file is re-read on
    every call, so a rotation needs no restart; --runner-id is optional, as the
    Server assigns the ID from the token;
  - elsewhere, a minted Runner token in the COMPASS_RUNNER_TOKEN environment
    variable (never a flag: flags show in ps), with --runner-id.

The two are mutually exclusive. With --server the Runner enrolls over the
Server's door (gRPC over HTTPS) and learns its Runner ID and, unless
--nats-url is set, the NATS URL. It then connects to NATS with the same token,
serves commands (ping, info) on compass.runner.<id>.cmd and publishes a
heartbeat on compass.runner.<id>.evt.heartbeat. SIGTERM drains: no new
commands are taken, in-flight ones finish, then it exits.

Every flag not given falls back to its environment variable.
`

// config is everything main parses; run acts on it.
type config struct {
	Server      string
	CAFile      string
	TokenFile   string
	Token       string // COMPASS_RUNNER_TOKEN only
	RunnerID    string
	NATSURL     string
	NATSCAFile  string
	Mounts      []string
	HealthAddr  string
	Heartbeat   time.Duration
	NATSRefresh time.Duration
	LogLevel    string
	Hostname    string
}

type mountList []string

func (m *mountList) String() string { return strings.Join(*m, ",") }
func (m *mountList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*m = append(*m, s)
		}
	}
	return nil
}

// envOf maps each flag to its environment variable.
var envOf = map[string]string{
	"server":       "COMPASS_SERVER_URL",
	"ca-file":      "COMPASS_CA_FILE",
	"token-file":   "COMPASS_RUNNER_TOKEN_FILE",
	"runner-id":    "COMPASS_RUNNER_ID",
	"nats-url":     "COMPASS_NATS_URL",
	"nats-ca-file": "COMPASS_NATS_CA_FILE",
	"mount":        "COMPASS_MOUNTS",
	"health-addr":  "COMPASS_HEALTH_ADDR",
	"heartbeat":    "COMPASS_HEARTBEAT",
	"nats-refresh": "COMPASS_NATS_REFRESH",
	"log-level":    "COMPASS_LOG_LEVEL",
}

var errHelp = flag.ErrHelp

// parseConfig reads flags, then COMPASS_* variables for the flags not given.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	var mounts mountList
	fs := flag.NewFlagSet("compass-runner", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.Server, "server", "", "Server door URL, https://host:port (omit to run without enrolling: needs --runner-id and --nats-url)")
	fs.StringVar(&c.CAFile, "ca-file", "", "PEM CA that signed the Server's certificate (default: system roots)")
	fs.StringVar(&c.TokenFile, "token-file", "", "file holding the projected token, re-read on every call\n(exclusive with COMPASS_RUNNER_TOKEN)")
	fs.StringVar(&c.RunnerID, "runner-id", "", "Runner ID; optional with --token-file and --server (the Server assigns it)")
	fs.StringVar(&c.NATSURL, "nats-url", "", "NATS URL (default: the one the Server returns at enrollment)")
	fs.StringVar(&c.NATSCAFile, "nats-ca-file", "", "PEM CA for a tls:// NATS server (default: system roots)")
	fs.Var(&mounts, "mount", "host:guest path to share with workloads; repeatable, or comma-separated in the env.\nRefused when the host path is the token directory, inside it or an ancestor of it")
	fs.StringVar(&c.HealthAddr, "health-addr", runner.DefaultHealthAddr, "address for /healthz and /readyz (empty disables)")
	fs.DurationVar(&c.Heartbeat, "heartbeat", runner.DefaultHeartbeat, "heartbeat event period (0 disables)")
	fs.DurationVar(&c.NATSRefresh, "nats-refresh", 0, "reconnect to NATS with a fresh authorization this often; set it below the\ncallout's maximum user-JWT lifetime when that is shorter than the token's\n(0: when the token changes, and at the lifetime learned from the first expiry)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(fs, stderr)
			return c, errHelp
		}
		return c, fmt.Errorf("compass-runner: %w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("compass-runner: unexpected argument %q (see --help)", fs.Arg(0))
	}
	if err := flagenv.Apply(fs, envOf, getenv); err != nil {
		return c, fmt.Errorf("compass-runner: %w", err)
	}
	c.Mounts = mounts
	c.Token = getenv("COMPASS_RUNNER_TOKEN")
	return c, nil
}

func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, help)
	fmt.Fprintln(w, "\nFlags:")
	flagenv.PrintFlags(w, fs, func(name string) string { return envOf[name] })
	fmt.Fprintln(w, "\nEnvironment only:\n  COMPASS_RUNNER_TOKEN  a minted Runner token (exclusive with --token-file)")
}

// run builds the Runner from cfg and runs it until ctx ends.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	tokens, err := runner.NewTokenSource(cfg.Token, cfg.TokenFile, log, nil)
	if err != nil {
		return err
	}
	var mounts []runner.Mount
	for _, s := range cfg.Mounts {
		m, err := runner.ParseMount(s)
		if err != nil {
			return err
		}
		mounts = append(mounts, m)
	}
	rc := runner.Config{
		RunnerID: cfg.RunnerID, Version: version, Hostname: cfg.Hostname, Tokens: tokens, TokenFile: cfg.TokenFile,
		NATSURL: cfg.NATSURL, Mounts: mounts, HealthAddr: cfg.HealthAddr, Heartbeat: cfg.Heartbeat, Logger: log,
		Link: runner.LinkConfig{Refresh: cfg.NATSRefresh},
	}
	if cfg.Heartbeat == 0 {
		rc.Heartbeat = -1
	}
	if cfg.NATSCAFile != "" {
		rc.Link.Options = append(rc.Link.Options, nats.RootCAs(cfg.NATSCAFile))
	}
	if cfg.Server != "" {
		e, err := enroll.New(enroll.Config{ServerURL: cfg.Server, CAFile: cfg.CAFile, Tokens: tokens, Logger: log})
		if err != nil {
			return err
		}
		rc.Enroller = e
	} else if cfg.NATSURL == "" {
		return errors.New("compass-runner: set --server (COMPASS_SERVER_URL) to enroll, or --runner-id and --nats-url to run without it")
	}
	r, err := runner.New(rc)
	if err != nil {
		return err
	}
	log.Info("compass-runner starting", "version", version, "server", cfg.Server, "token_source", fmt.Sprintf("%T", tokens))
	return r.Run(ctx)
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("compass-runner: --log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, errHelp) {
		os.Exit(0)
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
	cfg.Hostname, _ = os.Hostname()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("compass-runner stopped", "err", err)
		os.Exit(1)
	}
	log.Info("compass-runner stopped")
}
