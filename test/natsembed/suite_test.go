package natsembed

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/atomicfile"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/verifier"
)

// TestSuite is the callout's behaviour on a real nats-server, run in each
// NATS auth environment.
func TestSuite(t *testing.T) {
	for _, kind := range allEnvs {
		t.Run(string(kind), func(t *testing.T) {
			t.Run("RunnerConnectsAsItsID", func(t *testing.T) { testRunnerConnects(t, kind) })
			t.Run("PermissionViolations", func(t *testing.T) { testPermissionViolations(t, kind) })
			t.Run("NarrowUserJWT", func(t *testing.T) { testNarrowUserJWT(t, kind) })
			t.Run("RejectedAtConnect", func(t *testing.T) { testRejections(t, kind) })
			t.Run("KeysUnavailable", func(t *testing.T) { testKeysUnavailable(t, kind) })
			t.Run("MintedToken", func(t *testing.T) { testMinted(t, kind) })
			t.Run("ForgedAndReplayedRequests", func(t *testing.T) { testForged(t, kind) })
			t.Run("ExpiryAndRotation", func(t *testing.T) { testExpiry(t, kind) })
			t.Run("TwoReplicas", func(t *testing.T) { testReplicas(t, kind) })
			t.Run("KickOnRevocation", func(t *testing.T) { testKick(t, kind) })
		})
	}
}

const node = "ip-10-0-1-5.ec2.internal"
const runnerID = "prod/ip-10-0-1-5_ec2_internal"

