#!/usr/bin/env bash
# `make reproduce`: the release image of this checkout built twice from scratch, every step
# of the Dockerfile run again for both platforms (with the Debian engine, --no-cache also
# gives the build empty cargo caches: every crate is downloaded and compiled again), and
# the digests hack/release-image.sh prints compared. They must be equal: what `make
# release` compares with a published tag is then the commit's image, not a build's.
# About 10 minutes a build on 2 cores.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/target/reproduce"
rm -rf "$out"
mkdir -p "$out"
digests=()
for build in 1 2; do
	t=$(date +%s)
	digests+=("$(NO_CACHE=1 "$repo/hack/release-image.sh" "$repo" "$out/$build")")
	echo "reproduce.sh: build $build: ${digests[-1]} in $(($(date +%s) - t))s" >&2
done
if [[ "${digests[0]}" != "${digests[1]}" ]]; then
	echo "reproduce.sh: ERROR: two builds of $(git -C "$repo" rev-parse --short=12 HEAD) differ: ${digests[*]} (layouts in $out)" >&2
	exit 1
fi
echo "reproduce.sh: two builds of $(git -C "$repo" rev-parse --short=12 HEAD) from scratch: ${digests[0]}"
