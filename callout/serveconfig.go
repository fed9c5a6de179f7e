package callout

// ServeConfig: what compass-callout is told (flags and environment), its
// checks, and the defaults Serve fills in.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/verifier"
)

// Limits and defaults of Serve, each with its reason.
const (
	// DefaultConnections: enough to spread the server's answer handling over
	// the read loops of a small server; more add little on two cores.
	DefaultConnections = 4
	// MaxConnections bounds ServeConfig.Connections: each is a NATS client
	// connection.
	MaxConnections = 64
	// DefaultDrainTimeout bounds a SIGTERM drain: longer than any queued
	// request's expiry (the server's auth timeout, 2 s by default).
	DefaultDrainTimeout = 10 * time.Second
)

// ServeConfig configures Serve: compass-callout as a process.
type ServeConfig struct {
	// NATSURLs is one or more NATS URLs, comma-separated.
	NATSURLs string
	// The callout user's NATS credentials: at most one of a creds file
	// (operator mode), an nkey seed file, or a user and password.
	NATSCreds, NATSNkeyFile, NATSUser, NATSPassword string
	// NATSCAFile is a PEM CA for a tls:// NATS server (empty: system roots).
	NATSCAFile string

	Mode Mode
	// IssuerSeedFile: the account seed that signs answers (server-config:
	// the auth_callout issuer; operator: the callout account or one of its
	// signing keys).
	IssuerSeedFile string
	// CalloutAccount (operator mode) is the callout account's public key
	// when IssuerSeedFile is a signing key of it.
	CalloutAccount string
	// UserSeedFile (operator mode) is the Runners' account seed or a signing
	// key of it.
	UserSeedFile string
	// Account is the Runners' account: its name (server-config mode) or
	// public key (operator mode; default: UserSeedFile's account).
	Account string
	// XKeySeedFile, when set, is the curve seed requests must be sealed to.
	XKeySeedFile string
	// The keys a rotation moves the NATS servers to, held beside the ones
	// above while the servers roll (rotation.go, docs/self-host.md "Rotating
	// the callout's keys"): the next xkey (it needs XKeySeedFile), the next
	// issuer (server-config) or callout account signing key (operator), and
	// the next signing key of the Runners' account (operator). In operator
	// mode a next signing key needs a next xkey, by which a request tells
	// its server's generation.
	NextXKeySeedFile, NextIssuerSeedFile, NextUserSeedFile string
	// AllowPlaintextNATS lets NATSURLs be plaintext (nats://, ws://) to a
	// host that is not loopback without XKeySeedFile, which Check refuses
	// otherwise: every Runner's token then crosses the network in clear text
	// (nats-server puts it in each authorization request). Serve warns.
	AllowPlaintextNATS bool

	// The kick identity (package kick, docs/self-host.md "The kick
	// identity"): a NATS system-account user that may request only the
	// servers' CONNZ and KICK. At most one of a creds file (operator mode),
	// an nkey seed file, or a user and password. With it, a Runner that the
	// doors stop accepting (node denied, cluster removed, minted token
	// revoked or expired) loses its live NATS connections within seconds.
	KickCreds, KickNkeyFile, KickUser, KickPassword string
	// NoKick runs without the kick identity: revocations then reach live
	// connections only when their user JWTs expire (--max-user-jwt-lifetime).
	// Check refuses a config with neither.
	NoKick bool
	// Duplicates says what to do with the older connection when a Runner ID
	// authenticates while it already has one (default: end it).
	Duplicates     kick.Duplicates
	DuplicateGrace time.Duration // 0: kick.DefaultDuplicateGrace
	SweepInterval  time.Duration // 0: kick.DefaultSweepInterval
	ListInterval   time.Duration // 0: kick.DefaultListInterval
	RevocationPoll time.Duration // 0: DefaultRevocationPoll
	// QuarantineAfter and QuarantineWindow: a Runner ID displaced (its
	// older connection ended as a duplicate) more than QuarantineAfter times
	// within QuarantineWindow is quarantined until compass-server
	// clear-quarantine (DL-459). QuarantineAfter 0 counts nothing here (the
	// flag's default is DefaultQuarantineAfter); quarantines in the store
	// are refused all the same. Needs DatabaseURL; never with Duplicates
	// keep.
	QuarantineAfter  int
	QuarantineWindow time.Duration // 0: DefaultQuarantineWindow

	// RunnerClusters is the cluster file (DL-440); DatabaseURL the store of
	// minted Runner tokens. At least one is required.
	RunnerClusters, DatabaseURL string

	MaxUserLifetime time.Duration // 0: DefaultMaxLifetime
	AnswerHorizon   time.Duration // 0: DefaultAnswerHorizon (see Config.AnswerHorizon)
	Connections     int           // 0: DefaultConnections
	Workers         int           // 0: the responder's default
	MetricsAddr     string        // /metrics, /healthz, /readyz; empty: none
	DrainTimeout    time.Duration // 0: DefaultDrainTimeout

	Logger *slog.Logger
	// Ready, if set, is called with the metrics listener's address once the
	// callout answers requests.
	Ready func(metricsAddr string)
	// ClusterFilePoll is how often the cluster file is checked for a change
	// (0: clusterfile.DefaultPollInterval). ReloadSignals, for tests,
	// replaces SIGHUP as the forced reload.
	ClusterFilePoll time.Duration
	ReloadSignals   <-chan os.Signal
	// LoadHook, if set, observes every key-set load of the verifier.
	LoadHook func(verifier.LoadEvent)
}

