#!/usr/bin/env bash
# The node test tier (test/node): a one-node Kubernetes v1.37.2 with a real
# kubelet, containerd v2.4.2 and runc, on which the rendered deployment runs
# from the project's own images (docs/kube-tier.md, "The real node").
#
#   .ci/node.sh build       # pinned, idempotent builds into .bin/node (and .bin/images)
#   .ci/node.sh up DIR      # start the node with all its state under DIR; writes DIR/env
#   .ci/node.sh down DIR    # stop it: processes by PID, mounts, links, iptables, cgroups
#   .ci/node.sh test        # build; per phase (the rendered stream, helm on SQLite, on PostgreSQL, in operator mode): up, go test, down
#
# Everything is on this machine. The node's address (NODE_IP) is on a link the
# tier creates (compass-node, a bridge with no ports); pods get addresses on a
# second bridge (compass-cni0) in network namespaces containerd creates;
# Service addresses are translated by kube-proxy and otherwise routed to the
# portless link, where they end. A guard chain in the mangle table drops any
# packet from or to the tier's range that would leave through another
# interface, and CoreDNS has no upstream: no name is looked up, and nothing is
# dialled, outside the machine. The control plane binds NODE_IP (etcd too), so
# it never takes a loopback port another tier is using.
#
# Needs root, cgroup v1 or v2 hierarchies, and Debian's runc,
# containernetworking-plugins, iptables and conntrack, which it installs with
# apt-get when they are missing. It fails, never skips, when it cannot run.
set -euo pipefail

KUBE_VERSION=v1.37.2        # k8s.io/kubernetes, pinned in tools/node/go.mod (as tools/kube)
CONTAINERD_VERSION=v2.4.2   # tools/node/containerd/go.mod
COREDNS_VERSION=1.15.0      # tools/node/coredns/go.mod

# The tier's addresses: one /16 holds the node, the pods and the Services, so
# the guard chain is one rule each way.
TIER_NET=10.250.0.0/16
NODE_IP=10.250.0.10
POD_CIDR=10.250.1.0/24
POD_GW=10.250.1.1
SERVICE_CIDR=10.250.2.0/24
NODE_NAME=compass-node
NODE_LINK=compass-node
POD_BRIDGE=compass-cni0
GUARD=COMPASS-NODE-GUARD
CGROUP_ROOT=compass-node
KERNEL_TUNABLES="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/.bin/node"
export GOTOOLCHAIN=go1.27.3 GOWORK=off GOFLAGS=-buildvcs=false
export PATH="$bin:$root/.bin:$PATH"

