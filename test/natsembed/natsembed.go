// Package natsembed is the NATS side of compass-runner identity for tests: an
// in-process nats-server in server-config auth-callout mode, xkey on, whose
// requests a callout.Responder answers. Its own tests (TestSuite) run the
// callout's behaviour in every NATS auth mode; Start gives other packages'
// tests (the door parity, end-to-end and live-Kubernetes tiers) the same
// setup in one call.
package natsembed

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kick"
)

// Credentials of the users that bypass the callout (auth_users).
const (
	CalloutUser, CalloutPassword = "callout", "callout-pwd"
	// ServerUser is in the Runners' account, as compass-server connects to
	// send commands; present only with Config.ServerUser.
	ServerUser, ServerPassword = "server", "server-pwd"
)

// The kick identity (package kick): a user of the system account allowed only
// the servers' CONNZ and KICK requests and the Runners' account's connect
// and disconnect events, listed in auth_users. Present in
// ServeForProcess's server.
const KickUser, KickPassword = "kick", "kick-pwd"

// KickUserConfig is the kick identity's user block in a server-config
// nats-server configuration: exactly the permissions docs/self-host.md gives it.
var KickUserConfig = fmt.Sprintf(`{ user: %q, password: %q, permissions: { publish: { allow: [ %q, %q, %q ] }, subscribe: { allow: [ "_INBOX.>", %q, %q ] } } }`,
	KickUser, KickPassword, kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick,
	kick.EventSubjects(Account)[0], kick.EventSubjects(Account)[1])

// Account is the Runners' account: the user JWTs' audience.
const Account = "RUNNERS"

// readyTimeout bounds the server's start on a loaded test machine.
const readyTimeout = 10 * time.Second

// Config configures Start.
type Config struct {
	Resolver callout.Resolver // required: what the callout verifies tokens with
	// Observe receives every decision (callout.Config.Observe).
	Observe     func(callout.Event)
	MaxLifetime time.Duration // user JWT cap (default callout.DefaultMaxLifetime)
	Workers     int           // default 2
	Logger      *slog.Logger  // the callout's log (default: discarded)
	// ServerUser adds ServerUser to the Runners' account.
	ServerUser bool
	// AuthTimeout is the server's authorization timeout in seconds (default
	// nats-server's, 2 s).
	AuthTimeout int
	// Options, if set, adjusts the server's parsed options before it starts
	// (a WebSocket listener, for example).
	Options func(*server.Options)
}

