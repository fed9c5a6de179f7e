package runner

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// events collects link events for a test to wait on.
type events struct {
	mu  sync.Mutex
	all []LinkEvent
	ch  chan struct{}
}

func newEvents() *events { return &events{ch: make(chan struct{}, 1)} }

func (e *events) add(ev LinkEvent) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

// wait blocks until pred holds over the events so far, or fails at the deadline.
func (e *events) wait(t *testing.T, d time.Duration, what string, pred func([]LinkEvent) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		ok := pred(e.all)
		e.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-e.ch:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

func count(kind LinkEventKind, n int) func([]LinkEvent) bool {
	return func(evs []LinkEvent) bool {
		c := 0
		for _, ev := range evs {
			if ev.Kind == kind {
				c++
			}
		}
		return c >= n
	}
}

// startRunner runs a Runner with a fixed ID against the stack until the test
// ends; it returns once the Runner is ready.
func startRunner(t *testing.T, st *stack, cfg Config) (*Runner, *events, *testlog.Buffer) {
	t.Helper()
	log, logs := newLog(t)
	evs := newEvents()
	cfg.Logger = log
	if cfg.NATSURL == "" {
		cfg.NATSURL = st.url
	}
	cfg.Link.OnEvent = evs.add
	if cfg.Link.CheckEvery == 0 {
		cfg.Link.CheckEvery = 20 * time.Millisecond
	}
	if cfg.Link.RotateJitter == 0 {
		cfg.Link.RotateJitter = 50 * time.Millisecond
	}
	cfg.Link.ReconnectWait, cfg.Link.ReconnectJitter, cfg.Link.MaxReconnectJitter = 50*time.Millisecond, 50*time.Millisecond, 200*time.Millisecond
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testutil.RunUntilCleanup(t, "Run", DrainTimeout+5*time.Second, r.Run)
	evs.wait(t, 10*time.Second, "connected", count(EventConnected, 1))
	return r, evs, logs
}

// command sends one command as the Server does and decodes the answer.
func command(t *testing.T, nc *nats.Conn, id, body string) Response {
	t.Helper()
	subj, err := subjects.Command(id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(subj, []byte(body), 5*time.Second)
	if err != nil {
		t.Fatalf("command %s: %v", body, err)
	}
	var resp Response
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		t.Fatalf("answer is not an envelope: %v: %s", err, m.Data)
	}
	return resp
}

func TestRunnerAnswersPingAndInfoOverNATS(t *testing.T) {
	st := newStack(t, stackOpts{})
	id := st.runnerID("node-1.example")
	path := st.tokenFile(t, "node-1.example", 0)
	tokens := NewFileToken(path, slog.New(slog.DiscardHandler), nil)
	r, _, logs := startRunner(t, st, Config{RunnerID: id, Version: "v1.2.3", Tokens: tokens, TokenFile: path, Heartbeat: 50 * time.Millisecond})

	hbSubj, _ := subjects.Event(id, "heartbeat")
	hb, err := st.server.SubscribeSync(hbSubj)
	if err != nil {
		t.Fatal(err)
	}
	resp := command(t, st.server, id, `{"command":"ping","args":{}}`)
	var pong PingResult
	if !resp.OK || json.Unmarshal(resp.Result, &pong) != nil || !pong.Pong || pong.RunnerID != id {
		t.Fatalf("ping answer = %+v", resp)
	}
	resp = command(t, st.server, id, `{"command":"info"}`)
	var info InfoResult
	if !resp.OK || json.Unmarshal(resp.Result, &info) != nil {
		t.Fatalf("info answer = %+v", resp)
	}
	exp, _ := tokens.Expiry()
	if info.RunnerID != id || info.Version != "v1.2.3" || info.TokenSource != "file" || info.TokenExpiry == nil ||
		!info.TokenExpiry.Equal(exp) || !info.NATS.Connected || info.NATS.ServerID != st.ns.ID() || info.NATS.ServerURL == "" {
		t.Fatalf("info = %+v", info)
	}
	resp = command(t, st.server, id, `{"command":"reboot"}`)
	if resp.OK || resp.Error != `unknown command "reboot"; known: info, ping` {
		t.Fatalf("unknown command answer = %+v", resp)
	}
	m, err := hb.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no heartbeat: %v", err)
	}
	var beat map[string]any
	if json.Unmarshal(m.Data, &beat) != nil || beat["runner_id"] != id {
		t.Fatalf("heartbeat = %s", m.Data)
	}
	if !r.Ready() {
		t.Fatal("not ready while connected")
	}
	tok, _ := tokens.Token()
	assertNoToken(t, logs.String(), tok)
}