start=$SECONDS
log() { echo "node.sh: $* (+$((SECONDS - start))s)" >&2; }
fail() { echo "node.sh: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# build

# The version output is read whole before grep looks at it (see kube.sh).
reports() { # reports BINARY WANT ARGS...: the binary prints the line WANT
  local b=$1 want=$2 out; shift 2
  [[ -x $b ]] && out=$("$b" "$@" 2>/dev/null) && grep -qxF -- "$want" <<<"$out"
}

kube_ldflags() {
  local build_date major minor ldflags="-s -w" pkg
  build_date=$(cd "$root/tools/node" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$build_date"
  done
  echo "$ldflags"
}

# project_images_consistent DIR: each layout's index names the digest the
# digests file has for it (its first manifest, as .ci/images writes it).
project_images_consistent() {
  local dir=$1 ref digest name got
  [[ -f $dir/digests ]] || return 1
  while read -r ref digest; do
    name=${ref%:*}; name=${name##*/}
    got=$(grep -o '"digest": *"sha256:[0-9a-f]*"' "$dir/$name/index.json" 2>/dev/null | head -n 1 | grep -o 'sha256:[0-9a-f]*') || return 1
    [[ $got == "$digest" ]] || return 1
  done <"$dir/digests"
}

install_packages() {
  local missing=()
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  # The nats-server image's reloader is a shell script (deploy), as in the
  # official nats image: Debian's static busybox is its shell.
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || missing+=(busybox-static)
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing ${missing[*]} from Debian's packages"
    [[ $(id -u) == 0 ]] || fail "installing ${missing[*]} needs root"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || fail "apt-get update failed"
    apt-get install -y -qq "${missing[@]}" >&2 || fail "apt-get install ${missing[*]} failed"
  fi
}

build() {
  mkdir -p "$bin"
  install_packages
  bash "$root/.ci/kube.sh" >&2 || fail "building kube-apiserver and etcd (.ci/kube.sh) failed"

  local ldflags="" p
  for p in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
    local want="Kubernetes $KUBE_VERSION" args=(--version)
    [[ $p == kubectl ]] && want="Client Version: $KUBE_VERSION" args=(version --client)
    if reports "$bin/$p" "$want" "${args[@]}"; then
      log "$p $KUBE_VERSION already built"
      continue
    fi
    [[ -n $ldflags ]] || ldflags=$(kube_ldflags)
    local t=$SECONDS
    (cd "$root/tools/node" && go build -ldflags "$ldflags" -o "$bin/$p.tmp" "k8s.io/kubernetes/cmd/$p") || fail "building $p failed"
    mv -f "$bin/$p.tmp" "$bin/$p"
    reports "$bin/$p" "$want" "${args[@]}" || fail "built $p does not report $KUBE_VERSION"
    log "built $p $KUBE_VERSION in $((SECONDS - t))s"
  done

  # containerd without cgo: its btrfs, devmapper and zfs snapshotters need C
  # libraries, and the tier uses overlayfs.
  if reports "$bin/containerd" "containerd github.com/containerd/containerd/v2 $CONTAINERD_VERSION module" --version &&
    [[ -x $bin/containerd-shim-runc-v2 && -x $bin/ctr ]]; then
    log "containerd $CONTAINERD_VERSION already built"
  else
    local t=$SECONDS m=github.com/containerd/containerd/v2
    (cd "$root/tools/node/containerd" && CGO_ENABLED=0 go build -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
      -ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Revision=module" \
      -o "$bin/" $m/cmd/containerd $m/cmd/containerd-shim-runc-v2 $m/cmd/ctr) || fail "building containerd failed"
    reports "$bin/containerd" "containerd github.com/containerd/containerd/v2 $CONTAINERD_VERSION module" --version ||
      fail "built containerd does not report $CONTAINERD_VERSION"
    log "built containerd, its shim and ctr $CONTAINERD_VERSION in $((SECONDS - t))s"
  fi

  if reports "$bin/coredns" "CoreDNS-$COREDNS_VERSION" -version; then
    log "CoreDNS $COREDNS_VERSION already built"
  else
    local t=$SECONDS
    (cd "$root/tools/node/coredns" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$bin/coredns.tmp" .) || fail "building CoreDNS failed"
    mv -f "$bin/coredns.tmp" "$bin/coredns"
    reports "$bin/coredns" "CoreDNS-$COREDNS_VERSION" -version || fail "built CoreDNS does not report $COREDNS_VERSION"
    log "built CoreDNS $COREDNS_VERSION in $((SECONDS - t))s"
  fi

  # Small and fast to relink: always built. The nats-server is the main
  # module's pinned version (go.mod), static, for its image.
  (cd "$root/tools/node" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/" ./pause ./ociarchive) || fail "building pause and ociarchive failed"
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/nats-server" github.com/nats-io/nats-server/v2) || fail "building nats-server failed"
  local nats_version
  nats_version=$(cd "$root" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
  mkdir -p "$bin/images"
  "$bin/ociarchive" --binary "$bin/pause" --ref compass.test/pause:v1 --out "$bin/images/pause.tar" >"$bin/images/pause.digest"
  "$bin/ociarchive" --binary "$bin/nats-server" --ref "compass.test/nats-server:$nats_version" --out "$bin/images/nats.tar" \
    --busybox /bin/busybox --applets sh,cat,md5sum,sleep >"$bin/images/nats.digest"
  echo "compass.test/nats-server:$nats_version" >"$bin/images/nats.ref"

  # The project's three images, as .ci/images builds them from HEAD (checked
  # reproducible there), rebuilt only when HEAD moved. .bin/images is shared
  # with whoever else runs .ci/images on this machine, so the node imports
  # from its own copy, taken whole: every layout's index must have the digest
  # the digests file names, else the copy raced a publish and is taken again.
  local head attempt
  head=$(git -C "$root" rev-parse HEAD)
  for attempt in 1 2 3; do
    if [[ -f $root/.bin/images/digests && "$(cat "$bin/images/project/.rev" 2>/dev/null)" == "$head" ]] &&
      project_images_consistent "$bin/images/project"; then
      log "the project's images of $head already built"
      break
    fi
    if [[ "$(cat "$root/.bin/images/.node-rev" 2>/dev/null)" != "$head" || $attempt -gt 1 ]]; then
      local t=$SECONDS
      bash "$root/.ci/images" >"$root/.bin/images-build.log" 2>&1 || { tail -n 30 "$root/.bin/images-build.log" >&2; fail ".ci/images failed"; }
      echo "$head" >"$root/.bin/images/.node-rev"
      log "built the project's images of $head in $((SECONDS - t))s"
    fi
    rm -rf "$bin/images/project.tmp"
    mkdir -p "$bin/images/project.tmp"
    cp -r "$root/.bin/images/digests" "$root"/.bin/images/compass-* "$bin/images/project.tmp/"
    if project_images_consistent "$bin/images/project.tmp"; then
      echo "$head" >"$bin/images/project.tmp/.rev"
      rm -rf "$bin/images/project"
      mv "$bin/images/project.tmp" "$bin/images/project"
      break
    fi
    log "the copy of .bin/images raced another .ci/images run; building again"
    [[ $attempt -lt 3 ]] || fail "could not take a consistent copy of .bin/images"
  done
  log "build done"
}

# ---------------------------------------------------------------------------
# up

pki() { # pki DIR: the cluster CA and every certificate the node uses
  local d=$1
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
    -subj "/CN=compass-node-ca" -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  cert() { # cert NAME SUBJECT EXTKEYUSAGE [SANS]
    local name=$1 subj=$2 eku=$3 sans=${4:-} ext
    ext="basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=$eku"
    [[ -n $sans ]] && ext+="\nsubjectAltName=$sans"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
      -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 7 \
      -extfile <(printf "$ext") -out "$d/$name.crt" 2>/dev/null
    rm -f "$d/$name.csr"
  }
  local kube_sans="IP:$NODE_IP,IP:${SERVICE_CIDR%.*}.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver "/CN=kube-apiserver" serverAuth "$kube_sans"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" serverAuth "IP:$NODE_IP,DNS:$NODE_NAME"
  cert admin "/O=system:masters/CN=compass-node-admin" clientAuth
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert scheduler "/CN=system:kube-scheduler" clientAuth
  cert proxy "/CN=system:kube-proxy" clientAuth
  chmod 600 "$d"/*.key
}

kubeconfig() { # kubeconfig DIR NAME: a kubeconfig with NAME's client certificate
  local d=$1 name=$2
  cat >"$d/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: compass-node
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $d/ca.crt
users:
- name: $name
  user:
    client-certificate: $d/$name.crt
    client-key: $d/$name.key
contexts:
- name: compass-node
  context: {cluster: compass-node, user: $name}
current-context: compass-node
EOF
}

cgroup_hierarchies() { # every mounted cgroup v1 hierarchy, and the v2 one
  awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts
}

spawn() { # spawn DIR NAME CMD...: start CMD in the background, log and PID under DIR
  local d=$1 name=$2; shift 2
  "$@" >"$d/logs/$name.log" 2>&1 &
  echo $! >"$d/pids/$name"
  echo "$!" >>"$d/pids/all"
}

wait_for() { # wait_for SECONDS WHAT CMD...: until CMD succeeds
  local limit=$1 what=$2 t=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t < limit)) || fail "$what not ready after ${limit}s"
    sleep 0.2
  done
  log "$what ready in $((SECONDS - t))s"
}

ctr_ok() { # ctr_ok WHAT CMD...: run ctr, up to three times; each failure says what ctr printed
  local what=$1 out try; shift
  for try in 1 2 3; do
    out=$("$@" 2>&1) && return 0
    # ctr warns of cgroup v1 on every call; those lines are left out.
    echo "node.sh: $what failed (attempt $try of 3):" >&2
    grep -v 'cgroup' <<<"$out" | tail -n 20 | sed 's/^/  ctr: /' >&2 || true
    sleep 1
  done
  fail "$what failed"
}

running() { # running DIR NAME: the process started as NAME is alive
  kill -0 "$(cat "$1/pids/$2")" 2>/dev/null || { tail -n 20 "$1/logs/$2.log" >&2; fail "$2 exited (log: $1/logs/$2.log)"; }
}

up() {
  local d=${1:?usage: node.sh up DIR}
  [[ $(id -u) == 0 ]] || fail "the node needs root (mounts, network namespaces, cgroups, iptables)"
  for b in etcd kube-apiserver; do [[ -x $root/.bin/$b ]] || fail "$root/.bin/$b is missing: run .ci/node.sh build"; done
  for b in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl containerd containerd-shim-runc-v2 ctr coredns; do
    [[ -x $bin/$b ]] || fail "$bin/$b is missing: run .ci/node.sh build"
  done
  [[ -f $bin/images/project/digests ]] || fail "$bin/images/project/digests is missing: run .ci/node.sh build"
  if ip link show "$NODE_LINK" >/dev/null 2>&1; then
    fail "link $NODE_LINK exists: another node is up (or was not torn down: .ci/node.sh down DIR)"
  fi
  mkdir -p "$d"
  d=$(cd "$d" && pwd)
  mkdir -p "$d"/{logs,pids,pki,etcd,containerd,kubelet,cni/net.d,cni/ipam,pod-logs,volumes}
  : >"$d/pids/all"
  echo "$d" >"$d/.compass-node"

  # ---- network: the node's link, the pod bridge, routes, forwarding, the guard
  log "network"
  cat /proc/sys/net/ipv4/ip_forward >"$d/ip_forward.before"
  # The kubelet sets these kernel tunables to its defaults at start
  # (protectKernelDefaults is false); down puts the machine's back.
  local k
  for k in $KERNEL_TUNABLES; do
    [[ -f /proc/sys/$k ]] && echo "$k $(cat "/proc/sys/$k")"
  done >"$d/sysctl.before"
  ip link add "$NODE_LINK" type bridge
  ip addr add "$NODE_IP/32" dev "$NODE_LINK"
  ip link set "$NODE_LINK" up
  ip route add "$SERVICE_CIDR" dev "$NODE_LINK"
  ip link add "$POD_BRIDGE" type bridge
  ip addr add "$POD_GW/24" dev "$POD_BRIDGE"
  ip link set "$POD_BRIDGE" up
  echo 1 >/proc/sys/net/ipv4/ip_forward
  [[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ]] || fail "bridge netfilter is not available (/proc/sys/net/bridge): kube-proxy cannot translate pod-to-Service traffic"
  cat /proc/sys/net/bridge/bridge-nf-call-iptables >"$d/bridge-nf.before"
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  iptables -t mangle -N "$GUARD"
  iptables -t mangle -A "$GUARD" -o lo -j RETURN
  iptables -t mangle -A "$GUARD" -o "$POD_BRIDGE" -j RETURN
  iptables -t mangle -A "$GUARD" -o "$NODE_LINK" -j RETURN
  iptables -t mangle -A "$GUARD" -s "$TIER_NET" -j DROP
  iptables -t mangle -A "$GUARD" -d "$TIER_NET" -j DROP
  iptables -t mangle -I POSTROUTING 1 -j "$GUARD"

  # ---- PKI and kubeconfigs
  log "certificates"
  pki "$d/pki"
  for n in admin kubelet controller-manager scheduler proxy; do kubeconfig "$d/pki" "$n"; done

  # ---- etcd and the API server
  log "etcd"
  spawn "$d" etcd "$root/.bin/etcd" --name node --data-dir "$d/etcd" \
    --listen-client-urls "http://$NODE_IP:2379" --advertise-client-urls "http://$NODE_IP:2379" \
    --listen-peer-urls "http://$NODE_IP:2380" --initial-advertise-peer-urls "http://$NODE_IP:2380" \
    --initial-cluster "node=http://$NODE_IP:2380" --listen-metrics-urls "" --unsafe-no-fsync --log-level warn
  log "kube-apiserver"
  local issuer="https://$NODE_IP:6443"
  spawn "$d" kube-apiserver "$root/.bin/kube-apiserver" \
    --etcd-servers "http://$NODE_IP:2379" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
    --cert-dir "$d/pki/apiserver-certs" \
    --tls-cert-file "$d/pki/apiserver.crt" --tls-private-key-file "$d/pki/apiserver.key" \
    --client-ca-file "$d/pki/ca.crt" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --service-account-issuer "$issuer" \
    --service-account-key-file "$d/pki/sa.pub" --service-account-signing-key-file "$d/pki/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$d/pki/apiserver-kubelet-client.crt" --kubelet-client-key "$d/pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$d/pki/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --profiling=false --v 1
  local k=(kubectl --kubeconfig "$d/pki/admin.kubeconfig")
  wait_for 60 kube-apiserver "${k[@]}" get --raw /readyz
  # DL-440 self-host guide, first option: discovery and JWKS readable anonymously.
  "${k[@]}" create clusterrolebinding compass-oidc-discovery \
    --clusterrole=system:service-account-issuer-discovery --group=system:unauthenticated >/dev/null

  log "kube-controller-manager, kube-scheduler"
  spawn "$d" kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$d/pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$d/pki/controller-manager.kubeconfig" --authorization-kubeconfig "$d/pki/controller-manager.kubeconfig" \
    --bind-address "$NODE_IP" --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$d/pki/sa.key" --root-ca-file "$d/pki/ca.crt" \
    --cluster-signing-cert-file "$d/pki/ca.crt" --cluster-signing-key-file "$d/pki/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --profiling=false --v 1
  spawn "$d" kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$d/pki/scheduler.kubeconfig" \
    --authentication-kubeconfig "$d/pki/scheduler.kubeconfig" --authorization-kubeconfig "$d/pki/scheduler.kubeconfig" \
    --bind-address "$NODE_IP" --leader-elect=false --profiling=false --v 1

  # ---- containerd
  log "containerd"
  mkdir -p "$d/containerd/certs.d/_default"
  # Every registry is this machine's discard port: an image that is not
  # already imported fails at once instead of being looked up outside.
  cat >"$d/containerd/certs.d/_default/hosts.toml" <<EOF
server = "https://127.0.0.1:9"
EOF
  cat >"$d/containerd/config.toml" <<EOF
version = 3
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$d/containerd/containerd.sock"
[ttrpc]
  address = "$d/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = "$d/containerd/opt"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "compass.test/pause:v1"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$d/containerd/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # This machine drops CAP_SYS_RESOURCE: without it runc fails to raise a
  # container's oom_score_adj above containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$d/cni/net.d"
    max_conf_num = 1
EOF
  cat >"$d/cni/net.d/10-compass-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "compass-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$d/cni/ipam"
      }
    }
  ]
}
EOF
  spawn "$d" containerd "$bin/containerd" --config "$d/containerd/config.toml"
  local c=(ctr --address "$d/containerd/containerd.sock" -n k8s.io)
  wait_for 30 containerd "${c[@]}" version
  log "importing images"
  # Imports and names are written by ctr itself (--local), not through
  # containerd's transfer service: the plain metadata path, one step each.
  local ref digest name
  ctr_ok "importing the pause image" "${c[@]}" images import --local --no-unpack "$bin/images/pause.tar"
  ctr_ok "importing the nats-server image" "${c[@]}" images import --local --no-unpack "$bin/images/nats.tar"
  while read -r ref digest; do
    name=${ref%:*}
    name=${name##*/}
    tar -C "$bin/images/project/$name" -cf "$d/$name.tar" .
    ctr_ok "importing $ref" "${c[@]}" images import --local --no-unpack --index-name "$ref" "$d/$name.tar"
    rm -f "$d/$name.tar"
    ctr_ok "naming $ref by its digest" "${c[@]}" images tag --local --force "$ref" "${ref%:*}@$digest"
  done <"$bin/images/project/digests"
  ref=$(cat "$bin/images/nats.ref")
  ctr_ok "naming the nats-server image by its digest" "${c[@]}" images tag --local --force "$ref" "${ref%:*}@$(cat "$bin/images/nats.digest")"

  # ---- the kubelet
  log "kubelet"
  for h in $(cgroup_hierarchies); do mkdir -p "$h/$CGROUP_ROOT"; done
  # The pods' resolver for dnsPolicy Default: CoreDNS too, never the host's.
  echo "nameserver $NODE_IP" >"$d/resolv.conf"
  cat >"$d/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $d/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $d/pki/kubelet-serving.crt
tlsPrivateKeyFile: $d/pki/kubelet-serving.key
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$d/containerd/containerd.sock
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $d/resolv.conf
podLogsDir: $d/pod-logs
syncFrequency: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
maxPods: 30
serializeImagePulls: false
EOF
  spawn "$d" kubelet "$bin/kubelet" --config "$d/kubelet/config.yaml" \
    --kubeconfig "$d/pki/kubelet.kubeconfig" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
    --root-dir "$d/kubelet" --cert-dir "$d/kubelet/pki" --v 1

  # ---- kube-proxy and CoreDNS
  log "kube-proxy, CoreDNS"
  cat >"$d/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $d/pki/proxy.kubeconfig}
mode: iptables
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: $NODE_IP:10256
metricsBindAddress: $NODE_IP:10249
clusterCIDR: $POD_CIDR
nodePortAddresses: [$NODE_IP/32]
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF
  spawn "$d" kube-proxy "$bin/kube-proxy" --config "$d/kube-proxy.yaml" --v 1
  cat >"$d/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    health $NODE_IP:8080
    ready $NODE_IP:8181
    kubernetes cluster.local in-addr.arpa {
        kubeconfig $d/pki/admin.kubeconfig compass-node
        pods insecure
    }
    cache 5
}
EOF
  spawn "$d" coredns "$bin/coredns" -conf "$d/Corefile"

  running "$d" coredns
  wait_for 120 "node $NODE_NAME" bash -c "$(printf '%q ' "${k[@]}") get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  wait_for 60 CoreDNS curl -fsS "http://$NODE_IP:8181/ready"
  for p in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns; do running "$d" "$p"; done

  cat >"$d/env" <<EOF
COMPASS_NODE_DIR=$d
KUBECONFIG=$d/pki/admin.kubeconfig
COMPASS_NODE_NAME=$NODE_NAME
COMPASS_NODE_IP=$NODE_IP
COMPASS_NODE_ISSUER=$issuer
COMPASS_NODE_CA=$d/pki/ca.crt
COMPASS_NODE_CA_KEY=$d/pki/ca.key
COMPASS_NODE_KUBECTL=$bin/kubectl
COMPASS_NODE_CTR=$bin/ctr
COMPASS_NODE_CONTAINERD=$d/containerd/containerd.sock
COMPASS_NODE_IMAGES=$bin/images/project/digests
COMPASS_NODE_NATS_IMAGE=$(sed 's/:[^:]*$//' "$bin/images/nats.ref")@$(cat "$bin/images/nats.digest")
COMPASS_NODE_VOLUMES=$d/volumes
COMPASS_NODE_POD_CIDR=$POD_CIDR
EOF
  log "node $NODE_NAME is up: $d/env"
}

# ---------------------------------------------------------------------------
# down

# FAULT: the chain test/node's issuer outage (faults_test.go) adds to INPUT,
# removed here too should a test die before its cleanup.
FAULT=COMPASS-NODE-FAULT
ours='KUBE-[A-Z0-9-]+|CNI-[A-Za-z0-9-]+|'"$GUARD|$FAULT"

iptables_cleanup() {
  local tbl rule chain
  for tbl in filter nat mangle raw; do
    while read -r rule; do
      eval "iptables -t $tbl ${rule/#-A/-D}" 2>/dev/null || true
    done < <(iptables -t "$tbl" -S 2>/dev/null | grep -E -- "^-A [A-Z]+ .*-j ($ours)( |\$)" | grep -Ev -- "^-A ($ours) ")
    for chain in $(iptables -t "$tbl" -S 2>/dev/null | sed -n -E "s/^-N ($ours)$/\1/p"); do
      iptables -t "$tbl" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$tbl" -S 2>/dev/null | sed -n -E "s/^-N ($ours)$/\1/p"); do
      iptables -t "$tbl" -X "$chain" 2>/dev/null || true
    done
  done
}

down() {
  local d=${1:?usage: node.sh down DIR}
  [[ -d $d ]] || { log "$d does not exist: nothing to stop"; return 0; }
  d=$(cd "$d" && pwd)
  [[ -f $d/.compass-node ]] || fail "$d is not a node directory (no .compass-node)"

  # The kubelet first, so it restarts nothing; then every container
  # containerd runs (their shims are its children by its socket, not by
  # PID file); then the rest, newest first.
  local pid
  if [[ -f $d/pids/kubelet ]]; then kill "$(cat "$d/pids/kubelet")" 2>/dev/null || true; fi
  if [[ -S $d/containerd/containerd.sock ]]; then
    local c=(ctr --address "$d/containerd/containerd.sock" -n k8s.io) t
    for t in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  fi
  # Shims outlive containerd by design; they are found by the socket
  # directory in their command line, which is this node's alone.
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $d/containerd/" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
  if [[ -f $d/pids/all ]]; then
    for pid in $(tac "$d/pids/all"); do kill "$pid" 2>/dev/null || true; done
    for pid in $(tac "$d/pids/all"); do
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    done
  fi
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $d/containerd/" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done

  # kube-proxy's rules and chains, the kubelet's (KUBE-FIREWALL and its
  # canaries), the CNI plugins' and the guard: first every rule that jumps
  # to one of them, then the chains themselves.
  if [[ -x $bin/kube-proxy ]]; then "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  iptables_cleanup
  # Mounts under the directory, deepest first (projected volumes, overlay
  # roots, network namespaces).
  local m
  for _ in 1 2 3; do
    mapfile -t mounts < <(awk -v p="$d/" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r)
    [[ ${#mounts[@]} -gt 0 ]] || break
    for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
  done

  # Links and routes.
  ip link del "$POD_BRIDGE" 2>/dev/null || true
  ip link del "$NODE_LINK" 2>/dev/null || true
  for m in $(ip -o link show type veth 2>/dev/null | awk -F'[ :@]+' '{print $2}'); do
    ip link show "$m" 2>/dev/null | grep -q "master $POD_BRIDGE" && ip link del "$m" 2>/dev/null || true
  done
  if [[ -f $d/ip_forward.before ]]; then cat "$d/ip_forward.before" >/proc/sys/net/ipv4/ip_forward; fi
  if [[ -f $d/bridge-nf.before ]]; then cat "$d/bridge-nf.before" >/proc/sys/net/bridge/bridge-nf-call-iptables; fi
  if [[ -f $d/sysctl.before ]]; then
    local key val
    while read -r key val; do echo "$val" >"/proc/sys/$key" 2>/dev/null || true; done <"$d/sysctl.before"
  fi

  # The cgroups the kubelet and runc made under the node's cgroup root.
  local h
  for h in $(cgroup_hierarchies); do
    [[ -d $h/$CGROUP_ROOT ]] || continue
    find "$h/$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # The kubelet links container logs in /var/log/containers; remove ours.
  find /var/log/containers -maxdepth 1 -type l -lname "$d/*" -delete 2>/dev/null || true

  # The PostgreSQL a test started for the pods (test/node, the PostgreSQL
  # layout), beside the node's directory.
  if [[ -d $d-postgres ]]; then
    if [[ -f $d-postgres/data/postmaster.pid ]]; then
      COMPASS_PG_DIR=$d-postgres bash "$root/.ci/postgres.sh" stop >/dev/null 2>&1 || log "could not stop $d-postgres"
    fi
    rm -rf "$d-postgres" 2>/dev/null || log "some of $d-postgres could not be removed"
  fi
  rm -rf "$d" 2>/dev/null || log "some of $d could not be removed"
  log "node down"
}

# ---------------------------------------------------------------------------

case "${1:-}" in
  build) build ;;
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  test)
    build
    # Four phases, each on a node of its own, since all install into the
    # same namespaces: the rendered stream applied with kubectl (every test
    # but TestNodeHelm*), then the operator's path through the chart with
    # the real helm (helm_test.go) in each layout, SQLite and PostgreSQL,
    # and with NATS in operator mode (SQLite).
    rc=0
    for phase in stream helm-sqlite helm-postgres helm-operator; do
      dir=$(mktemp -d /tmp/compass-node.XXXXXX)
      trap 'down "$dir"' EXIT
      trap 'exit 1' INT TERM # the EXIT trap still takes the node down
      log "phase $phase"
      up "$dir"
      case $phase in
        stream) sel=(-skip '^TestNodeHelm') ;;
        helm-sqlite) sel=(-run '^TestNodeHelmSQLite$') ;;
        helm-postgres) sel=(-run '^TestNodeHelmPostgres$') ;;
        helm-operator) sel=(-run '^TestNodeHelmOperator$') ;;
      esac
      # In the background and waited for, so a TERM from the caller (.ci/test
      # ending early) is handled at once: the tests end and the node comes down.
      (set -a; . "$dir/env"; set +a; cd "$root" && exec go test -tags nodetier -count=1 -timeout 30m -v "${sel[@]}" ./test/node/) &
      test_pid=$!
      trap 'kill "$test_pid" 2>/dev/null; exit 1' INT TERM
      wait "$test_pid" || rc=$?
      trap - EXIT INT TERM
      down "$dir"
    done
    exit "$rc"
    ;;
  -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
  *) echo "usage: .ci/node.sh build | up DIR | down DIR | test" >&2; exit 2 ;;
esac
