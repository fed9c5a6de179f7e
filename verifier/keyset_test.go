package verifier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// A token whose kid is unknown re-fetches once; more unknown kids inside the
// cooldown do not fetch again; after the cooldown one more fetch is allowed.
func TestKIDMiss_RefetchOnceThenCooldown(t *testing.T) {
	clk, is, v := loadedProd(t, kubeissuer.RS256)
	base := is.JWKSFetches()

	stranger, _ := testkeys.Key(kubeissuer.RS256)
	forged := func() string { return forge(t, stranger, is) }
	if _, err := verify(t, v, forged()); !errors.Is(err, errUnknownKID) {
		t.Fatalf("err = %v, want unknown kid", err)
	}
	if got := is.JWKSFetches() - base; got != 1 {
		t.Fatalf("first miss: %d fetches, want 1", got)
	}
	clk.Advance(KIDMissCooldown - time.Second)
	if _, err := verify(t, v, forged()); !errors.Is(err, errUnknownKID) {
		t.Fatalf("err = %v, want unknown kid", err)
	}
	if got := is.JWKSFetches() - base; got != 1 {
		t.Fatalf("miss inside the cooldown: %d fetches, want still 1", got)
	}
	clk.Advance(time.Second)
	verify(t, v, forged())
	if got := is.JWKSFetches() - base; got != 2 {
		t.Fatalf("miss after the cooldown: %d fetches, want 2", got)
	}
}

// A known kid with a bad signature is a forgery, not a rotation: no fetch.
func TestKIDMiss_BadSignatureNeverFetches(t *testing.T) {
	_, is, v := loadedProd(t, kubeissuer.ES256)
	base := is.JWKSFetches()
	attacker, _ := testkeys.Key(kubeissuer.ES256)
	attacker.KeyID = is.SigningKey().KeyID
	for range 10 {
		tok, _ := kubeissuer.SignWith(attacker, is.Claims(kubeissuer.Pod{NodeName: "n"}, 0), nil)
		if _, err := verify(t, v, tok); !errors.Is(err, errSignature) || errors.Is(err, ErrKeysUnavailable) {
			t.Fatalf("err = %v, want bad signature", err)
		}
	}
	if got := is.JWKSFetches() - base; got != 0 {
		t.Fatalf("%d fetches, want 0", got)
	}
}

// A key published and then used for signing verifies after the kid-miss
// re-fetch, without waiting for the hourly refresh.
func TestRotation_NewKeyVerifiesAfterRefetch(t *testing.T) {
	_, is, v := loadedProd(t, kubeissuer.RS256)
	old := mustToken(t, is, "n")
	if _, err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	fresh := mustToken(t, is, "n")
	if _, err := verify(t, v, fresh); err != nil {
		t.Fatalf("token with the new kid: %v", err)
	}
	if _, err := verify(t, v, old); err != nil {
		t.Fatalf("token with the old kid, still published: %v", err)
	}
	// Once the old key is unpublished and the set refreshed, old tokens fail.
	is.Unpublish(old[:0] + kidOf(t, old))
	mustRefresh(t, v)
	if _, err := verify(t, v, old); !errors.Is(err, errUnknownKID) {
		t.Fatalf("token with the removed kid: %v, want unknown kid", err)
	}
}

func kidOf(t *testing.T, tok string) string {
	t.Helper()
	j, err := jose.ParseSignedCompact(tok, allowedAlgs)
	if err != nil {
		t.Fatal(err)
	}
	return j.Signatures[0].Header.KeyID
}

// A failed fetch keeps the last good keys; past StaleAfter they are
// discarded and the cluster answers keys-unavailable; a good fetch restores it.
func TestFetchError_KeepsLastGoodKeys(t *testing.T) {
	clk, f, is, v := loadedFaultyProd(t)

	f.set("503")
	if err := v.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh succeeded against a 503")
	}
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("after a failed fetch: %v", err)
	}
	clk.Advance(StaleAfter - time.Minute)
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("just inside the stale limit: %v", err)
	}
	clk.Advance(2 * time.Minute)
	_, err := verify(t, v, mustToken(t, is, "n"))
	if !errors.Is(err, ErrKeysUnavailable) || !errors.Is(err, errStale) || errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("past the stale limit: %v, want keys unavailable (stale)", err)
	}
	st := v.Status()[0]
	if st.Usable || st.LastError == "" {
		t.Fatalf("status = %+v, want unusable with the last error", st)
	}
	f.set("")
	mustRefresh(t, v)
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