func TestRunnerInboxIsUnderItsOwnSubjects(t *testing.T) {
	// The Runner's user JWT allows subscribing to its own inbox only: a
	// request from the Runner (nats.go's response subscription uses the
	// custom prefix) must get through the permissions.
	st := newStack(t, stackOpts{})
	id := st.runnerID("node-inbox")
	path := st.tokenFile(t, "node-inbox", 0)
	r, _, _ := startRunner(t, st, Config{RunnerID: id, Tokens: NewFileToken(path, nil, nil), TokenFile: path, Heartbeat: -1})
	l := r.Link()
	l.mu.Lock()
	nc := l.cur.nc
	l.mu.Unlock()
	inbox, _ := subjects.InboxPrefix(id)
	if got := nc.NewRespInbox(); !strings.HasPrefix(got, inbox+".") {
		t.Fatalf("response inbox %s is not under %s", got, inbox)
	}
	// The Runner may not subscribe to the default _INBOX.> (the server
	// refuses it): proof that the callout's scoped permissions are in force.
	// The handler goes in before the subscription, so the server's answer
	// cannot reach the Runner's own handler first.
	errs := make(chan error, 16)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	})
	sub, err := nc.SubscribeSync("_INBOX.x")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("err = %v, want a permissions violation", err)
		}
	case <-time.After(30 * time.Second): // the server answers within a round trip; this bounds a hang
		t.Fatal("subscribing to _INBOX.x was not refused")
	}
}

func TestRunnerReconnectsEarlyWhenTokenFileChanges(t *testing.T) {
	st := newStack(t, stackOpts{})
	node := "node-rotate"
	id := st.runnerID(node)
	r, evs, _, path, tokens := daemonSetRunner(t, st, node)
	// The first CONNECT's decision (recorded just after the answer, so
	// possibly after the Runner is up).
	before := st.calls.waitCount(t, 1, 10*time.Second)
	if resp := command(t, st.server, id, `{"command":"ping"}`); !resp.OK {
		t.Fatalf("ping = %+v", resp)
	}
	for i := 1; i <= 3; i++ {
		if _, err := st.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
			t.Fatal(err)
		}
		evs.wait(t, 10*time.Second, "early reconnect", count(EventHandover, i))
		if resp := command(t, st.server, id, `{"command":"ping"}`); !resp.OK {
			t.Fatalf("ping after rotation %d = %+v", i, resp)
		}
		l := r.Link()
		l.mu.Lock()
		sent := *l.cur.sent.Load()
		l.mu.Unlock()
		if cur, _ := tokens.Token(); sent != cur {
			t.Fatalf("rotation %d: the new connection did not CONNECT with the new token", i)
		}
	}
	if got := st.calls.waitCount(t, before+3, 10*time.Second) - before; got != 3 {
		t.Fatalf("callout answered %d CONNECTs for 3 rotations, want 3", got)
	}
	if st := r.Link().Status(); st.Handovers != 3 || st.Reconnects != 0 {
		t.Fatalf("status = %+v, want 3 early reconnects and no disconnect-driven reconnect", st)
	}
}

