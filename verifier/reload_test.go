package verifier

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// reloadWait bounds each wait on a goroutine of the verifier.
const reloadWait = 10 * time.Second

// fetchesOf counts the discovery and JWKS requests the issuers have served.
func fetchesOf(issuers ...*kubeissuer.Issuer) int64 {
	var n int64
	for _, is := range issuers {
		n += is.JWKSFetches() + is.DiscoveryFetches()
	}
	return n
}

// clusterNamed returns the verifier's current cluster value for name.
func clusterNamed(t *testing.T, v *RunnerVerifier, name string) *cluster {
	t.Helper()
	c := v.clusters.Load().byName[name]
	if c == nil {
		t.Fatalf("no cluster %q (have %v)", name, v.Clusters())
	}
	return c
}

// refreshEnded waits until c's refresh goroutine has returned.
func refreshEnded(t *testing.T, c *cluster) {
	t.Helper()
	select {
	case <-c.life.done:
	case <-time.After(reloadWait):
		t.Fatalf("cluster %s: refresh goroutine still running", c.cfg.Name)
	}
}

// refreshRunning checks that c's refresh goroutine started and has not returned.
func refreshRunning(t *testing.T, c *cluster) {
	t.Helper()
	if c.life.done == nil {
		t.Fatalf("cluster %s: no refresh goroutine", c.cfg.Name)
	}
	select {
	case <-c.life.done:
		t.Fatalf("cluster %s: refresh goroutine ended", c.cfg.Name)
	default:
	}
}

