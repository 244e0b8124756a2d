#!/usr/bin/env bash
# Builds the tools the tests run, from the Go module proxy: helm (the chart's
# lint, template and install tests; pinned in helm/go.mod), promtool (checks and
# unit-tests the alerting rules; pinned in promtool/go.mod), toxiproxy (the
# fault-injecting TCP proxy of tests/controlplane/e2e_lagging_watch.rs; pinned in
# toxiproxy/go.mod), the shipped suite's registry (registry/main.go, on
# go-containerregistry) with crane, which pushes to it, and release-image
# (registry/release-image/main.go), which makes what `make release` pushes
# reproducible (pinned in registry/go.mod), cosign, which signs and verifies
# releases (pinned in cosign/go.mod), and, from crates.io, cargo-cyclonedx, which
# writes the SBOM a release attests (pinned below), and puts them in
# <repo>/target/tools/bin/.
#
#   hack/tools/build.sh              helm, promtool, toxiproxy, registry, crane,
#                                     release-image, cosign and cargo-cyclonedx
#                                     (`make tools`, `make release`)
#   hack/tools/build.sh test         what the suites run: all but cosign and
#                                     cargo-cyclonedx (`make test`, before its suites;
#                                     `make run`)
#   hack/tools/build.sh release      cosign and cargo-cyclonedx only (`make test`, in
#                                     the background, for the shipped suite's releases)
#   hack/tools/build.sh prometheus   the Prometheus server only (`make dashboard`),
#                                     from the same module and version as promtool
#                                     (pinned in prometheus/go.mod; the script fails
#                                     if the two pins differ), cached under its own
#                                     key, so it never enters `make test`'s path
#
# Same pattern as hack/controlplane/build.sh (both use hack/tools/cache.sh): the
# binaries are kept in a machine-wide cache keyed by a hash of everything that
# decides their content (go.mod/go.sum, the flags below, the Go version), so a fresh
# clone only links them; they are rebuilt only when a pin or a flag changes. Three
# keys: helm and promtool together, the Prometheus server (prometheus-<key>) and
# toxiproxy (toxiproxy-<key>), so adding or bumping one rebuilds neither of the others.
#
# Measured on the 2-core dev machine (Go 1.26.8), cold (empty Go module, build and
# binary caches), while other engineers' builds loaded the machine, so wall times are
# pessimistic; a binary cache hit takes under 0.1 s.
# - helm and promtool: 29.7 min wall at nice 19 and load 10-16, 13.5 min of CPU (helm
#   20.1 min wall incl. ~1 min of module downloads, promtool 9.6 min); on the idle
#   machine 4.9 min (2026-12-03). Go's caches grow by ~1.4 GB (modules) and ~1.9 GB
#   (build).
# - prometheus (the server, `make dashboard` only), its modules already downloaded
#   (36 s for `go mod tidy`): 18.0 min wall on 2026-12-04 at load 13-25 (nice 10 for
#   the first 13 min, then 0); ~0.85 GB of build cache.
# - toxiproxy (17 modules), the standard library included: 2 min 46 s wall, 44 s of
#   CPU, measured 2026-12-04 at load 17-21; 33 MB of modules, 135 MB of build cache.
#   With Go's caches warm, 10 s.
# - cosign (its module graph lists ~800 modules): 4 min 21 s wall, 3 min 35 s of CPU, at
#   nice 19 beside a Rust build (2026-12-07), its modules already downloaded (about a
#   minute more).
# Binary cache empty, Go's caches warm (2026-12-04, nice 10, load 2-3): helm 16 s,
# promtool 9 s, toxiproxy 2 s; prometheus 101 s.
#
# Env: CDS_GUARD_CACHE (default ~/.cache/cds-secret-guard) moves the cache.
set -euo pipefail

what="${1:-}"
case "$what" in
"" | test | release | prometheus) ;;
*)
	echo "usage: $0 [test|release|prometheus]" >&2
	exit 2
	;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/tools/bin"
