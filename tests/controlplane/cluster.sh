#!/usr/bin/env bash
# A real, local Kubernetes control plane for tests: etcd, kube-apiserver and
# kube-controller-manager (garbage collector + namespace controller), built
# from source by build.sh, listening on 127.0.0.1 only. No kubelet, no
# scheduler: pods stay Pending, which is all an admission webhook needs.
#
#   cluster.sh up        build (cached) and start; idempotent
#   cluster.sh down      stop what `up` started, remove etcd data
#   cluster.sh env       eval "$(tests/controlplane/cluster.sh env)"
#   cluster.sh status    what runs
#   cluster.sh selftest  pods, secrets, GC and namespace deletion work
#
# Everything lives under <repo>/target/controlplane/: bin/, pki/, logs/, run/
# (pid files, ports), etcd/ (data), kubeconfig (admin, system:masters).
#
# Env (read by `up` only; later commands use the recorded values):
#   CDS_CP_APISERVER_PORT (6443), CDS_CP_ETCD_CLIENT_PORT (2379),
#   CDS_CP_ETCD_PEER_PORT (2380), CDS_CP_TIMEOUT (seconds to wait, 120).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cp_dir="$repo/target/controlplane"
bin="$cp_dir/bin"
pki="$cp_dir/pki"
logs="$cp_dir/logs"
run="$cp_dir/run"
etcd_data="$cp_dir/etcd"
kubeconfig="$cp_dir/kubeconfig"
kcm_kubeconfig="$cp_dir/controller-manager.kubeconfig"
timeout="${CDS_CP_TIMEOUT:-120}"
# Start order; `down` goes in reverse.
components=(etcd kube-apiserver kube-controller-manager)

