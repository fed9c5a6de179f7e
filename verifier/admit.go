package verifier

import (
	"errors"
	"fmt"
)

// ErrKeyRemoved is the cause of CheckKey's refusal: the cluster's key set in
// force no longer has the key that signed a token.
var ErrKeyRemoved = errors.New("signing key no longer in the cluster's key set")

// ErrClusterNotRegistered is the cause of CheckNode's refusal for a cluster
// that the cluster file no longer lists.
var ErrClusterNotRegistered = errors.New("cluster not registered")

// CheckNode reports whether a node that Verify accepted earlier would still
// be accepted by the clusters and deny lists in force now: nil, or an *Error
// of kind ErrUnauthenticated whose cause is ErrClusterNotRegistered or wraps
// ErrNodeDenied. An empty uid is checked against deny.nodes only.
//
// It is how a door that keeps something alive on a verified token (the
// callout's live NATS connections) ends it when the operator denies the node
// or removes the cluster: the token itself is not needed again. It does no
// I/O and takes no lock.
func (v *RunnerVerifier) CheckNode(cluster, node, uid string) error {
	c := v.clusters.Load().byName[cluster]
	if c == nil {
		return unauthenticated(cluster, ErrClusterNotRegistered)
	}
	if !validNodeUID(uid) {
		uid = ""
	}
	if err := c.life.deny.Load().match(node, uid); err != nil {
		return unauthenticated(cluster, err)
	}
	return nil
}

// CheckRunnerID is CheckNode for a workload Runner ID (<cluster>/<node>),
// without a node UID. A minted Runner ID (no "/") is an error: it names no
// cluster.
func (v *RunnerVerifier) CheckRunnerID(id string) error {
	cluster, node, ok := SplitWorkloadRunnerID(id)
	if !ok {
		return unauthenticated("", fmt.Errorf("%q is not a workload Runner ID", id))
	}
	return v.CheckNode(cluster, node, "")
}

// CheckKey reports whether the key set in force for cluster still has the
// key kid that signed a token Verify accepted earlier: nil, or an *Error of
// kind ErrUnauthenticated whose cause is ErrKeyRemoved (or
// ErrClusterNotRegistered). A cluster whose key set is empty (never loaded,
// or discarded as stale) says nothing about its keys and is not a refusal:
// that is an outage, not a revocation.
//
// It is how the callout ends the live connections opened with a key the
// operator pulled at the issuer (a leaked key) once Refetch has loaded the
// issuer's current key set. It does no I/O and takes no lock.
func (v *RunnerVerifier) CheckKey(cluster, kid string) error {
	c := v.clusters.Load().byName[cluster]
	if c == nil {
		return unauthenticated(cluster, ErrClusterNotRegistered)
	}
	s := c.snap.Load()
	if s == nil || s.count == 0 {
		return nil
	}
	if len(s.keys[kid]) == 0 {
		return unauthenticated(cluster, ErrKeyRemoved)
	}
	return nil
}
