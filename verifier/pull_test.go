package verifier

// Tests of Refetch, the operator's reload of every key set (SIGHUP, a
// changed cluster file): a signing key removed at the issuer, a leaked one,
// stops verifying when it returns.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/atomicfile"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// Log messages the tests wait for or read back.
const (
	msgRefetched = "runner cluster keys re-fetched on the operator's request"
	msgWaits     = "runner cluster key re-fetch waits for a load that began before the operator's request"
)

// notifyHandler passes records on to next and announces each one with
// message msg on seen (without blocking), so a test waits for the event
// rather than polling the log.
type notifyHandler struct {
	slog.Handler
	msg  string
	seen chan struct{}
}

func (h notifyHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Message == h.msg {
		select {
		case h.seen <- struct{}{}:
		default:
		}
	}
	return err
}

func (h notifyHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return notifyHandler{h.Handler.WithAttrs(as), h.msg, h.seen}
}

func (h notifyHandler) WithGroup(name string) slog.Handler {
	return notifyHandler{h.Handler.WithGroup(name), h.msg, h.seen}
}

// pullRig is one cluster "prod" on a test issuer, a verifier that logs as
// JSON and reports its loads, and the issuer's first signing key (A).
type pullRig struct {
	clk    *fakeClock
	is     *kubeissuer.Issuer
	v      *RunnerVerifier
	logs   *jsonLogs
	loads  chan LoadEvent
	waits  chan struct{} // msgWaits was logged
	kidA   string
	tokenA string // signed with A, verified once (so it is in the verified-token cache)
}

func newPullRig(t *testing.T, wrap func(http.Handler) http.Handler) *pullRig {
	t.Helper()
	r := &pullRig{clk: newClock(), logs: &jsonLogs{}, loads: make(chan LoadEvent, 64), waits: make(chan struct{}, 1)}
	if wrap == nil {
		wrap = func(h http.Handler) http.Handler { return h }
	}
	r.is = newIssuerWrapped(t, r.clk, wrap)
	log := slog.New(notifyHandler{r.logs.logger().Handler(), msgWaits, r.waits})
	v, err := New([]RunnerCluster{clusterFor(t, r.is, "prod")}, WithTenant("tenant-1"), WithClock(r.clk.Now),
		WithLogger(log), WithLoadHook(func(e LoadEvent) { r.loads <- e }))
	if err != nil {
		t.Fatal(err)
	}
	r.v = v
	mustRefresh(t, v)
	r.nextLoad(t, ReasonRefresh)
	r.kidA = r.is.SigningKey().KeyID
	r.tokenA = mustToken(t, r.is, "n")
	if _, err := verify(t, v, r.tokenA); err != nil {
		t.Fatal(err)
	}
	return r
}

// pull rotates the issuer to a new signing key (B) and removes A from its
// JWKS: the emergency of a leaked key A. It returns a token signed with B.
func (r *pullRig) pull(t *testing.T) string {
	t.Helper()
	if _, err := r.is.Rotate(); err != nil {
		t.Fatal(err)
	}
	r.is.Unpublish(r.kidA)
	return mustToken(t, r.is, "n")
}

// nextLoad returns the next load event, which must have the given reason.
func (r *pullRig) nextLoad(t *testing.T, why LoadReason) LoadEvent {
	t.Helper()
	select {
	case e := <-r.loads:
		if e.Reason != why || e.Cluster != "prod" {
			t.Fatalf("load event %+v, want cluster prod, reason %q", e, why)
		}
		return e
	case <-time.After(reloadWait):
		t.Fatalf("no %s load", why)
	}
	return LoadEvent{}
}

// noMoreLoads fails if a load event is pending.
func (r *pullRig) noMoreLoads(t *testing.T) {
	t.Helper()
	select {
	case e := <-r.loads:
		t.Fatalf("unexpected load %+v", e)
	default:
	}
}