// A cluster whose JWKS answers 503 from the start has no keys: its tokens get
// ErrKeysUnavailable. A bad signature on a cluster with keys does not.
func TestJWKS503_NoKeys_KeysUnavailable(t *testing.T) {
	clk := newClock()
	f := &fault{}
	f.set("503")
	down := newIssuerWrapped(t, clk, f.wrap)
	up := newIssuer(t, kubeissuer.RS256, clk)
	v := newVerifier(t, clk, clusterFor(t, down, "down"), clusterFor(t, up, "up"))
	if err := v.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh succeeded against a 503")
	}
	_, err := verify(t, v, mustToken(t, down, "n"))
	if !errors.Is(err, ErrKeysUnavailable) || !errors.Is(err, errNeverFetched) {
		t.Fatalf("down cluster: %v, want keys unavailable", err)
	}
	if ClusterOf(err) != "down" {
		t.Fatalf("ClusterOf = %q", ClusterOf(err))
	}
	attacker, _ := testkeys.Key(kubeissuer.RS256)
	attacker.KeyID = up.SigningKey().KeyID
	tok, _ := kubeissuer.SignWith(attacker, up.Claims(kubeissuer.Pod{NodeName: "n"}, 0), nil)
	_, err = verify(t, v, tok)
	if errors.Is(err, ErrKeysUnavailable) || !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("bad signature: %v, want unauthenticated only", err)
	}
}

// Every way a fetch can fail fails cleanly, keeps the last good keys, and
// records the error.
func TestFetchFailures_KeepLastGoodKeys(t *testing.T) {
	t.Parallel() // waits out real timeouts
	modes := []string{"503", "stall", "huge", "redirect-http", "issuer-differs", "jwks-http", "garbage", "empty-set"}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			_, f, is, v := loadedFaultyProd(t)
			f.set(mode)
			err := v.Refresh(context.Background())
			if err == nil {
				t.Fatalf("Refresh succeeded in mode %s", mode)
			}
			if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
				t.Fatalf("after a %s fetch: %v", mode, err)
			}
			if st := v.Status()[0]; st.LastError == "" || !st.Usable {
				t.Fatalf("status = %+v", st)
			}
		})
	}
}

// Clusters A and B publish one shared key: whichever loads first, tokens of
// both fail closed. Once B drops the key, A verifies again.
func TestSharedKey_BothLoadOrders(t *testing.T) {
	for _, order := range []string{"A first", "B first"} {
		t.Run(order, func(t *testing.T) {
			clk := newClock()
			a := newIssuer(t, kubeissuer.RS256, clk)
			b := newIssuer(t, kubeissuer.RS256, clk)
			b.PublishKey(a.SigningKey(), true) // B signs with A's key (a copied sa.key)
			var events []LoadEvent
			var mu sync.Mutex
			v, err := New([]RunnerCluster{clusterFor(t, a, "a"), clusterFor(t, b, "b")}, WithClock(clk.Now),
				WithLogger(testLogger()), WithLoadHook(func(e LoadEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }))
			if err != nil {
				t.Fatal(err)
			}
			ca, cb := v.clusters.Load().byName["a"], v.clusters.Load().byName["b"]
			first, second := ca, cb
			if order == "B first" {
				first, second = cb, ca
			}
			ctx := context.Background()
			if err := v.refresh(ctx, first); err != nil {
				t.Fatal(err)
			}
			if err := v.refresh(ctx, second); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			last := events[len(events)-1]
			mu.Unlock()
			if last.Cluster != second.cfg.Name || !slices.Equal(last.SharedWith, []string{first.cfg.Name}) {
				t.Fatalf("last load event = %+v", last)
			}
			for _, is := range []*kubeissuer.Issuer{a, b} {
				_, err := verify(t, v, mustToken(t, is, "n"))
				if !errors.Is(err, ErrKeysUnavailable) || !errors.Is(err, errSharedKey) {
					t.Fatalf("%s: %v, want keys unavailable (shared key)", is.URL(), err)
				}
			}
			// B stops publishing (and signing with) A's key.
			b.Unpublish(a.SigningKey().KeyID)
			if _, err := b.Rotate(); err != nil {
				t.Fatal(err)
			}
			if err := v.refresh(ctx, cb); err != nil {
				t.Fatal(err)
			}
			if _, err := verify(t, v, mustToken(t, a, "n")); err != nil {
				t.Fatalf("A after B dropped the key: %v", err)
			}
			if _, err := verify(t, v, mustToken(t, b, "n")); err != nil {
				t.Fatalf("B after dropping the key: %v", err)
			}
		})
	}
}

