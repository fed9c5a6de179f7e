package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
)

// scrape GETs /metrics from h and returns every sample by its name and
// labels as printed ("name{a=\"x\"}"), and the whole text.
func scrape(t *testing.T, h http.Handler) (map[string]float64, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	body, _ := io.ReadAll(rec.Body)
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("unparsable sample %q", line)
		}
		out[line[:i]] = v
	}
	return out, string(body)
}

// waitSample waits until the sample named key has the value want.
func waitSample(t *testing.T, h http.Handler, key string, want float64) {
	t.Helper()
	var got float64
	var ok bool
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("%s = %g", key, want), func() bool {
		s, _ := scrape(t, h)
		got, ok = s[key]
		return ok && got == want
	})
}

// The Runner's /metrics, on the health listener, follows a real Runner on
// the real NATS plane: its connection, the commands it answers by outcome,
// its reconnects by cause, its token's source and time left; and it never
// shows the token.
func TestRunnerMetricsFollowTheRunner(t *testing.T) {
	st := newStack(t, stackOpts{})
	const node = "node-metrics"
	id := st.runnerID(node)
	r, evs, logs, path, tokens := daemonSetRunner(t, st, node)
	h := r.HealthHandler()

	s, text := scrape(t, h)
	for _, k := range []string{`compass_runner_commands_total{command="ping",outcome="ok"}`, `compass_runner_commands_total{command="info",outcome="ok"}`} {
		if v, ok := s[k]; !ok || v != 0 {
			t.Fatalf("%s before any command: %v (present %v), want 0", k, v, ok)
		}
	}
	if s["compass_runner_nats_connected"] != 1 || s["compass_runner_enrolled"] != 1 || s[`compass_runner_token_source_info{source="file"}`] != 1 {
		t.Fatalf("a connected Runner's metrics:\n%s", text)
	}
	exp, _ := tokens.Expiry()
	left := s["compass_runner_token_remaining_seconds"]
	if want := time.Until(exp).Seconds(); left <= 0 || left > want+1 || left < want-5 {
		t.Fatalf("token remaining %v s, want about %v s", left, want)
	}

	for _, body := range []string{
		`{"command":"ping"}`, `{"command":"ping"}`, `{"command":"info"}`, // ok
		`{"command":"ping","args":{"x":1}}`, // the command fails: ping takes no arguments
		`{"command":"reboot"}`,              // unknown: counted as other
		`not json`,                          // invalid
	} {
		command(t, st.server, id, body)
	}
	for key, want := range map[string]float64{
		`compass_runner_commands_total{command="ping",outcome="ok"}`:       2,
		`compass_runner_commands_total{command="info",outcome="ok"}`:       1,
		`compass_runner_commands_total{command="ping",outcome="error"}`:    1,
		`compass_runner_commands_total{command="other",outcome="unknown"}`: 1,
		`compass_runner_commands_total{command="other",outcome="invalid"}`: 1,
		`compass_runner_command_replies_total{result="sent"}`:              6,
		`compass_runner_command_replies_total{result="failed"}`:            0,
	} {
		waitSample(t, h, key, want)
	}
	if s, _ := scrape(t, h); strings.Contains(fmt.Sprint(s), "reboot") {
		t.Fatal("an unknown command's name became a label value")
	}

	// The server drops the connection: one disconnect, one network reconnect.
	cz, err := st.ns.Connz(nil)
	if err != nil {
		t.Fatal(err)
	}
	var cid uint64
	for _, c := range cz.Conns {
		if c.Name == "compass-runner/"+id {
			cid = c.Cid
		}
	}
	if err := st.ns.DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	evs.wait(t, 20*time.Second, "reconnected", count(EventReconnected, 1))
	waitSample(t, h, "compass_runner_nats_disconnects_total", 1)
	waitSample(t, h, `compass_runner_nats_reconnects_total{cause="network"}`, 1)

	// The kubelet rotates the token: an early reconnect with the new one.
	if _, err := st.issuer.WriteTokenFile(path, kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	evs.wait(t, 20*time.Second, "the early reconnect", count(EventHandover, 1))
	waitSample(t, h, `compass_runner_nats_reconnects_total{cause="rotation"}`, 1)
	waitSample(t, h, "compass_runner_nats_connected", 1)

	s, text = scrape(t, h)
	for _, key := range []string{
		`compass_runner_nats_connect_failures_total{cause="authorization_refused"}`,
		`compass_runner_nats_connect_failures_total{cause="slow_auth"}`,
		`compass_runner_nats_connect_failures_total{cause="network"}`,
		"compass_runner_nats_authorization_expired_total",
	} {
		if v, ok := s[key]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0 on a healthy plane", key, v, ok)
		}
	}
	tok, _ := tokens.Token()
	assertNoToken(t, text+logs.String(), tok)
	if strings.Contains(text, id) {
		t.Fatal("the metrics show the Runner ID")
	}
}

