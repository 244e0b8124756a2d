#!/usr/bin/env bash
# `make image`: builds the repository's Dockerfile with a Docker engine (hack/docker.sh: the
# host's, or a private one) and tags it cds-secret-guard:<version> (Cargo.toml's) and
# cds-secret-guard:dev.
#
#   hack/image.sh [DIR]   DIR: another checkout (an earlier commit's, for the upgrade
#                         tests), built from its Dockerfile and tagged with its version only
#
# PLATFORMS (default: the host's, e.g. linux/amd64) names the platforms to build, among
# linux/amd64 and linux/arm64: the host's is tagged as above, another as
# cds-secret-guard:<version>-linux-<arch>. The Dockerfile cross-compiles: nothing is
# emulated.
#
# The Dockerfile is the one users build, unchanged. Its base images are build arguments
# (BUILD_IMAGE, RUNTIME_IMAGE, from RUST_VERSION); set them in the environment to build
# from a mirror. Each base is used as the engine has it, else pulled; only when no registry
# answers does this script make a local stand-in under that exact name, and it says so:
#   rust:<X.Y>-bookworm                     Debian bookworm (debootstrap, minbase) with gcc
#                                           and make, the host's CA bundle (cargo reaches
#                                           crates.io through the host's network), and the
#                                           host's Rust toolchain, which must be X.Y, with
#                                           the x86_64 and aarch64 standard libraries
#                                           (rustup adds them), laid out as the official
#                                           image has it (/usr/local/cargo)
#   gcr.io/distroless/cc-debian12:nonroot   what distroless/cc holds: glibc, libgcc, the CA
#                                           bundle, passwd with nonroot (65532); no shell
#   gcr.io/distroless/cc-debian12:nonroot-<arch>   the same for another architecture, from
#                                           that architecture's packages (for PLATFORMS)
# Each stand-in is labelled io.cds-secret-guard.stand-in=<hash of its recipe> and rebuilt
# when the recipe changes. The Dockerfile's own steps then run as they do anywhere.
#
# Env: DOCKERFILE, the Dockerfile to build with (default: the checkout's own). The upgrade
# tests build the previous release's sources with this checkout's: compiled as this one is
# (the same compiler, flags and base images), they take the crates both share from the
# build's cache rather than compiling them again.
# BUILD_IMAGE, RUNTIME_IMAGE, RUST_VERSION (the Dockerfile's arguments); NO_CACHE=1
# runs every step of the Dockerfile again (with the Debian engine, from empty cargo caches);
# DEBIAN_MIRROR (the stand-ins' Debian archive; default: the host's apt sources' bookworm
# archive, else deb.debian.org); CDS_GUARD_CACHE (default ~/.cache/cds-secret-guard).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/docker.sh
. "$repo/hack/docker.sh"
cache="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}/image"
name=cds-secret-guard
context="$(cd "${1:-$repo}" && pwd)"
dockerfile="$(realpath "${DOCKERFILE:-$context/Dockerfile}")"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$context/Cargo.toml" | head -n1)"
tags=(-t "$name:$version")
[[ "$context" != "$repo" ]] || tags+=(-t "$name:dev")
case "$(uname -m)" in
x86_64) host_arch=amd64 ;;
aarch64) host_arch=arm64 ;;
*) host_arch="$(uname -m)" ;;
esac
platforms="${PLATFORMS:-linux/$host_arch}"
platforms="${platforms//,/ }"
for platform in $platforms; do
	case "$platform" in
	linux/amd64 | linux/arm64) ;;
	*) echo "image.sh: ERROR: PLATFORMS: $platform is not linux/amd64 or linux/arm64" >&2 && exit 1 ;;
	esac
done
t0=$(date +%s)

