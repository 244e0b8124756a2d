#!/usr/bin/env bash
# The SBOM of the guard's binary, as `make release` attests it: CycloneDX 1.5 (JSON), from
# cargo-cyclonedx (hack/tools/build.sh builds it): every crate the binary is built from on
# Linux, none of the build-time or test-only ones, dated by the commit.
#
#   hack/sbom.sh TREE OUT   the SBOM of the checkout TREE, written to OUT
#
# Env: SOURCE_DATE_EPOCH (default: TREE's commit time).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$repo/target/tools/bin"
[[ $# == 2 ]] || {
	echo "usage: $0 TREE OUT" >&2
	exit 2
}
tree="$(cd "$1" && pwd)"
out="$2"
[[ -x "$tools/cargo-cyclonedx" ]] || "$repo/hack/tools/build.sh" >/dev/null
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$tree" log -1 --format=%ct)}"
# One SBOM per binary, written beside Cargo.toml under the binary's name.
written="$tree/cds-secret-guard_bin.cdx.json"
rm -f "$written"
(cd "$tree" && "$tools/cargo-cyclonedx" cyclonedx --quiet --describe binaries --format json \
	--spec-version 1.5 --target x86_64-unknown-linux-gnu --no-build-deps)
mv "$written" "$out"
