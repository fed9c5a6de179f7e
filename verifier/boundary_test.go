package verifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
)

// Every number DL-440 fixes for the key sets and for verification, pinned at
// its boundary by behaviour: a real TLS issuer, the injected clock (and its
// ticker), requests counted at the issuer. The tests write DL-440's numbers
// as literals, never the package's constants, so a changed constant fails
// here (docs/testing.md lists which test catches which constant).

// The numbers as DL-440 states them.
const (
	dlBodyCap      = 1 << 20 // 1 MiB
	dlFetchTimeout = 3 * time.Second
	dlRefresh      = time.Hour
	dlKIDCooldown  = 5 * time.Minute
	dlStaleAfter   = 24 * time.Hour
	dlLeeway       = time.Minute
)

// waitFor bounds how long a test waits for something it caused (a background
// load, a goroutine's return). It is a failure deadline, not a sleep: the
// tests go on as soon as the event arrives.
const waitFor = 10 * time.Second

// wantErr asserts an error exactly: its message, and each sentinel it must
// satisfy.
func wantErr(t *testing.T, err error, want string, is ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want %q", want)
	}
	if err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}
	for _, target := range is {
		if !errors.Is(err, target) {
			t.Fatalf("err = %q does not satisfy %q", err, target)
		}
	}
}

// tickClock is the injected clock with tickers: Advance moves the time and
// fires every ticker whose next tick it reaches, as a time.Ticker would
// (one buffered tick; ticks nobody took are dropped).
type tickClock struct {
	*fakeClock
	made chan *fakeTicker // each ticker, as the verifier asks for it

	mu      sync.Mutex
	tickers []*fakeTicker
}

type fakeTicker struct {
	period  time.Duration
	c       chan time.Time
	stopped chan struct{} // closed by the stop function
	once    sync.Once

	// Guarded by tickClock.mu.
	next  time.Time
	fired int
}

func newTickClock() *tickClock {
	return &tickClock{fakeClock: newClock(), made: make(chan *fakeTicker, 8)}
}

// newTicker is the verifier's WithTicker.
func (c *tickClock) newTicker(d time.Duration) (<-chan time.Time, func()) {
	tk := &fakeTicker{period: d, c: make(chan time.Time, 1), stopped: make(chan struct{}), next: c.Now().Add(d)}
	c.mu.Lock()
	c.tickers = append(c.tickers, tk)
	c.mu.Unlock()
	c.made <- tk
	return tk.c, func() { tk.once.Do(func() { close(tk.stopped) }) }
}

func (c *tickClock) Advance(d time.Duration) {
	c.fakeClock.Advance(d)
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tk := range c.tickers {
		for !now.Before(tk.next) {
			select {
			case tk.c <- tk.next:
			default:
			}
			tk.fired++
			tk.next = tk.next.Add(tk.period)
		}
	}
}

func (c *tickClock) fired(tk *fakeTicker) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return tk.fired
}

func waitTicker(t *testing.T, c *tickClock) *fakeTicker {
	t.Helper()
	select {
	case tk := <-c.made:
		return tk
	case <-time.After(waitFor):
		t.Fatal("Start made no refresh ticker")
		return nil
	}
}

func waitLoad(t *testing.T, loaded <-chan LoadEvent, what string) LoadEvent {
	t.Helper()
	select {
	case ev := <-loaded:
		return ev
	case <-time.After(waitFor):
		t.Fatalf("%s: no key-set load within %s", what, waitFor)
		return LoadEvent{}
	}
}

// padJSON returns doc (a JSON object) with a "padding" member added so that
// it is exactly size bytes, and still valid JSON.
func padJSON(t *testing.T, doc []byte, size int) []byte {
	t.Helper()
	doc = bytes.TrimSpace(doc)
	head := append(bytes.TrimSuffix(doc, []byte("}")), `,"padding":"`...)
	fill := size - len(head) - len(`"}`)
	if fill < 0 {
		t.Fatalf("document of %d bytes does not fit in %d", len(doc), size)
	}
	out := append(head, bytes.Repeat([]byte("x"), fill)...)
	out = append(out, `"}`...)
	if len(out) != size || !json.Valid(out) {
		t.Fatalf("padded document: %d bytes (want %d), valid JSON %v", len(out), size, json.Valid(out))
	}
	return out
}

// servedBody makes an issuer answer one of its paths with a body the test
// sets; the other path is served as usual.
type servedBody struct {
	suffix string
	mu     sync.Mutex
	body   []byte
}

