#!/usr/bin/env bash
# Builds the live Kubernetes test tier's control plane (kube-apiserver v1.37.2
# and etcd v3.7.3) into <repo>/.bin from the pinned modules in tools/kube.
#
# Idempotent: a binary that already reports the pinned version is kept. The Go
# build cache is reused, so a rebuild after the first is mostly linking.
# The last line printed is KUBEBUILDER_ASSETS=<dir>, the value test/kube needs.
#
# Usage: .ci/kube.sh [--force]
set -euo pipefail

KUBE_VERSION=v1.37.2   # k8s.io/kubernetes, pinned in tools/kube/go.mod
ETCD_VERSION=3.7.3     # go.etcd.io/etcd/server/v3, pinned in tools/kube/etcd/go.mod

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/.bin"
force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "kube.sh: unknown argument $1" >&2; exit 2 ;;
esac

# k8s.io/kubernetes v1.37.2 and etcd v3.7.3 declare go 1.26.0, which the
# installed toolchain satisfies; never switch toolchains behind the caller.
export GOTOOLCHAIN=go1.27.3 GOWORK=off GOFLAGS=-buildvcs=false
mkdir -p "$bin"

# The version output is read whole before grep looks at it: under pipefail,
# grep -q exiting at its first match would SIGPIPE a binary still writing
# (etcd prints several lines) and fail the check at random.
apiserver_ok() {
  local out
  [[ -x "$bin/kube-apiserver" ]] && out=$("$bin/kube-apiserver" --version 2>/dev/null) &&
    grep -qx "Kubernetes $KUBE_VERSION" <<<"$out"
}
etcd_ok() {
  local out
  [[ -x "$bin/etcd" ]] && out=$("$bin/etcd" --version 2>/dev/null) &&
    grep -qx "etcd Version: $ETCD_VERSION" <<<"$out"
}

if [[ $force == 1 ]] || ! apiserver_ok; then
  start=$SECONDS
  # The version stamp kube-apiserver reports, as hack/lib/version.sh sets it.
  # buildDate is the release's module time so the link is reproducible.
  build_date=$(cd "$root/tools/kube" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$build_date"
  done
  (cd "$root/tools/kube" && go build -ldflags "$ldflags" -o "$bin/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv -f "$bin/kube-apiserver.tmp" "$bin/kube-apiserver"
  apiserver_ok || { echo "kube.sh: built kube-apiserver does not report $KUBE_VERSION" >&2; exit 1; }
  echo "kube.sh: built kube-apiserver $KUBE_VERSION in $((SECONDS - start))s"
else
  echo "kube.sh: kube-apiserver $KUBE_VERSION already built"
fi

if [[ $force == 1 ]] || ! etcd_ok; then
  start=$SECONDS
  (cd "$root/tools/kube/etcd" && go build -ldflags "-s -w" -o "$bin/etcd.tmp" .)
  mv -f "$bin/etcd.tmp" "$bin/etcd"
  etcd_ok || { echo "kube.sh: built etcd does not report $ETCD_VERSION" >&2; exit 1; }
  echo "kube.sh: built etcd $ETCD_VERSION in $((SECONDS - start))s"
else
  echo "kube.sh: etcd $ETCD_VERSION already built"
fi

echo "kube.sh: kube-apiserver: $bin/kube-apiserver"
echo "kube.sh: etcd: $bin/etcd"
echo "KUBEBUILDER_ASSETS=$bin"
