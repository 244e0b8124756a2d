#!/usr/bin/env bash
# The image `make release` pushes, made locally: `make image` for linux/amd64 and
# linux/arm64 (the host's platform alone for an earlier release whose own Dockerfile did not
# cross-compile: it published no other), each saved from the engine, then release-image
# (hack/tools) sets every timestamp to the commit's and writes them as one OCI image index.
# Prints its digest: two builds of one commit print the same.
#
#   hack/release-image.sh TREE OUT   TREE: a checkout; OUT: the OCI image layout to write
#
# Env: SOURCE_DATE_EPOCH (default: TREE's commit time); NO_CACHE=1 builds from scratch
# (hack/image.sh).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/docker.sh
. "$repo/hack/docker.sh"
tools="$repo/target/tools/bin"
name=cds-secret-guard
log() { echo "release-image.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}
[[ $# == 2 ]] || die "usage: $0 TREE OUT"
tree="$(cd "$1" && pwd)"
out="$2"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$tree/Cargo.toml" | head -n1)"
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$tree" log -1 --format=%ct)}"
[[ "$epoch" =~ ^[0-9]+$ ]] || die "no commit time in $tree (set SOURCE_DATE_EPOCH)"
[[ -x "$tools/release-image" ]] || "$repo/hack/tools/build.sh" >/dev/null

# The engine runs until the images are saved (image.sh stops only an engine it started).
started=0
if docker_start; then started=1; fi
stop_engine() { if ((started)); then docker_stop; fi; }
trap stop_engine EXIT
host_arch="$(dk version -f '{{.Server.Arch}}')"
platforms=(linux/amd64 linux/arm64)
if ! grep -q 'BUILDPLATFORM' "$tree/Dockerfile"; then
	platforms=("linux/$host_arch")
	log "$tree's own Dockerfile did not cross-compile: its release is ${platforms[*]} only"
fi
PLATFORMS="${platforms[*]}" "$repo/hack/image.sh" "$tree"
saved=()
for platform in "${platforms[@]}"; do
	tag="$name:$version"
	[[ "$platform" == "linux/$host_arch" ]] || tag="$name:$version-${platform//\//-}"
	saved+=("$out.${platform//\//-}.tar")
	dk save "$tag" -o "${saved[-1]}"
done
stop_engine
trap - EXIT
"$tools/release-image" -epoch "$epoch" -out "$out" "${saved[@]}"
rm -f "${saved[@]}"
