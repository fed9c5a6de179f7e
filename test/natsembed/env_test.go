// The suite runs compass-callout against an in-process nats-server in each
// auth environment: server-config mode plain, server-config mode with xkey,
// and operator mode (with xkey), with a real TLS test issuer signing
// Kubernetes-format projected tokens.

package natsembed

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// waitFor bounds every wait on the embedded server or the callout. Nothing in
// these tests should take more than a fraction of it.
const waitFor = 10 * time.Second

// envKind is one of the three environments of the suite.
type envKind string

const (
	configPlain envKind = "config-plain"
	configXKey  envKind = "config-xkey"
	operator    envKind = "operator"
	// operatorPlain is operator mode without xkey: the server then checks the
	// answer's signer (a signing key of the callout account, with
	// issuer_account), which it skips for sealed answers.
	operatorPlain envKind = "operator-plain"
)

var allEnvs = []envKind{configPlain, configXKey, operator, operatorPlain}

// env is a running nats-server with compass-callout in front of it.
type env struct {
	t    *testing.T
	kind envKind
	dir  string
	srv  *server.Server

	issuer   *kubeissuer.Issuer // cluster "prod"
	dark     *kubeissuer.Issuer // cluster "dark": its JWKS always fails
	verifier *verifier.RunnerVerifier
	clusters []verifier.RunnerCluster // as the verifier was started (prod, dark)
	store    *spyStore
	resolver *verifier.Resolver

	calloutOpts []nats.Option // how a callout replica authenticates
	serverOpts  []nats.Option // how the Compass Server (the Runners' peer) authenticates
	kickOpts    []nats.Option // how the kick identity (a least-privilege system user) authenticates
	runnerOpts  []nats.Option // extra options every Runner uses (operator mode: none)
	account     string        // the Runners' account as Connz reports it

	// callout configuration
	mode        callout.Mode
	respSigner  *callout.Signer
	calloutAcct string
	userSigner  *callout.Signer
	userAccount string
	xkey        *callout.XKey

	logs   *testlog.Buffer
	events chan callout.Event
}

// spyStore is an in-memory minted-token store that counts lookups, so a test
// can prove a JWS-shaped token never reaches it.
type spyStore struct {
	mu      sync.Mutex
	tokens  map[[32]byte]verifier.MintedToken
	lookups atomic.Int64
}

func (s *spyStore) LookupTokenHash(_ context.Context, h [sha256.Size]byte) (verifier.MintedToken, error) {
	s.lookups.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.tokens[h]
	if !ok {
		return verifier.MintedToken{}, fmt.Errorf("spy store: %w", verifier.ErrTokenNotFound)
	}
	return m, nil
}

func (s *spyStore) mint(t *testing.T, id string) string {
	t.Helper()
	if err := verifier.CheckSubjectID(verifier.SubjectRunner, id); err != nil {
		t.Fatal(err)
	}
	tok, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[verifier.HashToken(tok)] = verifier.MintedToken{Kind: verifier.SubjectRunner, ID: id, Tenant: "t"}
	return tok
}

func mustAccount(t *testing.T) (nkeys.KeyPair, string, *callout.Signer) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return kp, pub, SignerOf(t, kp)
}

// credsFile writes dir/<name>.creds for a new user of account akp (signed
// by signer, which may be a signing key of it).
func credsFile(t *testing.T, dir, name string, signer nkeys.KeyPair, issuerAccount string, mod func(*jwt.UserClaims)) string {
	t.Helper()
	user, _ := NewKey(t, nkeys.CreateUser)
	return CredsFile(t, filepath.Join(dir, name+".creds"), user, signer, func(uc *jwt.UserClaims) {
		uc.Name = name
		uc.IssuerAccount = issuerAccount
		if mod != nil {
			mod(uc)
		}
	})
}

