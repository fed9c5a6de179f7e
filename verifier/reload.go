package verifier

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/go-jose/go-jose/v4"
)

// clusterSet is the registered clusters. It is never changed once published:
// Reload builds a new one and swaps it in whole, so a Verify sees the old set
// or the new, never a mix.
type clusterSet struct {
	list     []*cluster          // file order
	byIssuer map[string]*cluster // by exact iss
	byName   map[string]*cluster
}

// clusterLife is a cluster's part in reloads.
type clusterLife struct {
	// key names the cluster's loads in RunnerVerifier.loads. It is unique to
	// this cluster value, so a cluster replaced under the same name never
	// joins a load still in flight for its predecessor.
	key string
	// deny is the cluster's deny list (nil: none). Reload swaps it in place
	// for a cluster whose other configuration is unchanged.
	deny atomic.Pointer[NodeDeny]
	// review is the cluster's TokenReview client (nil: none). Reload keeps
	// it, and its cache, while the tokenReview is unchanged, and swaps it in
	// place for a cluster whose other configuration is unchanged.
	review atomic.Pointer[clusterReview]
	// removed is set, under RunnerVerifier.mu, once Reload drops the cluster;
	// a load still in flight for it then installs nothing.
	removed bool
	// Under reloadState.mu: the refresh goroutine's cancel, and the channel
	// closed when it has returned (both nil until it starts).
	stop context.CancelFunc
	done chan struct{}
}

// reloadState serializes Reload and Start.
type reloadState struct {
	mu     sync.Mutex
	runCtx context.Context // Start's ctx; nil until Start
	seq    uint64          // the last cluster key handed out
}

// Reload replaces the registered clusters with clusters, checked exactly as
// New checks them. On any error nothing changes: the clusters in force keep
// verifying as before.
//
// A cluster whose configuration other than Deny is unchanged (name, issuer,
// audience, namespace, serviceAccount, maxTokenLifetime, jwksURI, and the
// jwksFile and caFile paths) keeps its key set, its kid-miss cooldown, its
// fetch history and its refresh goroutine; only its deny list is swapped,
// and the next Verify applies it. A cluster no longer listed has its refresh
// goroutine stopped, and from the next Verify its tokens are refused as
// from an unknown issuer. Any other cluster is new, set up as New sets one
// up (its jwksFile read now); if Start has been called, its refresh
// goroutine starts at once and fetches in the background. A cluster whose
// configuration changed is removed and added.
// The shared-key check is recomputed over the new set.
//
// Reload reads local files only (caFile, jwksFile of new clusters) and never
// fetches; it holds no lock that Verify takes. The content of a caFile or
// jwksFile is read again only for a new or changed cluster.
func (v *RunnerVerifier) Reload(clusters []RunnerCluster) error {
	return v.apply(clusters, false)
}