func testRunnerConnects(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	e.startCallout(2, nil)
	srv := e.serverConn()

	inbox, _ := subjects.InboxPrefix(runnerID)
	nc, _, err := e.connectRunner(e.token(node, 0), nats.CustomInboxPrefix(inbox))
	if err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	ev := e.event()
	if ev.Outcome != callout.OutcomeAuthorized || ev.RunnerID != runnerID || ev.Cluster != "prod" {
		t.Fatalf("decision %+v", ev)
	}
	if ev.Sealed != (kind == configXKey || kind == operator) {
		t.Fatalf("sealed=%v in %s", ev.Sealed, kind)
	}
	ci := e.connInfo(nc)
	if ci.AuthorizedUser != runnerID {
		t.Fatalf("NATS user name %q, want the Runner ID %q", ci.AuthorizedUser, runnerID)
	}
	if ci.Account != e.account {
		t.Fatalf("account %q, want %q", ci.Account, e.account)
	}

	// It serves its cmd subject and the Server gets the reply.
	cmd, _ := subjects.Command(runnerID)
	sub, err := nc.Subscribe(cmd, func(m *nats.Msg) { _ = m.Respond(append([]byte("ok:"), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	reply, err := srv.Request(cmd, []byte("ping"), waitFor)
	if err != nil {
		t.Fatalf("command request: %v", err)
	}
	if string(reply.Data) != "ok:ping" {
		t.Fatalf("reply %q", reply.Data)
	}

	// It publishes its events and the Server receives them.
	evts, err := srv.SubscribeSync(subjects.AllEvents)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Flush(); err != nil {
		t.Fatal(err)
	}
	evt, _ := subjects.Event(runnerID, "heartbeat")
	if err := nc.Publish(evt, []byte("beat")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := evts.NextMsg(waitFor)
	if err != nil {
		t.Fatalf("event not received: %v", err)
	}
	if m.Subject != evt || string(m.Data) != "beat" {
		t.Fatalf("event %s %q", m.Subject, m.Data)
	}

	// Its own requests get replies on its inbox prefix.
	echo := "compass.runner.server.echo"
	if _, err := srv.Subscribe(echo, func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	_ = srv.Flush()
	// The Runner may not publish on the Server's subject: requests go through
	// its evt subjects; the reply comes back on its inbox.
	req, _ := subjects.Event(runnerID, "request")
	if _, err := srv.Subscribe(req, func(m *nats.Msg) { _ = m.Respond([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	_ = srv.Flush()
	resp, err := nc.Request(req, []byte("ping"), waitFor)
	if err != nil {
		t.Fatalf("runner request: %v", err)
	}
	if string(resp.Data) != "pong" || !strings.HasPrefix(resp.Subject, inbox+".") {
		t.Fatalf("reply %q on %s", resp.Data, resp.Subject)
	}
}

func testPermissionViolations(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	e.startCallout(1, nil)
	nc, errs, err := e.connectRunner(e.token(node, 0))
	if err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	otherCmd, _ := subjects.Command("prod/other-node")
	otherEvt, _ := subjects.Event("prod/other-node", "heartbeat")
	otherInbox, _ := subjects.InboxPrefix("prod/other-node")
	for _, subj := range []string{otherCmd, otherInbox + ".x", "_INBOX.>", "$SYS.>", ">", "compass.runner.*.cmd"} {
		t.Run("sub "+subj, func(t *testing.T) {
			if _, err := nc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			err := errs.next(t)
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "Subscription") {
				t.Fatalf("async error %v, want a subscription permission violation", err)
			}
		})
	}
	for _, subj := range []string{otherEvt, otherCmd, "_INBOX.abc", "$SYS.REQ.SERVER.PING", callout.Subject} {
		t.Run("pub "+subj, func(t *testing.T) {
			if err := nc.Publish(subj, []byte("x")); err != nil {
				t.Fatal(err)
			}
			err := errs.next(t)
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "Publish") {
				t.Fatalf("async error %v, want a publish permission violation", err)
			}
		})
	}
}

// A Runner's user JWT allows a standard client connection only (a WebSocket
// connection with the same token is refused), and records
// callout.MaxRunnerSubscriptions and callout.MaxRunnerPayload as its limits.
func testNarrowUserJWT(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	e.startCallout(1, nil)
	tok := e.token(node, 0)

	// The same token over the WebSocket listener: the callout authorizes, the
	// server refuses the connection type.
	if e.srv.WebsocketURL() == "" {
		t.Fatal("no WebSocket listener")
	}
	// The server writes -ERR 'Authorization Violation' and closes the socket
	// at once, so the client sees that error or, when its own write of PING
	// loses the race, the closed socket; never a connection.
	nc, err := nats.Connect(e.srv.WebsocketURL(), nats.Token(tok), nats.NoReconnect(), nats.Timeout(waitFor))
	if nc != nil {
		nc.Close()
	}
	if !errors.Is(err, nats.ErrAuthorization) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("WebSocket connect = %v, want an authorization violation (or the socket closed on it)", err)
	}

	closed := make(chan struct{})
	nc, errs, err := e.connectRunner(tok, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	cmd, _ := subjects.Command(runnerID)
	for i := range callout.MaxRunnerSubscriptions {
		if _, err := nc.SubscribeSync(cmd); err != nil {
			t.Fatalf("subscription %d: %v", i+1, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("within the limit: %v", err)
	default:
	}
	// nats-server (v2.15.2, client.go applyAccountLimits) reads Limits only
	// from a JWT the client presented itself, never from one an auth callout
	// issued: the user JWT's subscription and payload limits are recorded
	// but not enforced. What binds a Runner is the account's limits
	// (operator mode) and the server-wide max_subscriptions and max_payload.
	// This pins the upstream behaviour: when an upgrade starts enforcing the
	// user JWT's limits, the next subscription and message are refused and
	// this test fails, to be turned into the enforcing test.
	if _, err := nc.SubscribeSync(cmd); err != nil {
		t.Fatal(err)
	}
	evt, _ := subjects.Event(runnerID, "heartbeat")
	if err := nc.Publish(evt, make([]byte, callout.MaxRunnerPayload+1)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("nats-server now enforces a callout-issued user JWT's limits (%v): make this the enforcing test", err)
	case <-closed:
		t.Fatalf("nats-server now enforces a callout-issued user JWT's payload limit (%v): make this the enforcing test", nc.LastError())
	default:
	}
}

// rejection builds a token of one DL-440 rejection class.
type rejection struct {
	name    string
	token   func(t *testing.T, e *env) string
	cluster string // cluster named in the cause ("" when none is selected)
}

func signClaims(t *testing.T, e *env, edit func(map[string]any)) string {
	t.Helper()
	c := e.issuer.Claims(kubeissuer.Pod{NodeName: node}, 0)
	edit(c)
	tok, err := e.issuer.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func kubeClaim(c map[string]any) map[string]any { return c["kubernetes.io"].(map[string]any) }

var rejections = []rejection{
	{"wrong audience", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { c["aud"] = []string{"vault"} })
	}, "prod"},
	{"unknown issuer", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { c["iss"] = "https://elsewhere.example" })
	}, ""},
	{"empty kid", func(t *testing.T, e *env) string {
		k := e.issuer.SigningKey()
		k.KeyID = ""
		tok, err := kubeissuer.SignWith(k, e.issuer.Claims(kubeissuer.Pod{NodeName: node}, 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}, "prod"},
	{"expired", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) {
			c["iat"] = time.Now().Add(-700 * time.Second).Unix()
			c["nbf"] = c["iat"]
			c["exp"] = time.Now().Add(-100 * time.Second).Unix()
		})
	}, "prod"},
	{"not yet valid", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { c["nbf"] = time.Now().Add(5 * time.Minute).Unix() })
	}, "prod"},
	{"no exp", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { delete(c, "exp") })
	}, "prod"},
	{"lifetime over maxTokenLifetime", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { c["exp"] = time.Now().Add(2 * time.Hour).Unix() })
	}, "prod"},
	{"wrong sub", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { c["sub"] = "system:serviceaccount:default:default" })
	}, "prod"},
	{"wrong namespace", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { kubeClaim(c)["namespace"] = "default" })
	}, "prod"},
	{"wrong serviceaccount", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) {
			kubeClaim(c)["serviceaccount"] = map[string]any{"name": "default", "uid": "u"}
		})
	}, "prod"},
	{"no pod", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { delete(kubeClaim(c), "pod") })
	}, "prod"},
	{"no node", func(t *testing.T, e *env) string {
		return signClaims(t, e, func(c map[string]any) { delete(kubeClaim(c), "node") })
	}, "prod"},
	{"bad signature", func(t *testing.T, e *env) string {
		tok := e.token(node, 0)
		return tok[:len(tok)-6] + "AAAAAA"
	}, "prod"},
	{"alg none", func(t *testing.T, e *env) string {
		tok := e.token(node, 0)
		parts := strings.Split(tok, ".")
		hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"` + e.issuer.SigningKey().KeyID + `"}`))
		return hdr + "." + parts[1] + "."
	}, ""},
	{"HS256 with the public key as secret", func(t *testing.T, e *env) string {
		k := e.issuer.SigningKey()
		secret := []byte(e.issuer.JWKS())
		hk := jose.JSONWebKey{Key: secret, KeyID: k.KeyID, Algorithm: string(jose.HS256)}
		tok, err := kubeissuer.SignWith(hk, e.issuer.Claims(kubeissuer.Pod{NodeName: node}, 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}, ""},
	{"signed by another issuer's key", func(t *testing.T, e *env) string {
		other, err := kubeissuer.NewKey(kubeissuer.RS256)
		if err != nil {
			t.Fatal(err)
		}
		other.KeyID = e.issuer.SigningKey().KeyID
		tok, err := kubeissuer.SignWith(other, e.issuer.Claims(kubeissuer.Pod{NodeName: node}, 0), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}, "prod"},
}

func testRejections(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	e.startCallout(1, nil)
	lookups := e.store.lookups.Load()
	for _, rj := range rejections {
		t.Run(rj.name, func(t *testing.T) {
			tok := rj.token(t, e)
			_, _, err := e.connectRunner(tok)
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("connect error %v, want an authorization violation", err)
			}
			ev := e.event()
			if ev.Outcome != callout.OutcomeDenied || ev.Cluster != rj.cluster {
				t.Fatalf("decision %s cluster %q (%s), want denied for cluster %q", ev.Outcome, ev.Cluster, ev.Reason, rj.cluster)
			}
			if strings.Contains(e.logs.String(), tok) {
				t.Fatal("the callout log contains the token")
			}
		})
	}
	if got := e.store.lookups.Load(); got != lookups {
		t.Fatalf("%d minted-token lookups for JWS-shaped tokens, want 0", got-lookups)
	}
}

func testKeysUnavailable(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	e.startCallout(1, nil)
	tok, err := e.dark.Token(kubeissuer.Pod{NodeName: "node-d"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = e.connectRunner(tok)
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect error %v, want an authorization violation", err)
	}
	ev := e.event()
	if ev.Outcome != callout.OutcomeKeysUnavailable || ev.Cluster != "dark" {
		t.Fatalf("decision %+v", ev)
	}
	logs := e.logs.String()
	var line string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "runner refused") && strings.Contains(l, "cluster=dark") {
			line = l
		}
	}
	if !strings.Contains(line, "answer=\"runner cluster keys unavailable\"") || !strings.Contains(line, "keys unavailable") {
		t.Fatalf("no keys-unavailable cause with the cluster name in the callout log:\n%s", logs)
	}
	if strings.Contains(logs, tok) {
		t.Fatal("the callout log contains the token")
	}
}

func testMinted(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	e.startCallout(1, nil)
	tok := e.store.mint(t, "build-host-7")
	nc, _, err := e.connectRunner(tok)
	if err != nil {
		t.Fatalf("minted token connect: %v", err)
	}
	ev := e.event()
	if ev.Outcome != callout.OutcomeAuthorized || ev.RunnerID != "build-host-7" {
		t.Fatalf("decision %+v", ev)
	}
	if got := e.connInfo(nc).AuthorizedUser; got != "build-host-7" {
		t.Fatalf("user %q", got)
	}
	// A minted token gets the maximum lifetime (it has no exp of its own).
	if d := time.Until(ev.UserJWTExpiry); d < callout.DefaultMaxLifetime-5*time.Second || d > callout.DefaultMaxLifetime {
		t.Fatalf("minted user JWT lives %s", d)
	}

	// A JWS-shaped token never reaches the store, whatever it contains.
	before := e.store.lookups.Load()
	for _, jws := range []string{"a.b.c", tok[:10] + "." + tok[10:20] + "." + tok[20:], e.token("n", 0) + "x"} {
		if _, _, err := e.connectRunner(jws); !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect error %v", err)
		}
		if ev := e.event(); ev.Outcome != callout.OutcomeDenied {
			t.Fatalf("decision %+v", ev)
		}
	}
	if got := e.store.lookups.Load(); got != before {
		t.Fatalf("JWS-shaped tokens reached the minted-token store %d times", got-before)
	}
	// An unknown minted token is looked up and refused.
	unknown, _ := verifier.GenerateToken()
	if _, _, err := e.connectRunner(unknown); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect error %v", err)
	}
	if ev := e.event(); ev.Outcome != callout.OutcomeDenied {
		t.Fatalf("decision %+v", ev)
	}
	if e.store.lookups.Load() != before+1 {
		t.Fatal("unknown minted token not looked up once")
	}
}

// testForged: nobody but the server can put a request on the callout's
// subject, and a captured genuine request, replayed or altered, gets no user
// JWT from the responder that answered it.
func testForged(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	rp := e.startCallout(1, nil)
	// A second callout-account connection sees every genuine request (it is
	// not in the queue group): that is where a replay would start from.
	errs := make(asyncErrs, 4)
	spy, err := nats.Connect(e.srv.ClientURL(), append(e.calloutOpts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		errs <- err
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	seen, err := spy.SubscribeSync(callout.Subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.connectRunner(e.token(node, 0)); err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	if ev := e.event(); ev.Outcome != callout.OutcomeAuthorized {
		t.Fatalf("decision %+v", ev)
	}
	genuine, err := seen.NextMsg(waitFor)
	if err != nil {
		t.Fatal(err)
	}
	hdrKey := genuine.Header.Get(callout.XKeyHeader)
	if (hdrKey != "") != (kind == configXKey || kind == operator) {
		t.Fatalf("request sealed=%v in %s", hdrKey != "", kind)
	}

	// The server refuses a publish on the callout subject from the callout
	// account itself, so a forged request cannot even be delivered.
	if err := spy.PublishMsg(&nats.Msg{Subject: callout.Subject, Reply: "forged.reply", Header: genuine.Header, Data: genuine.Data}); err != nil {
		t.Fatal(err)
	}
	if err := errs.next(t); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("publish on %s: %v, want a permission violation", callout.Subject, err)
	}

	// What the responder does with the captured request if it got it again.
	ctx := t.Context()
	if resp, ev := rp.r.Answer(ctx, hdrKey, genuine.Data); resp != nil || ev.Reason != callout.DropReplayed {
		t.Fatalf("replay: %s/%s", ev.Outcome, ev.Reason)
	}
	late := e.startCallout(1, func(c *callout.Config) { c.Now = func() time.Time { return time.Now().Add(5 * time.Second) } })
	if resp, ev := late.r.Answer(ctx, hdrKey, genuine.Data); resp != nil || ev.Reason != callout.DropExpired {
		t.Fatalf("replay after expiry: %s/%s", ev.Outcome, ev.Reason)
	}
	fresh := e.startCallout(1, nil) // a replica that has not seen it
	if hdrKey == "" {
		// Re-signed by anyone but a server key.
		acct, _, _ := mustAccount(t)
		forged := testutil.ResignJWT(t, string(genuine.Data), acct, nil)
		if resp, ev := fresh.r.Answer(ctx, "", []byte(forged)); resp != nil || ev.Reason != callout.DropInvalid {
			t.Fatalf("not from a server key: %s/%s", ev.Outcome, ev.Reason)
		}
		// Flip one byte of the payload: the server's signature no longer holds.
		b := bytes.Clone(genuine.Data)
		b[len(b)/2] ^= 1
		if resp, ev := fresh.r.Answer(ctx, "", b); resp != nil || ev.Reason != callout.DropInvalid {
			t.Fatalf("altered: %s/%s", ev.Outcome, ev.Reason)
		}
		// A sealed-looking request to a responder without an xkey.
		if resp, ev := fresh.r.Answer(ctx, "XBADKEY", genuine.Data); resp != nil || ev.Reason != callout.DropSealMismatch {
			t.Fatalf("sealed without xkey: %s/%s", ev.Outcome, ev.Reason)
		}
	} else {
		// The sealed request with its header stripped is a plain request
		// where an xkey is configured.
		if resp, ev := fresh.r.Answer(ctx, "", genuine.Data); resp != nil || ev.Reason != callout.DropSealMismatch {
			t.Fatalf("plain with xkey: %s/%s", ev.Outcome, ev.Reason)
		}
		// Sealed, but claiming another server xkey.
		other := XKey(t)
		if resp, ev := fresh.r.Answer(ctx, other.Public(), genuine.Data); resp != nil || ev.Reason != callout.DropUndecryptable {
			t.Fatalf("other sender: %s/%s", ev.Outcome, ev.Reason)
		}
	}
	// The untouched request is still good for a replica that never saw it:
	// the checks above are what refused the others.
	if resp, ev := fresh.r.Answer(ctx, hdrKey, genuine.Data); resp == nil || ev.Outcome != callout.OutcomeAuthorized {
		t.Fatalf("control: %s/%s", ev.Outcome, ev.Reason)
	}
}

// testExpiry: the server disconnects a Runner when its user JWT expires, and
// a client re-reading its token file reconnects with the new token; with an
// expired token in the file it does not.
func testExpiry(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	const maxLife = 2 * time.Second
	e.startCallout(1, func(c *callout.Config) { c.MaxLifetime = maxLife })
	path := filepath.Join(e.dir, "token")
	if _, err := e.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 16)
	handler := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			return ""
		}
		served <- string(b)
		return string(b)
	}
	disconnected := make(chan error, 4)
	reconnected := make(chan struct{}, 4)
	nc, err := nats.Connect(e.srv.ClientURL(),
		nats.TokenHandler(handler),
		nats.ReconnectWait(50*time.Millisecond),
		nats.MaxReconnects(-1),
		// As compass-runner does: keep retrying through auth errors (keys
		// unavailable is transient) instead of nats.go's default abort.
		nats.IgnoreAuthErrorAbort(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { disconnected <- err }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	first := <-served
	ev := e.event()
	if ev.Outcome != callout.OutcomeAuthorized {
		t.Fatalf("decision %+v", ev)
	}
	connectedAt := time.Now()
	// Rotate the token file, as the kubelet does.
	if _, err := e.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-disconnected:
	case <-time.After(waitFor):
		t.Fatal("not disconnected at the user JWT's expiry")
	}
	if d := time.Since(connectedAt); d > maxLife+time.Second {
		t.Fatalf("disconnected after %s, user JWT capped at %s", d, maxLife)
	}
	select {
	case <-reconnected:
	case <-time.After(waitFor):
		t.Fatal("did not reconnect with the rotated token")
	}
	second := <-served
	if second == first {
		t.Fatal("reconnected with the old token")
	}
	if ev := e.event(); ev.Outcome != callout.OutcomeAuthorized || ev.RunnerID != runnerID {
		t.Fatalf("reconnect decision %+v", ev)
	}

	// Now the file holds an expired token: every reconnect is refused.
	claims := e.issuer.Claims(kubeissuer.Pod{NodeName: node}, 0)
	claims["iat"] = time.Now().Add(-700 * time.Second).Unix()
	claims["nbf"] = claims["iat"]
	claims["exp"] = time.Now().Add(-90 * time.Second).Unix()
	expired, err := e.issuer.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(path, []byte(expired)); err != nil {
		t.Fatal(err)
	}
	e.drainEvents()
	select {
	case <-disconnected:
	case <-time.After(waitFor):
		t.Fatal("not disconnected at the second user JWT's expiry")
	}
	for range 3 {
		if ev := e.event(); ev.Outcome != callout.OutcomeDenied {
			t.Fatalf("reconnect with an expired token: decision %+v", ev)
		}
	}
	if nc.IsConnected() {
		t.Fatal("connected with an expired token")
	}
	select {
	case <-reconnected:
		t.Fatal("reconnected with an expired token")
	default:
	}
}

// testReplicas: two replicas in the queue group; one is stopped mid-run and
// every client still connects through the other.
func testReplicas(t *testing.T, kind envKind) {
	e := newEnv(t, kind)
	a := e.startCallout(2, nil)
	b := e.startCallout(2, nil)
	const n = 40
	for i := range n {
		if i == n/2 {
			a.stop(t)
		}
		nc, _, err := e.connectRunner(e.token(fmt.Sprintf("node-%d", i), 0))
		if err != nil {
			t.Fatalf("connect %d (replica a stopped: %v): %v", i, i >= n/2, err)
		}
		nc.Close()
		if ev := e.event(); ev.Outcome != callout.OutcomeAuthorized {
			t.Fatalf("connect %d: decision %+v", i, ev)
		}
	}
	if a.served.Load() == 0 || b.served.Load() == 0 {
		t.Fatalf("served a=%d b=%d: both replicas should have answered before the stop", a.served.Load(), b.served.Load())
	}
	if a.served.Load()+b.served.Load() != n {
		t.Fatalf("served a=%d b=%d, want %d in all", a.served.Load(), b.served.Load(), n)
	}
}
