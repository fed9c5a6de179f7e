package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/internal/lib/atomicfile"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/verifier"
)

func ping(t *testing.T, nc *nats.Conn, id string) (runner.Response, error) {
	t.Helper()
	subj, err := subjects.Command(id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(subj, []byte(`{"command":"ping","args":{}}`), 5*time.Second)
	if err != nil {
		return runner.Response{}, err
	}
	var resp runner.Response
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		t.Fatalf("answer is not an envelope: %s", m.Data)
	}
	return resp, nil
}

func TestRunnerEnrollsWithOnlyTokenFileAndAnswersPing(t *testing.T) {
	s := newStack(t, stackOpts{})
	node := "ip-10-0-1-5.ec2.internal"
	h := s.startRunner(t, s.tokenFile(t, node), runnerOpts{})
	id := h.waitReady(t, 20*time.Second)
	if want := verifier.WorkloadRunnerID(cluster, node); id != want || h.r.ID() != want {
		t.Fatalf("Runner ID = %q, want the Server-assigned %q", id, want)
	}
	resp, err := ping(t, s.server, id)
	if err != nil || !resp.OK {
		t.Fatalf("ping: %+v %v", resp, err)
	}
	// The operator path: AdminService.PingRunner on the door reaches it too.
	acct, _, err := s.st.Mint(t.Context(), verifier.SubjectAccount, "ops")
	if err != nil {
		t.Fatal(err)
	}
	client := adminv1connect.NewAdminServiceClient(httpClientFor(t, s), s.doorURL, connect.WithGRPC())
	req := connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: id})
	req.Header().Set("Authorization", "Bearer "+acct)
	pr, err := client.PingRunner(t.Context(), req)
	if err != nil {
		t.Fatalf("PingRunner: %v", err)
	}
	if !strings.Contains(pr.Msg.GetAnswerJson(), `"pong":true`) {
		t.Fatalf("PingRunner answer = %s", pr.Msg.GetAnswerJson())
	}
	list, err := s.st.ListRunners(t.Context())
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("the Server's registry: %+v %v", list, err)
	}
	tok, _ := h.tokens.Token()
	if strings.Contains(h.logs.String(), tok) || strings.Contains(s.doorLogs.String(), tok) {
		t.Fatal("a token appears in a log")
	}
}

