package verifier

import (
	"errors"
	"fmt"
)

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
