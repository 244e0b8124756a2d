#!/usr/bin/env bash
# Builds the test control plane's binaries from source: kube-apiserver,
# kube-controller-manager and kubectl, and the node's kubelet, kube-scheduler
# and kube-proxy (pinned in kube/go.mod), and etcd (pinned in etcd/go.mod), and
# puts them in <repo>/target/controlplane/bin/.
#
# Binaries are kept in a machine-wide cache keyed by a hash of everything that
# decides their content (go.mod/go.sum files, etcd/main.go, the flags below,
# the Go version), so a fresh clone anywhere on the machine only links them
# (seconds); they are rebuilt only when a pinned version or flag changes. The
# cache's lock, atomic publish and links are hack/tools/cache.sh's.
# Go's own module and build caches (~/go/pkg/mod, ~/.cache/go-build) are used
# as they are.
#
# Measured on the 2-core dev machine (Go 1.26.8), see README.md: cold, with
# empty module and build caches, about 12 min (module downloads ~30 s, the
# three kube binaries 620 s, etcd 53 s). Binary cache empty but Go's build
# cache warm: ~20 s (link only). Binary cache hit: under 0.1 s.
#
# Env: CDS_GUARD_CACHE (default ~/.cache/cds-secret-guard) moves the cache.
# K8S_VERSION (default: the release pinned in kube/ and etcd/, v1.36.3) builds another release
# from its committed pins in versions/<version>/ (made once by pin.sh), cached
# under its own key. Each extra version's first build adds minutes (README.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/controlplane/bin"
t0=$(date +%s)
# shellcheck source=hack/tools/cache.sh
source "$here/../tools/cache.sh"

die() {
	echo "build.sh: ERROR: $*" >&2
	exit 1
}
# required_kubernetes GO_MOD: the k8s.io/kubernetes version it requires.
required_kubernetes() { sed -n 's#^[[:space:]]*k8s\.io/kubernetes \(v[0-9.]*\)\( // indirect\)*$#\1#p' "$1"; }

# The release: the default's pins are kube/ and etcd/ (its version is kube/go.mod's);
# another's, versions/<version>/.
pinned_version="$(required_kubernetes "$here/kube/go.mod")"
k8s_version="${K8S_VERSION:-$pinned_version}"
if [[ "$k8s_version" == "$pinned_version" ]]; then
	kube_dir="$here/kube" etcd_dir="$here/etcd"
else
	kube_dir="$here/versions/$k8s_version/kube" etcd_dir="$here/versions/$k8s_version/etcd"
fi
[[ "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || die "K8S_VERSION=$k8s_version: want v1.MINOR.PATCH"
k8s_minor=${BASH_REMATCH[1]}
if [[ ! -f "$kube_dir/go.mod" || ! -f "$etcd_dir/go.mod" ]]; then
	die "no pins for K8S_VERSION=$k8s_version (pinned: $pinned_version, the default$(
		cd "$here/versions" && printf ', %s' v*
	)); for another served version run $here/pin.sh $k8s_version and commit versions/$k8s_version"
fi
[[ "$(required_kubernetes "$kube_dir/go.mod")" == "$k8s_version" ]] ||
	die "$kube_dir/go.mod does not require k8s.io/kubernetes $k8s_version"
etcd_version="$(sed -n 's#^require go\.etcd\.io/etcd/server/v3 \(v[0-9.]*\)$#\1#p' "$etcd_dir/go.mod")"
[[ -n "$etcd_version" ]] || die "no 'require go.etcd.io/etcd/server/v3 vX.Y.Z' line in $etcd_dir/go.mod"

# Same version stamping as Kubernetes' hack/lib/version.sh, so /version and
# `kubectl version` report the real release instead of v0.0.0-master.
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean"
done
# etcd's version string comes from its api module; only the git SHA field
# ("Not provided" otherwise) is stamped, with the module version.
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=go-module-$etcd_version"
kube_cmds=(kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy)
binaries=("${kube_cmds[@]}" etcd)
kube_cmds=("${kube_cmds[@]/#/k8s.io/kubernetes/cmd/}")

# Static, reproducible builds; no VCS stamping (the repo's commit must not
# change the binaries) and no go.work from a parent directory.
export CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false
build_flags=(-trimpath)

key="$(cache_key "$kube_ldflags|$etcd_ldflags|${build_flags[*]}|${kube_cmds[*]}|CGO_ENABLED=$CGO_ENABLED" \
	"$kube_dir/go.mod" "$kube_dir/go.sum" "$etcd_dir/go.mod" "$etcd_dir/go.sum" "$etcd_dir/main.go")"

# build TMP: all the binaries into TMP.
build() {
	local tmp="$1" t
	t=$(date +%s)
	(cd "$kube_dir" && go build "${build_flags[@]}" -ldflags "$kube_ldflags" -o "$tmp/" "${kube_cmds[@]}")
	echo "build.sh: kube binaries built in $(($(date +%s) - t))s"
	t=$(date +%s)
	(cd "$etcd_dir" && go build "${build_flags[@]}" -ldflags "$etcd_ldflags" -o "$tmp/etcd" .)
	echo "build.sh: etcd built in $(($(date +%s) - t))s"
}

echo "build.sh: Kubernetes $k8s_version, etcd $etcd_version: cache key $key"
cached_build "$cache_root/controlplane/$key" "$out" "${binaries[*]}" build
# Which release bin/ holds now: cluster.sh compares it with the running one's.
echo "$k8s_version" >"$out/.k8s-version.tmp" && mv "$out/.k8s-version.tmp" "$out/.k8s-version"
echo "build.sh: $out ready ($(($(date +%s) - t0))s)"