// wantPulled checks that A's token, cached as verified, is refused and B's
// verifies.
func (r *pullRig) wantPulled(t *testing.T, tokenB string) {
	t.Helper()
	wantRefused(t, r.v, r.tokenA, "verifier: unauthenticated: cluster prod: no key with that kid")
	if _, err := verify(t, r.v, tokenB); err != nil {
		t.Fatalf("token signed with the new key: %v", err)
	}
}

// The operator's re-fetch is not held back by the kid-miss cooldown, nor
// does it use the cooldown up or reset it: a forged kid has just used the
// cluster's slot, so a kid miss cannot fetch for five minutes; Refetch
// fetches anyway, and the public's slot frees exactly when it would have.
func TestRefetch_BypassesKIDMissCooldown(t *testing.T) {
	r := newPullRig(t, nil)
	stranger, _ := testkeys.Key(kubeissuer.RS256)
	forged := forge(t, stranger, r.is)
	base := r.is.JWKSFetches()
	wantRefused(t, r.v, forged, "verifier: unauthenticated: cluster prod: no key with that kid")
	r.nextLoad(t, ReasonKIDMiss)
	if got := r.is.JWKSFetches() - base; got != 1 {
		t.Fatalf("%d fetches for the forged kid, want 1", got)
	}

	tokenB := r.pull(t)
	r.clk.Advance(time.Minute)
	// Inside the cooldown a kid miss fetches nothing: B is unknown, A trusted.
	wantRefused(t, r.v, tokenB, "verifier: unauthenticated: cluster prod: no key with that kid")
	if _, err := verify(t, r.v, r.tokenA); err != nil {
		t.Fatalf("A before the operator's re-fetch: %v", err)
	}
	if got := r.is.JWKSFetches() - base; got != 1 {
		t.Fatalf("%d fetches inside the cooldown, want still 1", got)
	}

	if err := r.v.Refetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e := r.nextLoad(t, ReasonOperator); e.Err != nil || e.Keys != 1 {
		t.Fatalf("operator load %+v, want one key and no error", e)
	}
	if got := r.is.JWKSFetches() - base; got != 2 {
		t.Fatalf("%d fetches after Refetch, want 2", got)
	}
	r.wantPulled(t, tokenB)
	recs := r.logs.records(t, msgRefetched)
	if len(recs) != 1 || recs[0]["cluster"] != "prod" || recs[0]["reason"] != "operator" ||
		fmt.Sprint(recs[0]["dropped_kids"]) != "["+r.kidA+"]" || fmt.Sprint(recs[0]["kids"]) != "["+r.is.SigningKey().KeyID+"]" {
		t.Fatalf("re-fetch records %v, want one for prod dropping A and keeping B", recs)
	}

	// The public's cooldown is as the forged kid left it: still on until
	// five minutes after it, then one more kid-miss fetch.
	r.clk.Advance(KIDMissCooldown - time.Minute - time.Second)
	wantRefused(t, r.v, forged, "verifier: unauthenticated: cluster prod: no key with that kid")
	if got := r.is.JWKSFetches() - base; got != 2 {
		t.Fatalf("%d fetches for a forged kid inside the cooldown after Refetch, want still 2", got)
	}
	r.clk.Advance(time.Second)
	wantRefused(t, r.v, forged, "verifier: unauthenticated: cluster prod: no key with that kid")
	if got := r.is.JWKSFetches() - base; got != 3 {
		t.Fatalf("%d fetches for a forged kid when the cooldown ended, want 3", got)
	}
}

// heldJWKS answers JWKS requests as the key set was when each arrived, but
// holds them while closed: a load in flight that began before the key was
// pulled brings back the old key set. It counts the requests being served
// at once.
type heldJWKS struct {
	mu       sync.Mutex
	closed   bool
	release  chan struct{}
	entered  chan struct{}
	inFlight int
	most     int
}

func newHeldJWKS() *heldJWKS {
	return &heldJWKS{release: make(chan struct{}), entered: make(chan struct{}, 8)}
}