// apply checks clusters and swaps them in; New (initial) and Reload share it.
func (v *RunnerVerifier) apply(clusters []RunnerCluster, initial bool) error {
	clusters = slices.Clone(clusters)
	for i := range clusters {
		if err := clusters[i].normalize(); err != nil {
			return fmt.Errorf("verifier: cluster %q: %w", clusters[i].Name, err)
		}
	}
	if err := checkUnique(clusters); err != nil {
		return err
	}

	v.reload.mu.Lock()
	defer v.reload.mu.Unlock()
	cur := v.clusters.Load()
	next := &clusterSet{byIssuer: make(map[string]*cluster, len(clusters)), byName: make(map[string]*cluster, len(clusters))}
	denies := make([]*NodeDeny, len(clusters))
	reviews := make([]*clusterReview, len(clusters))
	kept := map[*cluster]bool{}
	var added []*cluster
	for i, rc := range clusters {
		denies[i], rc.Deny = rc.Deny, nil
		review := rc.TokenReview
		rc.TokenReview = nil
		c := cur.byName[rc.Name]
		if c != nil && c.cfg == rc {
			kept[c] = true
			if r := c.life.review.Load(); review != nil && r != nil && r.cfg == *review {
				reviews[i] = r
			}
		} else {
			hc, err := v.newClusterClient(rc, v.client)
			if err != nil {
				return fmt.Errorf("verifier: cluster %q: %w", rc.Name, err)
			}
			c = &cluster{cfg: rc, client: hc, static: rc.JWKSFile != ""}
			c.life.key = strconv.FormatUint(v.reload.seq+uint64(len(added))+1, 10)
			c.snap.Store(&keySnapshot{})
			added = append(added, c)
		}
		if review != nil && reviews[i] == nil {
			r, err := v.newClusterReview(rc, *review)
			if err != nil {
				return fmt.Errorf("verifier: cluster %q: %w", rc.Name, err)
			}
			reviews[i] = r
		}
		next.list = append(next.list, c)
		next.byIssuer[rc.Issuer] = c
		next.byName[rc.Name] = c
	}
	staticKeys := map[*cluster][]jose.JSONWebKey{}
	for _, c := range added {
		if c.static {
			keys, err := v.readStatic(c)
			if err != nil {
				return fmt.Errorf("verifier: cluster %q: %w", c.cfg.Name, err)
			}
			staticKeys[c] = keys
		}
	}

	// Nothing can fail from here on.
	v.reload.seq += uint64(len(added))
	var removed []*cluster
	for _, c := range cur.list {
		if !kept[c] {
			removed = append(removed, c)
		}
	}
	// The reviews (and their pod watches) no longer in force: replaced, or
	// their cluster removed or without a tokenReview now.
	inForce := map[*clusterReview]bool{}
	for _, r := range reviews {
		inForce[r] = true
	}
	var retired []*clusterReview
	for _, c := range cur.list {
		if r := c.life.review.Load(); r != nil && !inForce[r] {
			retired = append(retired, r)
		}
	}
	var denyChanged []string
	v.mu.Lock()
	now := v.now()
	for i, c := range next.list {
		if kept[c] && !sameDeny(c.life.deny.Load(), denies[i]) {
			denyChanged = append(denyChanged, c.cfg.Name)
		}
		c.life.deny.Store(denies[i])
		c.life.review.Store(reviews[i])
	}
	for _, c := range removed {
		c.life.removed = true
	}
	for _, c := range added {
		if keys, ok := staticKeys[c]; ok {
			c.raw, c.loadedAt, c.lastErr = keys, now, nil
		}
	}
	v.clusters.Store(next)
	v.recomputeLocked(now)
	if v.onLoad != nil {
		for _, c := range added {
			if c.static {
				s := c.snap.Load()
				v.onLoad(LoadEvent{Cluster: c.cfg.Name, Keys: s.count, SharedWith: slices.Clone(s.sharedWith)})
			}
		}
	}
	v.mu.Unlock()

	for _, c := range removed {
		if c.life.stop != nil {
			c.life.stop()
		}
	}
	for _, r := range retired {
		r.pods.halt()
	}
	if v.reload.runCtx != nil {
		v.startRefresh(added)
		for _, r := range reviews {
			if r != nil {
				r.pods.start(v.reload.runCtx) // a no-op for one already running
			}
		}
	}
	if !initial {
		v.log.Info("runner clusters reloaded", "clusters", names(next.list), "added", names(added),
			"removed", names(removed), "deny_changed", denyChanged)
	}
	return nil
}

// clusterRun makes the context of c's refresh goroutine (under Start's, and
// cancelled when Reload removes c) and the channel it closes on return.
// v.reload.mu must be held.
func (v *RunnerVerifier) clusterRun(c *cluster) (context.Context, chan struct{}) {
	ctx, cancel := context.WithCancel(v.reload.runCtx)
	c.life.stop, c.life.done = cancel, make(chan struct{})
	return ctx, c.life.done
}

func names(cs []*cluster) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.cfg.Name
	}
	return out
}

// sameDeny compares two deny lists by value; nil and empty are the same.
func sameDeny(a, b *NodeDeny) bool {
	if a == nil {
		a = &NodeDeny{}
	}
	if b == nil {
		b = &NodeDeny{}
	}
	return slices.Equal(a.Nodes, b.Nodes) && slices.Equal(a.NodeUIDs, b.NodeUIDs)
}
