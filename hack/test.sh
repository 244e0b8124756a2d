#!/usr/bin/env bash
# `make test`: the control plane without the node, the tools the suites run, every suite of
# `cargo test --all-targets`, then the node and the shipped suite.
#
# The shipped suite, last, is the only one that needs the images (linux/amd64 for the node,
# linux/arm64 for the release) and the release's tools (cosign, cargo-cyclonedx). They are
# built in the background from the start, at nice 19 (the Docker engine too, when this
# script starts it), so that they take the CPU the steps before leave idle rather than
# lengthen those steps or slow a suite that waits on a deadline. Nothing depends on that
# head start: the shipped suite runs `make image` and `make release` itself, whose builds
# are cached and locked; they wait for a build under way and then find it done. A
# background build that failed is run again there, where its error shows; its own log is
# target/test-background.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p target
background_log=target/test-background.log

# One engine for the whole run, started here unless one runs (the host's, or another
# run's): the background's builds and the suite's commands all use it.
engine_started=0
if ! hack/docker.sh status >/dev/null 2>&1; then
	nice -n 19 hack/docker.sh start
	engine_started=1
fi
background=""
finish() {
	if [[ -n "$background" ]] && kill -0 "$background" 2>/dev/null; then
		kill -- -"$background" 2>/dev/null || true
		wait "$background" 2>/dev/null || true
	fi
	if ((engine_started)); then hack/docker.sh stop; fi
}
trap finish EXIT

# Its own process group (set -m), so that `finish` stops the builds with it.
set -m
nice -n 19 bash -c 'set -e
	hack/image.sh
	hack/tools/build.sh release
	PLATFORMS=linux/arm64 hack/image.sh' >"$background_log" 2>&1 &
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
