package natsretry_test

import (
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsretry"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
)

// wait bounds every wait of these tests; the backoff below retries every
// few tens of milliseconds.
const wait = 20 * time.Second

// fast is a backoff that keeps the tests short.
func fast(cfg natsretry.Config) natsretry.Config {
	cfg.Wait, cfg.Jitter, cfg.MaxJitter = 10*time.Millisecond, 10*time.Millisecond, 40*time.Millisecond
	return cfg
}

// startServer runs a nats-server on port with one user, svc, whose password
// is password, and returns it with its options.
func startServer(t *testing.T, port int, password string) (*server.Server, *server.Options) {
	t.Helper()
	opts := &server.Options{
		Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "svc", Password: password}},
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(wait) {
		t.Fatalf("nats-server on port %d not ready after %s", port, wait)
	}
	return ns, opts
}

// watched connects as svc with password through a Watch of cfg and returns
// the connection, a channel of failure causes and a channel closed at the
// first connect.
func watched(t *testing.T, port int, password string, cfg natsretry.Config) (*nats.Conn, *natsretry.Watch, <-chan string, <-chan struct{}) {
	t.Helper()
	causes := make(chan string, 1024)
	up := make(chan struct{})
	cfg.OnFailure = func(c string) {
		select {
		case causes <- c:
		default:
		}
	}
	cfg.OnConnect = func(*nats.Conn, bool) {
		select {
		case <-up:
		default:
			close(up)
		}
	}
	w := natsretry.New(cfg)
	opts := append(w.Options(), nats.UserInfo("svc", password), nats.Name("natsretry-test"))
	nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(port), opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	w.Bind(nc)
	t.Cleanup(nc.Close)
	return nc, w, causes, up
}

// receive takes n causes from ch, failing with what after wait.
func receive(t *testing.T, ch <-chan string, n int, what string) []string {
	t.Helper()
	var got []string
	deadline := time.After(wait)
	for len(got) < n {
		select {
		case c := <-ch:
			got = append(got, c)
		case <-deadline:
			t.Fatalf("%s: %d failed attempts after %s, want %d (%v)", what, len(got), wait, n, got)
		}
	}
	return got
}

func waitUp(t *testing.T, up <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-up:
	case <-time.After(wait):
		t.Fatalf("%s: not connected after %s", what, wait)
	}
}

// A connection refused for its credentials keeps trying, however many times
// the same refusal comes (nats.go closes it for good after two), says why at
// ERROR in the server's words, and connects once the server accepts it.
func TestRefusedCredentialsAreRetriedUntilAccepted(t *testing.T) {
	port := testutil.FreePort(t)
	ns, base := startServer(t, port, "the-new-password")
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	nc, w, causes, up := watched(t, port, "the-old-password", fast(natsretry.Config{
		Prefix: "svc", Attrs: []any{"connection", "kick"}, Logger: log,
	}))

	// Five refusals in a row: nats.go's default gives up at the second.
	for i, c := range receive(t, causes, 5, "refused") {
		if c != natsretry.CauseAuthorization {
			t.Fatalf("failure %d: cause %q, want %q", i, c, natsretry.CauseAuthorization)
		}
	}
	if nc.IsClosed() {
		t.Fatal("the connection closed for good after repeated refusals")
	}
	if w.Up() {
		t.Fatal("Up() while refused")
	}
	if err := w.LastFailure(); !natsretry.IsAuthorization(err) {
		t.Fatalf("LastFailure() = %v, want an authorization error", err)
	}
	logs.WaitFor(t, wait, `level=ERROR msg="svc: NATS refused the connection's credentials`, 1)
	// Logged once, not once per attempt: the same cause is repeated only
	// every LogEvery.
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Fatalf("%d ERROR records for one cause, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{`connection=kick`, `error="nats: Authorization Violation"`, `cause=authorization_refused`} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the ERROR record lacks %s:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "the-old-password") {
		t.Fatal("the log shows the password")
	}

	// The operator completes the change: the server now accepts the
	// password the daemon has.
	opts := base.Clone()
	opts.Users = []*server.User{{Username: "svc", Password: "the-old-password"}}
	if err := ns.ReloadOptions(opts); err != nil {
		t.Fatal(err)
	}
	waitUp(t, up, "after the server accepts the password")
	if !w.Up() || w.LastFailure() != nil {
		t.Fatalf("connected, yet Up() = %v, LastFailure() = %v", w.Up(), w.LastFailure())
	}
	logs.WaitFor(t, wait, `level=INFO msg="svc: NATS connected" connection=kick url=nats://127.0.0.1:`+strconv.Itoa(port), 1)
	logs.WaitFor(t, wait, `after_failures=`, 1)
}