// loadWatched is a verifier of clusters on clk (the system clock when nil),
// not started, whose key loads arrive on the returned channel.
func loadWatched(t *testing.T, clk *fakeClock, clusters []RunnerCluster, opts ...Option) (*RunnerVerifier, chan LoadEvent) {
	t.Helper()
	var now func() time.Time
	if clk != nil {
		now = clk.Now
	}
	loaded := make(chan LoadEvent, 256)
	v, err := New(clusters, append([]Option{WithClock(now), WithLogger(testLogger()),
		WithLoadHook(func(e LoadEvent) { loaded <- e })}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v, loaded
}

// startedVerifier builds a verifier with a load hook, starts it until the
// test ends and waits for the first load of every fetched cluster, so that
// fetch counts taken afterwards see only what the test causes.
func startedVerifier(t *testing.T, clk *fakeClock, clusters ...RunnerCluster) (*RunnerVerifier, chan LoadEvent) {
	t.Helper()
	v, loaded := loadWatched(t, clk, clusters, WithTenant("tenant-1"))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v.Start(ctx)
	for range clusters {
		select {
		case ev := <-loaded:
			if ev.Err != nil {
				t.Fatalf("first load: %+v", ev)
			}
		case <-time.After(reloadWait):
			t.Fatal("no first load")
		}
	}
	return v, loaded
}

func mustReload(t *testing.T, v *RunnerVerifier, clusters ...RunnerCluster) {
	t.Helper()
	if err := v.Reload(clusters); err != nil {
		t.Fatalf("Reload: %v", err)
	}
}

func wantVerifies(t *testing.T, v *RunnerVerifier, is *kubeissuer.Issuer, node string) {
	t.Helper()
	if _, err := verify(t, v, mustToken(t, is, node)); err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
}

func wantRefused(t *testing.T, v *RunnerVerifier, tok, want string) {
	t.Helper()
	_, err := verify(t, v, tok)
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrKeysUnavailable) {
		t.Fatalf("err = %v: want the unauthenticated failure shape", err)
	}
}

// A cluster whose configuration is unchanged but for its deny list keeps its
// key set (no fetch), its kid-miss cooldown and its refresh goroutine; the new
// deny list applies from the next Verify, and dropping it lets the node in again.
func TestReload_UnchangedClusterKeepsKeysAndDenyTakesEffect(t *testing.T) {
	p := newPair(t, kubeissuer.RS256, kubeissuer.ES256)
	a, b, ra, rb := p.a, p.b, p.ra, p.rb
	v, _ := startedVerifier(t, p.clk, ra, rb)
	ca, cb := clusterNamed(t, v, "a"), clusterNamed(t, v, "b")
	refreshRunning(t, ca)
	refreshRunning(t, cb)
	// Use up a's kid-miss fetch slot.
	stranger, _ := testkeys.Key(kubeissuer.RS256)
	forged := forge(t, stranger, a)
	wantRefused(t, v, forged, "verifier: unauthenticated: cluster a: no key with that kid")
	loadedAt := v.Status()[0].LoadedAt
	base := fetchesOf(a, b)

	const node = "ip-10-0-1-5.ec2.internal"
	wantVerifies(t, v, a, node)
	denied := ra
	denied.Deny = &NodeDeny{Nodes: []string{node}, NodeUIDs: []string{"5d0c6a3e-1b7f-4b8e-9c2a-7f3e1d2c4b5a"}}
	mustReload(t, v, denied, rb)

	wantRefused(t, v, mustToken(t, a, node), "verifier: unauthenticated: cluster a: node denied: node ip-10-0-1-5.ec2.internal is in deny.nodes")
	byUID, err := a.Token(kubeissuer.Pod{NodeName: "other", NodeUID: "5d0c6a3e-1b7f-4b8e-9c2a-7f3e1d2c4b5a"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, v, byUID, "verifier: unauthenticated: cluster a: node denied: node other uid 5d0c6a3e-1b7f-4b8e-9c2a-7f3e1d2c4b5a is in deny.nodeUIDs")
	wantVerifies(t, v, a, "ip-10-0-1-6.ec2.internal")
	wantVerifies(t, v, b, node) // b's deny list is its own
	// The kid-miss cooldown survived: another unknown kid fetches nothing.
	wantRefused(t, v, forged, "verifier: unauthenticated: cluster a: no key with that kid")
	if got := fetchesOf(a, b) - base; got != 0 {
		t.Fatalf("%d fetches after reloading unchanged clusters, want 0", got)
	}
	if clusterNamed(t, v, "a") != ca || clusterNamed(t, v, "b") != cb {
		t.Fatal("an unchanged cluster was replaced")
	}
	if st := v.Status()[0]; !st.Usable || !st.LoadedAt.Equal(loadedAt) {
		t.Fatalf("a's status after the reload = %+v, want usable and loaded at %v", st, loadedAt)
	}
	refreshRunning(t, ca)
	refreshRunning(t, cb)

	// The caller's slice is the caller's: editing it later changes nothing.
	denied.Deny.Nodes[0] = "someone-else"
	wantRefused(t, v, mustToken(t, a, node), "verifier: unauthenticated: cluster a: node denied: node ip-10-0-1-5.ec2.internal is in deny.nodes")

	// Dropping the deny list lets the node in again, still without a fetch.
	mustReload(t, v, ra, rb)
	wantVerifies(t, v, a, node)
	if got := fetchesOf(a, b) - base; got != 0 {
		t.Fatalf("%d fetches, want 0", got)
	}
}

// A removed cluster's refresh goroutine ends and its tokens are refused from
// the next Verify; the remaining cluster is untouched.
func TestReload_RemovedClusterRefused(t *testing.T) {
	p := newPair(t, kubeissuer.RS256, kubeissuer.RS256)
	a, b, ra, rb := p.a, p.b, p.ra, p.rb
	v, _ := startedVerifier(t, p.clk, ra, rb)
	cb := clusterNamed(t, v, "b")
	tok := mustToken(t, b, "n")
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	base := fetchesOf(a, b)

	mustReload(t, v, ra)
	wantRefused(t, v, tok, "verifier: unauthenticated: unknown issuer")
	refreshEnded(t, cb)
	refreshRunning(t, clusterNamed(t, v, "a"))
	wantVerifies(t, v, a, "n")
	if got := v.Clusters(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Clusters() = %v", got)
	}
	if st := v.Status(); len(st) != 1 || st[0].Name != "a" {
		t.Fatalf("Status() = %+v", st)
	}
	if got := fetchesOf(a, b) - base; got != 0 {
		t.Fatalf("%d fetches, want 0", got)
	}
	// A load of the removed cluster that finishes late installs nothing.
	if err := v.refresh(context.Background(), cb); err != nil {
		t.Fatal(err)
	}
	if got := v.Clusters(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Clusters() after a late load = %v", got)
	}
	wantRefused(t, v, tok, "verifier: unauthenticated: unknown issuer")

	// Removing every cluster leaves a verifier that refuses every token.
	mustReload(t, v)
	wantRefused(t, v, mustToken(t, a, "n"), "verifier: unauthenticated: unknown issuer")
	r := NewResolver(v, nil)
	_, err := r.Resolve(context.Background(), mustToken(t, a, "n"), SubjectRunner)
	if err == nil || err.Error() != "verifier: token not found: no runner cluster is registered" {
		t.Fatalf("Resolve with no cluster: %v", err)
	}
}

// An added cluster is set up as New and Start would: after Start its
// refresh goroutine fetches in the background; before Start it is started by
// Start; a jwksFile cluster is usable at once with no fetch. A Resolver built
// before the reload sees the new clusters.
func TestReload_AddedClusterWorks(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, kubeissuer.RS256, clk)
	c := newIssuer(t, kubeissuer.ES256, clk)
	s := newIssuer(t, kubeissuer.RS256, clk)
	ra, rc := clusterFor(t, a, "a"), clusterFor(t, c, "c")
	jwksFile := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwksFile, s.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := RunnerCluster{Name: "s", Issuer: s.URL(), JWKSFile: jwksFile}
	loaded := make(chan LoadEvent, 16)
	v, err := New(nil, WithTenant("tenant-1"), WithClock(clk.Now), WithLogger(testLogger()),
		WithLoadHook(func(e LoadEvent) { loaded <- e }))
	if err != nil {
		t.Fatal(err)
	}
	r := NewResolver(v, nil)
	_, err = r.Resolve(context.Background(), mustToken(t, a, "n"), SubjectRunner)
	if err == nil || err.Error() != "verifier: token not found: no runner cluster is registered" {
		t.Fatalf("Resolve before any cluster: %v", err)
	}

	// Added before Start: Start starts it.
	mustReload(t, v, ra)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v.Start(ctx)
	if ev := <-loaded; ev.Cluster != "a" || ev.Err != nil || ev.Keys != 1 {
		t.Fatalf("load event = %+v", ev)
	}
	refreshRunning(t, clusterNamed(t, v, "a"))
	sub, err := r.Resolve(context.Background(), mustToken(t, a, "n"), SubjectRunner)
	if err != nil || sub.ID != "a/n" {
		t.Fatalf("Resolve = %+v, %v", sub, err)
	}

	// Added after Start: its refresh goroutine fetches in the background.
	mustReload(t, v, ra, rc)
	if ev := <-loaded; ev.Cluster != "c" || ev.Err != nil || ev.Keys != 1 {
		t.Fatalf("load event = %+v", ev)
	}
	refreshRunning(t, clusterNamed(t, v, "c"))
	sub, err = verify(t, v, mustToken(t, c, "node-c"))
	if err != nil || sub.ID != "c/node-c" || sub.Tenant != "tenant-1" {
		t.Fatalf("c: %+v, %v", sub, err)
	}
	if got := c.DiscoveryFetches(); got != 1 {
		t.Fatalf("c: %d discovery fetches, want 1", got)
	}

	// A jwksFile cluster is read by Reload and needs no fetch.
	mustReload(t, v, ra, rc, rs)
	if ev := <-loaded; ev.Cluster != "s" || ev.Err != nil || ev.Keys != 1 {
		t.Fatalf("load event = %+v", ev)
	}
	wantVerifies(t, v, s, "node-s")
	if got := fetchesOf(s); got != 0 {
		t.Fatalf("jwksFile cluster: %d fetches", got)
	}
	if got := v.Clusters(); !slices.Equal(got, []string{"a", "c", "s"}) {
		t.Fatalf("Clusters() = %v", got)
	}
}

// A cluster whose key-relevant configuration changes is replaced: the old
// one's goroutine ends, the new one starts from scratch (its own fetch, its
// own cooldown) and tokens are checked against the new configuration.
func TestReload_ChangedClusterReplaced(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, kubeissuer.RS256, clk)
	ra := clusterFor(t, a, "a")
	v, _ := startedVerifier(t, clk, ra)
	old := clusterNamed(t, v, "a")
	tok := mustToken(t, a, "n")
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	base := fetchesOf(a)

	changed := ra
	changed.Audience = "other-audience"
	mustReload(t, v, changed)
	refreshEnded(t, old)
	now := clusterNamed(t, v, "a")
	if now == old {
		t.Fatal("a cluster with a new audience kept its old state")
	}
	refreshRunning(t, now)
	wantRefused(t, v, tok, "verifier: unauthenticated: cluster a: audience mismatch")
	if got := fetchesOf(a) - base; got < 2 {
		t.Fatalf("%d fetches for the replaced cluster, want its own discovery and JWKS", got)
	}
}

