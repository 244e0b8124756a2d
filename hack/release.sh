#!/usr/bin/env bash
# `make release REGISTRY=host:port[/path]`: the image and the chart of this checkout, pushed
# to an OCI registry as a release is:
#   REGISTRY/cds-secret-guard:<version>          the image, for linux/amd64 and linux/arm64:
#                                                one image index (make image for each
#                                                platform; pushed by crane)
#   oci://REGISTRY/charts/cds-secret-guard       the chart, <version>, whose image.repository
#                                                defaults to REGISTRY/cds-secret-guard
# <version> is Cargo.toml's, the one source of the chart's version and appVersion (the
# packaged chart says so whatever Chart.yaml holds; tests/controlplane/helm.rs keeps them equal).
#
# A published version never changes. Both are reproducible: every timestamp in the image
# (release-image) and the chart is the commit's, so two builds of one commit give the same
# image digest and the same chart. Before pushing anything, each is compared with what its
# tag holds: the same content is not pushed again (releasing a commit twice changes
# nothing and succeeds); other content is refused, and nothing is pushed.
#
# With COSIGN_KEY, the image and the chart are signed with cosign, and the image carries a
# CycloneDX SBOM of the binary's crates (hack/sbom.sh) as a signed attestation. They live in
# the registry as referrers of what they sign (the tag sha256-<digest> where the registry
# has no referrers API); no transparency log is written to. An unchanged release already
# signed by that key is not signed again.
#
#   hack/release.sh [DIR]   DIR: another checkout (an earlier commit's) released instead
#                           (the upgrade tests; DOCKERFILE, as hack/image.sh reads it, builds
#                           its sources with another Dockerfile than its own)
#
# Env:
#   REGISTRY            host:port, or host:port/path (required)
#   REGISTRY_CA         the registry's CA file, when the system does not trust it
#   REGISTRY_USER, REGISTRY_PASSWORD   log in first (else the logins you have: docker's
#                       config.json for the image, helm's registry config for the chart)
#   PLAIN_HTTP=1        a registry without TLS; refused unless on a loopback address
#   DOCKER_CONFIG       as docker, crane and cosign read it
#   COSIGN_KEY          a cosign private key (cosign generate-key-pair); its password in
#                       COSIGN_PASSWORD, as cosign reads it. Without it nothing is signed,
#                       and the script says so.
#   SOURCE_DATE_EPOCH   the time every timestamp is set to (default: the commit's)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
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
crane_flags=() helm_flags=() cosign_flags=()
if [[ "${PLAIN_HTTP:-}" == 1 ]]; then
	case "${host%:*}" in
	localhost | 127.* | "[::1]") ;;
	*) die "PLAIN_HTTP=1 is for a registry on a loopback address, not $host" ;;
	esac
	crane_flags+=(--insecure)
	helm_flags+=(--plain-http)
	cosign_flags+=(--allow-http-registry)
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

if [[ -n "${COSIGN_KEY:-}" ]]; then
	[[ -r "$COSIGN_KEY" ]] || die "COSIGN_KEY=$COSIGN_KEY: no such file"
	# The key must open before anything is pushed.
	"$tools/cosign" public-key --key "$COSIGN_KEY" >"$repo/target/release-cosign.pub" 2>/dev/null ||
		die "cosign cannot open COSIGN_KEY (is COSIGN_PASSWORD its password?)"
fi
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$tree" log -1 --format=%ct)}"
[[ "$epoch" =~ ^[0-9]+$ ]] || die "no commit time in $tree (set SOURCE_DATE_EPOCH)"
image="$registry/$name:$version"
chart_ref="$registry/charts/$name:$version"

# The image for every platform, with every timestamp the commit's.
rm -rf "$out"
mkdir -p "$out"
digest="$(SOURCE_DATE_EPOCH="$epoch" "$repo/hack/release-image.sh" "$tree" "$out/image")"

# The chart, defaulting to the pushed image; its files and archive dated like the image.
cp -r "$tree/manifests/helm/$name" "$out/chart"
sed -i "s#^  repository: $name\$#  repository: $registry/$name#" "$out/chart/values.yaml"
grep -q "^  repository: $registry/$name\$" "$out/chart/values.yaml" || die "values.yaml has no image.repository line to point at the registry"
find "$out/chart" -exec touch -h -d "@$epoch" {} +
"$tools/helm" package "$out/chart" --version "$version" --app-version "$version" -d "$out" >/dev/null
rm -rf "$out/chart"
chart="$out/$name-$version.tgz"
# helm push dates the chart's manifest with the archive's modification time.
touch -d "@$epoch" "$chart"