func (s *servedBody) set(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body = b
}

func (s *servedBody) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		body := s.body
		s.mu.Unlock()
		if body == nil || !strings.HasSuffix(r.URL.Path, s.suffix) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// DL-440: fetches cap the body at 1 MiB. A valid JWKS of exactly 1 MiB loads;
// the same document one byte larger, which parses, is refused by the cap.
// Discovery and a jwksFile have the same cap.
func TestBoundary_BodyCap(t *testing.T) {
	t.Run("jwks", func(t *testing.T) {
		clk := newClock()
		sb := &servedBody{suffix: "/openid/v1/jwks"}
		is := newIssuerWrapped(t, clk, sb.wrap)
		atCap := padJSON(t, is.JWKS(), dlBodyCap)
		overCap := padJSON(t, is.JWKS(), dlBodyCap+1)

		sb.set(atCap)
		v := newVerifier(t, clk, clusterFor(t, is, "prod"))
		mustRefresh(t, v)
		if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
			t.Fatalf("keys from a 1 MiB JWKS: %v", err)
		}

		sb.set(overCap)
		v = newVerifier(t, clk, clusterFor(t, is, "prod"))
		// Uncapped, the larger document is a good key set: only the cap refuses it.
		if keys, err := v.parseJWKS("prod", overCap); err != nil || len(keys) != 1 {
			t.Fatalf("parseJWKS(1 MiB + 1) = %d keys, %v; want the one key", len(keys), err)
		}
		err := v.Refresh(context.Background())
		wantErr(t, err, fmt.Sprintf(`cluster "prod": jwks: GET %s: body larger than 1048576 bytes`, is.JWKSURL()))
		_, err = verify(t, v, mustToken(t, is, "n"))
		wantErr(t, err, "verifier: runner cluster keys unavailable: cluster prod: key set not loaded yet", ErrKeysUnavailable, errNeverFetched)
	})
	t.Run("discovery", func(t *testing.T) {
		clk := newClock()
		sb := &servedBody{suffix: "/.well-known/openid-configuration"}
		is := newIssuerWrapped(t, clk, sb.wrap)
		disc := fmt.Appendf(nil, `{"issuer":%q,"jwks_uri":%q}`, is.URL(), is.JWKSURL())

		sb.set(padJSON(t, disc, dlBodyCap))
		v := newVerifier(t, clk, clusterFor(t, is, "prod"))
		mustRefresh(t, v)

		sb.set(padJSON(t, disc, dlBodyCap+1))
		v = newVerifier(t, clk, clusterFor(t, is, "prod"))
		err := v.Refresh(context.Background())
		wantErr(t, err, fmt.Sprintf(`cluster "prod": discovery: GET %s/.well-known/openid-configuration: body larger than 1048576 bytes`, is.URL()))
	})
	t.Run("jwksFile", func(t *testing.T) {
		clk := newClock()
		is := newIssuer(t, kubeissuer.ES256, clk)
		dir := t.TempDir()
		file := func(size int) RunnerCluster {
			path := filepath.Join(dir, fmt.Sprintf("jwks-%d.json", size))
			if err := os.WriteFile(path, padJSON(t, is.JWKS(), size), 0o600); err != nil {
				t.Fatal(err)
			}
			return RunnerCluster{Name: "file", Issuer: is.URL(), JWKSFile: path}
		}
		v := newVerifier(t, clk, file(dlBodyCap))
		if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
			t.Fatalf("keys from a 1 MiB jwksFile: %v", err)
		}
		_, err := New([]RunnerCluster{file(dlBodyCap + 1)}, WithClock(clk.Now))
		wantErr(t, err, `verifier: cluster "file": jwksFile: larger than 1048576 bytes`)
	})
}

