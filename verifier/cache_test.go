package verifier

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
)

// cacheSetup is one cluster "prod" on a fake clock, its keys loaded.
func cacheSetup(t *testing.T, opts ...Option) (*fakeClock, *kubeissuer.Issuer, *RunnerVerifier, RunnerCluster) {
	t.Helper()
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	rc := clusterFor(t, is, "prod")
	v, err := New([]RunnerCluster{rc}, append([]Option{WithTenant("tenant-1"), WithClock(clk.Now), WithLogger(testLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	mustRefresh(t, v)
	return clk, is, v, rc
}

// wantStats asserts the cache's counters.
func wantStats(t *testing.T, v *RunnerVerifier, hits, misses uint64) {
	t.Helper()
	if h, m := v.CacheStats(); h != hits || m != misses {
		t.Fatalf("cache hits %d, misses %d; want %d, %d", h, m, hits, misses)
	}
}

// A token presented again is answered from the cache with the same Subject,
// a copy the caller may change.
func TestVerifiedCache_Hit(t *testing.T) {
	_, is, v, _ := cacheSetup(t)
	tok := mustToken(t, is, "node-1")
	first, err := verify(t, v, tok)
	if err != nil {
		t.Fatal(err)
	}
	wantStats(t, v, 0, 1)
	again, err := verify(t, v, tok)
	if err != nil {
		t.Fatal(err)
	}
	wantStats(t, v, 1, 1)
	if !reflect.DeepEqual(first, again) {
		t.Fatalf("cached Subject %+v differs from the verified one %+v", again, first)
	}
	again.Workload.NodeName = "changed by the caller"
	third, _ := verify(t, v, tok)
	if third.Workload.NodeName != "node-1" {
		t.Fatalf("a caller's change reached the cache: %q", third.Workload.NodeName)
	}
	wantStats(t, v, 2, 1)
}

// An entry lives from the token's nbf and iat (less the leeway) to its exp,
// and not an instant longer; outside that the token is verified again, so
// the answer is the one Verify gives without a cache at every instant.
func TestVerifiedCache_TokenTimes(t *testing.T) {
	clk, is, v, _ := cacheSetup(t)
	tok := mustToken(t, is, "node-1") // iat = nbf = now, exp = now + 600 s
	t0 := clk.Now()
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	clk.Advance(600*time.Second - time.Nanosecond)
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	wantStats(t, v, 1, 1)
	clk.Advance(time.Nanosecond) // exp: verified again, still inside the leeway
	if _, err := verify(t, v, tok); err != nil {
		t.Fatalf("at exp: %v", err)
	}
	wantStats(t, v, 1, 2)
	clk.Advance(Leeway)
	_, err := verify(t, v, tok)
	wantErr(t, err, "verifier: unauthenticated: cluster prod: token expired", ErrUnauthenticated)
	wantStats(t, v, 1, 3)

	// Before nbf and iat - leeway (a clock stepped back) the cached token is
	// refused as Verify refuses it.
	clk.Advance(t0.Sub(clk.Now()) - Leeway) // exactly nbf - leeway: accepted
	if _, err := verify(t, v, tok); err != nil {
		t.Fatalf("at iat - leeway: %v", err)
	}
	hits, _ := v.CacheStats()
	clk.Advance(-time.Second)
	_, err = verify(t, v, tok)
	wantErr(t, err, "verifier: unauthenticated: cluster prod: token not valid yet", ErrUnauthenticated)
	if h, _ := v.CacheStats(); h != hits {
		t.Fatal("a token not valid yet was answered from the cache")
	}
}

// A key set load drops the entries verified with the set it replaced; a key
// that is no longer published no longer verifies a remembered token.
func TestVerifiedCache_KeySetChange(t *testing.T) {
	_, is, v, _ := cacheSetup(t)
	tok := mustToken(t, is, "node-1")
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	mustRefresh(t, v) // the same keys, a new set
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	wantStats(t, v, 0, 2)
	if _, err := verify(t, v, tok); err != nil { // remembered with the new set
		t.Fatal(err)
	}
	wantStats(t, v, 1, 2)

	old := is.SigningKey().KeyID
	if _, err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	is.Unpublish(old)
	mustRefresh(t, v)
	_, err := verify(t, v, tok)
	wantErr(t, err, "verifier: unauthenticated: cluster prod: no key with that kid", ErrUnauthenticated)
	wantStats(t, v, 1, 3)
}

// A reload that denies the token's node, or removes or changes its cluster,
// drops what the cache knew.
func TestVerifiedCache_Reload(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(RunnerCluster) []RunnerCluster
		want   string
	}{
		{"node denied", func(rc RunnerCluster) []RunnerCluster {
			rc.Deny = &NodeDeny{Nodes: []string{"node-1"}}
			return []RunnerCluster{rc}
		}, "verifier: unauthenticated: cluster prod: node denied: node node-1 is in deny.nodes"},
		{"cluster removed", func(RunnerCluster) []RunnerCluster { return nil },
			"verifier: unauthenticated: unknown issuer"},
		{"namespace changed", func(rc RunnerCluster) []RunnerCluster {
			rc.Namespace = "elsewhere"
			return []RunnerCluster{rc}
		}, "verifier: unauthenticated: cluster prod: sub is not the Runner ServiceAccount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, is, v, rc := cacheSetup(t)
			tok := mustToken(t, is, "node-1")
			if _, err := verify(t, v, tok); err != nil {
				t.Fatal(err)
			}
			if err := v.Reload(tc.change(rc)); err != nil {
				t.Fatal(err)
			}
			_, err := verify(t, v, tok)
			wantErr(t, err, tc.want)
			wantStats(t, v, 0, 2)
		})
	}
}

// A remembered token stops working when its cluster's keys go stale (24 h
// without a successful fetch), as every other token of the cluster does.
func TestVerifiedCache_StaleKeys(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	rc := clusterFor(t, is, "prod")
	rc.MaxTokenLifetime = 48 * time.Hour
	v := newVerifier(t, clk, rc)
	mustRefresh(t, v)
	tok, err := is.Token(kubeissuer.Pod{NodeName: "node-1"}, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	clk.Advance(StaleAfter)
	if _, err := verify(t, v, tok); err != nil {
		t.Fatalf("at the stale limit: %v", err)
	}
	wantStats(t, v, 1, 1)
	is.Close() // no fetch succeeds any more
	clk.Advance(time.Second)
	_, err = verify(t, v, tok)
	wantErr(t, err, "verifier: runner cluster keys unavailable: cluster prod: key set discarded after 24h without a successful fetch", ErrKeysUnavailable)
	wantStats(t, v, 1, 2)
}

// Refusals are never remembered: a bad token costs the full check every
// time and takes no room.
func TestVerifiedCache_RemembersOnlySuccesses(t *testing.T) {
	_, is, v, _ := cacheSetup(t)
	tok := mustToken(t, is, "node-1")
	bad := tok[:len(tok)-4] + "AAAA"
	for range 3 {
		_, err := verify(t, v, bad)
		wantErr(t, err, "verifier: unauthenticated: cluster prod: bad signature", ErrUnauthenticated)
	}
	wantStats(t, v, 0, 3)
	if n := len(v.cache.m); n != 0 {
		t.Fatalf("%d entries after refusals only", n)
	}
}

// The cache holds at most its bound; a full cache evicts an expired entry
// before a live one, whichever order the map visits them in. The live token
// goes in first: a small map hands out its entries mostly in the order they
// went in, so a cache that evicted the first entry it saw would lose it in
// most of the 20 rounds.
func TestVerifiedCache_Bounded(t *testing.T) {
	for round := range 20 {
		clk, is, v, _ := cacheSetup(t, WithVerifiedCache(2))
		live := mustToken(t, is, "live") // exp now + 600 s
		if _, err := verify(t, v, live); err != nil {
			t.Fatal(err)
		}
		short, err := is.Token(kubeissuer.Pod{NodeName: "short"}, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := verify(t, v, short); err != nil {
			t.Fatal(err)
		}
		clk.Advance(61 * time.Second) // short is past exp, live is not
		third := mustToken(t, is, "third")
		if _, err := verify(t, v, third); err != nil {
			t.Fatal(err)
		}
		if n := len(v.cache.m); n != 2 {
			t.Fatalf("%d entries, want the bound, 2", n)
		}
		h0, _ := v.CacheStats()
		for _, tok := range []string{live, third} {
			if _, err := verify(t, v, tok); err != nil {
				t.Fatal(err)
			}
		}
		if h, _ := v.CacheStats(); h != h0+2 {
			t.Fatalf("round %d: %d hits for the two live tokens, want 2: the expired one should have gone", round, h-h0)
		}
	}
}

// Past the bound, whatever the number of entries, an insert evicts one: the
// cache never grows beyond its size.
func TestVerifiedCache_StaysWithinItsBound(t *testing.T) {
	const bound = 2 * evictScan // an eviction scans a part of it
	_, is, v, _ := cacheSetup(t, WithVerifiedCache(bound))
	for i := range bound + 5 {
		if _, err := verify(t, v, mustToken(t, is, fmt.Sprintf("n-%d", i))); err != nil {
			t.Fatal(err)
		}
		if n, want := len(v.cache.m), min(i+1, bound); n != want {
			t.Fatalf("%d entries after %d tokens, want %d", n, i+1, want)
		}
	}
}

// A cache of one holds one: the newest token replaces the other.
func TestVerifiedCache_One(t *testing.T) {
	_, is, v, _ := cacheSetup(t, WithVerifiedCache(1))
	a, b := mustToken(t, is, "a"), mustToken(t, is, "b")
	for _, tok := range []string{a, b} {
		if _, err := verify(t, v, tok); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(v.cache.m); n != 1 {
		t.Fatalf("%d entries in a cache of 1", n)
	}
	if _, err := verify(t, v, b); err != nil {
		t.Fatal(err)
	}
	wantStats(t, v, 1, 2)
}

// WithVerifiedCache(0) turns the cache off: every call verifies.
func TestVerifiedCache_Off(t *testing.T) {
	_, is, v, _ := cacheSetup(t, WithVerifiedCache(0))
	tok := mustToken(t, is, "node-1")
	for range 2 {
		if _, err := verify(t, v, tok); err != nil {
			t.Fatal(err)
		}
	}
	wantStats(t, v, 0, 0)
	if v.cache != nil {
		t.Fatal("a cache with no room")
	}
}

// A cache hit needs no key fetch and no context: it is the answer already
// given.
func TestVerifiedCache_HitTakesNoFetch(t *testing.T) {
	_, is, v, _ := cacheSetup(t)
	tok := mustToken(t, is, "node-1")
	if _, err := verify(t, v, tok); err != nil {
		t.Fatal(err)
	}
	fetches := is.JWKSFetches()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("a remembered token with a cancelled context: %v", err)
	}
	if got := is.JWKSFetches(); got != fetches {
		t.Fatalf("%d fetches for a hit", got-fetches)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("unreachable")
	}
}

// An entry starts at the later of nbf and iat, less the leeway: a token
// whose nbf is after its iat, or before it, is refused from the cache exactly
// when Verify refuses it.
func TestVerifiedCache_NotBeforeIsTheLaterOfNbfAndIat(t *testing.T) {
	for _, tc := range []struct {
		name string
		nbf  time.Duration // relative to iat
		want string
	}{
		{"nbf after iat", 120 * time.Second, "verifier: unauthenticated: cluster prod: token not valid yet"},
		{"nbf before iat", -120 * time.Second, "verifier: unauthenticated: cluster prod: token issued in the future"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk, is, v, _ := cacheSetup(t)
			iat := clk.Now()
			claims := is.Claims(kubeissuer.Pod{NodeName: "node-1"}, 0)
			claims["nbf"] = iat.Add(tc.nbf).Unix()
			tok := mustSign(t, is, claims)
			later := max(tc.nbf, 0) // from here both nbf and iat have passed
			clk.Advance(later)
			if _, err := verify(t, v, tok); err != nil {
				t.Fatal(err)
			}
			if _, err := verify(t, v, tok); err != nil {
				t.Fatal(err)
			}
			wantStats(t, v, 1, 1)
			// One second before the later of the two, less the leeway.
			clk.Advance(-later - Leeway + max(tc.nbf, 0) - time.Second)
			_, err := verify(t, v, tok)
			wantErr(t, err, tc.want, ErrUnauthenticated)
			wantStats(t, v, 1, 2)
		})
	}
}
