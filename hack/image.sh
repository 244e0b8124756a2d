#!/usr/bin/env bash
# `make image`: builds the repository's Dockerfile with a real engine (hack/docker.sh) and
# tags it cds-secret-guard:<version> (Cargo.toml's) and cds-secret-guard:dev.
#
# The Dockerfile is the one users build, unchanged: its FROM lines name public images.
# No registry is reachable from this machine, so before the build this script makes local
# stand-ins under those exact names when they are missing (the engine then never pulls):
#   rust:<X.Y>-bookworm                     Debian bookworm (debootstrap, minbase) with gcc
#                                           and make, the host's CA bundle (cargo reaches
#                                           crates.io through the host's network), and the
#                                           host's Rust toolchain, which must be X.Y, laid
#                                           out as the official image has it (/usr/local/cargo)
#   gcr.io/distroless/cc-debian12:nonroot   what distroless/cc holds: glibc, libgcc, the CA
#                                           bundle, passwd with nonroot (65532); no shell
# Each stand-in is labelled io.cds-secret-guard.stand-in=<hash of its recipe> and rebuilt
# when the recipe changes. The Dockerfile's own steps then run as they do anywhere.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/docker.sh
. "$repo/hack/docker.sh"
cache="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}/image"
name=cds-secret-guard
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n1)"
t0=$(date +%s)

log() { echo "image.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# The FROM images of the Dockerfile, in order.
from_images() { sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$repo/Dockerfile"; }

# A Debian bookworm minbase rootfs with what both stand-ins take from it, as a tarball
# in the cache (debootstrap takes about a minute; it is made once).
bookworm_packages=ca-certificates,gcc,libc6-dev,make
bookworm_rootfs() {
	local tarball="$cache/bookworm-${bookworm_packages//,/-}.tar"
	if [[ ! -s "$tarball" ]]; then
		command -v debootstrap >/dev/null || docker_install
		log "debootstrap bookworm (minbase + $bookworm_packages)"
		local dir="$cache/bookworm.tmp.$$"
		rm -rf "$dir"
		mkdir -p "$dir"
		debootstrap --variant=minbase --include="$bookworm_packages" bookworm "$dir" \
			http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
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
	want="${image#rust:}"
	want="${want%-bookworm}"
	sysroot="$(rustc --print sysroot)"
	have="$(rustc --version | awk '{print $2}')"
	[[ "$have" == "$want" || "$have" == "$want".* ]] ||
		die "the Dockerfile builds with $image, but the host's rustc is $have: no stand-in can be made"
	hash="$(printf '%s|%s|%s|%s\n' "$bookworm_packages" "$have" "$(declare -f make_rust_stand_in)" \
		"$(sha256sum </etc/ssl/certs/ca-certificates.crt)" | sha256sum | cut -c1-16)"
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

# gcr.io/distroless/cc-debian12:nonroot: glibc and libgcc from the bookworm rootfs, the
# CA bundle, the users distroless has; nothing else.
make_distroless_stand_in() {
	local image=$1 hash dir root
	hash="$(printf '%s|%s\n' "$bookworm_packages" "$(declare -f make_distroless_stand_in)" | sha256sum | cut -c1-16)"
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
	mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/root"
	cp "$dir/bookworm/etc/ssl/certs/ca-certificates.crt" "$root/etc/ssl/certs/"
	printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
		'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
	printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$root/etc/group"
	chmod 1777 "$root/tmp"
	chown 65532:65532 "$root/home/nonroot"
	chmod 700 "$root/root"
	tar -C "$root" --numeric-owner -c . | dk import \
		--change "USER 65532" \
		--change "WORKDIR /home/nonroot" \
		--change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		--change "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
		--change "LABEL io.cds-secret-guard.stand-in=$hash" \
		- "$image" >/dev/null
	rm -rf "$dir"
}

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
started=0
if docker_start; then started=1; fi
stop_engine() { if ((started)); then docker_stop; fi; }
trap stop_engine EXIT

for image in $(from_images); do
	# A real image under that name (pulled or loaded by someone) is used as it is.
	if dk image inspect "$image" >/dev/null 2>&1 && [[ -z "$(stand_in_label "$image")" ]]; then continue; fi
	case "$image" in
	rust:*-bookworm) make_rust_stand_in "$image" ;;
	gcr.io/distroless/cc-debian12:nonroot) make_distroless_stand_in "$image" ;;
	*) die "the Dockerfile needs $image, which is not here and cannot be pulled" ;;
	esac
done

log "building $name:$version"
t=$(date +%s)
# --network=host: the build's cargo reaches crates.io through the host's network.
dk build --network=host --progress=plain -t "$name:$version" -t "$name:dev" "$repo" >"$cache/build.log" 2>&1 ||
	{ tail -n 40 "$cache/build.log" >&2; die "docker build failed; see $cache/build.log"; }
log "built in $(($(date +%s) - t))s (log: $cache/build.log)"
size="$(dk image inspect -f '{{.Size}}' "$name:$version")"
log "$name:$version and $name:dev: $((size / 1024 / 1024)) MiB ($size bytes), user $(dk image inspect -f '{{.Config.User}}' "$name:$version")"
log "done in $(($(date +%s) - t0))s"
