package verifier

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/compass-runner/identity/tokenreview"
)

// TokenReview is a cluster's optional online check (DL-440's deferred
// Enroll-time TokenReview, issue 34): after a projected token of the
// cluster verifies offline, its API server is asked whether it still
// accepts the token, which it refuses once the pod the token is bound to is
// gone. Offline verification stays the contract; this only ever refuses
// more.
type TokenReview struct {
	// Server is the API server, https://host[:port].
	Server string
	// TokenFile is the reviewer's own credential, a bearer token (in a pod:
	// its ServiceAccount token, which the kubelet rotates; re-read when it
	// changes). Its ServiceAccount needs create on tokenreviews, nothing else.
	TokenFile string
	// CAFile is the API server's CA (PEM); empty: the system roots.
	CAFile string
	// OnUnavailable is what a door does with a token it cannot have
	// reviewed (the API server unreachable, slow or refusing the
	// reviewer): ReviewFallbackOffline accepts it on offline verification
	// alone (the record's contract), saying so in a log line and a metric;
	// ReviewFailClosed refuses it, as keys unavailable (the Runner retries).
	OnUnavailable ReviewFallback
	// WatchPods also watches the pods of the cluster's Runner namespace
	// (podwatch): a pod going away is known within moments, so both doors
	// refuse its token at once (before the API server's own review says
	// so) and compass-callout ends its live NATS connections (kick reason
	// pod_deleted). The credential then needs get, list and watch on pods
	// in that namespace too.
	WatchPods bool
}

// ReviewFallback is TokenReview.OnUnavailable.
type ReviewFallback string

const (
	// ReviewFallbackOffline accepts on offline verification when the API
	// server cannot answer: the default, since offline verification is
	// DL-440's contract and an API server outage must not lock every
	// Runner of the cluster out.
	ReviewFallbackOffline ReviewFallback = "offline"
	// ReviewFailClosed refuses when the API server cannot answer: a deleted
	// pod's token is then never accepted, at the price of an API server
	// outage refusing every new connection of the cluster.
	ReviewFailClosed ReviewFallback = "refuse"
)

func parseTokenReview(n *yaml.Node) (*TokenReview, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("want a mapping with server, tokenFile, caFile, onUnavailable and watchPods (line %d)", n.Line)
	}
	r := &TokenReview{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var dst *string
		switch k.Value {
		case "server":
			dst = &r.Server
		case "tokenFile":
			dst = &r.TokenFile
		case "caFile":
			dst = &r.CAFile
		case "onUnavailable":
			dst = (*string)(&r.OnUnavailable)
		case "watchPods":
		default:
			return nil, fmt.Errorf("unknown key %q (line %d); known keys are server, tokenFile, caFile, onUnavailable, watchPods", k.Value, k.Line)
		}
		if seen[k.Value] {
			return nil, fmt.Errorf("duplicate key %q (line %d)", k.Value, k.Line)
		}
		seen[k.Value] = true
		if dst == nil { // watchPods
			if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
				return nil, fmt.Errorf("%s: want true or false (line %d)", k.Value, v.Line)
			}
			r.WatchPods = v.Value == "true"
			continue
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			return nil, fmt.Errorf("%s: want a string (line %d)", k.Value, v.Line)
		}
		*dst = v.Value
	}
	return r, nil
}

// check fills the default and checks r on its own; the error names the
// field, and the caller prefixes the cluster and tokenReview.
func (r *TokenReview) check() error {
	if r == nil {
		return nil
	}
	if r.Server == "" {
		return errors.New("server: required: the cluster's API server, https://host[:port]")
	}
	if err := checkHTTPSURL(r.Server, ""); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if r.TokenFile == "" {
		return errors.New("tokenFile: required: the reviewer's bearer token (in a pod: /var/run/secrets/kubernetes.io/serviceaccount/token)")
	}
	switch r.OnUnavailable {
	case "":
		r.OnUnavailable = ReviewFallbackOffline
	case ReviewFallbackOffline, ReviewFailClosed:
	default:
		return fmt.Errorf("onUnavailable: %q is neither %s nor %s", r.OnUnavailable, ReviewFallbackOffline, ReviewFailClosed)
	}
	return nil
}

