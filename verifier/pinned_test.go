package verifier

// Tests that pin what an audit of the mutation runs found no test for: the
// https-only check on redirects, Start not waiting for the first fetch, and
// the single flight that merges concurrent loads of one cluster.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
)

// A redirect from the issuer to a plain-http URL is refused by the redirect
// policy itself, before any request goes out: the plain-http server, which
// serves a valid discovery document and JWKS, is never asked. (The
// "redirect-http" fault of TestFetchFailures_KeepLastGoodKeys points back at
// the TLS port, where a plain request fails whatever the policy says.)
func TestFetch_RedirectToPlainHTTPRefused(t *testing.T) {
	for _, doc := range []string{"discovery", "jwks"} {
		t.Run(doc, func(t *testing.T) {
			clk := newClock()
			var is *kubeissuer.Issuer
			var plainHits atomic.Int64
			plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				plainHits.Add(1)
				if doc == "discovery" {
					fmt.Fprintf(w, `{"issuer":%q,"jwks_uri":%q}`, is.URL(), is.JWKSURL())
					return
				}
				w.Write(is.JWKS())
			}))
			t.Cleanup(plain.Close)
			path := "/openid/v1/jwks"
			if doc == "discovery" {
				path = "/.well-known/openid-configuration"
			}
			is = newIssuerWrapped(t, clk, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == path {
						http.Redirect(w, r, plain.URL+path, http.StatusFound)
						return
					}
					next.ServeHTTP(w, r)
				})
			})
			v := newVerifier(t, clk, clusterFor(t, is, "prod"))
			err := v.Refresh(context.Background())
			target := plain.URL + path
			want := fmt.Sprintf(`cluster "prod": %s: Get %q: redirect to non-https URL %s refused`, doc, target, target)
			wantErr(t, err, want)
			if n := plainHits.Load(); n != 0 {
				t.Fatalf("the plain-http server was asked %d times, want never", n)
			}
			if st := v.Status()[0]; st.Usable || st.Keys != 0 {
				t.Fatalf("status = %+v, want no keys", st)
			}
		})
	}
}

// Start begins the first fetch in the background and does not wait for it
// (DL-440: "Serve start begins one background fetch per cluster and does not
// wait for it"). The issuer holds its JWKS answer: Start returns with no load
// finished, the held request is then seen in flight, and once it is released
// the load succeeds and a token verifies with the keys it brought.
func TestStart_DoesNotWaitForTheFirstFetch(t *testing.T) {
	clk := newClock()
	g := newGate()
	g.close()
	is := newIssuerWrapped(t, clk, g.wrap)
	t.Cleanup(g.open) // before the issuer closes: never leave its handler held
	v, loaded := loadWatched(t, clk, []RunnerCluster{clusterFor(t, is, "prod")}, WithTenant("tenant-1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	v.Start(ctx)
	select {
	case ev := <-loaded:
		t.Fatalf("Start returned after the first load ended (%+v): it waited for the fetch", ev)
	default:
	}
	select {
	case <-g.entered:
	case <-time.After(waitFor):
		t.Fatal("no JWKS request in flight after Start returned")
	}
	select {
	case ev := <-loaded:
		t.Fatalf("a load ended while its JWKS request was held: %+v", ev)
	default:
	}
	g.open()
	select {
	case ev := <-loaded:
		if ev.Cluster != "prod" || ev.Err != nil || ev.Keys != 1 {
			t.Fatalf("first load = %+v, want prod with 1 key", ev)
		}
	case <-time.After(waitFor):
		t.Fatal("the first load did not end after the JWKS request was released")
	}
	wantVerifies(t, v, is, "n")
	if n := is.JWKSFetches(); n != 1 {
		t.Fatalf("%d JWKS fetches, want 1 (the background one)", n)
	}
}

// waitSignal is a context that reports, once, when its Done channel is first
// asked for. refresh asks for it only once it has begun or joined the
// cluster's load (the load itself runs under context.WithoutCancel, which
// never asks), as it starts to wait: the report means the caller is in the
// flight.
type waitSignal struct {
	context.Context
	once    sync.Once
	waiting chan<- struct{}
}

func (c *waitSignal) Done() <-chan struct{} {
	c.once.Do(func() { c.waiting <- struct{}{} })
	return c.Context.Done()
}

// Concurrent loads of one cluster are one fetch: callers that ask while a
// load is in flight join it and all get its outcome. N Refresh calls wait on
// one held JWKS request; when it is released, the issuer has served one JWKS
// request, and every caller has the load's result: the keys in one case, the
// same error in the other.
func TestRefresh_ConcurrentLoadsShareOneFetch(t *testing.T) {
	const callers = 6 // fewer than the gate's 8 announcements, should each make its own request
	for _, tc := range []struct {
		name string
		fail bool // the held request answers 503 when released
	}{{"keys", false}, {"error", true}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			g := newGate()
			var jwksRequests atomic.Int64 // served, with keys or with the error
			is := newIssuerWrapped(t, clk, func(next http.Handler) http.Handler {
				return g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.HasSuffix(r.URL.Path, "/openid/v1/jwks") {
						jwksRequests.Add(1)
						if tc.fail {
							http.Error(w, "unavailable", http.StatusServiceUnavailable)
							return
						}
					}
					next.ServeHTTP(w, r)
				}))
			})
			v := newVerifier(t, clk, clusterFor(t, is, "prod"))
			g.close()
			t.Cleanup(g.open)

			waiting := make(chan struct{}, callers)
			errs := make(chan error, callers)
			var wg sync.WaitGroup
			for range callers {
				ctx := &waitSignal{Context: context.Background(), waiting: waiting}
				wg.Go(func() { errs <- v.Refresh(ctx) })
			}
			for i := range callers {
				select {
				case <-waiting:
				case <-time.After(waitFor):
					t.Fatalf("%d of %d callers waiting on a load", i, callers)
				}
			}
			select {
			case <-g.entered:
			case <-time.After(waitFor):
				t.Fatal("no JWKS request in flight")
			}
			g.open()
			wg.Wait()
			close(errs)

			if n := jwksRequests.Load(); n != 1 {
				t.Fatalf("%d JWKS requests for %d concurrent loads, want 1", n, callers)
			}
			var want string
			if tc.fail {
				want = fmt.Sprintf(`cluster "prod": jwks: GET %s: status 503 Service Unavailable`, is.JWKSURL())
			}
			for err := range errs {
				got := ""
				if err != nil {
					got = err.Error()
				}
				if got != want {
					t.Fatalf("a caller got %q, want %q (the one load's outcome)", got, want)
				}
			}
			if !tc.fail {
				wantVerifies(t, v, is, "n")
			}
		})
	}
}