func TestRunnerStaysAnsweringAcrossUserJWTExpiriesAndRotations(t *testing.T) {
	if testing.Short() {
		t.Skip("runs through several 5 s user-JWT lifetimes")
	}
	const maxUser = 5 * time.Second // the callout's minimum cap
	for _, tc := range []struct {
		name         string
		refresh      time.Duration
		rotateEvery  time.Duration
		maxLost      int
		minHandovers int64
	}{
		// --nats-refresh below the cap: every user JWT is replaced before
		// the server expires it; nothing may be lost.
		{"refresh below the user-JWT lifetime", 3 * time.Second, 1500 * time.Millisecond, 0, 6},
		// No refresh: the server expires the first user JWT and cuts the
		// connection; the Runner reconnects, learns the lifetime and replaces
		// later ones early. Commands sent while it reconnects get "no
		// responders" at once (it is not connected); of those sent while it
		// is subscribed only one in flight at the cut may go unanswered (its
		// reply permission died with the old connection).
		// Rotations are rarer than the cap here, so the expiry happens.
		// Two early reconnects are what the 15 s after the expiry
		// guarantee (a third comes only when the reconnect after the cut is
		// quick); that the server expired the authorization only once is
		// what proves each one came in time.
		{"lifetime learned from the first expiry", 0, 7 * time.Second, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, stackOpts{maxUserLifetime: maxUser})
			node := "node-rotating"
			path := s.tokenFile(t, node)

			// The kubelet stand-in: RotateTokenFile rewrites the file
			// whenever the test fires its timer.
			fire := make(chan time.Time)
			var rotations atomic.Int64
			rctx, stopRotator := context.WithCancel(context.Background())
			rotatorDone := make(chan error, 1)
			go func() {
				rotatorDone <- s.issuer.RotateTokenFile(rctx, path, kubeissuer.Pod{NodeName: node}, 0,
					func(time.Duration) <-chan time.Time { return fire }, func(time.Time, error) { rotations.Add(1) })
			}()
			defer func() {
				stopRotator()
				if err := <-rotatorDone; err != nil {
					t.Errorf("rotator: %v", err)
				}
			}()

			var handovers, expiries atomic.Int64
			h := s.startRunner(t, path, runnerOpts{refresh: tc.refresh, checkEvery: 100 * time.Millisecond, rotateJitter: 500 * time.Millisecond,
				onEvent: func(ev runner.LinkEvent) {
					switch {
					case ev.Kind == runner.EventHandover:
						handovers.Add(1)
					case ev.Kind == runner.EventAuthError && errors.Is(ev.Err, nats.ErrAuthExpired):
						expiries.Add(1)
					}
				}})
			id := h.waitReady(t, 20*time.Second)

			// Commands keep coming for four user-JWT lifetimes while the
			// token file is rotated every rotateEvery.
			subj, _ := subjects.Command(id)
			var sent, answered, disconnected int
			var failures []string
			end := time.Now().Add(4 * maxUser)
			nextRotation := time.Now().Add(tc.rotateEvery)
			for time.Now().Before(end) {
				if time.Now().After(nextRotation) {
					fire <- time.Now()
					nextRotation = time.Now().Add(tc.rotateEvery)
				}
				sent++
				m, err := s.server.Request(subj, []byte(`{"command":"info"}`), 2*time.Second)
				if errors.Is(err, nats.ErrNoResponders) {
					// Sent while the Runner had no subscription (it was
					// reconnecting after a cut): the sender knows at once.
					disconnected++
					continue
				}
				if err != nil {
					failures = append(failures, err.Error())
					continue
				}
				var resp runner.Response
				if json.Unmarshal(m.Data, &resp) != nil || !resp.OK {
					failures = append(failures, string(m.Data))
					continue
				}
				answered++
			}
			st := h.r.Link().Status()
			t.Logf("%d commands sent, %d answered, %d refused at once as the Runner was not subscribed, %d sent while subscribed and not answered %v; %d token rotations, %d early reconnects, %d server-side user-JWT expiries, %d disconnect-driven reconnects",
				sent, answered, disconnected, len(failures), failures, rotations.Load()-1, handovers.Load(), expiries.Load(), st.Reconnects)
			if tc.refresh > 0 && disconnected > 0 {
				t.Fatalf("%d commands found the Runner unsubscribed", disconnected)
			}
			if len(failures) > tc.maxLost {
				t.Fatalf("%d of %d commands not answered, at most %d allowed: %v", len(failures), sent, tc.maxLost, failures[:min(5, len(failures))])
			}
			if handovers.Load() < tc.minHandovers || rotations.Load() < 3 {
				t.Fatalf("want several user-JWT replacements and rotations, got %d early reconnects and %d rotations", handovers.Load(), rotations.Load())
			}
			if tc.refresh > 0 && (st.Reconnects != 0 || expiries.Load() != 0) {
				t.Fatalf("the server expired the Runner's authorization %d times (reconnects %d)", expiries.Load(), st.Reconnects)
			}
			// After the one expiry, either nats.go reconnects the cut session
			// or, when the lesson lands first, an early reconnect replaces it.
			if tc.refresh == 0 && (expiries.Load() != 1 || st.Reconnects > 1) {
				t.Fatalf("want exactly one server-side expiry (then early reconnects), got %d expiries and %d reconnects", expiries.Load(), st.Reconnects)
			}
			if resp, err := ping(t, s.server, id); err != nil || !resp.OK {
				t.Fatalf("ping at the end: %+v %v", resp, err)
			}
		})
	}
}