func (h *heldJWKS) close() { h.mu.Lock(); h.closed = true; h.mu.Unlock() }

func (h *heldJWKS) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		h.closed = false
		close(h.release)
	}
}

func (h *heldJWKS) maxInFlight() int { h.mu.Lock(); defer h.mu.Unlock(); return h.most }

func (h *heldJWKS) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/openid/v1/jwks") {
			next.ServeHTTP(w, r)
			return
		}
		h.mu.Lock()
		h.inFlight++
		h.most = max(h.most, h.inFlight)
		held := h.closed
		h.mu.Unlock()
		defer func() { h.mu.Lock(); h.inFlight--; h.mu.Unlock() }()
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r) // the key set now
		if held {
			h.entered <- struct{}{}
			select {
			case <-h.release:
			case <-r.Context().Done():
				return
			}
		}
		for k, vs := range rec.Header() {
			w.Header()[k] = vs
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// A load in flight when the operator asks began before the request, and its
// answer may hold the pulled key: Refetch waits for it (one load at a time),
// then fetches again, and only that second answer is what it returns on.
func TestRefetch_WaitsOutALoadInFlightThenFetchesAgain(t *testing.T) {
	held := newHeldJWKS()
	r := newPullRig(t, held.wrap)
	base := r.is.JWKSFetches()

	held.close()
	refreshed := make(chan error, 1)
	go func() { refreshed <- r.v.Refresh(context.Background()) }()
	<-held.entered // the refresh has the key set with A, held
	tokenB := r.pull(t)
	refetched := make(chan error, 1)
	go func() { refetched <- r.v.Refetch(context.Background()) }()
	select {
	case <-r.waits:
	case <-time.After(reloadWait):
		t.Fatal("Refetch did not say it waits for the load in flight")
	}
	held.open()
	if err := <-refreshed; err != nil {
		t.Fatal(err)
	}
	if err := <-refetched; err != nil {
		t.Fatal(err)
	}
	if got := r.is.JWKSFetches() - base; got != 2 {
		t.Fatalf("%d JWKS fetches, want 2 (the held refresh, then the operator's)", got)
	}
	r.nextLoad(t, ReasonRefresh)
	r.nextLoad(t, ReasonOperator)
	r.noMoreLoads(t)
	if got := held.maxInFlight(); got != 1 {
		t.Fatalf("%d JWKS requests at once, want 1", got)
	}
	r.wantPulled(t, tokenB)
}

// Without a load in flight, Refetch begins one at once and says nothing of
// waiting; two at once each get a fetch that began after they were called,
// one at a time.
func TestRefetch_OneLoadAtATime(t *testing.T) {
	held := newHeldJWKS()
	r := newPullRig(t, held.wrap)
	base := r.is.JWKSFetches()

	held.close()
	first := make(chan error, 1)
	go func() { first <- r.v.Refetch(context.Background()) }()
	<-held.entered
	select {
	case <-r.waits:
		t.Fatal("the first Refetch said it waits, with no load in flight")
	default:
	}
	tokenB := r.pull(t)
	second := make(chan error, 1)
	go func() { second <- r.v.Refetch(context.Background()) }()
	select {
	case <-r.waits:
	case <-time.After(reloadWait):
		t.Fatal("the second Refetch did not wait for the first one's load")
	}
	held.open()
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if got := r.is.JWKSFetches() - base; got != 2 {
		t.Fatalf("%d JWKS fetches, want 2 (one for each Refetch)", got)
	}
	r.nextLoad(t, ReasonOperator)
	r.nextLoad(t, ReasonOperator)
	r.noMoreLoads(t)
	if got := held.maxInFlight(); got != 1 {
		t.Fatalf("%d JWKS requests at once, want 1", got)
	}
	r.wantPulled(t, tokenB)
}

// A token verified (and cached) with a key set is verified in full again
// once Refetch has replaced the set, so a pulled key stops at once through
// the verified-token cache too.
func TestRefetch_DropsCachedVerifications(t *testing.T) {
	r := newPullRig(t, nil)
	hits, misses := r.v.CacheStats()
	if _, err := verify(t, r.v, r.tokenA); err != nil {
		t.Fatal(err)
	}
	if h, m := r.v.CacheStats(); h != hits+1 || m != misses {
		t.Fatalf("A again before the pull: %d hits, %d misses, want one more hit", h-hits, m-misses)
	}
	tokenB := r.pull(t)
	if err := r.v.Refetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	hits, misses = r.v.CacheStats()
	wantRefused(t, r.v, r.tokenA, "verifier: unauthenticated: cluster prod: no key with that kid")
	if h, m := r.v.CacheStats(); h != hits || m != misses+1 {
		t.Fatalf("A after the pull: %d hits, %d misses, want one more miss", h-hits, m-misses)
	}
	if _, err := verify(t, r.v, tokenB); err != nil {
		t.Fatal(err)
	}
}

// A failed re-fetch keeps the last good key set, is logged, reported and
// returned with the cluster's name; the stale rule is unchanged, so a day
// of failures still discards the set.
func TestRefetch_FailureKeepsLastGoodKeys(t *testing.T) {
	var f fault
	r := newPullRig(t, f.wrap)
	f.set("503")
	err := r.v.Refetch(t.Context())
	want := `verifier: cluster "prod": key re-fetch: discovery: GET ` + r.is.URL() + `/.well-known/openid-configuration: status 503 Service Unavailable`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
	if e := r.nextLoad(t, ReasonOperator); e.Err == nil || e.Keys != 1 {
		t.Fatalf("failed operator load %+v, want its error and the one key still held", e)
	}
	if _, err := verify(t, r.v, r.tokenA); err != nil {
		t.Fatalf("the last good key set after a failed re-fetch: %v", err)
	}
	failed := r.logs.records(t, "runner cluster key fetch failed")
	if len(failed) != 1 || failed[0]["reason"] != "operator" || failed[0]["cluster"] != "prod" {
		t.Fatalf("failure records %v, want one for prod with reason operator", failed)
	}
	if recs := r.logs.records(t, msgRefetched); len(recs) != 0 {
		t.Fatalf("a failed re-fetch logged as done: %v", recs)
	}

	r.clk.Advance(StaleAfter + time.Second)
	if err := r.v.Refetch(t.Context()); err == nil {
		t.Fatal("Refetch from a failing issuer succeeded")
	}
	_, err = verify(t, r.v, r.tokenA)
	if !errors.Is(err, ErrKeysUnavailable) || !errors.Is(err, errStale) {
		t.Fatalf("after %v of failures: %v, want the stale key set refused", StaleAfter, err)
	}
}

// The cross-cluster shared-key check runs on the operator's load: a cluster
// that starts publishing another's key fails both closed.
func TestRefetch_SharedKeyCheck(t *testing.T) {
	clk := newClock()
	a, b := newIssuer(t, kubeissuer.RS256, clk), newIssuer(t, kubeissuer.RS256, clk)
	v := newVerifier(t, clk, clusterFor(t, a, "a"), clusterFor(t, b, "b"))
	mustRefresh(t, v)
	b.PublishKey(a.SigningKey(), false)
	if err := v.Refetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := v.Status()
	if st[0].Usable || st[1].Usable || !slices.Equal(st[0].SharedWith, []string{"b"}) || !slices.Equal(st[1].SharedWith, []string{"a"}) {
		t.Fatalf("status after the re-fetch = %+v, want both failing closed", st)
	}
}

// Refetch waits no longer than its context: a stalled issuer's load is
// given up when the caller's ctx ends.
func TestRefetch_StopsWithContext(t *testing.T) {
	held := newHeldJWKS()
	r := newPullRig(t, held.wrap)
	held.close()
	t.Cleanup(held.open)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.v.Refetch(ctx) }()
	<-held.entered
	cancel()
	select {
	case err := <-done:
		if want := `verifier: cluster "prod": key re-fetch: context canceled`; err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %s", err, want)
		}
	case <-time.After(reloadWait):
		t.Fatal("Refetch still waits after its ctx ended")
	}
	if _, err := verify(t, r.v, r.tokenA); err != nil {
		t.Fatalf("the key set in force while a re-fetch hangs: %v", err)
	}
}

