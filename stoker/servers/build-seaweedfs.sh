#!/usr/bin/env bash
# Build SeaweedFS's `weed` (the tests' S3 server) from the Go module proxy into $2.
# `go install module@version` refuses modules whose go.mod has replace directives (SeaweedFS has
# one), so the module is downloaded, copied out of the read-only module cache and built as the main
# module. About 7 minutes on 2 cores the first time; Go's build cache makes a rebuild quick.
set -euo pipefail
ver=$1 out=$2
mod=github.com/seaweedfs/seaweedfs
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