func TestRunnerWithTokenRemovedAndExpiredSaysWhy(t *testing.T) {
	// Tokens are issued 590 s in the past with the 600 s lifetime: they
	// expire 10 s from now. Both doors accept a token until exp plus the
	// verifier's 60 s leeway, so the callout caps the user JWT there: the
	// server ends the session about 70 s from now, and the Runner, whose
	// file is gone and whose last token has expired, is refused.
	s := newStack(t, stackOpts{issuerNow: func() time.Time { return time.Now().Add(-590 * time.Second) }})
	path := s.tokenFile(t, "node-expiring")
	var authErrs atomic.Int64
	authErr := make(chan struct{}, 1)
	h := s.startRunner(t, path, runnerOpts{onEvent: func(ev runner.LinkEvent) {
		if ev.Kind == runner.EventAuthError && errors.Is(ev.Err, nats.ErrAuthorization) {
			authErrs.Add(1)
			select {
			case authErr <- struct{}{}:
			default:
			}
		}
	}})
	id := h.waitReady(t, 20*time.Second)
	if resp, err := ping(t, s.server, id); err != nil || !resp.OK {
		t.Fatalf("ping before expiry: %+v %v", resp, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-authErr:
	case <-time.After(verifier.Leeway + 40*time.Second):
		t.Fatalf("the Runner was never refused:\n%s", h.logs)
	}
	logs := h.logs.String()
	for _, want := range []string{
		"token file unreadable; using the last good token until it expires",
		"token file unreadable and no usable token left",
		"NATS refused authorization: the Runner has no usable token",
	} {
		if !strings.Contains(logs, want) {
			t.Fatalf("the log does not say %q:\n%s", want, logs)
		}
	}
	if h.r.Ready() {
		t.Fatal("ready while refused")
	}
	if _, err := ping(t, s.server, id); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("ping after expiry: err = %v, want no responders", err)
	}
}

func TestManyRunnersRotateAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("500 Runners")
	}
	// The spread window under test (production default 30 s).
	const jitter = 5 * time.Second
	n := 500
	if v := os.Getenv("COMPASS_E2E_RUNNERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("COMPASS_E2E_RUNNERS=%q", v)
		}
	}
	// ES256: signing 500 RS256 tokens takes minutes under the race detector
	// on a loaded machine, longer than the first tokens live.
	s := newStack(t, stackOpts{alg: kubeissuer.ES256})
	type member struct {
		h        *runnerHandle
		path     string
		node     string
		id       string
		handover chan runner.LinkEvent
		written  time.Time // when its token file was rewritten
	}
	ms := make([]*member, n)
	// The Runners share one door client (one TLS session instead of 500
	// handshakes) and start in batches: this test is about the NATS
	// rotation, and 500 simultaneous enrollments under the race detector on
	// a shared 2-core machine exceed the 10 s attempt bound.
	hc := httpClientFor(t, s)
	// 20 at a time: the SQLite store's writers queue behind a 5 s busy
	// timeout, which 50 concurrent enrollments exceed under the race
	// detector on a loaded 2-core machine ("recording the enrollment failed").
	const batch = 20
	startAll := time.Now()
	for i := range ms {
		m := &member{node: fmt.Sprintf("node-%03d", i), handover: make(chan runner.LinkEvent, 4)}
		m.path = s.tokenFile(t, m.node)
		m.h = s.startRunner(t, m.path, runnerOpts{quiet: true, checkEvery: 250 * time.Millisecond, rotateJitter: jitter, httpClient: hc,
			onEvent: func(ev runner.LinkEvent) {
				if ev.Kind == runner.EventHandover {
					m.handover <- ev
				}
			}})
		ms[i] = m
		if (i+1)%batch == 0 || i == n-1 {
			for _, m := range ms[max(0, i+1-batch) : i+1] {
				m.id = m.h.waitReady(t, 60*time.Second)
			}
		}
	}
	t.Logf("%d Runners enrolled and connected in %s", n, time.Since(startAll).Round(time.Millisecond))
	// Registered after every Runner's own cleanup, so it runs first: all 500
	// drain in parallel instead of one after another.
	t.Cleanup(func() {
		for _, m := range ms {
			m.h.cancel()
		}
	})

	// Rotate every token file at once, as a node-pool-wide kubelet restart
	// would. The new tokens are signed first so the rewrite itself is quick.
	fresh := make([]string, n)
	for i, m := range ms {
		tok, err := s.issuer.Token(kubeissuer.Pod{NodeName: m.node}, 0)
		if err != nil {
			t.Fatal(err)
		}
		fresh[i] = tok
	}
	rotatedAt := time.Now()
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := atomicfile.Write(m.path, []byte(fresh[i])); err != nil {
				t.Error(err)
			}
			m.written = time.Now()
		}()
	}
	wg.Wait()
	written := time.Since(rotatedAt)
	// Per Runner, from its own file's rewrite - delays: to serving on the new
	// connection; starts: to the start of the early reconnect (token check +
	// jitter); took: the early reconnect itself (dial, CONNECT through the
	// callout, subscribe, flush).
	delays, starts, took := make([]time.Duration, 0, n), make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	var ends []time.Duration // from the first rewrite
	deadline := time.After(jitter + 10*time.Minute)
	for _, m := range ms {
		select {
		case ev := <-m.handover:
			delays = append(delays, ev.At.Sub(m.written))
			starts = append(starts, ev.At.Add(-ev.Took).Sub(m.written))
			took = append(took, ev.Took)
			ends = append(ends, ev.At.Sub(rotatedAt))
		case <-deadline:
			t.Fatalf("only %d of %d Runners reconnected; %s did not:\n%s", len(delays), n, m.id, m.h.logs)
		}
	}
	q := func(ds []time.Duration, p float64) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[int(p*float64(len(ds)-1))].Round(time.Millisecond)
	}
	spread := func(ds []time.Duration) string {
		return fmt.Sprintf("min %s p10 %s p50 %s p90 %s p99 %s max %s", q(ds, 0), q(ds, 0.1), q(ds, 0.5), q(ds, 0.9), q(ds, 0.99), q(ds, 1))
	}
	t.Logf("%d token files rewritten in %s (jitter window %s, token check every 250ms)", n, written.Round(time.Millisecond), jitter)
	t.Logf("file rewrite -> early reconnect starts: %s", spread(starts))
	t.Logf("early reconnect duration:               %s", spread(took))
	t.Logf("file rewrite -> serving on new conn:    %s", spread(delays))
	t.Logf("first rewrite -> last Runner serving:   %s", slices.Max(ends).Round(time.Millisecond))
	// Every Runner answers on its new connection.
	for _, m := range ms {
		if resp, err := ping(t, s.server, m.id); err != nil || !resp.OK {
			t.Fatalf("%s after the rotation: %+v %v", m.id, resp, err)
		}
		if st := m.h.r.Link().Status(); st.Reconnects != 0 {
			t.Fatalf("%s was cut off %d times", m.id, st.Reconnects)
		}
	}
	// Spread: the reconnects are not one burst.
	// Uniform jitter over the window spreads p10..p90 over ~80 % of it; with
	// a hundred Runners or more, under half means the jitter is not applied.
	if n >= 100 && q(starts, 0.9)-q(starts, 0.1) < jitter/2 {
		t.Fatalf("early reconnects start bunched: p10 %s p90 %s within a %s window", q(starts, 0.1), q(starts, 0.9), jitter)
	}
}

func TestRunnerStopsWhenEnrollmentRefused(t *testing.T) {
	s := newStack(t, stackOpts{})
	// A token from an issuer the Server does not trust: Unauthenticated, not retried.
	stranger, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	path := filepath.Join(t.TempDir(), "token")
	if _, err := stranger.WriteTokenFile(path, kubeissuer.Pod{NodeName: "node-x"}, 0); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	tokens := runner.NewFileToken(path, log, nil)
	e, err := enroll.New(enroll.Config{ServerURL: s.doorURL, CAFile: s.doorCA, Tokens: tokens, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(runner.Config{Tokens: tokens, TokenFile: path, Enroller: e, HealthAddr: "127.0.0.1:0", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case err := <-done:
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("Run = %v, want Unauthenticated", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the Server refused the token")
	}
}