func TestRunnerStaysAnsweringAcrossUserJWTExpiries(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for several 5 s user-JWT lifetimes")
	}
	for _, tc := range []struct {
		name    string
		refresh time.Duration
	}{
		{"refresh configured below the lifetime", 3 * time.Second},
		{"lifetime learned from the first expiry", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStack(t, stackOpts{maxUserLifetime: 5 * time.Second})
			node := "node-expiry"
			id := st.runnerID(node)
			path := st.tokenFile(t, node, 0)
			r, evs, _ := startRunner(t, st, Config{RunnerID: id, Tokens: NewFileToken(path, nil, nil), TokenFile: path,
				Heartbeat: -1, Link: LinkConfig{Refresh: tc.refresh}})
			subj, _ := subjects.Command(id)
			var sent, answered, noResp atomic.Int64
			var lost []string
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					sent.Add(1)
					_, err := st.server.Request(subj, []byte(`{"command":"ping"}`), 2*time.Second)
					switch {
					case err == nil:
						answered.Add(1)
					case errors.Is(err, nats.ErrNoResponders):
						noResp.Add(1) // the Runner had no subscription: it was not connected
					default:
						lost = append(lost, err.Error())
					}
				}
			}()
			// Three handovers after the link knows the lifetime: >= 3 user JWTs replaced.
			evs.wait(t, 40*time.Second, "three early reconnects", count(EventHandover, 3))
			close(stop)
			<-done
			t.Logf("sent %d, answered %d, no responders %d, lost %d; status %+v", sent.Load(), answered.Load(), noResp.Load(), len(lost), r.Link().Status())
			if tc.refresh > 0 {
				if len(lost) != 0 || noResp.Load() != 0 {
					t.Fatalf("with refresh below the lifetime every command must be answered: lost %v, no responders %d", lost, noResp.Load())
				}
				if st := r.Link().Status(); st.Reconnects != 0 {
					t.Fatalf("the server cut the connection %d times", st.Reconnects)
				}
			} else {
				// One server-side expiry teaches the lifetime; at most the
				// command in flight at that cut can be lost.
				if len(lost) > 1 {
					t.Fatalf("lost %d commands: %v", len(lost), lost)
				}
			}
			if answered.Load() == 0 {
				t.Fatal("nothing answered")
			}
		})
	}
}

func TestRunnerSaysWhyWhenTokenRemovedAndExpired(t *testing.T) {
	// The token expired 50 s ago (issued 650 s ago with a 600 s lifetime):
	// both doors still accept it inside the verifier's 60 s leeway, and the
	// callout caps the user JWT at exp plus the leeway, 10 s from now. The
	// Runner, once its file is gone, has no usable token left.
	skew := 650 * time.Second
	st := newStack(t, stackOpts{issuerNow: func() time.Time { return time.Now().Add(-skew) }})
	node := "node-expired"
	id := st.runnerID(node)
	path := st.tokenFile(t, node, 0)
	log, logs := newLog(t)
	tokens := NewFileToken(path, log, nil)
	r, evs, rlogs := startRunner(t, st, Config{RunnerID: id, Tokens: tokens, TokenFile: path, Heartbeat: -1})
	if resp := command(t, st.server, id, `{"command":"ping"}`); !resp.OK {
		t.Fatalf("ping = %+v", resp)
	}
	tok, _ := tokens.Token()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	evs.wait(t, 20*time.Second, "an authorization violation", func(all []LinkEvent) bool {
		for _, ev := range all {
			if ev.Kind == EventAuthError && errors.Is(ev.Err, nats.ErrAuthorization) {
				return true
			}
		}
		return false
	})
	out := rlogs.String()
	if !strings.Contains(out, "NATS refused authorization: the Runner has no usable token") ||
		!strings.Contains(out, "last good token expired at") {
		t.Fatalf("the Runner does not say why it is not authorized:\n%s", out)
	}
	if !strings.Contains(logs.String(), "token file unreadable") {
		t.Fatalf("the token source did not log the unreadable file:\n%s", logs)
	}
	if r.Ready() {
		t.Fatal("ready while not authorized")
	}
	if learned := r.Link().learned.Load(); learned != 0 {
		t.Fatalf("an expiry caused by the token's own exp was learned as the user-JWT lifetime (%s)", time.Duration(learned))
	}
	assertNoToken(t, out+logs.String(), tok)
}

