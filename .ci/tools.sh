#!/usr/bin/env bash
# Installs the pinned lint and vulnerability tools, grpcurl, promtool, helm and the real nats-server into <repo>/.bin/tools and
# builds an offline Go vulnerability database in <repo>/.bin/vulndb from the
# golang.org/x/vulndb module (the vulnerability service itself is not
# reachable from CI; the module proxy is). Idempotent.
set -euo pipefail

STATICCHECK_VERSION=v0.8.2
GOVULNCHECK_VERSION=v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
# grpcurl, as operators run it against the door (reflection, no -proto):
# door's TestGRPCurlListAndHealthCheck runs it from .bin/tools/grpcurl.
GRPCURL_VERSION=v1.9.4
# promtool, for the alerting rules and the dashboard's queries
# (deploy/monitoring): .ci/test runs `promtool check rules` and `promtool test
# rules`, and deploy's TestRulesAndDashboardQueriesParse runs it from
# .bin/tools/promtool. Its own module graph, installed apart (go install
# pkg@version): the prometheus module never enters go.mod.
PROMTOOL_VERSION=v0.316.0
# cyclonedx-gomod writes each image's SBOM from its binary's build info
# (.ci/images); built with -trimpath so the tool's own hash, which the SBOM
# names, is the same on every machine.
CYCLONEDX_VERSION=v1.10.0
# helm, for the chart (deploy/chart/compass): .ci/test lints and templates it,
# test/helm compares `helm template` with compass-server manifests, and
# .ci/release packages it. Its own module graph (client-go among it), installed
# apart like promtool.
HELM_VERSION=v4.3.2
# cosign signs the release's images and chart and their provenance
# (.ci/release). Its own module graph, installed apart; built only by
# `.ci/tools.sh --cosign`, which .ci/release runs: nothing else needs it.
COSIGN_VERSION=v3.1.3

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/.bin/tools"
export GOTOOLCHAIN=go1.27.3 GOFLAGS=-buildvcs=false
mkdir -p "$tools"
# The real nats-server, at the version go.mod pins for the embedded one, built
# from its own module (its own go.mod, as released): the tests that must see
# what the binary users run does (options no config file can set, `-t` on a
# rendered config) run it from .bin/tools/nats-server.
NATS_SERVER_VERSION=$(cd "$root" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)

# The analysers are rebuilt when the toolchain changes too: they type-check
# the standard library of the go command they run with.
gov=$(go env GOVERSION)
stamp() { cat "$tools/.$1" 2>/dev/null || true; }
if [[ ${1:-} == --cosign ]]; then
  if [[ "$(stamp cosign)" != "$COSIGN_VERSION $gov" || ! -x "$tools/cosign" ]]; then
    GOBIN="$tools" go install "github.com/sigstore/cosign/v3/cmd/cosign@$COSIGN_VERSION"
    echo "$COSIGN_VERSION $gov" > "$tools/.cosign"
  fi
  echo "tools: cosign $COSIGN_VERSION ($gov) in $tools"
  exit 0
fi
if [[ "$(stamp staticcheck)" != "$STATICCHECK_VERSION $gov" || ! -x "$tools/staticcheck" ]]; then
  GOBIN="$tools" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  echo "$STATICCHECK_VERSION $gov" > "$tools/.staticcheck"
fi
if [[ "$(stamp govulncheck)" != "$GOVULNCHECK_VERSION $gov" || ! -x "$tools/govulncheck" ]]; then
  GOBIN="$tools" go install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION"
  echo "$GOVULNCHECK_VERSION $gov" > "$tools/.govulncheck"
fi
if [[ "$(stamp nats-server)" != "$NATS_SERVER_VERSION $gov" || ! -x "$tools/nats-server" ]]; then
  GOBIN="$tools" go install "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION"
  echo "$NATS_SERVER_VERSION $gov" > "$tools/.nats-server"
fi
if [[ "$(stamp grpcurl)" != "$GRPCURL_VERSION $gov" || ! -x "$tools/grpcurl" ]]; then
  GOBIN="$tools" go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
  echo "$GRPCURL_VERSION $gov" > "$tools/.grpcurl"
fi
if [[ "$(stamp cyclonedx-gomod)" != "$CYCLONEDX_VERSION $gov" || ! -x "$tools/cyclonedx-gomod" ]]; then
  GOBIN="$tools" go install -trimpath "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$CYCLONEDX_VERSION"
  echo "$CYCLONEDX_VERSION $gov" > "$tools/.cyclonedx-gomod"
fi
if [[ "$(stamp promtool)" != "$PROMTOOL_VERSION $gov" || ! -x "$tools/promtool" ]]; then
  GOBIN="$tools" go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
  echo "$PROMTOOL_VERSION $gov" > "$tools/.promtool"
fi
if [[ "$(stamp helm)" != "$HELM_VERSION $gov" || ! -x "$tools/helm" ]]; then
  GOBIN="$tools" go install -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  echo "$HELM_VERSION $gov" > "$tools/.helm"
fi
if [[ "$(stamp vulndb)" != "$VULNDB_VERSION" || ! -d "$root/.bin/vulndb/index" ]]; then
  dir=$(cd "$(mktemp -d)" && go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  rm -rf "$root/.bin/vulndb"
  go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$dir/data/osv" -out "$root/.bin/vulndb"
  echo "$VULNDB_VERSION" > "$tools/.vulndb"
fi
echo "tools: staticcheck $STATICCHECK_VERSION, govulncheck $GOVULNCHECK_VERSION, grpcurl $GRPCURL_VERSION, promtool $PROMTOOL_VERSION, cyclonedx-gomod $CYCLONEDX_VERSION, helm $HELM_VERSION, nats-server $NATS_SERVER_VERSION ($gov), vulndb $VULNDB_VERSION in $root/.bin"
