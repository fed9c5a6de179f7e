package podwatch_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/podwatch"
)

// The names the tests watch, DL-440's.
const (
	namespace = "compass-runner"
	selector  = "app.kubernetes.io/name=compass-runner"
	node1     = "ip-10-0-1-5.ec2.internal"
	node2     = "ip-10-0-1-6.ec2.internal"
	token1    = "watcher-token-1-eyJhbGciOiJSUzI1NiJ9.c2lnbmF0dXJlLW9uZQ"
	token2    = "watcher-token-2-eyJhbGciOiJSUzI1NiJ9.c2lnbmF0dXJlLXR3bw"
)

// fakeAPI stands in for an API server's pods endpoint, for what the real
// one cannot be made to do (send a malformed or oversized event, fall
// silent, answer 5xx); the live tier (test/kube) watches a real
// kube-apiserver. A list is answered by list; each watch request takes the
// next script from watches, in order.
type fakeAPI struct {
	srv       *httptest.Server
	caFile    string
	tokenFile string
	watches   chan script

	mu       sync.Mutex
	list     script    // guarded by mu
	requests []request // guarded by mu
}

// script answers one request.
type script func(w http.ResponseWriter, r *http.Request)

// request is what the fake saw of one request.
type request struct {
	kind  string // list or watch
	query map[string]string
	auth  string
}

func newFakeAPI(t testing.TB) *fakeAPI {
	t.Helper()
	f := &fakeAPI{watches: make(chan script, 64)}
	f.list = listOf("10")
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	dir := t.TempDir()
	f.caFile = filepath.Join(dir, "ca.crt")
	f.tokenFile = filepath.Join(dir, "token")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	if err := errors.Join(os.WriteFile(f.caFile, ca, 0o600), os.WriteFile(f.tokenFile, []byte(token1+"\n"), 0o600)); err != nil {
		t.Fatal(err)
	}
	return f
}

const podsPath = "/api/v1/namespaces/" + namespace + "/pods"

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != podsPath || r.Method != http.MethodGet {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	req := request{kind: "list", query: map[string]string{}, auth: r.Header.Get("Authorization")}
	for k, v := range r.URL.Query() {
		req.query[k] = strings.Join(v, ",")
	}
	if req.query["watch"] != "" {
		req.kind = "watch"
	}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	list := f.list
	f.mu.Unlock()
	if req.kind == "list" {
		list(w, r)
		return
	}
	select {
	case s := <-f.watches:
		s(w, r)
	case <-r.Context().Done():
	}
}

func (f *fakeAPI) setList(s script) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = s
}

// seen is the requests so far.
func (f *fakeAPI) seen() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.requests...)
}

func (f *fakeAPI) count(kind string) int {
	n := 0
	for _, r := range f.seen() {
		if r.kind == kind {
			n++
		}
	}
	return n
}

func (f *fakeAPI) config() podwatch.Config {
	return podwatch.Config{Server: f.srv.URL, TokenFile: f.tokenFile, CAFile: f.caFile, Namespace: namespace, LabelSelector: selector}
}

// pod is a Pod as kube-apiserver encodes it in a watch event (kind and
// apiVersion set), with the fields a real one has around the ones decoded.
func pod(uid, name, node, rv string, deleting bool) string {
	del := ""
	if deleting {
		del = `"deletionTimestamp":"2026-07-01T12:00:30Z","deletionGracePeriodSeconds":30,`
	}
	return `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"` + name + `","generateName":"compass-runner-","namespace":"` + namespace +
		`","uid":"` + uid + `","resourceVersion":"` + rv + `","creationTimestamp":"2026-07-01T11:00:00Z",` + del +
		`"labels":{"app.kubernetes.io/name":"compass-runner"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"compass-runner","uid":"d5","controller":true}]},` +
		`"spec":{"serviceAccountName":"compass-runner","nodeName":"` + node + `","containers":[{"name":"runner","image":"example.invalid/runner:1"}]},` +
		`"status":{"phase":"Running","message":"ok","reason":"r"}}`
}

func event(typ, obj string) string { return `{"type":"` + typ + `","object":` + obj + "}\n" }

