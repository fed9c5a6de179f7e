package horizon

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// Upstream facts this package records (nats-server v2.15.2, nats.go v1.55.0).
const (
	// firstPing is nats-server's firstClientPingInterval: processConnect
	// arms a client's first PING at 2 s plus up to 20 % jitter, before it
	// consults the auth callout.
	firstPing       = 2 * time.Second
	firstPingJitter = firstPing / 5
	// firstPingErr is the error of nats.go's sendConnect when the first line
	// after its own PING is neither PONG nor -ERR (it exports no value for it).
	firstPingErr = "nats: expected 'PONG', got 'PING'"
)

// The answer times of the test's callout: one past the latest first PING,
// one well before the earliest.
const (
	lateAnswer   = 2600 * time.Millisecond
	inTimeAnswer = 1500 * time.Millisecond
)

// world is a Kubernetes-like issuer and the verifier that trusts it.
type world struct {
	issuer   *kubeissuer.Issuer
	verifier *verifier.RunnerVerifier
	resolver *verifier.Resolver
}

func newWorld(t *testing.T, opts kubeissuer.Options) *world {
	t.Helper()
	is, err := kubeissuer.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Close() })
	v := verifiertest.New(t, "", []verifier.RunnerCluster{verifiertest.Cluster(t, is, "prod")})
	return &world{issuer: is, verifier: v, resolver: verifier.NewResolver(v, nil)}
}

func (w *world) token(t *testing.T, node string) string {
	t.Helper()
	tok, err := w.issuer.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// lateResolver is a callout that answers late: it resolves only after delay,
// whatever the request's deadline, so that the answer's time is the test's
// choice and not the callout's.
type lateResolver struct {
	inner callout.Resolver
	delay atomic.Int64 // time.Duration
}

func (l *lateResolver) Resolve(ctx context.Context, tok string, want verifier.SubjectKind) (verifier.Subject, error) {
	timer := time.NewTimer(time.Duration(l.delay.Load()))
	defer timer.Stop()
	<-timer.C // deliberately not ctx: this callout ignores its deadline
	return l.inner.Resolve(context.WithoutCancel(ctx), tok, want)
}

// connectLikeRunner connects as compass-runner does: a token, and its
// connect timeout (far above the first PING, so the PING, not the client's
// timer, ends a slow CONNECT).
func connectLikeRunner(url, tok string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Token(tok), nats.Name("compass-runner/test"),
		nats.Timeout(runner.DefaultConnectTimeout), nats.NoReconnect())
}

// TestFirstPingHorizon records upstream behaviour, and fails loudly when an
// upgrade of nats-server or nats.go changes it: whatever
// authorization { timeout } says (5 s in deploy/nats/server-config.conf), a
// nats.go client gives the auth callout only until the server's first PING,
// 2 s to 2.4 s after its CONNECT. nats-server arms that PING before it asks
// the callout (only an embedding program can turn it off, with
// Options.DisableShortFirstPing, which no config key sets), and nats.go fails
// a CONNECT whose first answer is that PING. An answer at 2.6 s therefore
// fails the CONNECT with exactly firstPingErr, though the callout authorized
// it; one at 1.5 s connects. Both the real binary and an in-process server
// run the shipped config. If this test fails after an upgrade, revisit the
// callout's answer horizon (callout.DefaultAnswerHorizon, --answer-horizon)
// and the Runner's handling of the failure (runner/linkauth.go).
func TestFirstPingHorizon(t *testing.T) {
	t.Logf("nats-server %s (in-process; the binary is pinned to the same version), nats.go %s", server.VERSION, nats.Version)
	onBothServers(t, func(t *testing.T, serve func(*testing.T, string) string) {
		k := freshKeys(t)
		conf := k.config(t)
		checkAuthTimeout(t, conf)
		url := serve(t, conf)
		w := newWorld(t, kubeissuer.Options{})
		late := &lateResolver{inner: w.resolver}
		evs := newEvents()
		startCallout(t, url, k, func(c *callout.Config) { c.Resolver = late; c.Observe = evs.observe })

		t.Run("answer at 2.6s fails the CONNECT", func(t *testing.T) {
			late.delay.Store(int64(lateAnswer))
			start := time.Now()
			nc, err := connectLikeRunner(url, w.token(t, "node-late"))
			failed := time.Now()
			took := failed.Sub(start)
			if err == nil {
				nc.Close()
				t.Fatalf("CONNECT answered at %v succeeded after %v: nats-server no longer sends its first PING before the callout's answer, or nats.go now accepts it", lateAnswer, took)
			}
			if err.Error() != firstPingErr {
				t.Fatalf("CONNECT answered at %v failed after %v with %q, want %q", lateAnswer, took, err, firstPingErr)
			}
			if !runner.IsSlowAuth(err) {
				t.Fatalf("compass-runner does not recognise %q as a slow authorization", err)
			}
			if took < firstPing {
				t.Fatalf("CONNECT failed after %v, before the first PING's %v", took, firstPing)
			}
			d := evs.next(t)
			if d.Outcome != callout.OutcomeAuthorized {
				t.Fatalf("callout decision %s (%s), want authorized", d.Outcome, d.Reason)
			}
			if !failed.Before(d.at) {
				t.Fatalf("the client failed at %v, after the callout answered at %v", took, d.at.Sub(start))
			}
			t.Logf("CONNECT failed with %q after %v; the callout authorized it after %v (resolve to answer %v) - wasted",
				err, took.Round(time.Millisecond), d.at.Sub(start).Round(time.Millisecond), d.Latency.Round(time.Millisecond))
		})

		t.Run("answer at 1.5s connects", func(t *testing.T) {
			late.delay.Store(int64(inTimeAnswer))
			start := time.Now()
			nc, err := connectLikeRunner(url, w.token(t, "node-in-time"))
			took := time.Since(start)
			if err != nil {
				t.Fatalf("CONNECT answered at %v failed after %v: %v", inTimeAnswer, took, err)
			}
			defer nc.Close()
			if took < inTimeAnswer {
				t.Fatalf("CONNECT took %v, less than the callout's delay %v: the resolver was not in the path", took, inTimeAnswer)
			}
			if err := nc.FlushTimeout(waitFor); err != nil {
				t.Fatalf("connected Runner cannot round-trip: %v", err)
			}
			if d := evs.next(t); d.Outcome != callout.OutcomeAuthorized || d.RunnerID != "prod/node-in-time" {
				t.Fatalf("callout decision %s for %q (%s), want authorized prod/node-in-time", d.Outcome, d.RunnerID, d.Reason)
			}
			t.Logf("CONNECT answered at %v connected after %v", inTimeAnswer, took.Round(time.Millisecond))
		})
		evs.none(t)
	})
}

// checkAuthTimeout makes sure the configuration's authorization timeout is
// above the late answer: the test is about the first PING, not that timeout.
func checkAuthTimeout(t *testing.T, conf string) {
	t.Helper()
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		t.Fatalf("nats config: %v", err)
	}
	if d := time.Duration(opts.AuthTimeout * float64(time.Second)); d <= lateAnswer {
		t.Fatalf("%s sets authorization { timeout: %v }, not above the late answer %v; the test needs a longer one", deployConfig, d, lateAnswer)
	}
	if !strings.Contains(conf, "auth_callout") {
		t.Fatalf("%s has no auth_callout", deployConfig)
	}
}