// clone is a copy the verifier keeps.
func (r *TokenReview) clone() *TokenReview {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// clusterReview is a cluster's reviewer, kept across Reloads while the
// cluster and its tokenReview are unchanged (its cache with it), and what
// it decided, for ClusterStatus.
type clusterReview struct {
	cfg      TokenReview
	reviewer *tokenreview.Reviewer
	// The outcomes, counted per token reviewed (a cached answer counts as
	// the answer it repeats).
	accepted, rejected, fellBack, refused atomic.Uint64
	// lastFallbackLog rate-limits the fallback's log line (unix nanos).
	lastFallbackLog atomic.Int64
	// pods is the cluster's pod watch (tokenReview.watchPods; nil: none).
	pods *podWatch
}

// ReviewStats are a cluster's token reviews since it was configured with
// its tokenReview (ClusterStatus.Reviews).
type ReviewStats struct {
	OnUnavailable ReviewFallback
	// Accepted: the API server accepts the token. Rejected: it does not
	// (the pod is gone, the token was bound to another pod), so the token
	// was refused. FellBack: the API server could not answer and the token
	// was accepted on offline verification (OnUnavailable offline).
	// Refused: it could not answer and the token was refused (refuse).
	Accepted, Rejected, FellBack, Refused uint64
	// Watching: the cluster's tokenReview has watchPods; WatchUp: its
	// watch is established now; PodsGone: the pods it reported going
	// away.
	Watching, WatchUp bool
	PodsGone          uint64
}

// fallbackLogEvery bounds the fallback's log line to one per cluster in
// this long: during an API server outage every connect of the cluster
// falls back, and a reconnect storm would otherwise write a line each.
const fallbackLogEvery = 10 * time.Second

// newClusterReview makes rc's reviewer for cfg.
func (v *RunnerVerifier) newClusterReview(rc RunnerCluster, cfg TokenReview) (*clusterReview, error) {
	r, err := tokenreview.New(tokenreview.Config{
		Server: cfg.Server, TokenFile: cfg.TokenFile, CAFile: cfg.CAFile,
		Audience: rc.Audience, Namespace: rc.Namespace, ServiceAccount: rc.ServiceAccount,
	}, tokenreview.WithClock(v.now))
	if err != nil {
		return nil, fmt.Errorf("tokenReview: %w", err)
	}
	cr := &clusterReview{cfg: cfg, reviewer: r}
	if cfg.WatchPods {
		if cr.pods, err = v.newPodWatch(rc, cfg); err != nil {
			return nil, fmt.Errorf("tokenReview: watchPods: %w", err)
		}
	}
	return cr, nil
}

// review asks c's API server about a token that verified offline as sub,
// when c has a tokenReview: the token is refused when the API server does
// not accept it or names another pod than the token does, and, when it
// cannot answer, accepted or refused as OnUnavailable says.
func (v *RunnerVerifier) review(ctx context.Context, c *cluster, token string, sub Subject) (Subject, error) {
	r := c.life.review.Load()
	if r == nil {
		return sub, nil
	}
	name := c.cfg.Name
	if r.pods.isGone(sub.Workload.PodUID) {
		// The pod watch saw it go: no need to ask, and no 10 s of the API
		// server's own reuse of an earlier success.
		r.rejected.Add(1)
		return Subject{}, unauthenticated(name, errPodGone)
	}
	res, err := r.reviewer.Review(ctx, token, sub.NotAfter)
	switch {
	case err == nil && res.PodUID == sub.Workload.PodUID:
		r.accepted.Add(1)
		return sub, nil
	case err == nil:
		// The API server accepts the token for another pod than its claims
		// name: not this token's pod any more.
		r.rejected.Add(1)
		return Subject{}, unauthenticated(name, errReviewPod)
	case errors.Is(err, tokenreview.ErrRejected):
		r.rejected.Add(1)
		return Subject{}, unauthenticated(name, errReviewRejected)
	case ctx.Err() != nil:
		// The caller gave up: not the API server's doing.
		return Subject{}, keysUnavailable(name, errReviewUnavailable)
	case r.cfg.OnUnavailable == ReviewFailClosed:
		r.refused.Add(1)
		return Subject{}, keysUnavailable(name, errReviewUnavailable)
	}
	r.fellBack.Add(1)
	now := v.now().UnixNano()
	if last := r.lastFallbackLog.Load(); now-last >= int64(fallbackLogEvery) && r.lastFallbackLog.CompareAndSwap(last, now) {
		v.log.Warn("verifier: token review unavailable; accepting on offline verification (tokenReview.onUnavailable: offline)",
			"cluster", name, "error", err, "fell_back", r.fellBack.Load())
	}
	return sub, nil
}

// stats is what r decided so far.
func (r *clusterReview) stats() *ReviewStats {
	if r == nil {
		return nil
	}
	st := &ReviewStats{OnUnavailable: r.cfg.OnUnavailable, Accepted: r.accepted.Load(), Rejected: r.rejected.Load(),
		FellBack: r.fellBack.Load(), Refused: r.refused.Load()}
	if r.pods != nil {
		st.Watching = true
		st.WatchUp, _ = r.pods.w.Healthy()
		st.PodsGone = r.pods.reported.Load()
	}
	return st
}