t0=$(date +%s)
# shellcheck source=hack/tools/cache.sh
source "$here/cache.sh"

helm_version=v4.3.2
prometheus_version=3.16.0
# Helm's own Makefile stamps the version this way; without it `helm version` says v4.3.
helm_ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
promtool_ldflags="-s -w -X github.com/prometheus/common/version.Version=$prometheus_version"
# remove_all_sd: promtool without its service-discovery plugins (AWS, Azure, GCE,
# Kubernetes...), which `check rules` and `test rules` never use; they would add
# hundreds of modules and minutes of build.
promtool_tags=remove_all_sd
toxiproxy_version=v2.5.0
toxiproxy_ldflags="-s -w -X github.com/Shopify/toxiproxy/v2.Version=$toxiproxy_version"
cosign_version=v3.1.3
# cosign's own release stamps the version this way; without it `cosign version` says devel.
cosign_ldflags="-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$cosign_version"
cyclonedx_version=0.5.9

# Static, reproducible builds; no VCS stamping (the repo's commit must not
# change the binaries) and no go.work from a parent directory.
export CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false
build_flags=(-trimpath)

# cached_go_build PREFIX [BINARY MODULE PACKAGE LDFLAGS TAGS]...
# Builds each PACKAGE, from the module in hack/tools/MODULE, as BINARY with LDFLAGS
# and TAGS (either may be empty), into $cache_root/tools/PREFIX<key>/bin, and links
# the binaries into $out. The key hashes each MODULE's go.mod and go.sum (once, in
# order, with the module's own .go files if it has any), then the non-empty LDFLAGS and TAGS joined by "|", build_flags, CGO_ENABLED
# and the Go version: the flags a build uses always enter its key.
cached_go_build() {
	local prefix="$1" i module
	shift
	if (($# == 0 || $# % 5 != 0)); then
		echo "build.sh: cached_go_build PREFIX [BINARY MODULE PACKAGE LDFLAGS TAGS]..." >&2
		exit 2
	fi
	local -a builds=("$@") binaries=() files=() flags=()
	local -A seen=()
	for ((i = 0; i < ${#builds[@]}; i += 5)); do
		binaries+=("${builds[i]}")
		module="${builds[i + 1]}"
		if [[ -z "${seen[$module]:-}" ]]; then
			seen[$module]=1
			# A module of ours (registry/) enters the key with its sources.
			files+=("$here/$module/go.mod" "$here/$module/go.sum")
			files+=($(find "$here/$module" -name '*.go' | sort))
		fi
		if [[ -n "${builds[i + 3]}" ]]; then flags+=("${builds[i + 3]}"); fi
		if [[ -n "${builds[i + 4]}" ]]; then flags+=("${builds[i + 4]}"); fi
	done
	local key
	key="$(cache_key "$(IFS='|' && echo "${flags[*]}")|${build_flags[*]}|CGO_ENABLED=$CGO_ENABLED" "${files[@]}")"
	cached_build "$cache_root/tools/$prefix$key" "$out" "${binaries[*]}" go_builds "${builds[@]}"
}

# go_builds TMP [BINARY MODULE PACKAGE LDFLAGS TAGS]...: cached_go_build's builds, into TMP.
go_builds() {
	local tmp="$1" binary module package ldflags tags t
	shift
	while (($# >= 5)); do
		binary="$1" module="$2" package="$3" ldflags="$4" tags="$5"
		shift 5
		t=$(date +%s)
		(cd "$here/$module" && go build "${build_flags[@]}" ${tags:+-tags "$tags"} -ldflags "$ldflags" -o "$tmp/$binary" "$package")
		echo "build.sh: $binary built in $(($(date +%s) - t))s"
	done
}

if [[ "$what" == prometheus ]]; then
	# The Prometheus server, for `make dashboard` (hack/dashboard.sh): a separate module,
	# because cmd/prometheus needs modules promtool's go.sum does not list, and a separate
	# key, so that building it never invalidates helm's and promtool's cache. Without the
	# builtinassets tag (the web UI's assets are not in the module zip): the HTTP API is
	# all the dashboard needs. remove_all_sd as for promtool: the dashboard's scrape
	# config is static, it needs no service-discovery plugin.
	pin_tool="$(awk '$1 == "github.com/prometheus/prometheus" {print $2}' "$here/promtool/go.mod")"
	pin_server="$(awk '$1 == "github.com/prometheus/prometheus" {print $2}' "$here/prometheus/go.mod")"
	if [[ -z "$pin_tool" || "$pin_tool" != "$pin_server" ]]; then
		echo "build.sh: promtool pins prometheus ${pin_tool:-?}, the server ${pin_server:-?}: they must match" >&2
		exit 1
	fi
	# Prometheus 3.16.0 is the Go module's v0.316.0.
	if [[ "$pin_tool" != "$(awk -F. '{printf "v0.%d%02d.%d", $1, $2, $3}' <<<"$prometheus_version")" ]]; then
		echo "build.sh: go.mod pins prometheus $pin_tool but prometheus_version is $prometheus_version" >&2
		exit 1
	fi
	cached_go_build prometheus- \
		prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus "$promtool_ldflags" "$promtool_tags"
	echo "build.sh: $out/prometheus ready ($(($(date +%s) - t0))s)"
	exit 0
fi

# What the suites run.
test_tools() {
	# helm's and promtool's key has no prefix: it is older than the others.
	cached_go_build "" \
		helm helm helm.sh/helm/v4/cmd/helm "$helm_ldflags" "" \
		promtool promtool github.com/prometheus/prometheus/cmd/promtool "$promtool_ldflags" "$promtool_tags"
	cached_go_build toxiproxy- \
		toxiproxy toxiproxy github.com/Shopify/toxiproxy/v2/cmd/server "$toxiproxy_ldflags" ""
	cached_go_build registry- \
		registry registry . "-s -w" "" \
		crane registry github.com/google/go-containerregistry/cmd/crane "-s -w" "" \
		release-image registry ./release-image "-s -w" ""
}

# What a release signs and describes with: cosign, and cargo-cyclonedx, a Rust tool
# (`cargo install --locked`, its own Cargo.lock, keyed by its version and the host's rustc).
# Built unoptimised: it reads cargo's metadata once per release (0.9 s against 0.4 s, the
# same SBOM), and compiles in half the time (61 s against 134 s on 2 cores).
release_tools() {
	if [[ "$cosign_version" != "$(awk '$1 == "github.com/sigstore/cosign/v3" {print $2}' "$here/cosign/go.mod")" ]]; then
		echo "build.sh: cosign/go.mod does not pin cosign $cosign_version" >&2
		exit 1
	fi
	cached_go_build cosign- \
		cosign cosign github.com/sigstore/cosign/v3/cmd/cosign "$cosign_ldflags" ""
	local key
	key="$(echo "cargo-cyclonedx@$cyclonedx_version --debug $(rustc -V)" | sha256sum | cut -c1-16)"
	cached_build "$cache_root/tools/cyclonedx-$key" "$out" cargo-cyclonedx cargo_installs
}
cargo_installs() {
	local tmp="$1" t
	t=$(date +%s)
	cargo install --quiet --debug --locked --root "$tmp/root" "cargo-cyclonedx@$cyclonedx_version"
	mv "$tmp/root/bin/cargo-cyclonedx" "$tmp/" && rm -rf "$tmp/root"
	echo "build.sh: cargo-cyclonedx built in $(($(date +%s) - t))s"
}

if [[ "$what" != release ]]; then test_tools; fi
if [[ "$what" != test ]]; then release_tools; fi
echo "build.sh: $out ready ($(($(date +%s) - t0))s)"