// The same key under a different kid is the same key: thumbprints ignore kid.
func TestSharedKey_DifferentKIDs(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, kubeissuer.ES256, clk)
	b := newIssuer(t, kubeissuer.ES256, clk)
	k := a.SigningKey()
	k.KeyID = "renamed"
	b.PublishKey(k, false)
	v := newVerifier(t, clk, clusterFor(t, a, "a"), clusterFor(t, b, "b"))
	mustRefresh(t, v)
	for _, is := range []*kubeissuer.Issuer{a, b} {
		if _, err := verify(t, v, mustToken(t, is, "n")); !errors.Is(err, errSharedKey) {
			t.Fatalf("%v, want shared key", err)
		}
	}
	st := v.Status()
	if st[0].Usable || st[1].Usable || !slices.Equal(st[0].SharedWith, []string{"b"}) {
		t.Fatalf("status = %+v", st)
	}
}

// Thousands of tokens with random kids against a known issuer cause at most
// one fetch per cooldown window.
func TestKIDFlood_OneFetchPerCooldown(t *testing.T) {
	clk, is, v := loadedProd(t, kubeissuer.RS256)
	base := is.JWKSFetches()
	stranger, _ := testkeys.Key(kubeissuer.ES256)
	claims := is.Claims(kubeissuer.Pod{NodeName: "n"}, 0)
	const tokens = 3000
	toks := make([]string, tokens)
	for i := range toks {
		var b [8]byte
		rand.Read(b[:])
		stranger.KeyID = hex.EncodeToString(b[:])
		toks[i], _ = kubeissuer.SignWith(stranger, claims, nil)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < tokens; i += 8 {
				if _, err := v.Verify(context.Background(), toks[i]); !errors.Is(err, ErrUnauthenticated) {
					t.Errorf("flood token: %v", err)
					return
				}
				if i%1000 == 999 && w == 0 {
					clk.Advance(time.Minute)
				}
			}
		}()
	}
	wg.Wait()
	// The flood spanned under one cooldown window of fake time: one fetch.
	if got := is.JWKSFetches() - base; got != 1 {
		t.Fatalf("%d fetches for %d forged kids, want 1", got, tokens)
	}
	clk.Advance(KIDMissCooldown)
	v.Verify(context.Background(), toks[0])
	if got := is.JWKSFetches() - base; got != 2 {
		t.Fatalf("%d fetches after the window, want 2", got)
	}
}

// An unknown issuer never causes a fetch, however many tokens name it.
func TestUnknownIssuer_NoFetch(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	stranger := newIssuer(t, kubeissuer.RS256, clk)
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	for range 100 {
		if _, err := verify(t, v, mustToken(t, stranger, "n")); !errors.Is(err, errUnknownIssuer) {
			t.Fatal(err)
		}
	}
	if n := is.JWKSFetches() + is.DiscoveryFetches() + stranger.JWKSFetches() + stranger.DiscoveryFetches(); n != 0 {
		t.Fatalf("%d fetches", n)
	}
}

// Start fetches in the background without waiting, then stops with ctx.
func TestStart_BackgroundFetch(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.RS256, clk)
	v, loaded := loadWatched(t, clk, []RunnerCluster{clusterFor(t, is, "prod")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v.Start(ctx)
	v.Start(ctx) // a second Start is a no-op
	ev := <-loaded
	if ev.Err != nil || ev.Keys != 1 || ev.Cluster != "prod" {
		t.Fatalf("load event = %+v", ev)
	}
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatal(err)
	}
	if got := is.DiscoveryFetches(); got != 1 {
		t.Fatalf("%d discovery fetches, want 1", got)
	}
}

