#!/usr/bin/env bash
# Regenerates gen/ from proto/ with buf and the local protoc plugins, then
# fails if the committed generated code differs (CI's "generated code is
# current" check). Plugins are built from the versions pinned in go.mod;
# buf is pinned here. Nothing is fetched except Go modules.
#
# Usage: .ci/gen.sh            regenerate and check gen/ is unchanged
#        .ci/gen.sh --write    regenerate only (after editing a .proto)
set -euo pipefail

BUF_VERSION=v1.75.0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/.bin/gen"
check=1
case "${1:-}" in
  --write) check=0 ;;
  "") ;;
  -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gen.sh: unknown argument $1" >&2; exit 2 ;;
esac

export GOTOOLCHAIN=go1.27.3 GOFLAGS=-buildvcs=false
mkdir -p "$tools"
cd "$root"
# protoc-gen-go and protoc-gen-connect-go at the versions go.mod requires, so
# the generated code matches the runtime it is compiled against.
go build -o "$tools/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$tools/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
if ! [[ -x "$tools/buf" ]] || [[ "$("$tools/buf" --version 2>/dev/null)" != "${BUF_VERSION#v}" ]]; then
  GOBIN="$tools" go install "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION"
fi

"$tools/buf" lint
"$tools/buf" generate

if [[ $check == 1 ]]; then
  if ! git diff --exit-code -- gen/ || [[ -n "$(git status --porcelain --untracked-files=all -- gen/)" ]]; then
    git status --short -- gen/ >&2
    echo "gen.sh: gen/ is not what proto/ generates; run .ci/gen.sh --write and commit gen/" >&2
    exit 1
  fi
  echo "gen.sh: gen/ is current"
fi
