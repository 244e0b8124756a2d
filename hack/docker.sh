#!/usr/bin/env bash
# A Docker engine for this repository's scripts. An engine already on the host is used as
# it is: DOCKER_HOST's, or the one on the default socket. Without one, Debian's docker.io
# is installed on first use and started with its own socket and a data root in the
# machine-wide cache (so base images and build layers outlive a clone), and stopped again
# by whoever started it.
#
#   hack/docker.sh ARGS...    start the engine if none runs, run `docker ARGS...`, stop
#                             the engine again if this call started it
#   hack/docker.sh start|stop|status
#
# Sourced (`. hack/docker.sh`), it defines docker_start, docker_stop and dk (the docker
# CLI on the engine) and does nothing else.
#
# The private engine runs without iptables or a bridge: builds and containers use the
# host's network (`--network=host`), and nothing is given a route off the machine. The
# builds need BuildKit (the Dockerfile's cache mounts): Debian's /usr/bin/docker is
# preferred to another CLI on the PATH, which may lack buildx and fall back to the
# classic builder.
#
# Env: DOCKER_HOST (an engine of your own), CDS_GUARD_CACHE (default
# ~/.cache/cds-secret-guard) holds the private engine's data root.

docker_cache="${CDS_GUARD_CACHE:-$HOME/.cache/cds-secret-guard}/docker"
docker_run_dir=/run/cds-secret-guard/docker
docker_sock="$docker_run_dir/docker.sock"
docker_cli=/usr/bin/docker
[[ -x "$docker_cli" ]] || docker_cli="$(command -v docker || echo /usr/bin/docker)"

docker_log() { echo "docker.sh: $*" >&2; }

# Installs Debian's engine (and the tools the image and node scripts use) if missing.
docker_install() {
	command -v dockerd >/dev/null 2>&1 && [[ -x "$docker_cli" ]] && return 0
	docker_log "installing docker.io from Debian's packages"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		docker.io debootstrap >/dev/null
	# Debian's CLI now exists: prefer it to the one found on the PATH before the install.
	if [[ -x /usr/bin/docker ]]; then docker_cli=/usr/bin/docker; fi
}

# The host's engine: DOCKER_HOST's, or the default socket's; empty when none answers.
docker_host_engine="${DOCKER_HOST:-}"
if [[ -z "$docker_host_engine" && -S /var/run/docker.sock ]] &&
	DOCKER_HOST=unix:///var/run/docker.sock "$docker_cli" version >/dev/null 2>&1; then
	docker_host_engine=unix:///var/run/docker.sock
fi

dk() { DOCKER_HOST="${docker_host_engine:-unix://$docker_sock}" DOCKER_BUILDKIT=1 "$docker_cli" "$@"; }

docker_running() { dk version >/dev/null 2>&1; }

# Starts the private engine unless an engine runs; returns 0 if this call started it, 1 if
# one was running (the host's or the private one).
docker_start() {
	if [[ -n "$docker_host_engine" ]]; then
		docker_running || { docker_log "ERROR: no engine answers at $docker_host_engine"; exit 1; }
		return 1
	fi
	docker_install
	if docker_running; then return 1; fi
	mkdir -p "$docker_cache" "$docker_run_dir"
	rm -f "$docker_sock"
	setsid dockerd --iptables=false --ip6tables=false --bridge=none \
		--data-root "$docker_cache/data" --exec-root "$docker_run_dir/exec" \
		--host "unix://$docker_sock" --pidfile "$docker_run_dir/dockerd.pid" \
		>>"$docker_cache/dockerd.log" 2>&1 </dev/null &
	local i
	for i in $(seq 100); do
		if docker_running; then return 0; fi
		sleep 0.2
	done
	tail -n 20 "$docker_cache/dockerd.log" >&2
	docker_log "ERROR: the engine did not start; see $docker_cache/dockerd.log"
	exit 1
}

# Stops the engine and waits until it and its containerd are gone.
docker_stop() {
	local pid i
	[[ -f "$docker_run_dir/dockerd.pid" ]] || return 0
	pid="$(<"$docker_run_dir/dockerd.pid")"
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 150); do
		[[ -e "/proc/$pid" ]] && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$docker_run_dir/dockerd.pid" "$docker_sock"
}

# Not sourced: a command.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	set -euo pipefail
	case "${1:-}" in
	start) docker_start || docker_log "already running" ;;
	stop) docker_stop ;;
	status) if docker_running; then echo "running: ${docker_host_engine:-unix://$docker_sock}"; else echo "not running"; exit 1; fi ;;
	"") echo "usage: $0 start|stop|status|DOCKER_ARGS..." >&2; exit 2 ;;
	*)
		started=0
		if docker_start; then started=1; fi
		rc=0
		dk "$@" || rc=$?
		if ((started)); then docker_stop; fi
		exit "$rc"
		;;
	esac
fi
