package verifier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-runner/identity/podwatch"
)

// ErrPodGone is CheckPod's answer for a pod the cluster's pod watch saw go:
// a door refuses its token, and compass-callout ends its live connections
// (kick reason pod_deleted).
var ErrPodGone = errors.New("verifier: the token's pod is gone")

// maxGonePods bounds the pod UIDs a cluster's watch remembers. A UID is
// kept only as long as a token bound to its pod could still verify (the
// cluster's maxTokenLifetime plus Leeway); 65,536 is far above the pods a
// Runner namespace loses in that time (one per node per rollout), so the
// bound only matters against a namespace churning pods on purpose, where
// the oldest are forgotten first (their tokens are the nearest to expiry).
const maxGonePods = 1 << 16

// podWatch is a cluster's watch of its Runner pods (tokenReview.watchPods)
// and the pods it saw go, by UID.
type podWatch struct {
	cluster string
	w       *podwatch.Watcher
	keep    time.Duration // how long a UID is remembered
	now     func() time.Time
	hook    func(cluster string)

	mu   sync.Mutex
	gone map[string]time.Time // UID → when the watch saw it go
	// reported counts the pods reported going away.
	reported atomic.Uint64
	// stop cancels the watch; set under reloadState.mu once started.
	stop context.CancelFunc
}

// newPodWatch makes rc's pod watch for cfg; it starts with Start (or at
// once in Reload, when Start has been called).
func (v *RunnerVerifier) newPodWatch(rc RunnerCluster, cfg TokenReview) (*podWatch, error) {
	p := &podWatch{cluster: rc.Name, keep: rc.MaxTokenLifetime + Leeway, now: v.now, hook: v.onPodGone,
		gone: map[string]time.Time{}}
	w, err := podwatch.New(podwatch.Config{Server: cfg.Server, TokenFile: cfg.TokenFile, CAFile: cfg.CAFile, Namespace: rc.Namespace},
		p.record, podwatch.WithClock(v.now), podwatch.WithLogger(v.log.With("cluster", rc.Name)))
	if err != nil {
		return nil, err
	}
	p.w = w
	return p, nil
}

// record remembers a pod going away and tells the hook.
func (p *podWatch) record(g podwatch.Gone) {
	if g.UID == "" {
		return
	}
	now := p.now()
	p.mu.Lock()
	if _, seen := p.gone[g.UID]; !seen {
		p.reported.Add(1)
	}
	p.gone[g.UID] = now
	if len(p.gone) > maxGonePods {
		p.pruneLocked(now)
	}
	p.mu.Unlock()
	if p.hook != nil {
		p.hook(p.cluster)
	}
}

// pruneLocked forgets the UIDs no token can still name, then, while over
// the bound, the oldest.
func (p *podWatch) pruneLocked(now time.Time) {
	for uid, at := range p.gone {
		if now.Sub(at) > p.keep {
			delete(p.gone, uid)
		}
	}
	for len(p.gone) > maxGonePods {
		var oldest string
		var at time.Time
		for uid, t := range p.gone {
			if oldest == "" || t.Before(at) {
				oldest, at = uid, t
			}
		}
		delete(p.gone, oldest)
	}
}

// isGone reports whether the watch saw the pod uid go (false without a
// watch, or for an empty uid).
func (p *podWatch) isGone(uid string) bool {
	if p == nil || uid == "" {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.gone[uid]
	if ok && p.now().Sub(at) > p.keep {
		delete(p.gone, uid)
		return false
	}
	return ok
}

// start runs the watch under ctx until it ends or stop is called.
// reloadState.mu must be held.
func (p *podWatch) start(ctx context.Context) {
	if p == nil || p.stop != nil {
		return
	}
	ctx, p.stop = context.WithCancel(ctx)
	go func() { _ = p.w.Run(ctx) }() // it logs its own failures, and retries until ctx ends
}

// halt stops the watch (a no-op when it never started). reloadState.mu must
// be held.
func (p *podWatch) halt() {
	if p != nil && p.stop != nil {
		p.stop()
	}
}

// WithPodGone sets a function called, on the watch's goroutine, each time a
// cluster's pod watch (tokenReview.watchPods) sees a pod go: compass-callout
// sweeps its live connections then, ending the pod's (CheckPod). It must
// not block.
func WithPodGone(f func(cluster string)) Option {
	return func(v *RunnerVerifier) { v.onPodGone = f }
}

// CheckPod returns ErrPodGone (wrapped, naming the cluster) when cluster's
// pod watch saw the pod podUID go, else nil: also for a cluster without a
// watch, one no longer registered, or an empty podUID. compass-callout's
// kicker asks it about each live connection it authorized.
func (v *RunnerVerifier) CheckPod(cluster, podUID string) error {
	c := v.clusters.Load().byName[cluster]
	if c == nil {
		return nil
	}
	if r := c.life.review.Load(); r != nil && r.pods.isGone(podUID) {
		return fmt.Errorf("%w: cluster %s, pod %s", ErrPodGone, cluster, podUID)
	}
	return nil
}
