package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/verifier/keymetrics"
)

const runnerHelp = `Runs a Compass Runner. It authenticates with one token everywhere:

  - on Kubernetes, the projected ServiceAccount token named by --token-file
    (audience compass-runner; the kubelet rotates it). The file is re-read on
    every call, so a rotation needs no restart; --runner-id is optional, as the
    Server assigns the ID from the token;
  - elsewhere, a minted Runner token in the COMPASS_RUNNER_TOKEN environment
    variable (never a flag: flags show in ps), with --runner-id.

The two are mutually exclusive. --token-file's variable is
COMPASS_RUNNER_TOKEN_FILE, the name design record DL-440 gives it;
COMPASS_TOKEN_FILE (the toolkit's COMPASS_<FLAG_NAME>) is read too, and the
two set to different values is an error.

With --server the Runner enrolls over the Server's door (gRPC over HTTPS)
and learns its Runner ID and, unless --nats-url is set, the NATS URL. It
then connects to NATS with the same token, serves commands (ping, info) on
compass.runner.<id>.cmd and publishes a heartbeat on
compass.runner.<id>.evt.heartbeat. SIGTERM drains: no new commands are taken,
in-flight ones finish, then it exits.`

// mountList is a repeatable --mount; its environment variable holds a
// comma-separated list.
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

// Runner is compass-runner.
var Runner = &cli.Command{
	Name: "compass-runner",
	Help: runnerHelp,
	Logs: true,
	Env: []cli.EnvVar{
		{Name: "COMPASS_RUNNER_TOKEN", Usage: "a minted Runner token (exclusive with --token-file)"},
		// DL-440 names --token-file's variable; COMPASS_TOKEN_FILE is still read.
		{Name: "COMPASS_RUNNER_TOKEN_FILE", Flag: "token-file"},
	},
	Flags: func(fs *flag.FlagSet) cli.RunFunc {
		var (
			cfg                        runner.Config
			server, caFile, natsCAFile string
			mounts                     mountList
		)
		fs.StringVar(&server, "server", "", "Server door URL, https://host:port (omit to run without enrolling: needs --runner-id and --nats-url)")
		fs.StringVar(&caFile, "ca-file", "", "PEM CA that signed the Server's certificate (default: system roots)")
		fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding the projected token, re-read on every call\n(exclusive with COMPASS_RUNNER_TOKEN)")
		fs.StringVar(&cfg.RunnerID, "runner-id", "", "Runner ID; optional with --token-file and --server (the Server assigns it)")
		fs.StringVar(&cfg.NATSURL, "nats-url", "", "NATS URL(s), comma-separated; tls:// (nats:// only to loopback)\n(default: the one the Server returns at enrollment)")
		fs.StringVar(&natsCAFile, "nats-ca-file", "", "PEM CA for a tls:// NATS server (default: system roots)")
		fs.BoolVar(&cfg.AllowPlaintextNATS, "allow-plaintext-nats", false, "send the token over a nats:// URL to a non-loopback host (refused by default:\nthe token crosses the network in clear text and works at the door until it expires)")
		fs.Var(&mounts, "mount", "host:guest path to share with workloads; repeatable, or comma-separated in the env.\nRefused when the host path is the token directory, inside it or an ancestor of it")
		fs.StringVar(&cfg.HealthAddr, "health-addr", runner.DefaultHealthAddr, "address for /healthz, /readyz and /metrics (empty disables)")
		fs.DurationVar(&cfg.Heartbeat, "heartbeat", runner.DefaultHeartbeat, "heartbeat event period (0 disables)")
		fs.DurationVar(&cfg.Link.ReconnectJitter, "reconnect-jitter", runner.DefaultReconnectJitter, "window of random delay, after 2 s, before a lost NATS connection's first\nreconnect attempt; it doubles after each failed attempt, up to 60 s (or this,\nif longer). It spreads a fleet that loses its server at once: make it at least\nthe Runners of one NATS server divided by the CONNECTs a second it authorizes")
		fs.DurationVar(&cfg.Link.Refresh, "nats-refresh", 0, "reconnect to NATS with a fresh authorization this often; set it below the\ncallout's maximum user-JWT lifetime when that is shorter than the token's\n(0: when the token changes, and at the lifetime learned from the first expiry)")
		return func(ctx context.Context, in *cli.Invocation) error {
			if cfg.Link.ReconnectJitter <= 0 {
				return cli.UsageError(fmt.Errorf("--reconnect-jitter %s: want a positive duration", cfg.Link.ReconnectJitter))
			}
			log := in.Log
			tokens, err := runner.NewTokenSource(in.Getenv("COMPASS_RUNNER_TOKEN"), cfg.TokenFile, log, nil)
			if err != nil {
				return cli.UsageError(err)
			}
			for _, s := range mounts {
				m, err := runner.ParseMount(s)
				if err != nil {
					return cli.UsageError(err)
				}
				cfg.Mounts = append(cfg.Mounts, m)
			}
			cfg.Tokens, cfg.Logger, cfg.Version = tokens, log, cli.BuildInfo().Version
			cfg.Hostname, _ = os.Hostname()
			if cfg.Heartbeat == 0 {
				cfg.Heartbeat = -1
			}
			if natsCAFile != "" {
				cfg.Link.Options = append(cfg.Link.Options, nats.RootCAs(natsCAFile))
			}
			// /metrics on the health listener: the Runner's own families, the
			// build, the Go runtime and the process.
			cfg.Metrics = runner.NewMetrics()
			if err := cfg.Metrics.Register(keymetrics.BuildInfo("compass-runner"), collectors.NewGoCollector(),
				collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
				return fmt.Errorf("runner: metrics: %w", err)
			}
			switch {
			case server != "":
				if cfg.Enroller, err = enroll.New(enroll.Config{ServerURL: server, CAFile: caFile, Tokens: tokens, Logger: log,
					Retry: runner.Retry{OnAttempt: cfg.Metrics.ObserveEnroll}}); err != nil {
					return cli.UsageError(err)
				}
			case cfg.NATSURL == "":
				return cli.UsageError(errors.New("set --server (COMPASS_SERVER) to enroll, or --runner-id and --nats-url to run without it"))
			}
			r, err := runner.New(cfg)
			if err != nil {
				return cli.UsageError(err)
			}
			source := "environment"
			if cfg.TokenFile != "" {
				source = "file"
			}
			log.Info("compass-runner starting", "version", cfg.Version, "server", server, "token_source", source)
			err = r.Run(ctx)
			log.Info("compass-runner stopped")
			return err
		}
	},
}
