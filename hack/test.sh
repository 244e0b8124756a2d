#!/usr/bin/env bash
# `make test`: the control plane without the node, the tools the suites run, every suite of
# `cargo test --all-targets`, then the node and the shipped suite.
#
# The shipped suite, last, is the only one that needs the images (linux/amd64 for the
# node, linux/arm64 for the release, the previous release's to upgrade from) and the
# release's tools (cosign, cargo-cyclonedx). They are built in the background from the
# start, at the lowest priority, so that they take the CPU the steps before leave idle
# rather than lengthen those steps or slow a suite that waits on a deadline: the tools at
# nice 19, the images' steps in the engine's cgroup made idle (below). Nothing depends on
# that head start: the shipped suite runs `make image` and `make release` itself, whose
# builds are cached and locked; they wait for a build under way and then find it done. A
# background build that failed is run again there, where its error shows; its own log is
# target/test-background.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p target
background_log=target/test-background.log

# One engine for the whole run, started here unless one runs (the host's, or another
# run's): the background's builds and the suite's commands all use it.
# shellcheck source=hack/docker.sh
. hack/docker.sh
engine_started=0
if docker_start; then engine_started=1; fi
# The engine runs each build step in a container of its own under the cgroup /docker (its
# default cgroupfs driver), where nice does not reach: the kernel weighs that cgroup
# against this session as a peer. Marked idle (cpu.idle, Linux 5.15) for the run, it gets
# only the CPU nothing else wants. Only for an engine this script started; elsewhere the
# builds take their fair share.
engine_cgroup=""
if ((engine_started)); then
	dir=/sys/fs/cgroup/docker # cgroup v2
	if [[ -d /sys/fs/cgroup/cpu ]]; then dir=/sys/fs/cgroup/cpu/docker; fi # v1
	if mkdir -p "$dir" 2>/dev/null && echo 1 >"$dir/cpu.idle" 2>/dev/null; then engine_cgroup="$dir"; fi
	[[ -n "$engine_cgroup" ]] || echo "test.sh: no cgroup to make the engine's builds idle in: they take their share of the CPU"
fi
background=""
finish() {
	if [[ -n "$background" ]] && kill -0 "$background" 2>/dev/null; then
		kill -- -"$background" 2>/dev/null || true
		wait "$background" 2>/dev/null || true
	fi
	if ((engine_started)); then docker_stop; fi
	if [[ -n "$engine_cgroup" ]]; then echo 0 >"$engine_cgroup/cpu.idle" 2>/dev/null || true; fi
}
trap finish EXIT

# What the shipped suite builds, in the order it needs them: the node's image, the
# release's tools, the image for arm64, and the image of the release before this one
# (tests/node/shipped/release.rs names its commit), which the suite upgrades from. That
# one is built from the commit's files with this checkout's Dockerfile, as the suite builds
# it (its crates are the node image's, already compiled), under the name its worktree's
# build gives it. image.sh builds one image at a time: the suite's release, which finds its
# own images cached, may wait behind the last build.
background_builds() {
	hack/image.sh
	hack/tools/build.sh release
	PLATFORMS=linux/arm64 hack/image.sh
	local previous tree=target/test-background/previous-release
	previous="$(sed -n 's/^pub const PREVIOUS_RELEASE: &str = "\([0-9a-f]*\)";$/\1/p' tests/node/shipped/release.rs)"
	[[ -n "$previous" ]] || return 0
	rm -rf "$tree" && mkdir -p "$tree"
	# With the modes a checkout gives them (umask 022): the build's cache compares them.
	git -c tar.umask=0022 archive "$previous" | tar -x -C "$tree"
	DOCKERFILE=Dockerfile GIT_COMMIT="$(git rev-parse --short=12 "$previous")" hack/image.sh "$tree"
	rm -rf "$tree"
}
# Its own process group (set -m), so that `finish` stops the builds with it.
set -m
(
	renice -n 19 "$BASHPID" >/dev/null
	background_builds
) >"$background_log" 2>&1 &
background=$!
set +m
echo "test.sh: the images and the release's tools build in the background (pid $background, log $background_log)"

hack/controlplane/cluster.sh up --no-node
hack/tools/build.sh test
cargo test --locked --all-targets
hack/controlplane/cluster.sh up --node
cargo test --locked --test shipped -- --nocapture

if wait "$background"; then
	echo "test.sh: the background builds had finished"
else
	echo "test.sh: a background build failed, and was built again by the shipped suite; see $background_log"
fi
background=""