log() { echo "image.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# dockerfile_arg NAME: the default the Dockerfile gives the build argument NAME.
dockerfile_arg() { sed -n "s/^ARG $1=\(.*\)$/\1/p" "$dockerfile" | head -n1; }
# The build arguments: the environment's, else the Dockerfile's defaults (BUILD_IMAGE's
# names RUST_VERSION). An earlier Dockerfile may name its images literally.
build_args=()
for arg in RUST_VERSION BUILD_IMAGE RUNTIME_IMAGE; do
	value="${!arg:-$(dockerfile_arg "$arg")}"
	value="${value//\$\{RUST_VERSION\}/${RUST_VERSION:-}}"
	declare "$arg=$value"
	[[ -z "$value" ]] || build_args+=(--build-arg "$arg=$value")
done
# base_images: the FROM images, with the build arguments substituted.
base_images() {
	local image arg
	sed -n 's/^FROM[[:space:]]\+\(--platform=[^[:space:]]\+[[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$dockerfile" | while read -r image; do
		for arg in RUST_VERSION BUILD_IMAGE RUNTIME_IMAGE; do image="${image//\$\{$arg\}/${!arg}}"; done
		echo "$image"
	done
}

# The Debian archive of the host's apt sources that serves bookworm (deb822 .sources files
# or one-line .list files).
host_debian_mirror() {
	local file
	for file in /etc/apt/sources.list.d/*.sources; do
		[[ -f "$file" ]] || continue
		awk 'BEGIN { RS = ""; FS = "\n" }
			/(^|\n)Suites:[^\n]*[[:space:]]bookworm([[:space:]]|$)/ && !/(^|\n)Enabled:[[:space:]]*no/ {
				for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) { split($i, uri, /[[:space:]]+/); print uri[2]; exit }
			}' "$file"
	done
	for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f "$file" ]] || continue
		sed -e 's/\[[^]]*\]//' "$file" | awk '$1 == "deb" && $3 == "bookworm" { print $2 }'
	done
}
debian_mirror="${DEBIAN_MIRROR:-$(host_debian_mirror | grep -v security | head -n1)}"
debian_mirror="${debian_mirror:-http://deb.debian.org/debian}"

# A Debian bookworm minbase rootfs with what both stand-ins take from it, as a tarball
# in the cache (debootstrap takes about a minute; it is made once).
bookworm_packages=ca-certificates,gcc,libc6-dev,make
bookworm_rootfs() {
	local tarball="$cache/bookworm-${bookworm_packages//,/-}.tar"
	if [[ ! -s "$tarball" ]]; then
		command -v debootstrap >/dev/null || docker_install
		log "debootstrap bookworm from $debian_mirror (minbase + $bookworm_packages)"
		local dir="$cache/bookworm.tmp.$$"
		rm -rf "$dir"
		mkdir -p "$dir"
		debootstrap --variant=minbase --include="$bookworm_packages" bookworm "$dir" \
			"$debian_mirror" >"$cache/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$cache/debootstrap.log" >&2; die "debootstrap failed; see $cache/debootstrap.log"; }
		rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
		tar -C "$dir" --numeric-owner -cf "$tarball.tmp" .
		mv "$tarball.tmp" "$tarball"
		rm -rf "$dir"
	fi
	echo "$tarball"
}

stand_in_label() { dk image inspect -f '{{index .Config.Labels "io.cds-secret-guard.stand-in"}}' "$1" 2>/dev/null; }
# stand_in_current IMAGE RECIPE_HASH: IMAGE exists and was made from this recipe.
stand_in_current() { [[ "$(stand_in_label "$1")" == "$2" ]]; }

# rust:X.Y-bookworm from the bookworm rootfs and the host's toolchain.
make_rust_stand_in() {
	local image=$1 want sysroot have hash dir
	want="${image##*rust:}"
	want="${want%-bookworm}"
	sysroot="$(rustc --print sysroot)"
	have="$(rustc --version | awk '{print $2}')"
	[[ "$have" == "$want" || "$have" == "$want".* ]] ||
		die "no registry serves $image, and the host's rustc is $have: no stand-in can be made (RUST_VERSION=${have%.*} builds with the host's)"
	# The Dockerfile cross-compiles for the other platform: the stand-in has both standard
	# libraries (the official image lets the build add its own with rustup).
	rustup target add x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu >/dev/null 2>&1 ||
		die "rustup cannot add the x86_64 and aarch64 standard libraries to the host's Rust"
	hash="$(printf '%s|%s|%s|%s|%s\n' "$bookworm_packages" "$have" "$(declare -f make_rust_stand_in)" \
		"$(sha256sum </etc/ssl/certs/ca-certificates.crt)" "$(ls "$sysroot/lib/rustlib")" | sha256sum | cut -c1-16)"
	stand_in_current "$image" "$hash" && return 0
	log "making the stand-in $image (Debian bookworm + the host's Rust $have)"
	dir="$cache/rust.tmp.$$"
	rm -rf "$dir"
	mkdir -p "$dir/rootfs"
	tar -C "$dir/rootfs" -xf "$(bookworm_rootfs)"
	# The official image: RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo, the
	# tools in /usr/local/cargo/bin. No docs: they are most of a toolchain's size.
	local toolchain="$dir/rootfs/usr/local/rustup/toolchains/$have-x86_64-unknown-linux-gnu"
	mkdir -p "$toolchain" "$dir/rootfs/usr/local/cargo/bin"
	cp -a "$sysroot/bin" "$sysroot/lib" "$toolchain/"
	[[ -d "$sysroot/libexec" ]] && cp -a "$sysroot/libexec" "$toolchain/"
	# The build reaches crates.io through this machine's network: it trusts what the
	# host trusts (which may include a local proxy's CA).
	cp /etc/ssl/certs/ca-certificates.crt "$dir/rootfs/etc/ssl/certs/ca-certificates.crt"
	local tool
	for tool in "$toolchain"/bin/*; do
		ln -s "../../rustup/toolchains/$have-x86_64-unknown-linux-gnu/bin/$(basename "$tool")" \
			"$dir/rootfs/usr/local/cargo/bin/$(basename "$tool")"
	done
	tar -C "$dir/rootfs" --numeric-owner -c . | dk import \
		--change "ENV RUSTUP_HOME=/usr/local/rustup" \
		--change "ENV CARGO_HOME=/usr/local/cargo" \
		--change "ENV RUST_VERSION=$have" \
		--change "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		--change "LABEL io.cds-secret-guard.stand-in=$hash" \
		- "$image" >/dev/null
	rm -rf "$dir"
}

# distroless_files ROOT BOOKWORM: what every distroless stand-in holds beside glibc and
# libgcc: the CA bundle of the bookworm rootfs unpacked at BOOKWORM, the users distroless
# has (nonroot is 65532), /tmp and the home directories.
distroless_files() {
	local root=$1 bookworm=$2
	mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/root" "$root/usr/local/bin"
	cp "$bookworm/etc/ssl/certs/ca-certificates.crt" "$root/etc/ssl/certs/"
	printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
		'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
	printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$root/etc/group"
	chmod 1777 "$root/tmp"
	chown 65532:65532 "$root/home/nonroot"
	chmod 700 "$root/root"
}

# gcr.io/distroless/cc-debian12:nonroot: glibc and libgcc from the bookworm rootfs, the
# CA bundle, the users distroless has; nothing else.
make_distroless_stand_in() {
	local image=$1 hash dir root
	hash="$(printf '%s|%s\n' "$bookworm_packages" "$(declare -f make_distroless_stand_in distroless_files)" | sha256sum | cut -c1-16)"
	stand_in_current "$image" "$hash" && return 0
	log "making the stand-in $image (glibc, libgcc and CA certificates from Debian bookworm)"
	dir="$cache/distroless.tmp.$$"
	rm -rf "$dir"
	mkdir -p "$dir/bookworm" "$dir/rootfs"
	tar -C "$dir/bookworm" -xf "$(bookworm_rootfs)"
	root="$dir/rootfs"
	# Debian's merged /usr: /lib, /lib64, /bin and /sbin are links into /usr.
	local pkg file link
	for link in bin sbin lib lib64; do
		mkdir -p "$root/usr/$link"
		cp -a "$dir/bookworm/$link" "$root/$link"
	done
	for pkg in libc6 libgcc-s1; do
		while read -r file; do
			if [[ -f "$dir/bookworm$file" || -L "$dir/bookworm$file" ]]; then
				mkdir -p "$root$(dirname "$file")"
				cp -a "$dir/bookworm$file" "$root$file"
			fi
		done <"$dir/bookworm/var/lib/dpkg/info/$pkg:amd64.list"
	done
	distroless_files "$root" "$dir/bookworm"
	tar -C "$root" --numeric-owner -c . | dk import \
		--change "USER 65532" \
		--change "WORKDIR /home/nonroot" \
		--change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		--change "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
		--change "LABEL io.cds-secret-guard.stand-in=$hash" \
		- "$image" >/dev/null
	rm -rf "$dir"
}

# The distroless stand-in for another architecture ARCH, as IMAGE: glibc and libgcc from
# ARCH's Debian packages (debootstrap --foreign downloads and unpacks them; nothing of
# ARCH runs), the CA bundle and the users as for the host's.
make_foreign_distroless_stand_in() {
	local image=$1 arch=$2 hash dir root deb
	hash="$(printf '%s|%s\n' "$arch" "$(declare -f make_foreign_distroless_stand_in distroless_files)" | sha256sum | cut -c1-16)"
	stand_in_current "$image" "$hash" && return 0
	log "making the stand-in $image (glibc, libgcc and CA certificates from Debian bookworm, $arch)"
	dir="$cache/distroless-$arch.tmp.$$"
	rm -rf "$dir"
	mkdir -p "$dir/debs" "$dir/rootfs" "$dir/bookworm"
	debootstrap --foreign --arch="$arch" --variant=minbase bookworm "$dir/debs" "$debian_mirror" \
		>"$cache/debootstrap-$arch.log" 2>&1 ||
		{ tail -n 20 "$cache/debootstrap-$arch.log" >&2; die "debootstrap --arch=$arch failed; see $cache/debootstrap-$arch.log"; }
	root="$dir/rootfs"
	for deb in "$dir"/debs/var/cache/apt/archives/{libc6,libgcc-s1}_*_"$arch".deb; do
		dpkg-deb -x "$deb" "$root"
	done
	tar -C "$dir/bookworm" -xf "$(bookworm_rootfs)" ./etc/ssl/certs/ca-certificates.crt
	distroless_files "$root" "$dir/bookworm"
	# `docker import` cannot say the architecture (without the engine's experimental
	# features): a build from scratch for the platform can, and runs nothing.
	mkdir -p "$dir/context"
	tar -C "$root" --numeric-owner -cf "$dir/context/rootfs.tar" .
	printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' 'USER 65532' 'WORKDIR /home/nonroot' \
		'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
		"LABEL io.cds-secret-guard.stand-in=$hash" >"$dir/context/Dockerfile"
	dk build --platform "linux/$arch" -q -t "$image" "$dir/context" >/dev/null
	[[ "$(dk image inspect -f '{{.Architecture}}' "$image")" == "$arch" ]] || die "the engine made $image for another architecture than $arch"
	rm -rf "$dir"
}

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
started=0
if docker_start; then started=1; fi
stop_engine() { if ((started)); then docker_stop; fi; }
trap stop_engine EXIT

for image in $(base_images); do
	# A real image under that name (pulled or loaded by someone) is used as it is.
	if dk image inspect "$image" >/dev/null 2>&1 && [[ -z "$(stand_in_label "$image")" ]]; then continue; fi
	if timeout 120 "$docker_cli" --host "${docker_host_engine:-unix://$docker_sock}" pull -q "$image" >/dev/null 2>"$cache/pull.log"; then
		log "pulled $image"
		continue
	fi
	log "no registry answers for $image ($(tail -n1 "$cache/pull.log")): making a local stand-in"
	case "$image" in
	*rust:*-bookworm) make_rust_stand_in "$image" ;;
	*distroless/cc-debian12:nonroot) make_distroless_stand_in "$image" ;;
	*) die "the Dockerfile needs $image, which is not here and cannot be pulled" ;;
	esac
done

# The commit --version names: the checkout's HEAD, or GIT_COMMIT for a tree without one.
commit="${GIT_COMMIT:-unknown}"
if [[ "$(git -C "$context" rev-parse --show-toplevel 2>/dev/null)" == "$context" ]]; then
	commit="$(git -C "$context" rev-parse --short=12 HEAD)"
fi
for platform in $platforms; do
	arch="${platform#linux/}"
	platform_tags=("${tags[@]}") platform_args=()
	if [[ "$arch" != "$host_arch" ]]; then
		platform_tags=(-t "$name:$version-linux-$arch")
		# A stand-in serves one platform: another architecture's is an image of its own.
		if [[ -n "$(stand_in_label "$RUNTIME_IMAGE")" ]]; then
			make_foreign_distroless_stand_in "$RUNTIME_IMAGE-$arch" "$arch"
			platform_args=(--build-arg "RUNTIME_IMAGE=$RUNTIME_IMAGE-$arch")
		fi
	fi
	log "building $name:$version for $platform (commit $commit) of $context${DOCKERFILE:+ with $dockerfile} from $(base_images | paste -sd' ')${platform_args[*]:+ (${platform_args[1]#*=} for the runtime)}"
	t=$(date +%s)
	# --network=host: the build's cargo reaches crates.io through the host's network.
	dk build --network=host --progress=plain ${NO_CACHE:+--no-cache} --platform "$platform" "${build_args[@]}" \
		"${platform_args[@]}" --build-arg "GIT_COMMIT=$commit" "${platform_tags[@]}" -f "$dockerfile" "$context" >"$cache/build.log" 2>&1 ||
		{ tail -n 40 "$cache/build.log" >&2; die "docker build failed; see $cache/build.log"; }
	log "built in $(($(date +%s) - t))s (log: $cache/build.log)"
	image="${platform_tags[1]}"
	size="$(dk image inspect -f '{{.Size}}' "$image")"
	log "$(printf '%s ' "${platform_tags[@]}" | sed 's/-t //g'): $((size / 1024 / 1024)) MiB ($size bytes), user $(dk image inspect -f '{{.Config.User}}' "$image"), $(dk image inspect -f '{{.Os}}/{{.Architecture}}' "$image")"
done
log "done in $(($(date +%s) - t0))s"
