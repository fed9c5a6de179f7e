// Package kube is the live Kubernetes test tier: it runs a real kube-apiserver
// and etcd (built by .ci/kube.sh into .bin/) under envtest, configured as a
// cluster running the Compass Runner would be, and checks DL-440's live smoke,
// refusals, key rotation and admission-policy threat proof against it.
//
// The package holds only tests. Without the binaries the tests fail when CI is
// set and skip otherwise; run .ci/kube.sh first.
package kube
