#!/usr/bin/env bash
# Builds the tools the tests run, from the Go module proxy: helm (the chart's
# lint, template and install tests; pinned in helm/go.mod), promtool (checks and
# unit-tests the alerting rules; pinned in promtool/go.mod) and toxiproxy (the
# fault-injecting TCP proxy of tests/e2e_lagging_watch.rs; pinned in
# toxiproxy/go.mod), and puts them in <repo>/target/tools/bin/.
#
#   tests/tools/build.sh              helm, promtool and toxiproxy (`make test`, `make tools`)
#   tests/tools/build.sh prometheus   the Prometheus server only (`make dashboard`),
#                                     from the same module and version as promtool
#                                     (pinned in prometheus/go.mod; the script fails
#                                     if the two pins differ), cached under its own
#                                     key, so it never enters `make test`'s path
#
# Same pattern as tests/controlplane/build.sh: the binaries are kept in a
# machine-wide cache keyed by a hash of everything that decides their content
# (go.mod/go.sum, the flags below, the Go version), so a fresh clone only links
# them; they are rebuilt only when a pin or a flag changes.
#
# Measured on the 2-core dev machine (Go 1.26.8), cold (empty Go module, build
# and binary caches), while other engineers' builds loaded it (load 10-16), so
# wall times are pessimistic: this whole script 29.7 min wall at nice 19, 13.5
# min of CPU (helm 20.1 min wall incl. ~1 min of module downloads, promtool 9.6
# min); on an idle machine expect about 8-10 min. Go's caches grow by ~1.4 GB
# (modules) and ~1.9 GB (build). Binary cache hit: under 0.1 s.
# `build.sh prometheus` (the server, for `make dashboard` only), cold (empty Go build
# cache; its modules were already downloaded, 36 s for `go mod tidy`): 18.0 min wall
# on 2026-12-04 while other builds loaded the machine (load 13-25; nice 10 for the first
# 13 min, then 0); ~0.85 GB of build cache.
# toxiproxy has its own cache key, so adding or bumping it rebuilds neither helm nor
# promtool. It is small (17 modules): cold (empty module and build caches, the
# standard library included) 2 min 46 s wall, 44 s of CPU, measured 2026-12-04 at
# load 17-21; 33 MB of modules, 135 MB of build cache. With Go's caches warm, 10 s.
#
# Env: CDS_GUARD_CACHE (default ~/.cache/cds-secret-guard) moves the cache.
set -euo pipefail

what="${1:-}"
case "$what" in
"" | prometheus) ;;
*)
	echo "usage: $0 [prometheus]" >&2
	exit 2
	;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/tools/bin"
t0=$(date +%s)

helm_version=v4.3.2
prometheus_version=3.16.0
# Helm's own Makefile stamps the version this way; without it `helm version` says v4.3.
helm_ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
promtool_ldflags="-s -w -X github.com/prometheus/common/version.Version=$prometheus_version"
# remove_all_sd: promtool without its service-discovery plugins (AWS, Azure, GCE,
# Kubernetes...), which `check rules` and `test rules` never use; they would add
# hundreds of modules and minutes of build.
promtool_tags=remove_all_sd
binaries=(helm promtool)
toxiproxy_version=v2.5.0
toxiproxy_ldflags="-s -w -X github.com/Shopify/toxiproxy/v2.Version=$toxiproxy_version"

# Static, reproducible builds; no VCS stamping (the repo's commit must not
# change the binaries) and no go.work from a parent directory.
export CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false
build_flags=(-trimpath)

# The Prometheus server, for `make dashboard` (hack/dashboard.sh): a separate module,
# because cmd/prometheus needs modules promtool's go.sum does not list, and a separate
# key, so that building it never invalidates helm's and promtool's cache. Without the
# builtinassets tag (the web UI's assets are not in the module zip): the HTTP API is
# all the dashboard needs. remove_all_sd as for promtool: the dashboard's scrape
# config is static, it needs no service-discovery plugin.
build_prometheus() {
	local pin_tool pin_server
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
	local key cache
	key="$(
		{
			cat "$here/prometheus/go.mod" "$here/prometheus/go.sum"
			echo "$promtool_ldflags|$promtool_tags|${build_flags[*]}|CGO_ENABLED=$CGO_ENABLED"
			go env GOVERSION GOOS GOARCH
		} | sha256sum | cut -c1-16
	)"
	cache="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}/tools/prometheus-$key"
	mkdir -p "$cache"
	exec 9>"$cache/.lock"
	flock 9
	if [[ -x "$cache/bin/prometheus" ]]; then
		echo "build.sh: cached prometheus $cache/bin"
	else
		echo "build.sh: building prometheus $prometheus_version into $cache/bin (cold: minutes)"
		local tmp="$cache/bin.tmp.$$" t
		rm -rf "$tmp" "$cache"/bin.tmp.*
		mkdir -p "$tmp"
		t=$(date +%s)
		(cd "$here/prometheus" && go build "${build_flags[@]}" -tags "$promtool_tags" -ldflags "$promtool_ldflags" \
			-o "$tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
		echo "build.sh: prometheus built in $(($(date +%s) - t))s"
		rm -rf "$cache/bin"
		mv "$tmp" "$cache/bin"
	fi
	link "$cache/bin" prometheus
	echo "build.sh: $out/prometheus ready ($(($(date +%s) - t0))s)"
}