// A reload keeps an unchanged cluster (its key set, cluster value and
// refresh) and fetches nothing itself; Refetch after it, as the daemons
// call it on every reload, fetches every cluster again, the unchanged one
// included, and its pulled key stops verifying.
func TestRefetch_UnchangedClusterAfterReload(t *testing.T) {
	p := newPair(t, kubeissuer.RS256, kubeissuer.ES256)
	clk, a, b, ra, rb := p.clk, p.a, p.b, p.ra, p.rb
	v, loaded := startedVerifier(t, clk, ra, rb)
	ca, cb := clusterNamed(t, v, "a"), clusterNamed(t, v, "b")
	oldB := mustToken(t, b, "n")
	if _, err := verify(t, v, oldB); err != nil {
		t.Fatal(err)
	}
	kidB := b.SigningKey().KeyID
	if _, err := b.Rotate(); err != nil {
		t.Fatal(err)
	}
	b.Unpublish(kidB)
	base, jwksBase := fetchesOf(a, b), a.JWKSFetches()+b.JWKSFetches()

	denied := ra
	denied.Deny = &NodeDeny{Nodes: []string{"other"}}
	mustReload(t, v, denied, rb)
	if got := fetchesOf(a, b) - base; got != 0 {
		t.Fatalf("Reload fetched %d times, want 0", got)
	}
	if _, err := verify(t, v, oldB); err != nil {
		t.Fatalf("the pulled key before Refetch: %v", err)
	}
	if err := v.Refetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := map[string]LoadReason{}
	for range 2 {
		select {
		case e := <-loaded:
			if e.Err != nil {
				t.Fatalf("load %+v", e)
			}
			got[e.Cluster] = e.Reason
		case <-time.After(reloadWait):
			t.Fatal("fewer than two loads")
		}
	}
	if got["a"] != ReasonOperator || got["b"] != ReasonOperator {
		t.Fatalf("loads %v, want an operator load of a and of b", got)
	}
	if n := a.JWKSFetches() + b.JWKSFetches() - jwksBase; n != 2 {
		t.Fatalf("%d JWKS fetches, want one per cluster", n)
	}
	wantRefused(t, v, oldB, "verifier: unauthenticated: cluster b: no key with that kid")
	wantVerifies(t, v, b, "n")
	wantVerifies(t, v, a, "n")
	if clusterNamed(t, v, "a") != ca || clusterNamed(t, v, "b") != cb {
		t.Fatal("Refetch replaced a cluster")
	}
	refreshRunning(t, ca)
	refreshRunning(t, cb)
}

// A jwksFile cluster's file is read again by Refetch: an operator pulls a
// key from it by rewriting the file and sending SIGHUP.
func TestRefetch_RereadsJWKSFile(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := atomicfile.Write(path, is.JWKS()); err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t, clk, RunnerCluster{Name: "static", Issuer: is.URL(), JWKSFile: path})
	old := mustToken(t, is, "n")
	if _, err := verify(t, v, old); err != nil {
		t.Fatal(err)
	}
	kid := is.SigningKey().KeyID
	if _, err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	is.Unpublish(kid)
	if err := atomicfile.Write(path, is.JWKS()); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, v, old); err != nil {
		t.Fatalf("the old key before Refetch (a jwksFile is read only when asked): %v", err)
	}
	if err := v.Refetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, v, old, "verifier: unauthenticated: cluster static: no key with that kid")
	wantVerifies(t, v, is, "n")
	if n := is.JWKSFetches() + is.DiscoveryFetches(); n != 0 {
		t.Fatalf("%d fetches for a jwksFile cluster, want 0", n)
	}
}