# held REF: the digest REF's tag holds, or nothing when the tag does not exist.
held() {
	local output
	if output="$("$tools/crane" digest "${crane_flags[@]}" "$1" 2>&1)"; then
		echo "$output"
	elif ! grep -q "MANIFEST_UNKNOWN\|NAME_UNKNOWN\|404 Not Found" <<<"$output"; then
		die "cannot read $1: $output"
	fi
}
# Nothing is pushed unless both tags are free or hold this very release.
held_image="$(held "$image")"
if [[ -n "$held_image" && "$held_image" != "$digest" ]]; then
	die "$image holds $held_image, this build is $digest: a published version never changes; release this one under a new version (Cargo.toml). Nothing was pushed."
fi
held_chart="$(held "$chart_ref")"
if [[ -n "$held_chart" ]]; then
	mkdir -p "$out/held"
	"$tools/helm" pull "oci://$registry/charts/$name" --version "$version" -d "$out/held" "${helm_flags[@]}" >/dev/null 2>&1 ||
		die "cannot pull the chart $chart_ref that the registry lists"
	if ! cmp -s "$out/held/$name-$version.tgz" "$chart"; then
		die "$chart_ref holds another chart than this build's: a published version never changes; release this one under a new version (Cargo.toml). Nothing was pushed."
	fi
fi

if [[ -z "$held_image" ]]; then
	"$tools/crane" push "${crane_flags[@]}" "$out/image" "$image" >/dev/null
	[[ "$(held "$image")" == "$digest" ]] || die "$image does not hold $digest after the push"
	log "pushed $image@$digest"
else
	log "$image already holds $digest: not pushed again"
fi
if [[ -z "$held_chart" ]]; then
	"$tools/helm" push "$chart" "oci://$registry/charts" "${helm_flags[@]}" >&2
	held_chart="$(held "$chart_ref")"
	[[ -n "$held_chart" ]] || die "the registry does not list the chart just pushed"
else
	log "$chart_ref already holds this chart ($held_chart): not pushed again"
fi

if [[ -z "${COSIGN_KEY:-}" ]]; then
	log "NOT SIGNED: no COSIGN_KEY; the image and the chart carry no signature and no SBOM"
else
	public_key="$out/cosign.pub"
	mv "$repo/target/release-cosign.pub" "$public_key"
	# cosign COMMAND ARGS...: cosign on the registry, its output kept for an error.
	cosign() { "$tools/cosign" "$1" "${cosign_flags[@]}" "${@:2}" 2>&1; }
	# A signature and an attestation live in the registry alone: no transparency log.
	signed() { cosign verify --key "$public_key" --insecure-ignore-tlog=true "$1" >/dev/null; }
	attested() { cosign verify-attestation --key "$public_key" --type cyclonedx --insecure-ignore-tlog=true "$1" >/dev/null; }
	keyed=(--key "$COSIGN_KEY" --use-signing-config=false --tlog-upload=false --yes)
	for ref in "$registry/$name@$digest" "$registry/charts/$name@$held_chart"; do
		if signed "$ref"; then
			log "$ref is already signed by this key"
		else
			output="$(cosign sign "${keyed[@]}" "$ref")" || die "cosign could not sign $ref: $output"
			log "signed $ref"
		fi
	done
	if attested "$registry/$name@$digest"; then
		log "$registry/$name@$digest already carries this key's SBOM attestation"
	else
		SOURCE_DATE_EPOCH="$epoch" "$repo/hack/sbom.sh" "$tree" "$out/sbom.cdx.json"
		output="$(cosign attest "${keyed[@]}" --type cyclonedx --predicate "$out/sbom.cdx.json" "$registry/$name@$digest")" ||
			die "cosign could not attest the SBOM of $registry/$name@$digest: $output"
		log "attested the SBOM of $registry/$name@$digest"
	fi
fi
log "released $version: image $image@$digest, chart oci://$registry/charts/$name --version $version"