func bookmark(rv string) string {
	return event("BOOKMARK", `{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"`+rv+`","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}`)
}

func statusEvent(code int, reason, msg string) string {
	m, _ := json.Marshal(msg)
	return event("ERROR", fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%s,"reason":%q,"code":%d}`, m, reason, code))
}

// listOf answers a list with items (pods as the list encodes them: no kind
// nor apiVersion), in one page at resourceVersion rv.
func listOf(rv string, items ...string) script {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":%q},"items":[%s]}`, rv, strings.Join(items, ","))
	}
}

// item is pod as a list holds it.
func item(uid, name, node, rv string, deleting bool) string {
	return strings.Replace(pod(uid, name, node, rv, deleting), `"kind":"Pod","apiVersion":"v1",`, "", 1)
}

// stream answers a watch with events, then ends it (end) or holds it open
// until the client leaves.
func stream(end bool, events ...string) script {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for _, e := range events {
			_, _ = w.Write([]byte(e))
			w.(http.Flusher).Flush()
		}
		if !end {
			<-r.Context().Done()
		}
	}
}

// gated is s, once release is closed (or the client leaves).
func gated(release <-chan struct{}, s script) script {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			s(w, r)
		case <-r.Context().Done():
		}
	}
}

// status answers with code and a metav1.Status of msg.
func status(code int, msg string) script {
	return func(w http.ResponseWriter, r *http.Request) {
		m, _ := json.Marshal(msg)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%s,"code":%d}`, m, code)
	}
}

// gones records what onGone reports.
type gones struct {
	mu   sync.Mutex
	list []podwatch.Gone
	ch   chan podwatch.Gone
}

func newGones() *gones { return &gones{ch: make(chan podwatch.Gone, 1024)} }

func (g *gones) onGone(x podwatch.Gone) {
	g.mu.Lock()
	g.list = append(g.list, x)
	g.mu.Unlock()
	g.ch <- x
}

func (g *gones) all() []podwatch.Gone {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]podwatch.Gone(nil), g.list...)
}

// next waits for the next report.
func (g *gones) next(t *testing.T) podwatch.Gone {
	t.Helper()
	select {
	case x := <-g.ch:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no pod reported within 10 s")
		return podwatch.Gone{}
	}
}

// clock is a settable clock for WithClock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// jsonLogger logs JSON lines to buf, without the time.
func jsonLogger(buf *testlog.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
}

// running is a Watcher started by start.
type running struct {
	w    *podwatch.Watcher
	logs *testlog.Buffer
	g    *gones
	clk  *clock
	stop func() error // cancels Run and returns what it returned
}

// start makes a Watcher of f with opts (fast backoff, a clock, a logger
// unless given) and runs it until the test ends or stop is called; setup
// runs between New and Run.
func start(t *testing.T, f *fakeAPI, setup func(*running), opts ...podwatch.Option) *running {
	t.Helper()
	r := &running{logs: &testlog.Buffer{}, g: newGones(), clk: newClock()}
	opts = append([]podwatch.Option{podwatch.WithBackoff(time.Millisecond, 4*time.Millisecond),
		podwatch.WithClock(r.clk.Now), podwatch.WithLogger(jsonLogger(r.logs))}, opts...)
	w, err := podwatch.New(f.config(), r.g.onGone, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.w = w
	if setup != nil {
		setup(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var runErr error
	r.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				runErr = errors.New("Run did not return within 10 s of its ctx ending")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := r.stop(); !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
		noWatcherGoroutines(t)
	})
	return r
}

// records are the JSON log records with message msg, without retry_in
// (jittered).
func (r *running) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	recs, err := r.logs.JSONRecords(msg)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		delete(rec, "retry_in")
	}
	return recs
}

// waitFor waits until cond holds, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// noWatcherGoroutines fails if a goroutine of package podwatch is left.
func noWatcherGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "identity/podwatch.") && !strings.Contains(g, "podwatch_test.") {
			t.Errorf("a goroutine of package podwatch outlives Run:\n%s", g)
		}
	}
}
