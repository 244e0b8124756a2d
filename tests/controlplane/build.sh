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
# cache's lock, atomic publish and links are tests/tools/cache.sh's.
# Go's own module and build caches (~/go/pkg/mod, ~/.cache/go-build) are used
# as they are.
#
# Measured on the 2-core dev machine (Go 1.26.8), see README.md: cold, with
# empty module and build caches, about 12 min (module downloads ~30 s, the
# three kube binaries 620 s, etcd 53 s). Binary cache empty but Go's build
# cache warm: ~20 s (link only). Binary cache hit: under 0.1 s.
#
# Env: CDS_GUARD_CACHE (default ~/.cache/cds-secret-guard) moves the cache.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/controlplane/bin"
t0=$(date +%s)
# shellcheck source=tests/tools/cache.sh
source "$here/../tools/cache.sh"

# Same version stamping as Kubernetes' hack/lib/version.sh, so /version and
# `kubectl version` report the real release instead of v0.0.0-master.
k8s_version=v1.36.3
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=36 -X $pkg.gitTreeState=clean"
done
# etcd's version string comes from its api module; only the git SHA field
# ("Not provided" otherwise) is stamped, with the module version.
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=go-module-v3.6.8"
kube_cmds=(kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy)
binaries=("${kube_cmds[@]}" etcd)
kube_cmds=("${kube_cmds[@]/#/k8s.io/kubernetes/cmd/}")

# Static, reproducible builds; no VCS stamping (the repo's commit must not
# change the binaries) and no go.work from a parent directory.
export CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false
build_flags=(-trimpath)

key="$(cache_key "$kube_ldflags|$etcd_ldflags|${build_flags[*]}|${kube_cmds[*]}|CGO_ENABLED=$CGO_ENABLED" \
	"$here/kube/go.mod" "$here/kube/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" "$here/etcd/main.go")"

# build TMP: all the binaries into TMP.
build() {
	local tmp="$1" t
	t=$(date +%s)
	(cd "$here/kube" && go build "${build_flags[@]}" -ldflags "$kube_ldflags" -o "$tmp/" "${kube_cmds[@]}")
	echo "build.sh: kube binaries built in $(($(date +%s) - t))s"
	t=$(date +%s)
	(cd "$here/etcd" && go build "${build_flags[@]}" -ldflags "$etcd_ldflags" -o "$tmp/etcd" .)
	echo "build.sh: etcd built in $(($(date +%s) - t))s"
}

cached_build "$cache_root/controlplane/$key" "$out" "${binaries[*]}" build
echo "build.sh: $out ready ($(($(date +%s) - t0))s)"