// Two clusters sharing a key fail closed; removing one makes the other
// usable again at once, without a fetch.
func TestReload_SharedKeyRecomputed(t *testing.T) {
	p := newPair(t, kubeissuer.RS256, kubeissuer.RS256)
	a, b, ra, rb := p.a, p.b, p.ra, p.rb
	b.PublishKey(a.SigningKey(), false)
	v := newVerifier(t, p.clk, ra, rb)
	mustRefresh(t, v)
	_, err := verify(t, v, mustToken(t, a, "n"))
	if !errors.Is(err, ErrKeysUnavailable) || !errors.Is(err, errSharedKey) {
		t.Fatalf("shared key: %v", err)
	}
	base := fetchesOf(a, b)
	mustReload(t, v, ra)
	wantVerifies(t, v, a, "n")
	if got := fetchesOf(a, b) - base; got != 0 {
		t.Fatalf("%d fetches, want 0", got)
	}
}

// An invalid cluster list changes nothing: not the clusters, not their key
// sets, deny lists or goroutines, even when the valid part of the list would
// have changed all of those.
func TestReload_InvalidLeavesEverything(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, kubeissuer.RS256, clk)
	b := newIssuer(t, kubeissuer.RS256, clk)
	c := newIssuer(t, kubeissuer.RS256, clk)
	ra, rb, rc := clusterFor(t, a, "a"), clusterFor(t, b, "b"), clusterFor(t, c, "c")
	v, _ := startedVerifier(t, clk, ra, rb)
	ca, cb := clusterNamed(t, v, "a"), clusterNamed(t, v, "b")
	base := fetchesOf(a, b, c)

	// Each list would deny n on a, drop b and add c, were it valid.
	deniedA := ra
	deniedA.Deny = &NodeDeny{Nodes: []string{"n"}}
	missingCA := rc
	missingCA.CAFile = filepath.Join(t.TempDir(), "missing.pem")
	missingJWKS := RunnerCluster{Name: "s", Issuer: "https://s.example", JWKSFile: filepath.Join(t.TempDir(), "missing.json")}
	badDeny := rc
	badDeny.Deny = &NodeDeny{Nodes: []string{"Node_A"}}
	short := rc
	short.MaxTokenLifetime = 599 * time.Second
	sameIssuer := rc
	sameIssuer.Issuer = ra.Issuer + "/"
	cases := []struct {
		name string
		list []RunnerCluster
		want string
	}{
		{"duplicate name", []RunnerCluster{deniedA, rc, deniedA},
			`verifier: cluster "a" (clusters[2]): name: duplicate of clusters[0]`},
		{"same issuer up to a trailing slash", []RunnerCluster{deniedA, sameIssuer},
			`verifier: cluster "c": issuer: same issuer as cluster "a" (compared without a trailing "/"); the cluster is selected by iss, so each issuer must be unique`},
		{"maxTokenLifetime below the minimum", []RunnerCluster{deniedA, short},
			`verifier: cluster "c": maxTokenLifetime: 9m59s is below the minimum 10m0s (the Kubernetes TokenRequest minimum; a shorter bound rejects every projected token)`},
		{"bad deny entry", []RunnerCluster{deniedA, badDeny},
			`verifier: cluster "c": deny: nodes[0]: "Node_A" is not a Kubernetes node name`},
		{"http issuer", []RunnerCluster{deniedA, {Name: "h", Issuer: "http://h.example"}},
			`verifier: cluster "h": issuer: "http://h.example" must begin with lowercase "https://" (the token's iss is compared byte for byte)`},
		{"missing caFile", []RunnerCluster{deniedA, missingCA},
			`verifier: cluster "c": caFile: open ` + missingCA.CAFile + `: no such file or directory`},
		{"missing jwksFile", []RunnerCluster{deniedA, rc, missingJWKS},
			`verifier: cluster "s": jwksFile: open ` + missingJWKS.JWKSFile + `: no such file or directory`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Reload(tc.list)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Reload: %v\nwant %s", err, tc.want)
			}
			if got := v.Clusters(); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("Clusters() = %v", got)
			}
			if clusterNamed(t, v, "a") != ca || clusterNamed(t, v, "b") != cb {
				t.Fatal("a cluster was replaced")
			}
			wantVerifies(t, v, a, "n") // a's deny list is unchanged
			wantVerifies(t, v, b, "n") // b is still registered
			wantRefused(t, v, mustToken(t, c, "n"), "verifier: unauthenticated: unknown issuer")
			refreshRunning(t, ca)
			refreshRunning(t, cb)
			if got := fetchesOf(a, b, c) - base; got != 0 {
				t.Fatalf("%d fetches, want 0", got)
			}
		})
	}
}