log() { echo "cluster.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# ---- ports: chosen by `up`, recorded so the other commands agree with it ----
load_ports() {
	if [[ -f "$run/ports.env" ]]; then
		# shellcheck source=/dev/null
		source "$run/ports.env"
	else
		apiserver_port="${CDS_CP_APISERVER_PORT:-6443}"
		etcd_client_port="${CDS_CP_ETCD_CLIENT_PORT:-2379}"
		etcd_peer_port="${CDS_CP_ETCD_PEER_PORT:-2380}"
	fi
}

# ---- processes: tracked by pid file, identified by their command line ----
pid_of() { # prints the recorded pid if that process is alive and really ours
	local name=$1 pid
	[[ -f "$run/$name.pid" ]] || return 1
	pid="$(<"$run/$name.pid")"
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	# A recycled pid would run something else: compare argv[0] with our binary.
	[[ -r "/proc/$pid/cmdline" ]] || return 1
	[[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n1)" == "$bin/$name" ]] || return 1
	echo "$pid"
}

start() { # start NAME ARGS...: detached from this shell, logs to logs/NAME.log
	local name=$1
	shift
	rm -f "$run/$name.pid"
	echo "=== cluster.sh: starting $name at $(date -Is) ===" >>"$logs/$name.log"
	# setsid: the process must outlive the shell (and process group) that ran
	# `up`. The wrapper writes its own pid, then execs into the binary, so the
	# pid file holds the server's pid.
	# 8>&-: the server must not inherit (and so hold forever) the up/down lock.
	setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$run/$name.pid" "$bin/$name" "$@" \
		>>"$logs/$name.log" 2>&1 </dev/null 8>&- &
	local i
	for i in $(seq 50); do
		[[ -s "$run/$name.pid" ]] && break
		sleep 0.1
	done
	log "started $name (pid $(<"$run/$name.pid"), log $logs/$name.log)"
}

stop() { # SIGTERM, then SIGKILL after 15 s; only a process that is ours
	local name=$1 pid i
	if pid="$(pid_of "$name")"; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 150); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "$name (pid $pid) ignored SIGTERM for 15s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.5
		fi
		log "stopped $name (pid $pid)"
	elif [[ -f "$run/$name.pid" ]]; then
		log "$name: stale pid file (pid $(<"$run/$name.pid") is gone or not ours), removed"
	fi
	rm -f "$run/$name.pid"
}

lock() {
	exec 8>"$run/cluster.lock"
	flock -w "$timeout" 8 || die "another cluster.sh up/down holds $run/cluster.lock"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
check_port() { # check_port PORT ENV_VAR
	if port_busy "$1"; then die "port $1 is in use by another process; set $2 to another port"; fi
}

# wait_for NAME WHAT COMMAND...: until COMMAND succeeds; fails early if the
# process died, and points at its log.
wait_for() {
	local name=$1 what=$2
	shift 2
	local deadline=$((SECONDS + timeout))
	until "$@" >/dev/null 2>&1; do
		if ! pid_of "$name" >/dev/null; then
			tail -n 30 "$logs/$name.log" >&2 || true
			die "$name exited before $what; see $logs/$name.log"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 30 "$logs/$name.log" >&2 || true
			die "$name: no $what after ${timeout}s; see $logs/$name.log"
		fi
		sleep 0.5
	done
}

etcd_healthy() { curl -fsS "http://127.0.0.1:$etcd_client_port/health" | grep -q '"health":"true"'; }
apiserver_ready() {
	# As admin: anonymous /readyz is only allowed once RBAC is bootstrapped.
	curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
		"https://127.0.0.1:$apiserver_port/readyz" | grep -qx ok
}

# ---- certificates: one CA for serving and client certs, made once ----
gen_pki() {
	[[ -f "$pki/done" ]] && return 0
	log "creating certificates in $pki"
	rm -rf "$pki"
	mkdir -p "$pki"
	(
		cd "$pki"
		ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
		openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 3650 \
			-subj "/CN=cds-secret-guard-test-ca" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
		# sign NAME SUBJECT EXTENSIONS: key + CSR, then a CA-signed cert
		sign() {
			openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
			openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
				-days 3650 -out "$1.crt" -extfile <(printf '%s\n' "$3") 2>/dev/null
			rm -f "$1.csr"
		}
		# 10.0.0.1 and kubernetes.default*: the in-cluster names of the apiserver.
		sign apiserver "/CN=kube-apiserver" "$(printf '%s\n' \
			"keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
			"subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")"
		client_ext="$(printf '%s\n' "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth")"
		sign admin "/O=system:masters/CN=admin" "$client_ext"
		# The controller-manager's own client: it creates the controllers'
		# service accounts and requests their tokens.
		sign controller-manager "/O=system:masters/CN=system:kube-controller-manager" "$client_ext"
		# Service-account token signing key pair.
		openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
		openssl pkey -in sa.key -pubout -out sa.pub
		chmod 600 ./*.key
		touch done
	)
}

write_kubeconfig() ( # write_kubeconfig FILE CERT_NAME USER (subshell: umask)
	b64="base64 -w0"
	umask 077
	cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cds-guard-test
  cluster:
    server: https://127.0.0.1:$apiserver_port
    certificate-authority-data: $($b64 <"$pki/ca.crt")
users:
- name: $3
  user:
    client-certificate-data: $($b64 <"$pki/$2.crt")
    client-key-data: $($b64 <"$pki/$2.key")
contexts:
- name: cds-guard-test
  context:
    cluster: cds-guard-test
    user: $3
current-context: cds-guard-test
EOF
	mv "$1.tmp" "$1"
)

# ---- commands ----
cmd_up() {
	"$here/build.sh"
	mkdir -p "$logs" "$run"
	# Serialize up/down: two at once would start everything twice.
	lock

	local name running=0
	for name in "${components[@]}"; do
		if pid_of "$name" >/dev/null; then running=$((running + 1)); fi
	done
	if ((running == 0)); then
		rm -f "$run"/*.pid "$run/ports.env" # stale from a crash or reboot
		load_ports
		# Check every port before starting anything, so a clash leaves nothing behind.
		check_port "$etcd_client_port" CDS_CP_ETCD_CLIENT_PORT
		check_port "$etcd_peer_port" CDS_CP_ETCD_PEER_PORT
		check_port "$apiserver_port" CDS_CP_APISERVER_PORT
		printf 'apiserver_port=%s\netcd_client_port=%s\netcd_peer_port=%s\n' \
			"$apiserver_port" "$etcd_client_port" "$etcd_peer_port" >"$run/ports.env"
	else
		load_ports # keep the ports of what already runs
	fi
	gen_pki

	if pid_of etcd >/dev/null; then
		log "etcd already running (pid $(pid_of etcd))"
	else
		stop etcd # cleans a stale pid file
		check_port "$etcd_client_port" CDS_CP_ETCD_CLIENT_PORT
		check_port "$etcd_peer_port" CDS_CP_ETCD_PEER_PORT
		local client="http://127.0.0.1:$etcd_client_port" peer="http://127.0.0.1:$etcd_peer_port"
		# --unsafe-no-fsync: test data, speed matters more than durability.
		start etcd --name=cds-guard --data-dir="$etcd_data" \
			--listen-client-urls="$client" --advertise-client-urls="$client" \
			--listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" \
			--initial-cluster="cds-guard=$peer" --initial-cluster-state=new \
			--unsafe-no-fsync --log-level=warn
	fi
	wait_for etcd "health" etcd_healthy

	if pid_of kube-apiserver >/dev/null; then
		log "kube-apiserver already running (pid $(pid_of kube-apiserver))"
	else
		stop kube-apiserver
		check_port "$apiserver_port" CDS_CP_APISERVER_PORT
		# ServiceAccount admission is off: no service-account controllers run,
		# so a new namespace has no `default` SA and pods would be rejected.
		# No endpoint reconciler: it would log every 10 s that the loopback
		# advertise address is invalid for the `kubernetes` Endpoints (no
		# kube-proxy here to use them anyway).
		start kube-apiserver \
			--etcd-servers="http://127.0.0.1:$etcd_client_port" \
			--bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
			--secure-port="$apiserver_port" --cert-dir="$cp_dir/apiserver-certs" \
			--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
			--client-ca-file="$pki/ca.crt" \
			--authorization-mode=Node,RBAC \
			--service-account-issuer=https://kubernetes.default.svc.cluster.local \
			--service-account-key-file="$pki/sa.pub" \
			--service-account-signing-key-file="$pki/sa.key" \
			--service-cluster-ip-range=10.0.0.0/24 \
			--allow-privileged=true \
			--disable-admission-plugins=ServiceAccount \
			--endpoint-reconciler-type=none
	fi
	wait_for kube-apiserver "/readyz ok" apiserver_ready
	write_kubeconfig "$kubeconfig" admin admin

	if pid_of kube-controller-manager >/dev/null; then
		log "kube-controller-manager already running (pid $(pid_of kube-controller-manager))"
	else
		stop kube-controller-manager
		write_kubeconfig "$kcm_kubeconfig" controller-manager system:kube-controller-manager
		# --secure-port=0: no health endpoint needed, and no port to collide.
		# Controllers: GC (ownerReferences), namespace deletion, and ClusterRole
		# aggregation so the built-in admin/edit/view roles get their rules.
		# Each controller acts as its own service account, as in a kubeadm
		# cluster: the namespace controller is
		# system:serviceaccount:kube-system:namespace-controller (the guard's
		# default exempt user), the garbage collector generic-garbage-collector.
		start kube-controller-manager --kubeconfig="$kcm_kubeconfig" \
			--controllers=garbage-collector-controller,namespace-controller,clusterrole-aggregation-controller \
			--leader-elect=false --secure-port=0 \
			--use-service-account-credentials=true
		sleep 1
		pid_of kube-controller-manager >/dev/null ||
			{ tail -n 30 "$logs/kube-controller-manager.log" >&2; die "kube-controller-manager exited; see $logs/kube-controller-manager.log"; }
	fi
	if ((running == ${#components[@]})); then
		log "already up and healthy"
	fi
	log "ready: https://127.0.0.1:$apiserver_port, KUBECONFIG=$kubeconfig"
	# Measured: built-in types are collected at once, even right after start;
	# dependents of a CRD's kind only after the GC's next discovery (<= 30 s).
	log "note: the GC finds a new CRD's kind within 30s (built-in kinds at once)"
}

cmd_down() {
	mkdir -p "$run"
	lock
	local i
	for ((i = ${#components[@]} - 1; i >= 0; i--)); do stop "${components[i]}"; done
	rm -rf "$etcd_data" "$cp_dir/apiserver-certs" "$run/ports.env" "$kubeconfig" "$kcm_kubeconfig"
	log "down"
}

cmd_env() {
	printf 'export KUBECONFIG=%q\n' "$kubeconfig"
	printf 'export PATH=%q:"$PATH"\n' "$bin"
}

cmd_status() {
	load_ports
	local name pid up=0
	for name in "${components[@]}"; do
		if pid="$(pid_of "$name")"; then
			echo "$name: running (pid $pid)"
			up=$((up + 1))
		elif [[ -f "$run/$name.pid" ]]; then
			echo "$name: not running (stale pid file)"
		else
			echo "$name: not running"
		fi
	done
	if ((up > 0)); then
		echo "etcd: http://127.0.0.1:$etcd_client_port (peer $etcd_peer_port)"
		if apiserver_ready 2>/dev/null; then
			echo "kube-apiserver: https://127.0.0.1:$apiserver_port ready"
		else
			echo "kube-apiserver: https://127.0.0.1:$apiserver_port NOT ready"
		fi
		echo "KUBECONFIG=$kubeconfig"
	fi
	((up == ${#components[@]}))
}

# End-to-end check of what the tests rely on; leaves nothing behind.
cmd_selftest() {
	export KUBECONFIG="$kubeconfig" PATH="$bin:$PATH"
	local ns="cp-selftest-$$" t
	kubectl version
	kubectl create namespace "$ns"
	kubectl -n "$ns" run pause --image=registry.k8s.io/pause:3.10 --restart=Never
	kubectl -n "$ns" get pod pause -o jsonpath='{.status.phase}{"\n"}'
	kubectl -n "$ns" create secret generic s1 --from-literal=k=v
	kubectl -n "$ns" get secret s1 -o jsonpath='{.data.k}{"\n"}' | base64 -d
	echo
	# GC: a ConfigMap owned by the pod goes away when the pod does.
	local uid
	uid="$(kubectl -n "$ns" get pod pause -o jsonpath='{.metadata.uid}')"
	kubectl -n "$ns" apply -f - <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: owned
  ownerReferences:
  - {apiVersion: v1, kind: Pod, name: pause, uid: "$uid"}
data: {k: v}
EOF
	kubectl -n "$ns" delete pod pause --wait=true
	t=$SECONDS
	until ! kubectl -n "$ns" get configmap owned >/dev/null 2>&1; do
		((SECONDS - t < timeout)) || die "GC did not delete the owned ConfigMap in ${timeout}s; see $logs/kube-controller-manager.log"
		sleep 1
	done
	echo "GC deleted the owned ConfigMap $((SECONDS - t))s after its owner"
	t=$SECONDS
	kubectl delete namespace "$ns" --timeout="${timeout}s"
	echo "namespace $ns deleted in $((SECONDS - t))s"
	echo "selftest: ok"
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
env) cmd_env ;;
status) cmd_status ;;
selftest) cmd_selftest ;;
*)
	echo "usage: $0 up|down|env|status|selftest" >&2
	exit 2
	;;
esac
