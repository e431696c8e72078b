#!/usr/bin/env bash
# Build SeaweedFS's `weed` (the tests' S3 server) from the Go module proxy into $2.
# `go install module@version` refuses modules whose go.mod has replace directives (SeaweedFS has
# one), so the module is downloaded, copied out of the read-only module cache and built as the main
# module. About 7 minutes on 2 cores the first time; Go's build cache makes a rebuild quick.
set -euo pipefail
ver=$1 out=$2
mod=github.com/seaweedfs/seaweedfs
# SeaweedFS's go.mod asks for Go 1.26.6. An older Go (1.21+) fetches that toolchain from the module proxy.
have=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n' 1.26.6 "$have" | sort -V | head -1)" != 1.26.6 ]; then
  if [ "$(printf '%s\n' 1.21 "$have" | sort -V | head -1)" != 1.21 ]; then
    echo "build-seaweedfs: Go $have is too old (it cannot fetch a newer toolchain): install Go 1.26+" >&2
    exit 1
  fi
  export GOTOOLCHAIN=go1.26.8
fi
dir=$(go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -d "$dir" ] || { echo "build-seaweedfs: go mod download $mod@$ver gave no folder" >&2; exit 1; }
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
echo "build-seaweedfs: go build $mod/weed@$ver (first time: several minutes)"
(cd "$work/src" && go build -trimpath -ldflags "-s -w" -o "$work/weed" ./weed)
mkdir -p "$(dirname "$out")"
mv "$work/weed" "$out"