// A connection started before any server is up retries the dial, counts
// each failure as network, and connects when a server comes.
func TestNoServerYetIsRetriedUntilOneIsUp(t *testing.T) {
	port := testutil.FreePort(t)
	var logs testlog.Buffer
	_, _, causes, up := watched(t, port, "pw", fast(natsretry.Config{
		Prefix: "svc", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}))
	for i, c := range receive(t, causes, 3, "no server") {
		if c != natsretry.CauseNetwork {
			t.Fatalf("failure %d: cause %q, want %q", i, c, natsretry.CauseNetwork)
		}
	}
	logs.WaitFor(t, wait, `level=ERROR msg="svc: cannot connect to NATS: no server answered; retrying for ever"`, 1)
	startServer(t, port, "pw")
	waitUp(t, up, "after the server starts")
}

// A connection that was up and is then refused (the server's users changed
// under it) keeps reconnecting past two refusals.
func TestRefusedOnReconnectIsRetried(t *testing.T) {
	port := testutil.FreePort(t)
	ns, base := startServer(t, port, "pw")
	var logs testlog.Buffer
	nc, w, causes, up := watched(t, port, "pw", fast(natsretry.Config{
		Prefix: "svc", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}))
	waitUp(t, up, "first connect")

	reconnected := make(chan struct{}, 1)
	nc.SetReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} })
	opts := base.Clone()
	opts.Users = []*server.User{{Username: "svc", Password: "another"}}
	if err := ns.ReloadOptions(opts); err != nil {
		t.Fatal(err)
	}
	// The reload ends the connection whose credentials no longer pass.
	receive(t, causes, 4, "refused on reconnect")
	if nc.IsClosed() {
		t.Fatal("the connection closed for good after repeated refusals on reconnect")
	}
	if w.Up() {
		t.Fatal("Up() while refused")
	}
	opts = base.Clone()
	opts.Users = []*server.User{{Username: "svc", Password: "pw"}}
	if err := ns.ReloadOptions(opts); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(wait):
		t.Fatalf("not reconnected %s after the server accepts the password again", wait)
	}
}

func TestDelayDoublesItsWindowUpToTheCap(t *testing.T) {
	d := natsretry.Delay(time.Second, 100*time.Millisecond, 400*time.Millisecond)
	for _, tc := range []struct {
		attempts int
		max      time.Duration
	}{{1, 1100 * time.Millisecond}, {2, 1200 * time.Millisecond}, {3, 1400 * time.Millisecond}, {10, 1400 * time.Millisecond}} {
		for range 200 {
			if got := d(tc.attempts); got < time.Second || got >= tc.max {
				t.Fatalf("Delay(attempt %d) = %s, want in [1s, %s)", tc.attempts, got, tc.max)
			}
		}
	}
	if got := natsretry.Delay(time.Second, 0, 0)(3); got != time.Second {
		t.Fatalf("no jitter: %s, want 1s", got)
	}
}

// garbage is a listener that answers every connection with a line that is
// not INFO and closes it: an attempt that dials and fails its handshake.
func garbage(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("NOT-INFO\r\n"))
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}

// Every refusal of a reconnect is counted, also when another server of the
// same round fails otherwise after it (a TLS name a learned address does
// not match, on a real cluster): the round's last error alone would hide
// the refusal.
func TestRefusalCountedWhenTheRoundEndsOtherwise(t *testing.T) {
	port := testutil.FreePort(t)
	ns, base := startServer(t, port, "pw")
	causes := make(chan string, 1024)
	up := make(chan struct{}, 1)
	w := natsretry.New(fast(natsretry.Config{Prefix: "svc",
		OnFailure: func(c string) {
			select {
			case causes <- c:
			default:
			}
		},
		OnConnect: func(*nats.Conn, bool) {
			select {
			case up <- struct{}{}:
			default:
			}
		},
	}))
	// The real server first, the one that fails its handshake last, in
	// every round.
	opts := append(w.Options(), nats.UserInfo("svc", "pw"), nats.DontRandomize())
	nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(port)+",nats://"+garbage(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	w.Bind(nc)
	t.Cleanup(nc.Close)
	select {
	case <-up:
	case <-time.After(wait):
		t.Fatalf("not connected after %s", wait)
	}
	o := base.Clone()
	o.Users = []*server.User{{Username: "svc", Password: "another"}}
	if err := ns.ReloadOptions(o); err != nil {
		t.Fatal(err)
	}
	refused := 0
	deadline := time.After(wait)
	for refused < 3 {
		select {
		case c := <-causes:
			if c == natsretry.CauseAuthorization {
				refused++
			}
		case <-deadline:
			t.Fatalf("%d refusals counted after %s, want 3: the round's last, failing attempt hid them", refused, wait)
		}
	}
}