// newEnv starts a nats-server of the given kind, a test issuer ("prod"), a
// failing issuer ("dark") and a verifier; the callout is started by startCallout.
func newEnv(t *testing.T, kind envKind) *env {
	t.Helper()
	e := &env{t: t, kind: kind, dir: t.TempDir(), logs: &testlog.Buffer{}, events: make(chan callout.Event, 1024)}
	e.store = &spyStore{tokens: map[[32]byte]verifier.MintedToken{}}

	var err error
	if e.issuer, err = kubeissuer.New(kubeissuer.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.issuer.Close() })
	if e.dark, err = kubeissuer.New(kubeissuer.Options{Alg: kubeissuer.ES256, Wrap: testutil.NewFailingJWKS(true).Wrap}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.dark.Close() })
	prodCA, err := e.issuer.WriteCAFileIn(e.dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	darkCA, err := e.dark.WriteCAFileIn(e.dir, "dark")
	if err != nil {
		t.Fatal(err)
	}
	clusters := []verifier.RunnerCluster{
		{Name: "prod", Issuer: e.issuer.URL(), CAFile: prodCA},
		{Name: "dark", Issuer: e.dark.URL(), CAFile: darkCA},
	}
	e.clusters = clusters
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	loaded := make(chan verifier.LoadEvent, 16)
	e.verifier, err = verifier.New(clusters,
		verifier.WithLogger(log), verifier.WithLoadHook(func(ev verifier.LoadEvent) {
			select {
			case loaded <- ev:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.verifier.Start(ctx)
	// Wait for prod's first load (dark's fails, which is the point).
	deadline := time.After(waitFor)
	for prodLoaded := false; !prodLoaded; {
		select {
		case ev := <-loaded:
			if ev.Cluster == "prod" {
				if ev.Err != nil {
					t.Fatalf("prod key load: %v", ev.Err)
				}
				prodLoaded = true
			}
		case <-deadline:
			t.Fatal("prod keys never loaded")
		}
	}
	e.resolver = verifier.NewResolver(e.verifier, e.store)

	var conf string
	switch kind {
	case configPlain, configXKey:
		conf = e.configMode(kind == configXKey)
	case operator, operatorPlain:
		conf = e.operatorMode(kind == operator)
	}
	// A WebSocket listener beside the standard one, with the same
	// authorization: a Runner's user JWT must not open it.
	e.srv = Serve(t, conf, func(o *server.Options) {
		o.Websocket.Host, o.Websocket.Port, o.Websocket.NoTLS = "127.0.0.1", -1, true
	})
	return e
}

func (e *env) configMode(withXKey bool) string {
	t := e.t
	_, _, e.respSigner = mustAccount(t)
	e.mode = callout.ModeServerConfig
	e.userAccount = "RUNNERS"
	e.account = "RUNNERS"
	xkeyLine := ""
	if withXKey {
		e.xkey = XKey(t)
		xkeyLine = "xkey: " + e.xkey.Public()
	}
	e.calloutOpts = []nats.Option{nats.UserInfo("callout", "callout-pwd")}
	e.serverOpts = []nats.Option{nats.UserInfo("compass-server", "server-pwd")}
	e.kickOpts = []nats.Option{nats.UserInfo(KickUser, KickPassword)}
	return fmt.Sprintf(`
listen: "127.0.0.1:-1"
server_name: embedded
accounts {
  CALLOUT { users: [ { user: callout, password: callout-pwd } ] }
  RUNNERS { users: [ { user: compass-server, password: server-pwd } ] }
  SYS { users: [ %s ] }
}
system_account: SYS
authorization {
  auth_callout {
    issuer: %s
    account: CALLOUT
    auth_users: [ callout, compass-server, %s ]
    %s
  }
}
`, KickUserConfig, e.respSigner.Public(), KickUser, xkeyLine)
}

func (e *env) operatorMode(withXKey bool) string {
	t := e.t
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "compass"
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	// SYS
	skp, spub, _ := mustAccount(t)
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sjwt, err := sc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	// RUNNERS: user JWTs are signed by a signing key of it.
	rkp, rpub, _ := mustAccount(t)
	rsk, rskPub, rskSigner := mustAccount(t)
	_ = rsk
	rc := jwt.NewAccountClaims(rpub)
	rc.Name = "RUNNERS"
	rc.SigningKeys.Add(rskPub)
	rjwt, err := rc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	// AUTH: the callout account; answers are signed by a signing key of it.
	akp, apub, _ := mustAccount(t)
	ask, askPub, askSigner := mustAccount(t)
	_ = ask
	if withXKey {
		e.xkey = XKey(t)
	}
	calloutUser, cuPub := NewKey(t, nkeys.CreateUser)
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "AUTH"
	ac.SigningKeys.Add(askPub)
	ac.EnableExternalAuthorization(cuPub)
	ac.Authorization.AllowedAccounts.Add(rpub)
	if withXKey {
		ac.Authorization.XKey = e.xkey.Public()
	}
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	// The callout's own user, in AUTH.
	calloutCreds := CredsFile(t, filepath.Join(e.dir, "callout.creds"), calloutUser, akp, func(uc *jwt.UserClaims) { uc.Name = "callout" })
	sentinel := Sentinel(t, akp)
	// The Compass Server: an ordinary RUNNERS user.
	serverCreds := credsFile(t, e.dir, "compass-server", rkp, "", nil)

	e.mode = callout.ModeOperator
	e.respSigner = askSigner
	e.calloutAcct = apub
	e.userSigner = rskSigner
	e.userAccount = rpub
	e.account = rpub
	e.calloutOpts = []nats.Option{nats.UserCredentials(calloutCreds)}
	e.serverOpts = []nats.Option{nats.UserCredentials(serverCreds)}
	// The kick identity: a SYS user that may request the servers' CONNZ and
	// KICK and nothing else (docs/self-host.md, "The kick identity").
	kickCreds := credsFile(t, e.dir, "compass-kick", skp, "", func(uc *jwt.UserClaims) {
		uc.Pub.Allow.Add(kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick)
		uc.Sub.Allow.Add("_INBOX.>")
		uc.Sub.Allow.Add(kick.EventSubjects(rpub)...)
	})
	e.kickOpts = []nats.Option{nats.UserCredentials(kickCreds)}
	return `
listen: "127.0.0.1:-1"
server_name: embedded` + OperatorConfig(ojwt, spub, sentinel, [2]string{spub, sjwt}, [2]string{rpub, rjwt}, [2]string{apub, ajwt})
}

// replica is one running callout.
type replica struct {
	r      *callout.Responder
	cancel context.CancelFunc
	conns  []*nats.Conn
	served atomic.Int64
}

// stop drains the replica and waits for it.
func (rp *replica) stop(t *testing.T) {
	t.Helper()
	rp.cancel()
	select {
	case <-rp.r.Done():
	case <-time.After(waitFor):
		t.Fatal("callout replica did not drain")
	}
	for _, nc := range rp.conns {
		nc.Close()
	}
}

// startCallout starts a callout replica on n connections.
func (e *env) startCallout(n int, mod func(*callout.Config)) *replica {
	t := e.t
	t.Helper()
	rp := &replica{}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := callout.Config{
		Mode:           e.mode,
		Resolver:       e.resolver,
		ResponseSigner: e.respSigner,
		CalloutAccount: e.calloutAcct,
		UserSigner:     e.userSigner,
		Account:        e.userAccount,
		XKey:           e.xkey,
		Workers:        4,
		Logger:         log,
		Observe: func(ev callout.Event) {
			rp.served.Add(1)
			select {
			case e.events <- ev:
			default:
			}
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := callout.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rp.r = r
	for range n {
		nc, err := nats.Connect(e.srv.ClientURL(), append([]nats.Option{nats.Name("compass-callout")}, e.calloutOpts...)...)
		if err != nil {
			t.Fatalf("callout connect: %v", err)
		}
		rp.conns = append(rp.conns, nc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp.cancel = cancel
	if err := r.Start(ctx, rp.conns...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-r.Done():
		default:
			rp.stop(t)
		}
	})
	return rp
}

// event returns the next callout decision.
func (e *env) event() callout.Event {
	e.t.Helper()
	select {
	case ev := <-e.events:
		return ev
	case <-time.After(waitFor):
		e.t.Fatal("no callout decision")
	}
	return callout.Event{}
}

// drainEvents discards decisions so far.
func (e *env) drainEvents() {
	for {
		select {
		case <-e.events:
		default:
			return
		}
	}
}

// asyncErrs collects a connection's asynchronous errors (permission violations).
type asyncErrs chan error

func (a asyncErrs) next(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a:
		return err
	case <-time.After(waitFor):
		t.Fatal("no asynchronous error from the server")
	}
	return nil
}

// connectRunner connects with a token, as compass-runner does.
func (e *env) connectRunner(token string, extra ...nats.Option) (*nats.Conn, asyncErrs, error) {
	errs := make(asyncErrs, 16)
	opts := append([]nats.Option{
		nats.Token(token),
		nats.NoReconnect(),
		nats.Timeout(waitFor),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}),
	}, e.runnerOpts...)
	opts = append(opts, extra...)
	nc, err := nats.Connect(e.srv.ClientURL(), opts...)
	if nc != nil {
		e.t.Cleanup(nc.Close)
	}
	return nc, errs, err
}

// token signs a projected token for a node of cluster prod.
func (e *env) token(node string, lifetime time.Duration) string {
	e.t.Helper()
	tok, err := e.issuer.Token(kubeissuer.Pod{NodeName: node}, lifetime)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// serverConn connects as the Compass Server (a plain user of the Runners' account).
func (e *env) serverConn() *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.ClientURL(), e.serverOpts...)
	if err != nil {
		e.t.Fatalf("compass-server connect: %v", err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

// connInfo is what the server reports about a client connection.
func (e *env) connInfo(nc *nats.Conn) *server.ConnInfo {
	e.t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		e.t.Fatal(err)
	}
	cz, err := e.srv.Connz(&server.ConnzOptions{CID: cid, Username: true})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(cz.Conns) != 1 {
		e.t.Fatalf("connz for cid %d: %d conns", cid, len(cz.Conns))
	}
	return cz.Conns[0]
}
