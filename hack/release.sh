#!/usr/bin/env bash
# `make release REGISTRY=host:port[/path]`: the image and the chart of this checkout, pushed
# to an OCI registry as a release is:
#   REGISTRY/cds-secret-guard:<version>          the image (make image; pushed by crane)
#   oci://REGISTRY/charts/cds-secret-guard       the chart, <version>, whose image.repository
#                                                defaults to REGISTRY/cds-secret-guard
# <version> is Cargo.toml's, the one source of the chart's version and appVersion (the
# packaged chart says so whatever Chart.yaml holds; tests/controlplane/helm.rs keeps them equal).
#
#   hack/release.sh [DIR]   DIR: another checkout (an earlier commit's) released instead,
#                           its image built from its own Dockerfile (the upgrade tests)
#
# Env:
#   REGISTRY            host:port, or host:port/path (required)
#   REGISTRY_CA         the registry's CA file, when the system does not trust it
#   REGISTRY_USER, REGISTRY_PASSWORD   log in first (else the logins you have: docker's
#                       config.json for the image, helm's registry config for the chart)
#   PLAIN_HTTP=1        a registry without TLS; refused unless on a loopback address
#   DOCKER_CONFIG       as docker and crane read it
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/docker.sh
. "$repo/hack/docker.sh"
tools="$repo/target/tools/bin"
out="$repo/target/release-artifacts"
name=cds-secret-guard
tree="$(cd "${1:-$repo}" && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$tree/Cargo.toml" | head -n1)"

log() { echo "release.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

registry="${REGISTRY:-}"
[[ -n "$registry" ]] || die "usage: make release REGISTRY=host:port[/path]"
registry="${registry%/}"
# Logins and TLS are the host's; a path (harbor.example/team) only prefixes the names.
host="${registry%%/*}"
crane_flags=() helm_flags=()
if [[ "${PLAIN_HTTP:-}" == 1 ]]; then
	case "${host%:*}" in
	localhost | 127.* | "[::1]") ;;
	*) die "PLAIN_HTTP=1 is for a registry on a loopback address, not $host" ;;
	esac
	crane_flags+=(--insecure)
	helm_flags+=(--plain-http)
elif [[ -n "${REGISTRY_CA:-}" ]]; then
	# Go's TLS (crane) takes extra roots from SSL_CERT_FILE; helm from --ca-file.
	export SSL_CERT_FILE="$REGISTRY_CA"
	helm_flags+=(--ca-file "$REGISTRY_CA")
fi

"$repo/hack/tools/build.sh" >/dev/null
if [[ -n "${REGISTRY_USER:-}" ]]; then
	"$tools/crane" auth login "$host" -u "$REGISTRY_USER" --password-stdin \
		"${crane_flags[@]}" <<<"${REGISTRY_PASSWORD:?REGISTRY_PASSWORD with REGISTRY_USER}" >/dev/null
	"$tools/helm" registry login "$host" -u "$REGISTRY_USER" --password-stdin \
		"${helm_flags[@]}" <<<"$REGISTRY_PASSWORD" >/dev/null
fi

# The image, as `make image` builds it, pushed from the engine's export. The engine runs
# until both are done (image.sh stops only an engine it started).
started=0
if docker_start; then started=1; fi
stop_engine() { if ((started)); then docker_stop; fi; }
trap stop_engine EXIT
"$repo/hack/image.sh" "$tree"
rm -rf "$out"
mkdir -p "$out"
dk save "$name:$version" -o "$out/image.tar"
digest="$("$tools/crane" push "${crane_flags[@]}" "$out/image.tar" "$registry/$name:$version")"
rm -f "$out/image.tar"
log "pushed $digest"

# The chart, defaulting to the pushed image.
cp -r "$tree/manifests/helm/$name" "$out/chart"
sed -i "s#^  repository: $name\$#  repository: $registry/$name#" "$out/chart/values.yaml"
grep -q "^  repository: $registry/$name\$" "$out/chart/values.yaml" || die "values.yaml has no image.repository line to point at the registry"
"$tools/helm" package "$out/chart" --version "$version" --app-version "$version" -d "$out" >/dev/null
rm -rf "$out/chart"
"$tools/helm" push "$out/$name-$version.tgz" "oci://$registry/charts" "${helm_flags[@]}" >&2
log "released $version: image $registry/$name:$version, chart oci://$registry/charts/$name --version $version"
