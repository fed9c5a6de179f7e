package verifier

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/kubeissuer"
)

// jsonLogs is a logger whose records a test reads back, one map per record.
type jsonLogs struct{ buf testlog.Buffer }

func (l *jsonLogs) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(&l.buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns the records with message msg, in order.
func (l *jsonLogs) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	recs, err := l.buf.JSONRecords(msg)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// gate holds an issuer's JWKS requests while closed: each held request is
// announced on entered and waits for open (or its own end).
type gate struct {
	mu      sync.Mutex
	closed  bool
	release chan struct{}
	entered chan struct{}
}

func newGate() *gate {
	return &gate{release: make(chan struct{}), entered: make(chan struct{}, 8)}
}

func (g *gate) close() { g.mu.Lock(); g.closed = true; g.mu.Unlock() }

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.release)
	}
}

func (g *gate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		held := g.closed && strings.HasSuffix(r.URL.Path, "/openid/v1/jwks")
		g.mu.Unlock()
		if held {
			g.entered <- struct{}{}
			select {
			case <-g.release:
			case <-r.Context().Done():
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// Every cluster loads its keys in its own flight: clusters added by later
// reloads never join a load of another cluster that is in flight. The loads
// of the first four clusters are held open while the last two (added three
// at a time, then one) are verified; a cluster whose load joined a held one
// would wait for it and fail at the fetch timeout.
func TestEachClusterLoadsInItsOwnFlight(t *testing.T) {
	clk := newClock()
	gates := map[string]*gate{}
	issuers := map[string]*kubeissuer.Issuer{}
	clusters := map[string]RunnerCluster{}
	for _, name := range []string{"a", "b", "d", "e", "g", "f"} {
		gates[name] = newGate()
		issuers[name] = newIssuerWrapped(t, clk, gates[name].wrap)
		clusters[name] = clusterFor(t, issuers[name], name)
	}
	list := func(names ...string) []RunnerCluster {
		var out []RunnerCluster
		for _, n := range names {
			out = append(out, clusters[n])
		}
		return out
	}
	v := newVerifier(t, clk, list("a", "b")...)
	mustReload(t, v, list("a", "b", "d", "e", "g")...)
	mustReload(t, v, list("a", "b", "d", "e", "g", "f")...)

	var wg sync.WaitGroup
	held := map[string]error{}
	var mu sync.Mutex
	for _, name := range []string{"a", "b", "d", "e"} {
		gates[name].close()
		tok := mustToken(t, issuers[name], "n")
		wg.Go(func() {
			_, err := verify(t, v, tok)
			mu.Lock()
			held[name] = err
			mu.Unlock()
		})
		<-gates[name].entered
	}
	for _, name := range []string{"g", "f"} {
		wantVerifies(t, v, issuers[name], "n")
	}
	for _, g := range gates {
		g.open()
	}
	wg.Wait()
	for name, err := range held {
		if err != nil {
			t.Fatalf("cluster %s, verified during its held load: %v", name, err)
		}
	}
	for name, is := range issuers {
		if n := is.JWKSFetches(); n != 1 {
			t.Fatalf("cluster %s: %d JWKS fetches, want 1", name, n)
		}
	}
}

// Reload logs what changed: the clusters added and removed, and the kept
// clusters whose deny list changed (a change of nodeUIDs alone counts; a new
// cluster's deny list is not a change).
func TestReload_LogsWhatChanged(t *testing.T) {
	clk := newClock()
	var logs jsonLogs
	var cs []RunnerCluster
	for _, name := range []string{"a", "b", "c", "d"} {
		cs = append(cs, clusterFor(t, newIssuer(t, kubeissuer.ES256, clk), name))
	}
	a, b, c, d := cs[0], cs[1], cs[2], cs[3]
	a.Deny = &NodeDeny{Nodes: []string{"n1"}, NodeUIDs: []string{"u1"}}
	v, err := New([]RunnerCluster{a, b, c}, WithClock(clk.Now), WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	a.Deny = &NodeDeny{Nodes: []string{"n1"}, NodeUIDs: []string{"u2"}}
	d.Deny = &NodeDeny{Nodes: []string{"n3"}}
	mustReload(t, v, a, b, d)
	recs := logs.records(t, "runner clusters reloaded")
	if len(recs) != 1 {
		t.Fatalf("%d reload records, want 1: %s", len(recs), logs.buf.String())
	}
	got := fmt.Sprint(recs[0]["clusters"], recs[0]["added"], recs[0]["removed"], recs[0]["deny_changed"])
	if want := "[a b d] [d] [c] [a]"; got != want {
		t.Fatalf("clusters, added, removed, deny_changed = %s, want %s", got, want)
	}
}

// A key shared between clusters is logged once per change, with both
// clusters named, at error level; when the sharing ends each cluster logs
// that it no longer shares a key. A cluster that publishes one key twice
// (under two kids) still has its other keys checked.
func TestSharedKey_Logs(t *testing.T) {
	clk := newClock()
	var logs jsonLogs
	a, b := newIssuer(t, kubeissuer.RS256, clk), newIssuer(t, kubeissuer.RS256, clk)
	own := a.SigningKey()
	again := own
	again.KeyID = "the-same-key-again"
	a.PublishKey(again, false)
	shared := b.SigningKey()
	a.PublishKey(shared, false)
	v, err := New([]RunnerCluster{clusterFor(t, a, "a"), clusterFor(t, b, "b")}, WithClock(clk.Now), WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	_ = v.Refresh(context.Background())
	_ = v.Refresh(context.Background()) // nothing changed: nothing more is logged
	failing := logs.records(t, "runner cluster fails closed: a signing key is shared with another cluster")
	if len(failing) != 2 {
		t.Fatalf("%d fail-closed records, want 2 (one per cluster): %s", len(failing), logs.buf.String())
	}
	var got []string
	for _, r := range failing {
		if r["level"] != "ERROR" {
			t.Fatalf("record %v: want level ERROR", r)
		}
		got = append(got, fmt.Sprint(r["cluster"], " shares with ", r["shared_with"]))
	}
	slices.Sort(got)
	if want := "a shares with b,b shares with a"; strings.Join(got, ",") != want {
		t.Fatalf("fail-closed records %q, want %q", got, want)
	}
	if st := v.Status(); st[0].Usable || st[1].Usable {
		t.Fatalf("status %+v: both clusters must fail closed", st)
	}
	if recs := logs.records(t, "runner cluster no longer shares a signing key"); len(recs) != 0 {
		t.Fatalf("no-longer-shares records while sharing: %v", recs)
	}

	a.Unpublish(shared.KeyID)
	mustRefresh(t, v)
	ended := logs.records(t, "runner cluster no longer shares a signing key")
	var endedFor []string
	for _, r := range ended {
		if r["level"] != "INFO" {
			t.Fatalf("record %v: want level INFO", r)
		}
		endedFor = append(endedFor, fmt.Sprint(r["cluster"]))
	}
	slices.Sort(endedFor)
	if strings.Join(endedFor, ",") != "a,b" {
		t.Fatalf("no-longer-shares records for %q, want a and b", endedFor)
	}
	if n := len(logs.records(t, "runner cluster fails closed: a signing key is shared with another cluster")); n != 2 {
		t.Fatalf("%d fail-closed records after the sharing ended, want still 2", n)
	}
	wantVerifies(t, v, a, "n")
	wantVerifies(t, v, b, "n")
}

// caFile works whatever the base client's transport: none (the default
// transport is cloned) or a bare one with no TLS configuration.
func TestCAFile_AnyBaseTransport(t *testing.T) {
	for name, base := range map[string]*http.Client{
		"no transport":   {},
		"bare transport": {Transport: &http.Transport{}},
		// HTTP/2 off: Clone leaves no TLS configuration to build on.
		"HTTP/2 disabled": {Transport: &http.Transport{TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}},
	} {
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			is := newIssuer(t, kubeissuer.ES256, clk)
			v, err := New([]RunnerCluster{clusterFor(t, is, "prod")}, WithHTTPClient(base), WithClock(clk.Now), WithLogger(testLogger()))
			if err != nil {
				t.Fatal(err)
			}
			mustRefresh(t, v)
			wantVerifies(t, v, is, "n")
		})
	}
}

// A fetch follows at most five redirects, each on https.
func TestFetch_RedirectLimit(t *testing.T) {
	for _, tc := range []struct {
		hops int
		ok   bool
	}{{5, true}, {6, false}} {
		t.Run(fmt.Sprint(tc.hops), func(t *testing.T) {
			clk := newClock()
			is := newIssuerWrapped(t, clk, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					var hop int
					fmt.Sscan(r.URL.Query().Get("hop"), &hop)
					if strings.HasSuffix(r.URL.Path, "/openid/v1/jwks") && hop < tc.hops {
						http.Redirect(w, r, fmt.Sprintf("https://%s%s?hop=%d", r.Host, r.URL.Path, hop+1), http.StatusFound)
						return
					}
					next.ServeHTTP(w, r)
				})
			})
			v := newVerifier(t, clk, clusterFor(t, is, "prod"))
			err := v.Refresh(context.Background())
			if tc.ok {
				if err != nil {
					t.Fatalf("%d redirects: %v", tc.hops, err)
				}
				wantVerifies(t, v, is, "n")
				return
			}
			wantErr(t, err, fmt.Sprintf(`cluster "prod": jwks: Get "%s?hop=6": more than 5 redirects`, is.JWKSURL()))
		})
	}
}