# Hard links when the cache is on the same file system, else copies; replacing
# the directory entry is safe while an old binary runs.
link() {
	local from="$1" b
	shift
	mkdir -p "$out"
	for b in "$@"; do
		if [[ "$from/$b" -ef "$out/$b" ]]; then continue; fi
		ln -f "$from/$b" "$out/$b" 2>/dev/null || {
			cp "$from/$b" "$out/.$b.tmp" && mv -f "$out/.$b.tmp" "$out/$b"
		}
	done
}

if [[ "$what" == prometheus ]]; then
	build_prometheus
	exit 0
fi

key="$(
	{
		cat "$here/helm/go.mod" "$here/helm/go.sum" "$here/promtool/go.mod" "$here/promtool/go.sum"
		echo "$helm_ldflags|$promtool_ldflags|$promtool_tags|${build_flags[*]}|CGO_ENABLED=$CGO_ENABLED"
		go env GOVERSION GOOS GOARCH
	} | sha256sum | cut -c1-16
)"
cache="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}/tools/$key"

mkdir -p "$cache"
# One build at a time per key (two clones building at once share the result).
exec 9>"$cache/.lock"
flock 9

if [[ -x "$cache/bin/helm" && -x "$cache/bin/promtool" ]]; then
	echo "build.sh: cached tools $cache/bin"
else
	echo "build.sh: building helm and promtool into $cache/bin (cold: minutes, see the header)"
	tmp="$cache/bin.tmp.$$"
	rm -rf "$tmp" "$cache"/bin.tmp.*
	mkdir -p "$tmp"
	t=$(date +%s)
	(cd "$here/helm" && go build "${build_flags[@]}" -ldflags "$helm_ldflags" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
	echo "build.sh: helm built in $(($(date +%s) - t))s"
	t=$(date +%s)
	(cd "$here/promtool" && go build "${build_flags[@]}" -tags "$promtool_tags" -ldflags "$promtool_ldflags" \
		-o "$tmp/promtool" github.com/prometheus/prometheus/cmd/promtool)
	echo "build.sh: promtool built in $(($(date +%s) - t))s"
	# Publish atomically: a half-finished build is never taken for a cached one.
	rm -rf "$cache/bin"
	mv "$tmp" "$cache/bin"
fi

exec 9>&-
link "$cache/bin" "${binaries[@]}"

toxiproxy_key="$(
	{
		cat "$here/toxiproxy/go.mod" "$here/toxiproxy/go.sum"
		echo "$toxiproxy_ldflags|${build_flags[*]}|CGO_ENABLED=$CGO_ENABLED"
		go env GOVERSION GOOS GOARCH
	} | sha256sum | cut -c1-16
)"
toxiproxy_cache="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}/tools/toxiproxy-$toxiproxy_key"
mkdir -p "$toxiproxy_cache"
exec 9>"$toxiproxy_cache/.lock"
flock 9
if [[ -x "$toxiproxy_cache/bin/toxiproxy" ]]; then
	echo "build.sh: cached toxiproxy $toxiproxy_cache/bin"
else
	tmp="$toxiproxy_cache/bin.tmp.$$"
	rm -rf "$tmp" "$toxiproxy_cache"/bin.tmp.*
	mkdir -p "$tmp"
	t=$(date +%s)
	(cd "$here/toxiproxy" && go build "${build_flags[@]}" -ldflags "$toxiproxy_ldflags" \
		-o "$tmp/toxiproxy" github.com/Shopify/toxiproxy/v2/cmd/server)
	echo "build.sh: toxiproxy built in $(($(date +%s) - t))s"
	rm -rf "$toxiproxy_cache/bin"
	mv "$tmp" "$toxiproxy_cache/bin"
fi
exec 9>&-
link "$toxiproxy_cache/bin" toxiproxy
echo "build.sh: $out ready ($(($(date +%s) - t0))s)"