// Keys returns a fresh auth_callout issuer (an account key) and a fresh
// xkey, for a server and its callout configured in the test.
func Keys(t testing.TB) (*callout.Signer, *callout.XKey) {
	t.Helper()
	signer, err := callout.GenerateSigner(nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	return signer, XKey(t)
}

// XKey returns a fresh curve key for sealing requests and answers.
func XKey(t testing.TB) *callout.XKey {
	t.Helper()
	x, err := callout.GenerateXKey()
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// SignerOf is the callout's signer for the account key kp (an account or
// one of its signing keys).
func SignerOf(t testing.TB, kp nkeys.KeyPair) *callout.Signer {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	s, err := callout.NewSigner(seed, nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Sentinel is an operator-mode server's default_sentinel: a bearer user of
// the callout's account auth, signed by it, that may publish and subscribe
// nothing. Every client without a JWT of its own (every Runner) becomes it,
// which sends the client to the callout.
func Sentinel(t testing.TB, auth nkeys.KeyPair) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	sen := jwt.NewUserClaims(pub)
	sen.Name = "sentinel"
	sen.BearerToken = true
	sen.Permissions.Pub.Deny.Add(">")
	sen.Permissions.Sub.Deny.Add(">")
	tok, err := sen.Encode(auth)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Callout is a running server and its callout; both stop when the test ends.
type Callout struct {
	URL       string
	Server    *server.Server
	Responder *callout.Responder
}

// Start runs the server and the callout and returns once the callout has
// its subscription, so the next CONNECT is answered.
func Start(t testing.TB, cfg Config) *Callout {
	t.Helper()
	signer, xkey := Keys(t)
	runners, authUsers := "", CalloutUser
	if cfg.ServerUser {
		runners = fmt.Sprintf("users: [ { user: %s, password: %s } ]", ServerUser, ServerPassword)
		authUsers += ", " + ServerUser
	}
	timeout := ""
	if cfg.AuthTimeout > 0 {
		timeout = fmt.Sprintf("timeout: %d", cfg.AuthTimeout)
	}
	conf := fmt.Sprintf(`
listen: "127.0.0.1:-1"
accounts {
  CALLOUT { users: [ { user: %s, password: %s } ] }
  %s { %s }
  SYS {}
}
system_account: SYS
authorization {
  %s
  auth_callout {
    issuer: %s
    account: CALLOUT
    auth_users: [ %s ]
    xkey: %s
  }
}
`, CalloutUser, CalloutPassword, Account, runners, timeout, signer.Public(), authUsers, xkey.Public())
	ns := Serve(t, conf, cfg.Options)

	workers := cfg.Workers
	if workers == 0 {
		workers = 2
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r, err := callout.New(callout.Config{
		Mode: callout.ModeServerConfig, Resolver: cfg.Resolver, ResponseSigner: signer,
		Account: Account, XKey: xkey, MaxLifetime: cfg.MaxLifetime, Workers: workers,
		Logger: log, Observe: cfg.Observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(CalloutUser, CalloutPassword), nats.Name("compass-callout"))
	if err != nil {
		t.Fatal(err)
	}
	StartResponder(t, r, nc)
	return &Callout{URL: ns.ClientURL(), Server: ns, Responder: r}
}

// StartResponder starts r on its connections ncs until the test ends, or
// until the stop it returns is called. Stopping drains the responder and
// waits for it, then closes the connections; at the end of the test it
// happens in the cleanup, last-in first-out: before whatever the test
// started earlier (its nats-server) stops. A Start that fails closes the
// connections and fails the test.
func StartResponder(t testing.TB, r *callout.Responder, ncs ...*nats.Conn) (stop func()) {
	t.Helper()
	closeAll := func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}
	// Stopped by stop, not when the test's context ends first.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	if err := r.Start(ctx, ncs...); err != nil {
		cancel()
		closeAll()
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-r.Done()
			closeAll()
		})
	}
	t.Cleanup(stop)
	return stop
}

// Serve starts an in-process nats-server from a configuration text, quiet
// and without signal handlers, and shuts it down when the test ends. mod, if
// set, adjusts the parsed options first; when it turns logging on, the
// server's logger is configured from them.
func Serve(t testing.TB, conf string, mod func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		t.Fatalf("nats config: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	if mod != nil {
		mod(opts)
	}
	return ServeOptions(t, opts)
}

// ServeOptions starts an in-process nats-server on opts as they are (a test
// sets NoLog and NoSigs itself, or has them from a configuration it parsed),
// waits until it is ready for connections, and shuts it down when the test
// ends. When opts.NoLog is false, the server's logger is configured from
// them.
func ServeOptions(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	if !opts.NoLog {
		ns.ConfigureLogger()
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(readyTimeout) {
		t.Fatal("nats-server not ready")
	}
	return ns
}

// Plain starts a quiet in-process nats-server on a random loopback port,
// with no authorization and no auth callout, for tests that need only a NATS
// to publish and subscribe on. It shuts down when the test ends.
func Plain(t testing.TB) *server.Server {
	t.Helper()
	return ServeOptions(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
}

// ForProcess is an in-process nats-server in server-config auth-callout mode
// for a compass-callout that runs on its own (callout.Serve, or the binary):
// the callout logs in as CalloutUser, answers for Account, signs with the
// account seed in IssuerSeedFile, and kicks as KickUser.
type ForProcess struct {
	URL            string
	Server         *server.Server
	IssuerSeedFile string
}

// ServeConfig is what a compass-callout serving this server sets: its
// URL, the callout and kick users, server-config mode with the issuer seed
// written here, and the Runners' account. The caller adds the rest (the
// cluster file, the store, metrics, logging).
func (p *ForProcess) ServeConfig() callout.ServeConfig {
	return callout.ServeConfig{
		NATSURLs: p.URL, NATSUser: CalloutUser, NATSPassword: CalloutPassword,
		KickUser: KickUser, KickPassword: KickPassword,
		Mode: callout.ModeServerConfig, IssuerSeedFile: p.IssuerSeedFile, Account: Account,
	}
}

// Env is ServeConfig as the compass-callout binary's environment.
func (p *ForProcess) Env() []string {
	return []string{
		"COMPASS_NATS_URL=" + p.URL, "COMPASS_NATS_USER=" + CalloutUser, "COMPASS_NATS_PASSWORD=" + CalloutPassword,
		"COMPASS_KICK_USER=" + KickUser, "COMPASS_KICK_PASSWORD=" + KickPassword,
		"COMPASS_ISSUER_SEED_FILE=" + p.IssuerSeedFile, "COMPASS_ACCOUNT=" + Account,
	}
}

// ServeForProcess starts the server and writes the issuer seed into dir.
func ServeForProcess(t testing.TB, dir string) *ForProcess {
	t.Helper()
	seedFile := filepath.Join(dir, "callout-issuer.nk")
	ns := Serve(t, ForProcessConfig(WriteIssuerSeed(t, seedFile), ""), nil)
	return &ForProcess{URL: ns.ClientURL(), Server: ns, IssuerSeedFile: seedFile}
}

// WriteIssuerSeed makes a fresh auth_callout issuer (an account key), writes
// its seed to path for a callout that runs on its own, and returns its
// public key for the servers' configuration.
func WriteIssuerSeed(t testing.TB, path string) string {
	t.Helper()
	_, pub := WriteSeed(t, path, nkeys.CreateAccount)
	return pub
}

// OperatorConfig is the operator-mode part of a nats-server configuration:
// the operator's JWT, the system account, the account JWTs (each a public
// key and its JWT) preloaded into a memory resolver, and the default
// sentinel every client without a JWT of its own becomes.
func OperatorConfig(operatorJWT, systemAccount, sentinel string, accounts ...[2]string) string {
	var preload strings.Builder
	for _, a := range accounts {
		fmt.Fprintf(&preload, "  %s: %s\n", a[0], a[1])
	}
	return fmt.Sprintf(`
operator: %s
system_account: %s
resolver: MEM
resolver_preload: {
%s}
default_sentinel: %s
`, operatorJWT, systemAccount, preload.String(), sentinel)
}

// CredsFile writes to path (0600) the .creds file of user: a user JWT
// signed by signer (an account or one of its signing keys), shaped by mod
// (its name, issuer account, permissions) when set, with user's seed.
func CredsFile(t testing.TB, path string, user, signer nkeys.KeyPair, mod func(*jwt.UserClaims)) string {
	t.Helper()
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	uc := jwt.NewUserClaims(pub)
	if mod != nil {
		mod(uc)
	}
	ujwt, err := uc.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// NewKey makes a fresh key with create (nkeys.CreateAccount,
// nkeys.CreateCurveKeys, ...) and returns it with its public key.
func NewKey(t testing.TB, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// WriteSeed is NewKey with the key's seed written to path (0600), for a
// callout that reads it from a file.
func WriteSeed(t testing.TB, path string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string) {
	t.Helper()
	kp, pub := NewKey(t, create)
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// ForProcessConfig is ServeForProcess's configuration, for a server run in
// process or as the real binary: clients on a free loopback port,
// server-config auth callout with issuer (a public account key), CalloutUser
// answering for Account, ServerUser in Account (compass-server's own
// connection, past the callout as the rendered configuration has it),
// KickUser in the system account; extra is appended (a server_name, a
// cluster block).
func ForProcessConfig(issuer, extra string) string {
	return fmt.Sprintf(`
listen: "127.0.0.1:-1"
accounts {
  CALLOUT { users: [ { user: %q, password: %q } ] }
  %s { users: [ { user: %q, password: %q } ] }
  SYS { users: [ %s ] }
}
system_account: SYS
authorization { auth_callout { issuer: %s, account: CALLOUT, auth_users: [ %q, %q, %q ] } }
%s
`, CalloutUser, CalloutPassword, Account, ServerUser, ServerPassword, KickUserConfig, issuer, CalloutUser, KickUser, ServerUser, extra)
}

// ClientsNamed counts the client connections on ns whose CONNECT named
// them name (compass-callout's connections, for example).
func ClientsNamed(t testing.TB, ns *server.Server, name string) int {
	t.Helper()
	cz, err := ns.Connz(&server.ConnzOptions{Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cz.Conns {
		if c.Name == name {
			n++
		}
	}
	return n
}
