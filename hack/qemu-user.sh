#!/usr/bin/env bash
# Prints the path of qemu-aarch64, Debian's qemu-user, after installing the package when the
# machine lacks it: the shipped suite runs the released linux/arm64 binary with it, from the
# files of its own image (`qemu-aarch64 -L <image root> <binary>`).
set -euo pipefail
if ! command -v qemu-aarch64 >/dev/null; then
	echo "qemu-user.sh: installing qemu-user from Debian's packages" >&2
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
fi
command -v qemu-aarch64
