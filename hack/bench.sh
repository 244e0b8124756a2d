#!/usr/bin/env bash
# `make bench`: every benchmark of the guard, one after the other, then one report.
#
#   1. in-process (criterion): policy::decide and whole /validate and /mutate reviews
#      through the router, with allocations per request   (benches/admission.rs)
#   2. the guard against its ceiling over TLS, HTTP/1.1 and HTTP/2, alternating
#                                                          (examples/bench_tls.rs, ceiling.rs)
#   3. a worker's start on the node (`cluster.sh up --node`), with the chart's guard and
#      without it, alternating                             (examples/bench_node.rs)
#   4. the apiserver path, memory and the reconciler's load on a local control plane of
#      its own, on other ports than the usual one         (examples/bench_apiserver.rs)
#   5. in-use protection: a delete with the guard and without, 10 and 10,000 pods, and
#      helm uninstall, on that control plane too          (examples/bench_in_use.rs)
#
# The load generator is oha from crates.io, installed once into
# ~/.cache/cds-secret-guard/tools. The report (Markdown) is printed at the end and kept
# in target/bench/report.md.
#
# Env:
#   BENCH_PARTS              which parts to run (default "inprocess tls node apiserver in-use")
#   BENCH_TLS_ARGS           e.g. "--rounds 5 --duration 5s --connections 16"
#   BENCH_NODE_ARGS          e.g. "--rounds 3 --workers 40 --every-ms 250"
#   BENCH_APISERVER_ARGS     e.g. "--rounds 3 --duration 5s --pods 10000 --spawn-rate 50";
#                            "--paths orphan,orphan-churn --no-reconciler": the allow paths only
#   BENCH_IN_USE_ARGS        e.g. "--rounds 3 --deletes 100 --pods 10000 --no-uninstall"
#   CDS_CP_APISERVER_PORT (9443), CDS_CP_ETCD_CLIENT_PORT (4379), CDS_CP_ETCD_PEER_PORT (4380):
#                            the benchmark's control plane; it is stopped at the end
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tools="$HOME/.cache/cds-secret-guard/tools"
cluster="$repo/hack/controlplane/cluster.sh"
parts="${BENCH_PARTS:-inprocess tls node apiserver in-use}"
report="$repo/target/bench/report.md"
export CDS_BENCH_REPORT="$report"
export OHA="$tools/bin/oha"
started=$SECONDS

log() { echo "bench.sh: $*" >&2; }

# Where the apiserver's CPU went during the first guarded run of each delete path: the
# share of its samples under a few functions, from Go's pprof (`go tool pprof -top -cum`).
apiserver_profiles() { # apiserver_profiles DIR
	local dir=$1 file
	compgen -G "$dir/*.pprof" >/dev/null || return 0
	echo
	echo "## Apiserver CPU profiles, first guarded run of each path (share of the apiserver's samples)"
	echo
	echo "| profile | CPU s in 5 s | watch cache LIST (\`Cacher.GetList\`) | label matching in it | etcd GET (\`etcd3 store.Get\`) | calling webhooks (\`Webhook.Dispatch\`) | garbage collection (\`gcBgMarkWorker\`) |"
	echo "|---|---|---|---|---|---|---|"
	for file in "$dir"/*.pprof; do
		go tool pprof -top -cum -nodefraction=0 -nodecount=100000 "$file" 2>/dev/null | awk -v name="$(basename "$file" .pprof)" '
			/^Duration:/ { sub(/.*Total samples = /, ""); total = $1 }
			function share(pattern) { return (pattern in seen) ? seen[pattern] : "0%" }
			$6 ~ /cacher\.\(\*Cacher\)\.GetList$/ { seen["list"] = $5 }
			$6 ~ /labels\.\(\*Requirement\)\.Matches$/ { seen["labels"] = $5 }
			$6 ~ /etcd3\.\(\*store\)\.Get$/ { seen["get"] = $5 }
			$6 ~ /generic\.\(\*Webhook\)\.Dispatch$/ { seen["webhook"] = $5 }
			$6 ~ /runtime\.gcBgMarkWorker$/ { seen["gc"] = $5 }
			END { printf "| %s | %s | %s | %s | %s | %s | %s |\n", name, total, share("list"), share("labels"), share("get"), share("webhook"), share("gc") }'
	done
	echo
	echo "Read one whole: \`go tool pprof -top FILE\` (files in $dir)."
}
wants() { [[ " $parts " == *" $1 "* ]]; }

# A fresh control plane on the benchmark's ports, stopped at exit: leftovers of an earlier
# run would be measured too.
own_control_plane() {
	export CDS_CP_APISERVER_PORT="${CDS_CP_APISERVER_PORT:-9443}"
	export CDS_CP_ETCD_CLIENT_PORT="${CDS_CP_ETCD_CLIENT_PORT:-4379}"
	export CDS_CP_ETCD_PEER_PORT="${CDS_CP_ETCD_PEER_PORT:-4380}"
	"$cluster" down
	trap '"$cluster" down' EXIT
	"$cluster" up
}

# ---- tools ----
if [[ ! -x "$OHA" ]]; then
	log "installing oha (crates.io) into $tools"
	cargo install oha --locked --root "$tools"
fi
command -v curl >/dev/null || { log "curl is needed"; exit 1; }

# ---- build ----
log "building (release)"
# The bench profile (release settings, as `cargo bench` builds): one build serves all parts.
cargo build --profile bench --locked --bins --benches --example ceiling --example bench_tls --example bench_node --example bench_apiserver --example bench_in_use

mkdir -p "$(dirname "$report")"
{
	echo "# cds-secret-guard benchmarks"
	echo
	echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
	echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(free -g | awk '/^Mem:/ {print $2}') GiB"
	echo "- kernel $(uname -r); $(rustc --version); $("$OHA" --version)"
	echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews absolute figures; ratios are measured side by side)"
} >"$report"

# ---- 1. in-process ----
if wants inprocess; then
	log "1/5 in-process benchmarks (criterion)"
	cargo bench --locked --bench admission
fi

# ---- 2. guard vs ceiling over TLS ----
if wants tls; then
	log "2/5 guard vs ceiling over TLS"
	# shellcheck disable=SC2086
	target/release/examples/bench_tls ${BENCH_TLS_ARGS:-}
fi

# ---- 3. a worker's start on the node ----
if wants node; then
	log "3/5 a worker's start on the node, with the chart's guard and without"
	"$cluster" up --node
	hack/tools/build.sh # helm
	# shellcheck disable=SC2086
	target/release/examples/bench_node ${BENCH_NODE_ARGS:-}
fi

# ---- 4. the apiserver path ----
if wants apiserver; then
	log "4/5 the apiserver path, on a control plane of its own"
	own_control_plane
	profiles="$repo/target/bench/apiserver-pprof"
	rm -rf "$profiles"
	# shellcheck disable=SC2086
	target/release/examples/bench_apiserver --apiserver-profiles "$profiles" ${BENCH_APISERVER_ARGS:-}
	apiserver_profiles "$profiles" >>"$report"
fi

# ---- 5. in-use protection ----
if wants in-use; then
	log "5/5 in-use protection, on a control plane of its own"
	own_control_plane
	hack/tools/build.sh # helm
	# shellcheck disable=SC2086
	target/release/examples/bench_in_use ${BENCH_IN_USE_ARGS:-}
fi

echo "- took $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s" >>"$report"
echo
echo "================================================================================"
cat "$report"