// Reload races with Verify, Resolve, Status, Clusters and Refresh, under
// -race: every answer is one that the set in force at some instant gives.
func TestReload_ConcurrentVerify(t *testing.T) {
	a := newIssuer(t, kubeissuer.RS256, nil)
	b := newIssuer(t, kubeissuer.ES256, nil)
	ra, rb := clusterFor(t, a, "a"), clusterFor(t, b, "b")
	deniedA := ra
	deniedA.Deny = &NodeDeny{Nodes: []string{"n"}}
	v := newVerifier(t, nil, ra, rb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mustRefresh(t, v)
	v.Start(ctx)
	tokA, tokB := mustToken(t, a, "n"), mustToken(t, b, "n")
	r := NewResolver(v, nil)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	check := func(which string, err error) {
		switch {
		case err == nil,
			errors.Is(err, ErrNodeDenied),      // a's deny list in force
			errors.Is(err, errUnknownIssuer),   // b removed
			errors.Is(err, ErrKeysUnavailable), // b re-added, its first fetch in flight
			errors.Is(err, errNoClusters):      // nothing registered
		default:
			select {
			case errs <- errors.New(which + ": " + err.Error()):
			default:
			}
		}
	}
	// untilStop runs f over and over on a goroutine of its own until stop.
	untilStop := func(f func()) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				f()
			}
		})
	}
	for range 4 {
		untilStop(func() {
			_, err := v.Verify(ctx, tokA)
			check("a", err)
			_, err = r.Resolve(ctx, tokB, SubjectRunner)
			check("b", err)
			_ = v.Status()
			_ = v.Clusters()
		})
	}
	untilStop(func() { _ = v.Refresh(ctx) })
	lists := [][]RunnerCluster{{deniedA, rb}, {ra}, {ra, rb}, {deniedA}, {}, {rb, ra}}
	for i := range 60 {
		mustReload(t, v, lists[i%len(lists)]...)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	record(tokA, nil)
	record(tokB, nil)
	// The last list was {b, a}: both verify, with a's deny list gone.
	mustRefresh(t, v)
	if _, err := verify(t, v, tokA); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, v, tokB); err != nil {
		t.Fatal(err)
	}
}

// Start fetches every cluster that is fetched, wherever it is in the file: a
// static cluster listed first is passed over, not the end of the list.
func TestStart_StaticClusterFirst(t *testing.T) {
	clk := newClock()
	st := newIssuer(t, kubeissuer.ES256, clk)
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, st.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	fetched := newIssuer(t, kubeissuer.ES256, clk)
	// startedVerifier waits for both first loads: the static one at
	// New, the fetched one from Start's refresh goroutine.
	v, _ := startedVerifier(t, clk, RunnerCluster{Name: "file", Issuer: st.URL(), JWKSFile: path}, clusterFor(t, fetched, "prod"))
	if n := fetched.JWKSFetches(); n != 1 {
		t.Fatalf("%d JWKS fetches of prod after Start, want 1", n)
	}
	wantVerifies(t, v, st, "n")
	wantVerifies(t, v, fetched, "n")
}
