// Package node is the real-node test tier: the rendered deployment, applied
// as an operator applies it, runs on a one-node Kubernetes v1.37.2 with a
// real kubelet, containerd and runc, from the project's own images.
// .ci/node.sh builds and starts the node and runs these tests; they are built
// only with the nodetier build tag, so go vet ./... and go test ./... do not
// compile them. docs/kube-tier.md ("The real node") says what is real here.
//
// Run with: bash .ci/node.sh test
package node
