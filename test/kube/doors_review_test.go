package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/tokenreview"
)

// reviewDeadline bounds the wait for a deleted pod's token to be refused at
// both doors: the API server's own 10 s reuse of a success, the doors'
// tokenreview.MaxAcceptedAge (10 s), its informers' lag, and room for a
// loaded machine.
const reviewDeadline = 40 * time.Second

// reviewClusterFile registers the review cluster with a tokenReview asking
// its own API server, onUnavailable as given.
func (c *reviewCluster) clusterFile(t *testing.T, onUnavailable string) string {
	t.Helper()
	body := clusterFileFor("review", c.srv.issuer, "", c.srv.caFile) + fmt.Sprintf(
		"    tokenReview:\n      server: %q\n      tokenFile: %q\n      caFile: %q\n      onUnavailable: %s\n",
		c.cfg.Server, c.cfg.TokenFile, c.cfg.CAFile, onUnavailable)
	path := filepath.Join(t.TempDir(), "clusters.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// connectRunner connects to NATS with tok as runnerID: nil when the callout
// authorized it.
func (s *compassStack) connectRunner(t *testing.T, runnerID, tok string) (*nats.Conn, error) {
	t.Helper()
	inbox, err := subjects.InboxPrefix(runnerID)
	if err != nil {
		t.Fatal(err)
	}
	return nats.Connect(s.natsURL, nats.Token(tok), nats.CustomInboxPrefix(inbox), nats.NoReconnect(), nats.Timeout(natsWait))
}

// lastDecision is the callout's decision about the next request, within
// natsWait.
func (s *compassStack) lastDecision(t *testing.T) callout.Event {
	t.Helper()
	select {
	case ev := <-s.events:
		return ev
	case <-time.After(natsWait):
		t.Fatal("the callout decided nothing")
		return callout.Event{}
	}
}

// Issue 34 at both doors, against a real kube-apiserver: a cluster whose
// entry has a tokenReview. A Runner pod's bound token (TokenRequest, as the
// kubelet asks for it; this control plane's --api-audiences is its issuer
// alone, so the test asks as the admin) enrolls at the
// Server's door and connects to NATS through the callout; the pod deleted,
// the same token is refused at both doors (within the API server's 10 s
// reuse of a success plus the doors' MaxAcceptedAge), as unauthenticated,
// while offline verification alone would still accept it. Then the API
// server stopped: a token never reviewed before is accepted on offline
// verification where the entry says onUnavailable offline, at both doors,
// and refused as unavailable (which Runners retry) where it says refuse, at
// both doors; each door's verifier counts what it decided
// (ClusterStatus.Reviews, compass_token_reviews_total).
func TestLiveDeletedPodsTokenIsRefusedAtBothDoors(t *testing.T) {
	c := startReviewCluster(t)
	ctx := t.Context()
	if err := c.srv.waitAnonymousDiscovery(ctx); err != nil {
		t.Fatal(err)
	}
	offline := newCompassStack(t, c.clusterFile(t, "offline"))
	refuse := newCompassStack(t, c.clusterFile(t, "refuse"))
	runnerID := "review/" + strings.ReplaceAll(runnerNode, ".", "_")

	tok, err := tokenFor(ctx, c.srv.cs, runnerSA, c.pod, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}
	// A second pod's token, for after the API server is stopped: minted
	// now, never reviewed by either stack until then.
	later, err := c.srv.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod("compass-runner-later", runnerSA, runnerNode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	laterTok, err := tokenFor(ctx, c.srv.cs, runnerSA, later, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}

	for name, s := range map[string]*compassStack{"offline": offline, "refuse": refuse} {
		if resp, err := s.enroll(ctx, tok); err != nil || resp.GetRunnerId() != runnerID {
			t.Fatalf("%s: Enroll with the live pod's token = %v, %v; want %s", name, resp, err, runnerID)
		}
		nc, err := s.connectRunner(t, runnerID, tok)
		if err != nil {
			t.Fatalf("%s: NATS CONNECT with the live pod's token: %v", name, err)
		}
		nc.Close()
		if ev := s.lastDecision(t); ev.Outcome != callout.OutcomeAuthorized {
			t.Fatalf("%s: the callout's decision = %s (%s), want authorized", name, ev.Outcome, ev.Reason)
		}
	}

	// A connect storm at the callout: 1,000 CONNECTs of ten pods' tokens,
	// 50 at a time, cost the API server at most one TokenReview per token.
	var storm []string
	for i := range 10 {
		p, err := c.srv.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod(fmt.Sprintf("compass-runner-storm-%d", i), runnerSA, runnerNode), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tk, err := tokenFor(ctx, c.srv.cs, runnerSA, p, runnerAudience)
		if err != nil {
			t.Fatal(err)
		}
		storm = append(storm, tk)
	}
	before := c.srv.tokenReviews(t)
	start := time.Now()
	errs := make(chan error, 1000)
	sem := make(chan struct{}, 50)
	for i := range 1000 {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			nc, err := offline.connectRunner(t, runnerID, storm[i%len(storm)])
			if err == nil {
				nc.Close()
			}
			errs <- err
		}()
	}
	for range 1000 {
		if err := <-errs; err != nil {
			t.Fatalf("a CONNECT of the storm: %v", err)
		}
	}
	took := time.Since(start)
	reviews := c.srv.tokenReviews(t) - before
	for len(offline.events) > 0 {
		<-offline.events
	}
	// One per token, each token new to the callout: an acceptance is reused
	// for MaxAcceptedAge, so a storm longer than that may cost one more
	// per token for each such period.
	want := len(storm) * (1 + int(took/tokenreview.MaxAcceptedAge))
	if reviews < len(storm) || reviews > want {
		t.Fatalf("1,000 CONNECTs of %d tokens in %s cost the API server %d TokenReviews, want %d to %d: one per token (per %s)",
			len(storm), took, reviews, len(storm), want, tokenreview.MaxAcceptedAge)
	}
	t.Logf("a storm of 1,000 CONNECTs of %d tokens, 50 at a time: %s, %d TokenReviews at the API server", len(storm), took.Round(time.Millisecond), reviews)

	// The pod deleted: both doors refuse its token.
	zero := int64(0)
	deleted := time.Now()
	if err := c.srv.cs.CoreV1().Pods(runnerNS).Delete(ctx, c.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	var lastEnroll error
	waitCtx, cancel := context.WithTimeout(ctx, reviewDeadline)
	defer cancel()
	err = poll(waitCtx, func(ctx context.Context) (bool, error) {
		_, lastEnroll = offline.enroll(ctx, tok)
		return connect.CodeOf(lastEnroll) == connect.CodeUnauthenticated, nil
	})
	if err != nil {
		t.Fatalf("Enroll with the deleted pod's token still not refused after %s: %v (last: %v)", reviewDeadline, err, lastEnroll)
	}
	t.Logf("the deleted pod's token refused at the door %s after the deletion", time.Since(deleted).Round(100*time.Millisecond))
	for name, s := range map[string]*compassStack{"offline": offline, "refuse": refuse} {
		// Each stack reuses its own acceptance of the token for
		// MaxAcceptedAge from when it asked: the other stack may still be
		// within it.
		waitCtx, cancel := context.WithTimeout(ctx, reviewDeadline)
		err := poll(waitCtx, func(ctx context.Context) (bool, error) {
			_, lastEnroll = s.enroll(ctx, tok)
			return connect.CodeOf(lastEnroll) == connect.CodeUnauthenticated, nil
		})
		cancel()
		if err != nil {
			t.Fatalf("%s: Enroll with the deleted pod's token still not refused after %s: %v (last: %v)", name, reviewDeadline, err, lastEnroll)
		}
		var decision callout.Event
		waitCtx, cancel = context.WithTimeout(ctx, reviewDeadline)
		err = poll(waitCtx, func(ctx context.Context) (bool, error) {
			nc, err := s.connectRunner(t, runnerID, tok)
			if err == nil {
				nc.Close()
			}
			decision = s.lastDecision(t)
			return errors.Is(err, nats.ErrAuthorization) && decision.Outcome == callout.OutcomeDenied, nil
		})
		cancel()
		if err != nil {
			t.Fatalf("%s: NATS CONNECT with the deleted pod's token still not refused: %v (last decision %s: %s)", name, err, decision.Outcome, decision.Reason)
		}
		if !strings.Contains(decision.Reason, "no longer accepts the token") {
			t.Fatalf("%s: the callout refused the deleted pod's token because %q, want the API server's refusal", name, decision.Reason)
		}
	}

	// The API server gone: a token never reviewed is accepted offline by
	// one stack and refused as unavailable by the other, at both doors.
	if err := c.srv.env.ControlPlane.GetAPIServer().Stop(); err != nil {
		t.Fatal(err)
	}
	if resp, err := offline.enroll(ctx, laterTok); err != nil || resp.GetRunnerId() != runnerID {
		t.Fatalf("offline: Enroll with the API server down = %v, %v; want accepted on offline verification", resp, err)
	}
	nc, err := offline.connectRunner(t, runnerID, laterTok)
	if err != nil {
		t.Fatalf("offline: NATS CONNECT with the API server down: %v, want accepted on offline verification", err)
	}
	nc.Close()
	if ev := offline.lastDecision(t); ev.Outcome != callout.OutcomeAuthorized {
		t.Fatalf("offline: the callout's decision with the API server down = %s (%s), want authorized", ev.Outcome, ev.Reason)
	}
	if _, err := refuse.enroll(ctx, laterTok); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("refuse: Enroll with the API server down: %v, want Unavailable (retried)", err)
	}
	if _, err := refuse.connectRunner(t, runnerID, laterTok); err == nil {
		t.Fatal("refuse: NATS CONNECT with the API server down was accepted")
	}
	if ev := refuse.lastDecision(t); ev.Outcome != callout.OutcomeKeysUnavailable {
		t.Fatalf("refuse: the callout's decision with the API server down = %s (%s), want keys unavailable (retried)", ev.Outcome, ev.Reason)
	}

	// What each door's verifier counted: every door accepted the live
	// token and refused the deleted pod's; with the API server down the
	// offline doors fell back once each and the refusing doors refused.
	for name, s := range map[string]*compassStack{"offline": offline, "refuse": refuse} {
		for i, v := range s.verifiers {
			st := v.Status()
			if len(st) != 1 || st[0].Reviews == nil {
				t.Fatalf("%s: door %d's verifier status %+v: want one cluster with reviews", name, i, st)
			}
			r := *st[0].Reviews
			if r.Accepted < 1 || r.Rejected < 1 {
				t.Errorf("%s: door %d's reviews %+v: want the live token accepted and the deleted pod's rejected", name, i, r)
			}
			if name == "offline" && (r.FellBack != 1 || r.Refused != 0 || r.OnUnavailable != "offline") {
				t.Errorf("offline: door %d's reviews %+v: want one fallback, no refusal", i, r)
			}
			if name == "refuse" && (r.Refused != 1 || r.FellBack != 0 || r.OnUnavailable != "refuse") {
				t.Errorf("refuse: door %d's reviews %+v: want one refusal, no fallback", i, r)
			}
		}
	}
}

// tokenReviews is how many TokenReviews the API server has answered since
// it started, from its own metrics (apiserver_request_total).
func (s *apiServer) tokenReviews(t *testing.T) int {
	t.Helper()
	body, err := s.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("the API server's metrics: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "apiserver_request_total{") && strings.Contains(l, `resource="tokenreviews"`) && strings.Contains(l, `verb="POST"`) {
			var v float64
			if _, err := fmt.Sscanf(l[strings.LastIndexByte(l, ' ')+1:], "%g", &v); err != nil {
				t.Fatalf("the API server's metric line %q: %v", l, err)
			}
			n += int(v)
		}
	}
	return n
}