// jwksURI skips discovery; jwksFile needs no network at all.
func TestKeySources(t *testing.T) {
	clk := newClock()
	is := newIssuer(t, kubeissuer.ES256, clk)
	t.Run("jwksURI", func(t *testing.T) {
		rc := clusterFor(t, is, "uri")
		rc.JWKSURI = is.JWKSURL()
		v := newVerifier(t, clk, rc)
		d := is.DiscoveryFetches()
		mustRefresh(t, v)
		if is.DiscoveryFetches() != d {
			t.Fatal("discovery fetched despite jwksURI")
		}
		if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("jwksFile", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "jwks.json")
		if err := os.WriteFile(path, is.JWKS(), 0o600); err != nil {
			t.Fatal(err)
		}
		rc := RunnerCluster{Name: "file", Issuer: is.URL(), JWKSFile: path}
		j := is.JWKSFetches()
		v := newVerifier(t, clk, rc)
		if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * StaleAfter) // a static set never goes stale
		if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
			t.Fatal(err)
		}
		if is.JWKSFetches() != j {
			t.Fatal("fetched despite jwksFile")
		}
	})
	t.Run("jwksFile unreadable", func(t *testing.T) {
		rc := RunnerCluster{Name: "file", Issuer: is.URL(), JWKSFile: filepath.Join(t.TempDir(), "missing.json")}
		if _, err := New([]RunnerCluster{rc}); err == nil {
			t.Fatal("New accepted a missing jwksFile")
		}
	})
	t.Run("caFile without a certificate", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ca.pem")
		os.WriteFile(path, []byte("not pem"), 0o600)
		rc := RunnerCluster{Name: "c", Issuer: is.URL(), CAFile: path}
		if _, err := New([]RunnerCluster{rc}); err == nil {
			t.Fatal("New accepted a caFile without a certificate")
		}
	})
	t.Run("issuer not trusted without caFile", func(t *testing.T) {
		v := newVerifier(t, clk, RunnerCluster{Name: "c", Issuer: is.URL()})
		if err := v.Refresh(context.Background()); err == nil {
			t.Fatal("fetched from an issuer whose CA is not trusted")
		}
	})
}

// Keys the verifier cannot use are ignored, each with a log line.
func TestParseJWKS_FiltersKeys(t *testing.T) {
	v := newVerifier(t, nil)
	good, _ := testkeys.Key(kubeissuer.ES256)
	rsaKey, _ := testkeys.Key(kubeissuer.RS256)
	encKey := rsaKey.Public()
	encKey.Use = "enc"
	wrongAlg := good.Public()
	wrongAlg.Algorithm = "ES384"
	noKID := good.Public()
	noKID.KeyID = ""
	rsaWrongAlg := rsaKey.Public()
	rsaWrongAlg.Algorithm = "PS256"
	// Every refused key comes before the good one: a refusal skips that key
	// and goes on to the next.
	set := map[string]any{"keys": []any{
		"not an object",
		encKey, wrongAlg, rsaWrongAlg, noKID, good, // good is private: refused
		map[string]any{"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
		map[string]any{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "ed"},
		map[string]any{"kty": "RSA", "n": "sXch", "e": "AQAB", "kid": "small"},
		"not an object either",
		good.Public(),
	}}
	data, _ := jsonMarshal(set)
	keys, err := v.parseJWKS("c", data)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0].KeyID != good.KeyID || !keys[0].IsPublic() {
		t.Fatalf("kept %d keys: %+v", len(keys), keys)
	}
}

// An ES256 token that names an RSA key's kid never reaches a signature check
// with the wrong key type.
func TestVerify_AlgMustMatchKeyType(t *testing.T) {
	_, is, v := loadedProd(t, kubeissuer.RS256)
	if got := v.Clusters(); !slices.Equal(got, []string{"prod"}) {
		t.Fatalf("Clusters() = %v", got)
	}
	ec, _ := testkeys.Key(kubeissuer.ES256)
	ec.KeyID = is.SigningKey().KeyID
	tok, err := kubeissuer.SignWith(ec, is.Claims(kubeissuer.Pod{NodeName: "n"}, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, v, tok); !errors.Is(err, errSignature) {
		t.Fatalf("err = %v, want bad signature", err)
	}
}

// Redirects are followed only on https, and only a few times.
func TestFetch_RedirectLoop(t *testing.T) {
	clk := newClock()
	is := newIssuerWrapped(t, clk, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://"+r.Host+r.URL.Path, http.StatusFound)
		})
	})
	v := newVerifier(t, clk, clusterFor(t, is, "prod"))
	err := v.Refresh(context.Background())
	if err == nil || !strings.Contains(err.Error(), "redirects") {
		t.Fatalf("err = %v, want a redirect limit", err)
	}
}

// A set of more than MaxKeysPerSet usable keys is cut at 64, with one warning.
func TestParseJWKS_KeepsAtMost64Keys(t *testing.T) {
	var logs jsonLogs
	v, err := New(nil, WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	var set []any
	for range 66 {
		k, err := testkeys.Key(kubeissuer.ES256)
		if err != nil {
			t.Fatal(err)
		}
		set = append(set, k.Public())
	}
	data, _ := jsonMarshal(map[string]any{"keys": set})
	keys, err := v.parseJWKS("c", data)
	if err != nil || len(keys) != 64 {
		t.Fatalf("kept %d keys (%v), want 64", len(keys), err)
	}
	if n := len(logs.records(t, "runner cluster key set truncated")); n != 1 {
		t.Fatalf("%d truncation warnings, want 1", n)
	}
}