// DL-440: a fetch times out after 3 s. A JWKS that answers after 2.5 s loads;
// one that answers after 3.5 s is refused. The delay is real time (the HTTP
// client's deadline is), so the two cases run side by side.
func TestBoundary_FetchTimeout(t *testing.T) {
	t.Parallel() // waits out real timeouts
	for _, tc := range []struct {
		delay time.Duration
		ok    bool
	}{
		{dlFetchTimeout - 500*time.Millisecond, true},
		{dlFetchTimeout + 500*time.Millisecond, false},
	} {
		t.Run(tc.delay.String(), func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			var asked atomic.Int64 // JWKS requests received (the issuer counts those it answers)
			is := newIssuerWrapped(t, clk, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.HasSuffix(r.URL.Path, "/openid/v1/jwks") {
						asked.Add(1)
						select {
						case <-time.After(tc.delay):
						case <-r.Context().Done():
							return
						}
					}
					next.ServeHTTP(w, r)
				})
			})
			v := newVerifier(t, clk, clusterFor(t, is, "prod"))
			start := time.Now()
			err := v.Refresh(context.Background())
			took := time.Since(start)
			if tc.ok {
				if err != nil {
					t.Fatalf("JWKS answering after %s: %v", tc.delay, err)
				}
				if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
					t.Fatalf("after a slow fetch: %v", err)
				}
				return
			}
			wantErr(t, err, fmt.Sprintf(`cluster "prod": jwks: Get %q: context deadline exceeded`, is.JWKSURL()), context.DeadlineExceeded)
			if took < dlFetchTimeout || took >= tc.delay {
				t.Fatalf("the fetch gave up after %s, want from %s to %s", took, dlFetchTimeout, tc.delay)
			}
			if got, answered := asked.Load(), is.JWKSFetches(); got != 1 || answered != 0 {
				t.Fatalf("%d JWKS requests, %d answered; want 1 request, unanswered", got, answered)
			}
		})
	}
}

// DL-440: an unknown kid re-fetches at most once per cluster per 5 minutes.
// Counted at the issuer: a second miss 4 min 59 s after the first does not
// fetch, one 5 min 1 s after it does.
func TestBoundary_KIDMissCooldown(t *testing.T) {
	clk, is, v := loadedProd(t, kubeissuer.RS256)
	base := is.JWKSFetches()
	stranger, err := testkeys.Key(kubeissuer.RS256)
	if err != nil {
		t.Fatal(err)
	}
	miss := func(wantFetches int64) {
		t.Helper()
		_, err := verify(t, v, forge(t, stranger, is))
		wantErr(t, err, "verifier: unauthenticated: cluster prod: no key with that kid", ErrUnauthenticated, errUnknownKID)
		if got := is.JWKSFetches() - base; got != wantFetches {
			t.Fatalf("%d JWKS fetches caused by misses, want %d", got, wantFetches)
		}
	}
	miss(1)
	clk.Advance(dlKIDCooldown - time.Second) // 4m59s after the first miss
	miss(1)
	clk.Advance(2 * time.Second) // 5m01s after it
	miss(2)
}

// DL-440: the last good keys are kept for 24 h after the last successful
// fetch, then discarded (keys unavailable). A failed fetch does not extend
// the window; a successful one does.
func TestBoundary_StaleAfter(t *testing.T) {
	clk, f, is, v := loadedFaultyProd(t)
	clk.Advance(6 * time.Hour)
	mustRefresh(t, v) // the last successful fetch: the window runs from here
	f.set("503")
	clk.Advance(12 * time.Hour)
	err := v.Refresh(context.Background())
	wantErr(t, err, fmt.Sprintf(`cluster "prod": discovery: GET %s/.well-known/openid-configuration: status 503 Service Unavailable`, is.URL()))

	clk.Advance(dlStaleAfter - 12*time.Hour - time.Minute) // 23h59m after the last success
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("23h59m after the last successful fetch: %v", err)
	}
	clk.Advance(time.Minute) // exactly 24 h: still used, even by a failed fetch's recount
	if err := v.Refresh(context.Background()); err == nil {
		t.Fatal("the issuer still answers 503; Refresh succeeded")
	}
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("24h after the last successful fetch: %v", err)
	}
	clk.Advance(time.Second) // 24h00m01s
	_, err = verify(t, v, mustToken(t, is, "n"))
	wantErr(t, err, "verifier: runner cluster keys unavailable: cluster prod: key set discarded after 24h without a successful fetch",
		ErrKeysUnavailable, errStale)
	if errors.Is(err, ErrUnauthenticated) {
		t.Fatal("a stale key set also answers unauthenticated")
	}
}