// Failed connection attempts are counted by cause: a refusal and a slow
// authorization from a planned callout in front of the real verifier, and a
// dial to an address where nothing listens.
func TestRunnerMetricsCountConnectFailuresByCause(t *testing.T) {
	st := newSlowStack(t)
	const node = "node-failures"
	id := st.runnerID(node)
	tok, err := st.issuer.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	h := m.Handler()
	evs := newEvents()
	link := func(url string) {
		l, err := NewLink(LinkConfig{
			URL: url, RunnerID: id, Tokens: StaticToken(tok), Handler: func(*nats.Msg) {},
			ReconnectWait: 100 * time.Millisecond, ReconnectJitter: 50 * time.Millisecond, MaxReconnectJitter: 100 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler), OnEvent: func(ev LinkEvent) { m.observeLink(ev); evs.add(ev) },
		})
		if err != nil {
			t.Fatal(err)
		}
		testutil.RunUntilCleanup(t, "Run", DrainTimeout+5*time.Second, l.Run)
	}
	st.resolver.then("refuse", "slow")
	link(st.url)
	evs.wait(t, 30*time.Second, "connected", count(EventConnected, 1))
	waitSample(t, h, `compass_runner_nats_connect_failures_total{cause="authorization_refused"}`, 1)
	waitSample(t, h, `compass_runner_nats_connect_failures_total{cause="slow_auth"}`, 1)
	if s, text := scrape(t, h); s[`compass_runner_nats_connect_failures_total{cause="network"}`] != 0 {
		t.Fatalf("a network failure counted where there was none:\n%s", text)
	}

	link("tls://" + testutil.FreeAddr(t))
	testutil.Eventually(t, 20*time.Second, "a network failure counted", func() bool {
		s, _ := scrape(t, h)
		return s[`compass_runner_nats_connect_failures_total{cause="network"}`] >= 1
	})
	if s, text := scrape(t, h); s[`compass_runner_nats_connect_failures_total{cause="authorization_refused"}`] != 1 {
		t.Fatalf("a network failure counted as a refusal:\n%s", text)
	}
}