func TestLinkShutdownFinishesInFlightCommands(t *testing.T) {
	st := newStack(t, stackOpts{})
	node := "node-drain"
	id := st.runnerID(node)
	path := st.tokenFile(t, node, 0)
	started, release := make(chan struct{}), make(chan struct{})
	evs := newEvents()
	l, err := NewLink(LinkConfig{URL: st.url, RunnerID: id, Tokens: NewFileToken(path, nil, nil), OnEvent: evs.add,
		Logger: slog.New(slog.DiscardHandler),
		Handler: func(m *nats.Msg) {
			close(started)
			<-release
			_ = m.Respond([]byte(`{"ok":true}`))
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	evs.wait(t, 10*time.Second, "connected", count(EventConnected, 1))
	subj, _ := subjects.Command(id)
	reply := make(chan error, 1)
	go func() {
		m, err := st.server.Request(subj, []byte(`{"command":"slow"}`), 10*time.Second)
		if err == nil && string(m.Data) != `{"ok":true}` {
			err = errors.New("unexpected answer " + string(m.Data))
		}
		reply <- err
	}()
	<-started
	cancel() // SIGTERM while a command is in flight
	select {
	case <-done:
		t.Fatal("Run returned before the in-flight command finished")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-reply; err != nil {
		t.Fatalf("the in-flight command was not answered: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	evs.wait(t, time.Second, "closed", count(EventClosed, 1))
	// After the drain the Runner no longer takes commands.
	if _, err := st.server.Request(subj, []byte(`{"command":"ping"}`), time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("after shutdown: err = %v, want no responders", err)
	}
}

func TestHealthEndpoints(t *testing.T) {
	st := newStack(t, stackOpts{})
	id := st.runnerID("node-health")
	path := st.tokenFile(t, "node-health", 0)
	r, err := New(Config{RunnerID: id, Tokens: NewFileToken(path, nil, nil), TokenFile: path, NATSURL: st.url, Heartbeat: -1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.HealthHandler())
	defer srv.Close()
	get := func(p string) int {
		t.Helper()
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if get("/healthz") != 200 || get("/readyz") != 503 {
		t.Fatal("before enrollment: want healthz 200, readyz 503")
	}
	ready := make(chan struct{})
	r.cfg.OnReady = func(string) { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	if get("/readyz") != 200 {
		t.Fatal("connected: want readyz 200")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if get("/readyz") != 503 || get("/healthz") != 200 {
		t.Fatal("after shutdown: want readyz 503")
	}
}

// plannedResolver answers the callout's next requests as planned ("slow":
// after slowAnswer, whatever the deadline; "refuse": not authorized), then
// as the verifier does.
type plannedResolver struct {
	inner callout.Resolver
	mu    sync.Mutex
	plan  []string
}

// slowAnswer is past the latest first PING (2 s plus 20 %) and inside the
// server's 5 s authorization timeout: a callout that answers too late.
const slowAnswer = 2600 * time.Millisecond

func (p *plannedResolver) then(steps ...string) {
	p.mu.Lock()
	p.plan = append(p.plan, steps...)
	p.mu.Unlock()
}

func (p *plannedResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	p.mu.Lock()
	step := ""
	if len(p.plan) > 0 {
		step, p.plan = p.plan[0], p.plan[1:]
	}
	p.mu.Unlock()
	switch step {
	case "slow":
		timer := time.NewTimer(slowAnswer)
		defer timer.Stop()
		<-timer.C // deliberately not ctx: this callout ignores its deadline
		return p.inner.Resolve(context.WithoutCancel(ctx), tok, want)
	case "refuse":
		return verifier.Subject{}, errors.New("refused by the test's plan")
	}
	return p.inner.Resolve(ctx, tok, want)
}

// slowStack is the NATS plane with a planned callout in front of the real
// verifier, and the server's authorization timeout of deploy/nats (5 s).
type slowStack struct {
	*stack
	resolver *plannedResolver
}

func newSlowStack(t *testing.T) *slowStack {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Close() })
	pr := &plannedResolver{inner: verifiertest.Resolver(t, is, "test", "bootstrap")}
	calls := &calloutLog{}
	nc := natsembed.Start(t, natsembed.Config{Resolver: pr, Workers: 4, AuthTimeout: 5, Observe: calls.add})
	return &slowStack{stack: &stack{issuer: is, ns: nc.Server, url: nc.URL, cluster: "test", calls: calls}, resolver: pr}
}

// daemonSetRunner starts a Runner of node as the DaemonSet runs it: its
// projected token (the default lifetime) read from a file, no heartbeat.
// It returns the Runner, its events and log, the token file and the token
// source reading it.
func daemonSetRunner(t *testing.T, st *stack, node string) (*Runner, *events, *testlog.Buffer, string, *FileToken) {
	t.Helper()
	path := st.tokenFile(t, node, 0)
	tokens := NewFileToken(path, slog.New(slog.DiscardHandler), nil)
	r, evs, logs := startRunner(t, st, Config{RunnerID: st.runnerID(node), Tokens: tokens, TokenFile: path, Heartbeat: -1})
	return r, evs, logs, path, tokens
}

// runLink runs a Link until the test ends, with short reconnect waits.
func runLink(t *testing.T, st *slowStack, id string, tokens TokenSource) (*Link, *events, *testlog.Buffer) {
	t.Helper()
	log, logs := newLog(t)
	evs := newEvents()
	l, err := NewLink(LinkConfig{
		URL: st.url, RunnerID: id, Tokens: tokens, Handler: func(*nats.Msg) {},
		ReconnectWait: testReconnectWait, ReconnectJitter: 100 * time.Millisecond, MaxReconnectJitter: 200 * time.Millisecond,
		CheckEvery: 20 * time.Millisecond, RotateJitter: 50 * time.Millisecond,
		Logger: log, OnEvent: evs.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.RunUntilCleanup(t, "Run", DrainTimeout+5*time.Second, l.Run)
	return l, evs, logs
}

const testReconnectWait = 300 * time.Millisecond

// kinds lists the events' kinds in order, without those in skip.
func kinds(evs *events, skip ...LinkEventKind) []LinkEventKind {
	evs.mu.Lock()
	defer evs.mu.Unlock()
	var out []LinkEventKind
	for _, ev := range evs.all {
		if !slices.Contains(skip, ev.Kind) {
			out = append(out, ev.Kind)
		}
	}
	return out
}

func lastOf(evs *events, kind LinkEventKind) LinkEvent {
	evs.mu.Lock()
	defer evs.mu.Unlock()
	for i := len(evs.all) - 1; i >= 0; i-- {
		if evs.all[i].Kind == kind {
			return evs.all[i]
		}
	}
	return LinkEvent{}
}

const slowAuthLog = "NATS CONNECT not authorized in time: the server's first PING"

// A CONNECT whose callout answers after the server's first PING fails with
// nats.go's "expected 'PONG', got 'PING'". The Link recognises it, on the
// first connect and on a reconnect (where nats.go reports nothing), counts it
// apart from refusals, says so, and retries on its reconnect backoff.
func TestLinkCountsSlowAuthApartFromRefusals(t *testing.T) {
	st := newSlowStack(t)
	const node = "node-slow"
	id := st.runnerID(node)
	tok, err := st.issuer.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}

	// The first connect: too slow once, then connected.
	st.resolver.then("slow")
	l, evs, logs := runLink(t, st, id, StaticToken(tok))
	evs.wait(t, 20*time.Second, "connected", count(EventConnected, 1))
	if got, want := kinds(evs), []LinkEventKind{EventSlowAuth, EventConnected}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	slow, up := lastOf(evs, EventSlowAuth), lastOf(evs, EventConnected)
	if slow.Err == nil || slow.Err.Error() != slowAuthErr || !IsSlowAuth(slow.Err) {
		t.Fatalf("slow-auth event error %v, want %q", slow.Err, slowAuthErr)
	}
	if d := up.At.Sub(slow.At); d < testReconnectWait {
		t.Fatalf("reconnected %v after the slow CONNECT, before the %v reconnect wait", d, testReconnectWait)
	}
	if s := l.Status(); s.SlowAuths != 1 || s.AuthRefusals != 0 || !s.Connected {
		t.Fatalf("status %+v, want connected with 1 slow authorization and no refusal", s)
	}
	if n := strings.Count(logs.String(), slowAuthLog); n != 1 {
		t.Fatalf("the slow authorization is explained %d times, want once:\n%s", n, logs)
	}

	// A reconnect: refused once, too slow once, then back.
	st.resolver.then("refuse", "slow")
	cid := serverCID(t, st, id)
	if err := st.ns.DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	evs.wait(t, 30*time.Second, "reconnected", count(EventReconnected, 1))
	want := []LinkEventKind{EventSlowAuth, EventConnected, EventDisconnected, EventAuthError, EventSlowAuth, EventReconnected}
	if got := kinds(evs); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if s := l.Status(); s.SlowAuths != 2 || s.AuthRefusals != 1 || s.Reconnects != 1 {
		t.Fatalf("status %+v, want 2 slow authorizations, 1 refusal, 1 reconnect", s)
	}
	if err := lastOf(evs, EventSlowAuth).Err; !IsSlowAuth(err) {
		t.Fatalf("reconnect's slow-auth event error %v", err)
	}
	// Logged at most once a minute, with the refusal explained on its own.
	if n := strings.Count(logs.String(), slowAuthLog); n != 1 {
		t.Fatalf("the slow authorization is explained %d times within a minute, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "NATS refused authorization") {
		t.Fatalf("the refusal is not explained:\n%s", logs)
	}
	assertNoToken(t, logs.String(), tok)
}

// An early reconnect whose CONNECT is too slow keeps the current connection,
// counts the slow authorization and hands over on a later attempt.
func TestLinkHandoverAfterSlowAuth(t *testing.T) {
	st := newSlowStack(t)
	const node = "node-handover"
	id := st.runnerID(node)
	path := st.tokenFile(t, node, 0)
	tokens := NewFileToken(path, slog.New(slog.DiscardHandler), nil)
	l, evs, logs := runLink(t, st, id, tokens)
	evs.wait(t, 10*time.Second, "connected", count(EventConnected, 1))
	st.resolver.then("slow")
	if _, err := st.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	evs.wait(t, 10*time.Second, "a slow early reconnect", count(EventSlowAuth, 1))
	if s := l.Status(); !s.Connected || s.Session != 1 || s.Handovers != 0 || s.SlowAuths != 1 || s.AuthRefusals != 0 {
		t.Fatalf("status after the slow early reconnect %+v, want session 1 still connected, 1 slow authorization", s)
	}
	evs.wait(t, 20*time.Second, "the early reconnect", count(EventHandover, 1))
	if got, want := kinds(evs), []LinkEventKind{EventConnected, EventSlowAuth, EventHandover}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if !strings.Contains(logs.String(), slowAuthLog) || !strings.Contains(logs.String(), "early reconnect failed; keeping the current connection") {
		t.Fatalf("the slow early reconnect is not explained:\n%s", logs)
	}
}

// serverCID is the server's client ID of the Runner's connection.
func serverCID(t *testing.T, st *slowStack, id string) uint64 {
	t.Helper()
	cz, err := st.ns.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.AuthorizedUser == id {
			return c.Cid
		}
	}
	t.Fatalf("no connection of %s on the server", id)
	return 0
}