// ErrConfig marks a ServeConfig that cannot work; the message says which
// setting.
var ErrConfig = errors.New("callout: invalid configuration")

type configError string

func (e configError) Error() string        { return string(e) }
func (e configError) Is(target error) bool { return target == ErrConfig }

func configErr(format string, a ...any) error { return configError(fmt.Sprintf(format, a...)) }

// Check reports the first setting of c that cannot work, as an error wrapping
// ErrConfig and naming the flag that sets it.
func (c ServeConfig) Check() error {
	creds := 0
	for _, s := range []string{c.NATSCreds, c.NATSNkeyFile, c.NATSUser} {
		if s != "" {
			creds++
		}
	}
	switch {
	case !c.AllowPlaintextNATS && c.plaintextNATSURL() != "":
		return configErr("--nats-url %s is plaintext to a non-loopback host and there is no --xkey-seed-file: every Runner's token would cross the network in clear text (nats-server puts it in each authorization request); use tls:// or wss://, set --xkey-seed-file, or accept that with --allow-plaintext-nats", c.plaintextNATSURL())
	case creds > 1:
		return configErr("set one of --nats-creds, --nats-nkey and --nats-user")
	case c.NATSUser != "" && c.NATSPassword == "":
		return configErr("--nats-user needs --nats-password-file or COMPASS_NATS_PASSWORD")
	case c.IssuerSeedFile == "":
		return configErr("--issuer-seed-file is required")
	case c.Mode == ModeServerConfig && c.Account == "":
		return configErr("--account (the Runners' account name) is required in server-config mode")
	case c.Mode == ModeOperator && c.UserSeedFile == "":
		return configErr("--user-signing-seed-file is required in operator mode")
	case c.Mode == ModeServerConfig && (c.UserSeedFile != "" || c.CalloutAccount != ""):
		return configErr("--user-signing-seed-file and --callout-account are operator-mode flags")
	case c.Mode != ModeServerConfig && c.Mode != ModeOperator:
		return configErr("unknown mode %d", c.Mode)
	case c.NextXKeySeedFile != "" && c.XKeySeedFile == "":
		return configErr("--next-xkey-seed-file needs --xkey-seed-file: a rotation does not turn sealing on or off")
	case c.Mode == ModeServerConfig && c.NextUserSeedFile != "":
		return configErr("--next-user-signing-seed-file is an operator-mode flag")
	case c.Mode == ModeOperator && (c.NextIssuerSeedFile != "" || c.NextUserSeedFile != "") && c.NextXKeySeedFile == "":
		return configErr("in operator mode a next signing key (--next-issuer-seed-file, --next-user-signing-seed-file) needs --next-xkey-seed-file: a request tells its server's keys only by the xkey it is sealed to (or list the new signing key beside the old one in the account JWT instead)")
	case c.NextXKeySeedFile != "" && c.NextXKeySeedFile == c.XKeySeedFile,
		c.NextIssuerSeedFile != "" && c.NextIssuerSeedFile == c.IssuerSeedFile,
		c.NextUserSeedFile != "" && c.NextUserSeedFile == c.UserSeedFile:
		return configErr("a --next-* seed file is the current one: give the next key its own file, or drop the flag once the rotation is done")
	case c.Connections < 0 || c.Connections > MaxConnections:
		return configErr("--connections %d: want 1 to %d", c.Connections, MaxConnections)
	case c.Workers < 0:
		return configErr("--workers %d: want at least 1", c.Workers)
	case c.MaxUserLifetime != 0 && (c.MaxUserLifetime < MinMaxLifetime || c.MaxUserLifetime > MaxMaxLifetime):
		return configErr("--max-user-jwt-lifetime %s: want %s to %s", c.MaxUserLifetime, MinMaxLifetime, MaxMaxLifetime)
	case c.AnswerHorizon != 0 && c.AnswerHorizon < MinAnswerHorizon:
		return configErr("--answer-horizon %s: want at least %s", c.AnswerHorizon, MinAnswerHorizon)
	case countSet(c.KickCreds, c.KickNkeyFile, c.KickUser) > 1:
		return configErr("set one of --kick-creds, --kick-nkey and --kick-user")
	case c.KickUser != "" && c.KickPassword == "":
		return configErr("--kick-user needs --kick-password-file or COMPASS_KICK_PASSWORD")
	case c.NoKick && countSet(c.KickCreds, c.KickNkeyFile, c.KickUser) > 0:
		return configErr("--no-kick and a kick identity (--kick-creds, --kick-nkey, --kick-user) contradict each other")
	case c.DuplicateGrace != 0 && c.DuplicateGrace < kick.MinDuplicateGrace:
		return configErr("--duplicate-grace %s: want at least %s", c.DuplicateGrace, kick.MinDuplicateGrace)
	case c.SweepInterval < 0:
		return configErr("--sweep-interval %s: want a positive duration", c.SweepInterval)
	case c.ListInterval < 0:
		return configErr("--list-interval %s: want a positive duration", c.ListInterval)
	case c.RevocationPoll < 0:
		return configErr("--revocation-poll %s: want a positive duration", c.RevocationPoll)
	case c.QuarantineAfter < 0:
		return configErr("--quarantine-after %d: want 0 (off) or more", c.QuarantineAfter)
	case c.QuarantineWindow != 0 && c.QuarantineWindow < MinQuarantineWindow:
		return configErr("--quarantine-window %s: want at least %s", c.QuarantineWindow, MinQuarantineWindow)
	case c.RunnerClusters == "" && c.DatabaseURL == "":
		return configErr("nothing to accept: set --runner-clusters, --database-url or both")
	case !c.NoKick && countSet(c.KickCreds, c.KickNkeyFile, c.KickUser) == 0:
		return configErr("no kick identity: set --kick-creds, --kick-nkey or --kick-user (a NATS system-account user allowed the servers' CONNZ and KICK requests), or --no-kick to let revoked Runners stay connected until their user JWTs expire")
	}
	return nil
}

// plaintextNATSURL is the first of NATSURLs that is plaintext to a host that
// is not loopback (natsurl.CheckSealed), without its user part; "" when there
// is none, or when XKeySeedFile seals the requests.
func (c ServeConfig) plaintextNATSURL() string {
	if c.XKeySeedFile != "" {
		return ""
	}
	for _, u := range strings.Split(c.NATSURLs, ",") {
		if errors.Is(natsurl.CheckSealed(u), natsurl.ErrPlaintext) {
			shown, _ := natsurl.StripUser(strings.TrimSpace(u))
			return shown
		}
	}
	return ""
}

func countSet(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// Set parses a mode's name ("server-config" or "operator"), so a Mode is a
// flag.Value.
func (m *Mode) Set(s string) error {
	switch s {
	case ModeServerConfig.String():
		*m = ModeServerConfig
	case ModeOperator.String():
		*m = ModeOperator
	default:
		return fmt.Errorf("want %s or %s", ModeServerConfig, ModeOperator)
	}
	return nil
}