// The token gauges, for each source: a projected (JWT) token's time left by
// the injected clock, a minted opaque token's none.
func TestRunnerMetricsTokenSource(t *testing.T) {
	clock := newClock()
	jwt := signedToken(t, clock.Now().Add(300*time.Second))
	path := t.TempDir() + "/token"
	writeFile(t, path, jwt)
	file := NewFileToken(path, slog.New(slog.DiscardHandler), clock.Now)
	if _, err := file.Token(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		tokens    TokenSource
		tokenFile string
		source    string
		remaining float64 // 0: absent
	}{
		{"projected token file", file, path, "file", 300},
		{"static JWT", StaticToken(jwt), "", "static", 300},
		{"minted opaque token", StaticToken(mintedToken(t)), "", "static", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(Config{RunnerID: "runner-1", Tokens: tc.tokens, TokenFile: tc.tokenFile, NATSURL: "tls://127.0.0.1:4222", Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			s, text := scrape(t, r.HealthHandler())
			if s[`compass_runner_token_source_info{source="`+tc.source+`"}`] != 1 || len(filter(s, "compass_runner_token_source_info")) != 1 {
				t.Fatalf("token source, want %s:\n%s", tc.source, text)
			}
			got, ok := s["compass_runner_token_remaining_seconds"]
			if tc.remaining == 0 && ok || tc.remaining != 0 && got != tc.remaining {
				t.Fatalf("token remaining %v (present %v), want %v", got, ok, tc.remaining)
			}
			if s["compass_runner_nats_connected"] != 0 || s["compass_runner_enrolled"] != 0 {
				t.Fatalf("a Runner not started reports itself connected:\n%s", text)
			}
		})
	}
	// Time passes by the Runner's clock.
	r, err := New(Config{RunnerID: "runner-1", Tokens: StaticToken(jwt), NATSURL: "tls://127.0.0.1:4222", Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(400 * time.Second)
	if s, _ := scrape(t, r.HealthHandler()); s["compass_runner_token_remaining_seconds"] != -100 {
		t.Fatalf("an expired token's remaining seconds %v, want -100", s["compass_runner_token_remaining_seconds"])
	}
}

func filter(s map[string]float64, prefix string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		if strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return out
}

// Every Enroll attempt is counted by its result: the retried Unavailable
// ones, the refusal that ends the retries, and success.
func TestRunnerMetricsCountEnrollAttempts(t *testing.T) {
	d := newDoor(t)
	path := t.TempDir() + "/token"
	writeFile(t, path, mintedToken(t))
	client := d.unaryClient(NewFileToken(path, nil, nil))
	m := NewMetrics()
	r := Retry{Logger: slog.New(slog.DiscardHandler), OnAttempt: m.ObserveEnroll,
		Jitter: func(time.Duration) time.Duration { return 0 },
		After:  elapsed}
	call := echoCall(client)
	d.fail = []connect.Code{connect.CodeUnavailable, connect.CodeUnavailable}
	if err := r.Do(context.Background(), "Enroll", call); err != nil {
		t.Fatal(err)
	}
	d.fail = []connect.Code{connect.CodePermissionDenied}
	if err := r.Do(context.Background(), "Enroll", call); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("err %v, want permission_denied", err)
	}
	s, text := scrape(t, m.Handler())
	want := map[string]float64{
		`compass_runner_enroll_attempts_total{result="ok"}`:                1,
		`compass_runner_enroll_attempts_total{result="unavailable"}`:       2,
		`compass_runner_enroll_attempts_total{result="permission_denied"}`: 1,
	}
	if got := filter(s, "compass_runner_enroll_attempts_total"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("enroll attempts %v, want %v\n%s", got, want, text)
	}
}

// One Metrics serves one Runner: a second Runner on it would mix their
// states in one set of gauges, so New refuses it.
func TestRunnerMetricsServeOneRunner(t *testing.T) {
	m := NewMetrics()
	cfg := Config{RunnerID: "runner-1", Tokens: StaticToken(mintedToken(t)), NATSURL: "tls://127.0.0.1:4222", Metrics: m}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "runner: metrics") {
		t.Fatalf("a second Runner on the same Metrics: %v", err)
	}
}

// The server expires a user JWT the Runner has not replaced yet (the
// callout caps it at 5 s and the Runner has not learned that): counted as an
// expiry, not as a refusal, and followed by a network reconnect.
func TestRunnerMetricsCountAnExpiredAuthorization(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a 5 s user-JWT lifetime")
	}
	st := newStack(t, stackOpts{maxUserLifetime: 5 * time.Second})
	const node = "node-metrics-expiry"
	id := st.runnerID(node)
	path := st.tokenFile(t, node, 0)
	r, evs, _ := startRunner(t, st, Config{RunnerID: id, Tokens: NewFileToken(path, nil, nil), TokenFile: path, Heartbeat: -1})
	h := r.HealthHandler()
	evs.wait(t, 20*time.Second, "the server-side expiry", func(all []LinkEvent) bool {
		for _, ev := range all {
			if ev.Kind == EventAuthError && errors.Is(ev.Err, nats.ErrAuthExpired) {
				return true
			}
		}
		return false
	})
	waitSample(t, h, "compass_runner_nats_authorization_expired_total", 1)
	evs.wait(t, 20*time.Second, "connected again", func(all []LinkEvent) bool {
		return count(EventReconnected, 1)(all) || count(EventHandover, 1)(all)
	})
	waitSample(t, h, "compass_runner_nats_connected", 1)
	if s, text := scrape(t, h); s[`compass_runner_nats_connect_failures_total{cause="authorization_refused"}`] != 0 {
		t.Fatalf("an expiry counted as a refusal:\n%s", text)
	}
}