// DL-440: 60 s of leeway on exp, nbf and iat. A token is accepted until
// exp + 60 s, exclusive; nbf and iat may be up to 60 s in the future.
func TestBoundary_Leeway(t *testing.T) {
	clk, is, v := loadedProd(t, kubeissuer.ES256)
	const lifetime = 600 * time.Second

	t.Run("exp", func(t *testing.T) {
		start := clk.Now()
		tok := mustToken(t, is, "n") // exp = start + 600 s
		exp := start.Add(lifetime)
		at := func(d time.Duration) error {
			clk.Advance(exp.Add(d).Sub(clk.Now()))
			_, err := verify(t, v, tok)
			return err
		}
		if err := at(dlLeeway - time.Second); err != nil {
			t.Fatalf("at exp + 59 s: %v", err)
		}
		const expired = "verifier: unauthenticated: cluster prod: token expired"
		wantErr(t, at(dlLeeway), expired, ErrUnauthenticated, errExpired)
		wantErr(t, at(dlLeeway+time.Second), expired, ErrUnauthenticated, errExpired)
	})
	future := func(claim string, ahead time.Duration) string {
		t.Helper()
		now := clk.Now()
		c := is.Claims(kubeissuer.Pod{NodeName: "n"}, 0)
		c[claim] = now.Add(ahead).Unix()
		if claim == "iat" { // keep exp - iat at the lifetime bound
			c["exp"] = now.Add(ahead + lifetime).Unix()
		}
		return mustSign(t, is, c)
	}
	t.Run("nbf", func(t *testing.T) {
		if _, err := verify(t, v, future("nbf", dlLeeway-time.Second)); err != nil {
			t.Fatalf("nbf 59 s ahead: %v", err)
		}
		_, err := verify(t, v, future("nbf", dlLeeway+time.Second))
		wantErr(t, err, "verifier: unauthenticated: cluster prod: token not valid yet", ErrUnauthenticated, errNotYetValid)
	})
	t.Run("iat", func(t *testing.T) {
		if _, err := verify(t, v, future("iat", dlLeeway-time.Second)); err != nil {
			t.Fatalf("iat 59 s ahead: %v", err)
		}
		_, err := verify(t, v, future("iat", dlLeeway+time.Second))
		wantErr(t, err, "verifier: unauthenticated: cluster prod: token issued in the future", ErrUnauthenticated, errIssuedInFuture)
	})
}

// DL-440: a refresh runs hourly under the serve loop's context. Driven by the
// injected ticker: a key rotated at the issuer, with no kid miss, is held
// after one hour and not before; when the context ends the refresh goroutine
// returns (its ticker is stopped) and nothing is fetched any more.
func TestBoundary_RefreshInterval(t *testing.T) {
	clk := newTickClock()
	is := newIssuer(t, kubeissuer.RS256, clk.fakeClock)
	loaded := make(chan LoadEvent, 8)
	v, err := New([]RunnerCluster{clusterFor(t, is, "prod")}, WithClock(clk.Now),
		WithLogger(testLogger()), WithLoadHook(func(e LoadEvent) { loaded <- e }), WithTicker(clk.newTicker))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v.Start(ctx)
	tk := waitTicker(t, clk)
	if ev := waitLoad(t, loaded, "first fetch"); ev.Err != nil || ev.Keys != 1 {
		t.Fatalf("first load = %+v", ev)
	}
	if got := is.JWKSFetches(); got != 1 {
		t.Fatalf("%d JWKS fetches after Start, want 1", got)
	}
	if _, err := is.Rotate(); err != nil {
		t.Fatal(err)
	}

	clk.Advance(dlRefresh - time.Second)
	if n := clk.fired(tk); n != 0 {
		t.Fatalf("the refresh ticker fired %d times within 59m59s", n)
	}
	if st := v.Status()[0]; st.Keys != 1 || is.JWKSFetches() != 1 {
		t.Fatalf("before the hour: %d keys held, %d JWKS fetches; want 1 and 1", st.Keys, is.JWKSFetches())
	}

	clk.Advance(time.Second)
	if ev := waitLoad(t, loaded, "the hourly refresh"); ev.Err != nil || ev.Keys != 2 {
		t.Fatalf("hourly load = %+v, want both keys", ev)
	}
	// The rotated key is held: its token verifies with no kid-miss fetch.
	if _, err := verify(t, v, mustToken(t, is, "n")); err != nil {
		t.Fatalf("token signed with the rotated key: %v", err)
	}
	if got := is.JWKSFetches(); got != 2 {
		t.Fatalf("%d JWKS fetches, want 2 (start, the hour)", got)
	}

	cancel()
	select {
	case <-tk.stopped:
	case <-time.After(waitFor):
		t.Fatal("the refresh goroutine did not return when its context ended")
	}
	clk.Advance(3 * dlRefresh)
	if got := is.JWKSFetches(); got != 2 {
		t.Fatalf("%d JWKS fetches after the context ended, want still 2", got)
	}
	select {
	case ev := <-loaded:
		t.Fatalf("a load after the context ended: %+v", ev)
	default:
	}
}
