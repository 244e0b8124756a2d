#!/usr/bin/env bash
# A real, local Kubernetes control plane for tests: etcd, kube-apiserver and
# kube-controller-manager (garbage collector + namespace controller), built
# from source by build.sh, listening on 127.0.0.1 only. No kubelet, no
# scheduler: pods stay Pending, which is all an admission webhook needs. With
# --node, a real node too (node.sh): containerd, kubelet, kube-scheduler and
# kube-proxy on the host, so pods run.
#
#   cluster.sh up [--ha|--node|--no-node]   build (cached) and start; idempotent
#                          (a node that runs is kept). --node on a running control
#                          plane adds the node, --no-node removes it (each restarts the
#                          apiserver and the controller-manager with or without the
#                          node's flags)
#   cluster.sh down        stop what `up` started (any mode), remove etcd data; fails
#                          if the node left a process, mount, namespace or bridge
#   cluster.sh image-load NAME:TAG
#                          an image of the local Docker engine (hack/docker.sh) onto
#                          the node (containerd's k8s.io namespace)
#   cluster.sh env         eval "$(hack/controlplane/cluster.sh env)"
#   cluster.sh registry    the node's registry, as shell assignments: REGISTRY (host:port),
#                          REGISTRY_CA (its CA file), REGISTRY_USER, REGISTRY_PASSWORD,
#                          DOCKER_CONFIG (a directory whose config.json logs crane in)
#   cluster.sh status      what runs
#   cluster.sh selftest    pods, secrets, GC and namespace deletion work
#   cluster.sh sa-kubeconfig NAMESPACE SA OUT
#                          a kubeconfig acting as that service account (a
#                          TokenRequest token, 24 h): tests run the guard as
#                          its shipped role, not as admin
#   cluster.sh stop|kill|start|restart COMPONENT   fault injection: SIGTERM
#                          (stop) or SIGKILL (kill); start waits until the
#                          component is healthy again
#
# HA mode (`up --ha` or CDS_CP_HA=1): a 3-member etcd cluster (etcd-0..2), two
# kube-apiservers (kube-apiserver-a on the usual port, kube-apiserver-b on the
# next one), one kube-controller-manager talking to a. Default (single) mode:
# etcd, kube-apiserver, kube-controller-manager.
#
# Each apiserver writes an audit log (logs/<name>.audit.log, Metadata level, for
# pods, secrets, namespaces, events and leases outside kube-system and
# kube-node-lease): tests read who asked for what, and the guard's auditAnnotations.
#
# Everything lives under <repo>/target/controlplane/: bin/, pki/, logs/, run/
# (pid files, ports and mode), etcd/ or etcd-0..2/ (data), kubeconfig (admin,
# system:masters; HA also kubeconfig-a and kubeconfig-b).
#
# Env (read by `up` only; later commands use the recorded values):
#   CDS_CP_APISERVER_PORT (6443), CDS_CP_ETCD_CLIENT_PORT (2379),
#   CDS_CP_ETCD_PEER_PORT (2380), CDS_CP_TIMEOUT (seconds to wait, 120).
#   K8S_VERSION: the Kubernetes release (build.sh: the pinned one by default, or
#   one with pins in versions/). Unset, `up` keeps the running control plane's;
#   set to another release than the running one's, `up` refuses (run `down` first).
#   HA: CDS_CP_HA=1 (or true/yes/on), CDS_CP_APISERVER_B_PORT (apiserver port + 1); etcd member
#   N listens on client port + 2N and peer port + 2N.
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
kubeconfig_a="$cp_dir/kubeconfig-a"
kubeconfig_b="$cp_dir/kubeconfig-b"
kcm_kubeconfig="$cp_dir/controller-manager.kubeconfig"
timeout="${CDS_CP_TIMEOUT:-120}"
etcd_members_ha=3
# Every component either mode starts, in start order; `down` goes in reverse.
all_components=(etcd etcd-0 etcd-1 etcd-2 kube-apiserver kube-apiserver-a kube-apiserver-b kube-controller-manager
	containerd registry kube-proxy kubelet kube-scheduler)

# shellcheck source=hack/controlplane/node.sh
source "$here/node.sh"

log() { echo "cluster.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# ---- mode: single (default) or ha; sets the component lists ----
set_mode() {
	mode=$1
	case "$mode" in
	single)
		etcds=(etcd)
		apiservers=(kube-apiserver)
		;;
	ha)
		etcds=(etcd-0 etcd-1 etcd-2)
		apiservers=(kube-apiserver-a kube-apiserver-b)
		;;
	*) die "unknown mode '$mode'" ;;
	esac
	# Start order; `down` goes in reverse.
	components=("${etcds[@]}" "${apiservers[@]}" kube-controller-manager)
	if node_enabled; then components+=("${node_components[@]}"); fi
}

# ---- ports: chosen by `up`, recorded so the other commands agree with it ----
load_ports() {
	mode=""
	node=0
	version=""
	apiserver_b_port=""
	if [[ -f "$run/ports.env" ]]; then
		# shellcheck source=/dev/null
		source "$run/ports.env"
	else
		apiserver_port="${CDS_CP_APISERVER_PORT:-6443}"
		etcd_client_port="${CDS_CP_ETCD_CLIENT_PORT:-2379}"
		etcd_peer_port="${CDS_CP_ETCD_PEER_PORT:-2380}"
		apiserver_b_port="${CDS_CP_APISERVER_B_PORT:-}"
	fi
	[[ -n "$apiserver_b_port" ]] || apiserver_b_port=$((apiserver_port + 1))
	# No record (or one from before K8S_VERSION): the release bin/ holds, else the
	# pinned one (kube/go.mod's, the only one before K8S_VERSION).
	if [[ -z "$version" && -f "$bin/.k8s-version" ]]; then version="$(<"$bin/.k8s-version")"; fi
	[[ -n "$version" ]] || version="$(sed -n 's#^[[:space:]]*k8s\.io/kubernetes \(v[0-9.]*\).*#\1#p' "$here/kube/go.mod")"
	set_version "$version"
	if [[ -z "$mode" ]]; then # no record (or one from before HA mode): what runs
		mode=single
		local name
		for name in etcd-0 etcd-1 etcd-2 kube-apiserver-a kube-apiserver-b; do
			if pid_of "$name" >/dev/null; then mode=ha; fi
		done
	fi
	set_mode "$mode"
}

# set_version VERSION: the release and its minor (k8s_minor), for the flags that
# differ between releases.
set_version() {
	version=$1
	[[ "$version" =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || die "bad Kubernetes version '$version' (want v1.MINOR.PATCH)"
	k8s_minor=${BASH_REMATCH[1]}
}

# ensure_binaries: bin/ holds the recorded release's binaries (build.sh links them from
# its cache; another release's `build.sh` may have replaced them since `up`).
ensure_binaries() {
	[[ "$(cat "$bin/.k8s-version" 2>/dev/null)" == "$version" ]] && return 0
	log "bin/ does not hold $version's binaries: linking them (build.sh)"
	K8S_VERSION=$version "$here/build.sh" >&2
}

# etcd member NAME's ports: etcd uses the base ports, etcd-N base + 2N.
etcd_client_of() {
	case "$1" in
	etcd) echo "$etcd_client_port" ;;
	etcd-[0-9]) echo $((etcd_client_port + 2 * ${1#etcd-})) ;;
	esac
}
etcd_peer_of() {
	case "$1" in
	etcd) echo "$etcd_peer_port" ;;
	etcd-[0-9]) echo $((etcd_peer_port + 2 * ${1#etcd-})) ;;
	esac
}
apiserver_port_of() {
	case "$1" in
	kube-apiserver | kube-apiserver-a) echo "$apiserver_port" ;;
	kube-apiserver-b) echo "$apiserver_b_port" ;;
	esac
}
etcd_servers() { # all members' client URLs, comma-separated
	local name urls=()
	for name in "${etcds[@]}"; do urls+=("http://127.0.0.1:$(etcd_client_of "$name")"); done
	(
		IFS=,
		echo "${urls[*]}"
	)
}

# ---- processes: tracked by pid file, identified by their command line ----
binary_of() { # the executable's path
	case "$1" in
	etcd-*) echo "$bin/etcd" ;;
	kube-apiserver-*) echo "$bin/kube-apiserver" ;;
	containerd) command -v containerd ;; # Debian's
	registry) echo "$repo/target/tools/bin/registry" ;;
	*) echo "$bin/$1" ;;
	esac
}
marker_of() { # an argument only NAME's process has (HA names share a binary)
	case "$1" in
	etcd-*) echo "--data-dir=$cp_dir/$1" ;;
	kube-apiserver-*) echo "--cert-dir=$cp_dir/apiserver-certs-${1#kube-apiserver-}" ;;
	esac
}
pid_of() { # prints the recorded pid if that process is alive and really ours
	local name=$1 pid marker
	[[ -f "$run/$name.pid" ]] || return 1
	pid="$(<"$run/$name.pid")"
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	# A recycled pid would run something else: compare argv[0] with our binary.
	[[ -r "/proc/$pid/cmdline" ]] || return 1
	[[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n1)" == "$(binary_of "$name")" ]] || return 1
	marker="$(marker_of "$name")"
	if [[ -n "$marker" ]]; then
		tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF -- "$marker" || return 1
	fi
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
	setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$run/$name.pid" "$(binary_of "$name")" "$@" \
		>>"$logs/$name.log" 2>&1 </dev/null 8>&- &
	local i
	for i in $(seq 50); do
		[[ -s "$run/$name.pid" ]] && break
		sleep 0.1
	done
	log "started $name (pid $(<"$run/$name.pid"), log $logs/$name.log)"
}

alive() { # alive PID: exists and is not a zombie (our servers' parent is init)
	local state
	kill -0 "$1" 2>/dev/null || return 1
	read -r _ _ state _ <"/proc/$1/stat" 2>/dev/null || return 1
	[[ "$state" != Z ]]
}
any_alive() { # any_alive PID...
	local pid
	for pid in "$@"; do
		if alive "$pid"; then return 0; fi
	done
	return 1
}

# stop NAME...: SIGTERM to all, then SIGKILL to those alive after 15 s; only
# processes that are ours.
stop() {
	local name pid i pids=() names=()
	for name in "$@"; do
		if pid="$(pid_of "$name")"; then
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
			names+=("$name")
		elif [[ -f "$run/$name.pid" ]]; then
			log "$name: stale pid file (pid $(<"$run/$name.pid") is gone or not ours), removed"
			rm -f "$run/$name.pid"
		fi
	done
	((${#pids[@]} > 0)) || return 0
	for i in $(seq 150); do
		any_alive "${pids[@]}" || break
		sleep 0.1
	done
	for i in "${!pids[@]}"; do
		pid=${pids[i]}
		name=${names[i]}
		if alive "$pid"; then
			log "$name (pid $pid) ignored SIGTERM for 15s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.5
		fi
		log "stopped $name (pid $pid)"
		rm -f "$run/$name.pid"
		stopped_pids+=("$pid")
	done
}
stopped_pids=()

# An exited server stays a zombie until init reaps it (seconds, in some
# sandboxes): `down` waits up to 5 s for that, so that `pgrep` right after
# shows nothing. The zombie holds no port or file.
wait_reaped() {
	local i pid left
	for i in $(seq 50); do
		left=0
		for pid in "$@"; do
			if [[ -e "/proc/$pid" ]]; then left=1; fi
		done
		((left)) || return 0
		sleep 0.1
	done
}

lock() {
	exec 8>"$run/cluster.lock"
	flock -w "$timeout" 8 || die "another cluster.sh command holds $run/cluster.lock"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
check_port() { # check_port PORT ENV_VAR
	# A process of ours killed a moment ago may hold its port until it is reaped.
	local i
	for i in $(seq 20); do port_busy "$1" || return 0; sleep 0.5; done
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

etcd_healthy() { # etcd_healthy CLIENT_PORT; /health needs a leader (a quorum)
	curl -fsS "http://127.0.0.1:$1/health" | grep -q '"health":"true"'
}
apiserver_ready() { # apiserver_ready PORT
	# As admin: anonymous /readyz is only allowed once RBAC is bootstrapped.
	curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
		"https://127.0.0.1:$1/readyz" | grep -qx ok
}
# etcd's member list (v3 JSON gateway), as JSON; no etcdctl needed.
etcd_member_list() { # etcd_member_list CLIENT_PORT
	curl -fsS -X POST "http://127.0.0.1:$1/v3/cluster/member/list" -d '{}'
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

# write_kubeconfig FILE CERT_NAME USER [PORT] (subshell: umask); PORT defaults
# to apiserver (a)'s.
write_kubeconfig() (
	b64="base64 -w0"
	umask 077
	cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cds-guard-test
  cluster:
    server: https://127.0.0.1:${4:-$apiserver_port}
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

# ---- components: launch (no wait) and wait until healthy ----
launch_etcd() { # launch_etcd NAME
	local name=$1 client peer
	client="http://127.0.0.1:$(etcd_client_of "$name")"
	peer="http://127.0.0.1:$(etcd_peer_of "$name")"
	stop "$name" # cleans a stale pid file
	check_port "$(etcd_client_of "$name")" CDS_CP_ETCD_CLIENT_PORT
	check_port "$(etcd_peer_of "$name")" CDS_CP_ETCD_PEER_PORT
	if [[ "$name" == etcd ]]; then
		# --unsafe-no-fsync: test data, speed matters more than durability.
		start etcd --name=cds-guard --data-dir="$etcd_data" \
			--listen-client-urls="$client" --advertise-client-urls="$client" \
			--listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" \
			--initial-cluster="cds-guard=$peer" --initial-cluster-state=new \
			--unsafe-no-fsync --log-level=warn
		return
	fi
	# HA member: a raft cluster of all members. A member that has data already
	# rejoins (state "existing"; etcd then restarts from its WAL).
	local initial=() state=new i
	for ((i = 0; i < etcd_members_ha; i++)); do
		initial+=("cds-guard-$i=http://127.0.0.1:$(etcd_peer_of "etcd-$i")")
	done
	if [[ -d "$cp_dir/$name/member" ]]; then state=existing; fi
	start "$name" --name="cds-guard-${name#etcd-}" --data-dir="$cp_dir/$name" \
		--listen-client-urls="$client" --advertise-client-urls="$client" \
		--listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" \
		--initial-cluster="$(
			IFS=,
			echo "${initial[*]}"
		)" --initial-cluster-state="$state" --initial-cluster-token=cds-guard-ha \
		--unsafe-no-fsync --log-level=warn
}

launch_apiserver() { # launch_apiserver NAME
	local name=$1 port cert_dir="$cp_dir/apiserver-certs"
	port="$(apiserver_port_of "$name")"
	stop "$name"
	if [[ "$name" == kube-apiserver-b ]]; then
		check_port "$port" CDS_CP_APISERVER_B_PORT
	else
		check_port "$port" CDS_CP_APISERVER_PORT
	fi
	if [[ "$name" != kube-apiserver ]]; then
		# Unused (the serving cert is given) but distinct: it tells a from b
		# in /proc/PID/cmdline.
		cert_dir="$cp_dir/apiserver-certs-${name#kube-apiserver-}"
	fi
	# Without a node: ServiceAccount admission is off (no service-account
	# controllers run, so a new namespace has no `default` SA and pods would be
	# rejected), and no endpoint reconciler (it would log every 10 s that the
	# loopback advertise address is invalid for the `kubernetes` Endpoints;
	# nothing would use them). A node needs both (node_apiserver_flags).
	local where=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1
		--endpoint-reconciler-type=none --disable-admission-plugins=ServiceAccount)
	if node_enabled; then mapfile -t where < <(node_apiserver_flags); fi
	start "$name" \
		--etcd-servers="$(etcd_servers)" \
		"${where[@]}" \
		--secure-port="$port" --cert-dir="$cert_dir" \
		--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--client-ca-file="$pki/ca.crt" \
		--authorization-mode=Node,RBAC \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$pki/sa.pub" \
		--service-account-signing-key-file="$pki/sa.key" \
		--service-cluster-ip-range=10.0.0.0/24 \
		--allow-privileged=true \
		--audit-policy-file="$(audit_policy)" --audit-log-path="$logs/$name.audit.log" \
		--audit-log-maxsize=200 --audit-log-maxbackup=1
}

# The audit policy: what the guard and the tests do, with the guard's lease but not
# the control plane's own (the apiservers' identities, the nodes' heartbeats).
audit_policy() {
	local policy="$cp_dir/audit-policy.yaml"
	cat >"$policy" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  namespaces: [kube-system, kube-node-lease]
  resources:
  - {group: coordination.k8s.io, resources: [leases]}
- level: Metadata
  resources:
  - {group: "", resources: [pods, secrets, namespaces, events]}
  - {group: events.k8s.io, resources: [events]}
  - {group: coordination.k8s.io, resources: [leases]}
- level: None
EOF
	echo "$policy"
}

launch_kcm() {
	stop kube-controller-manager
	write_kubeconfig "$kcm_kubeconfig" controller-manager system:kube-controller-manager
	# --secure-port=0: no health endpoint needed, and no port to collide.
	# Controllers: GC (ownerReferences), namespace deletion, ClusterRole
	# aggregation so the built-in admin/edit/view roles get their rules, and the
	# Deployment and ReplicaSet controllers, whose pods in-use protection follows
	# to their owners (the pods stay Pending without a node).
	# Each controller acts as its own service account, as in a kubeadm
	# cluster: the namespace controller is
	# system:serviceaccount:kube-system:namespace-controller (the guard's
	# default exempt user), the garbage collector generic-garbage-collector.
	local node_flags=()
	if node_enabled; then mapfile -t node_flags < <(node_kcm_flags); fi
	start kube-controller-manager --kubeconfig="$kcm_kubeconfig" \
		--controllers="garbage-collector-controller,namespace-controller,clusterrole-aggregation-controller,deployment-controller,replicaset-controller$(node_kcm_controllers)" \
		--leader-elect=false --secure-port=0 \
		--use-service-account-credentials=true "${node_flags[@]}"
}

launch() { # launch NAME
	case "$1" in
	etcd*) launch_etcd "$1" ;;
	kube-apiserver*) launch_apiserver "$1" ;;
	kube-controller-manager) launch_kcm ;;
	*) node_launch "$1" ;;
	esac
}

wait_healthy() { # wait_healthy NAME
	case "$1" in
	etcd*) wait_for "$1" "health" etcd_healthy "$(etcd_client_of "$1")" ;;
	kube-apiserver*) wait_for "$1" "/readyz ok" apiserver_ready "$(apiserver_port_of "$1")" ;;
	kube-controller-manager)
		sleep 1
		pid_of kube-controller-manager >/dev/null ||
			{ tail -n 30 "$logs/kube-controller-manager.log" >&2; die "kube-controller-manager exited; see $logs/kube-controller-manager.log"; }
		;;
	*) node_healthy "$1" ;;
	esac
}

# launch_group NAME...: start those not running, then wait for all (a new
# 3-member etcd is healthy only once a quorum of members runs).
launch_group() {
	local name
	for name in "$@"; do
		if pid_of "$name" >/dev/null; then
			log "$name already running (pid $(pid_of "$name"))"
		else
			launch "$name"
		fi
	done
	for name in "$@"; do wait_healthy "$name"; done
}

# ports.env: the mode, the ports and whether a node runs, for the later commands.
save_ports() {
	{
		printf 'mode=%s\nnode=%s\nversion=%s\n' "$mode" "$node" "$version"
		printf 'apiserver_port=%s\netcd_client_port=%s\netcd_peer_port=%s\n' \
			"$apiserver_port" "$etcd_client_port" "$etcd_peer_port"
		if [[ "$mode" == ha ]]; then printf 'apiserver_b_port=%s\n' "$apiserver_b_port"; fi
	} >"$run/ports.env"
}

# ---- commands ----
cmd_up() {
	local want=single
	case "${CDS_CP_HA:-}" in
	1 | [tT]rue | TRUE | [yY]es | YES | [oO]n | ON) want=ha ;;
	"" | 0 | [fF]alse | FALSE | [nN]o | NO | [oO]ff | OFF) ;;
	*) die "CDS_CP_HA='$CDS_CP_HA': use 1 (HA) or 0 (single)" ;;
	esac
	local want_node="" # 1: with a node, 0: without, empty: keep what runs
	while (($# > 0)); do
		case "$1" in
		--ha) want=ha ;;
		--node) want_node=1 ;;
		--no-node) want_node=0 ;;
		*) die "up: unknown argument '$1' (usage: up [--ha|--node|--no-node])" ;;
		esac
		shift
	done
	if [[ "$want" == ha && "$want_node" == 1 ]]; then die "up: a node is made for the single control plane, not with --ha"; fi
	# The release: K8S_VERSION, else the running control plane's, else build.sh's
	# default. A running one is never swapped for another release under its clients.
	local want_version="${K8S_VERSION:-}" name running=0
	for name in "${all_components[@]}"; do
		if pid_of "$name" >/dev/null; then running=$((running + 1)); fi
	done
	if ((running > 0)); then
		load_ports
		if [[ -n "$want_version" && "$want_version" != "$version" ]]; then
			die "Kubernetes $version is running; K8S_VERSION=$want_version asks for another release: run \`$0 down\` first, then \`K8S_VERSION=$want_version $0 up\`"
		fi
		want_version=$version
	fi
	if [[ -n "$want_version" ]]; then K8S_VERSION=$want_version "$here/build.sh"; else "$here/build.sh"; fi
	mkdir -p "$logs" "$run"
	# etcd, the node's images and the pods' files share this disk with the builds.
	local free_kib
	free_kib=$(df -Pk "$run" | awk 'NR == 2 { print $4 }')
	if ((free_kib < 4 * 1024 * 1024)); then
		log "warning: $((free_kib / 1024)) MiB free under $run: etcd and the node fail when the disk fills"
	fi
	# Serialize up/down: two at once would start everything twice.
	lock

	running=0
	for name in "${all_components[@]}"; do
		if pid_of "$name" >/dev/null; then running=$((running + 1)); fi
	done
	if ((running == 0)); then
		rm -f "$run"/*.pid "$run/ports.env" # stale from a crash or reboot
		load_ports
		node=${want_node:-0}
		set_mode "$want"
		set_version "$(<"$bin/.k8s-version")"
		# Check every port before starting anything, so a clash leaves nothing behind.
		local ports=()
		for name in "${etcds[@]}"; do
			check_port "$(etcd_client_of "$name")" CDS_CP_ETCD_CLIENT_PORT
			check_port "$(etcd_peer_of "$name")" CDS_CP_ETCD_PEER_PORT
			ports+=("$(etcd_client_of "$name")" "$(etcd_peer_of "$name")")
		done
		check_port "$apiserver_port" CDS_CP_APISERVER_PORT
		ports+=("$apiserver_port")
		if [[ "$mode" == ha ]]; then
			check_port "$apiserver_b_port" CDS_CP_APISERVER_B_PORT
			ports+=("$apiserver_b_port")
		fi
		if [[ "$(printf '%s\n' "${ports[@]}" | sort -u | wc -l)" != "${#ports[@]}" ]]; then
			die "ports overlap: ${ports[*]}; etcd member N uses client and peer port + 2N"
		fi
		save_ports
	else
		load_ports # keep the ports of what already runs
		# Another `up` may have started a release while this one was building.
		[[ "$(<"$bin/.k8s-version")" == "$version" ]] ||
			die "Kubernetes $version is running but bin/ holds $(<"$bin/.k8s-version"); run \`$0 down\` first"
		if [[ "$mode" != "$want" ]]; then
			die "a control plane in $mode mode is running; run \`$0 down\` first, then \`$0 up$([[ $want == ha ]] && echo ' --ha')\`"
		fi
		if [[ -n "$want_node" && "$want_node" != "$node" ]]; then
			# The node's flags: restart the apiserver and the controller-manager with
			# or without them (etcd keeps the cluster's objects).
			if ((want_node)); then
				log "adding a node: restarting kube-apiserver and kube-controller-manager with its flags"
			else
				log "removing the node: restarting kube-apiserver and kube-controller-manager without its flags"
				node_down
				[[ -z "$node_leftovers" ]] || die "the node left behind: $node_leftovers"
			fi
			node=$want_node
			set_mode "$mode"
			save_ports
			stop kube-controller-manager "${apiservers[@]}"
		fi
	fi
	gen_pki
	if node_enabled; then node_pki; fi

	launch_group "${etcds[@]}"
	launch_group "${apiservers[@]}"
	write_kubeconfig "$kubeconfig" admin admin
	if [[ "$mode" == ha ]]; then
		write_kubeconfig "$kubeconfig_a" admin admin "$apiserver_port"
		write_kubeconfig "$kubeconfig_b" admin admin "$apiserver_b_port"
	fi

	if pid_of kube-controller-manager >/dev/null; then
		log "kube-controller-manager already running (pid $(pid_of kube-controller-manager))"
	else
		launch_kcm
		wait_healthy kube-controller-manager
	fi
	if node_enabled; then node_up; fi
	if ((running == ${#components[@]})); then
		log "already up and healthy"
	fi
	if [[ "$mode" == ha ]]; then
		log "ready (HA, Kubernetes $version): a https://127.0.0.1:$apiserver_port, b https://127.0.0.1:$apiserver_b_port, etcd $(etcd_servers)"
		log "KUBECONFIG=$kubeconfig (a), $kubeconfig_a, $kubeconfig_b"
	else
		log "ready (Kubernetes $version): https://127.0.0.1:$apiserver_port, KUBECONFIG=$kubeconfig"
	fi
	# Measured: built-in types are collected at once, even right after start;
	# dependents of a CRD's kind only after the GC's next discovery (<= 30 s).
	log "note: the GC finds a new CRD's kind within 30s (built-in kinds at once)"
}

cmd_down() {
	mkdir -p "$run"
	lock
	load_ports
	local name
	# The node first: its pods' teardown goes through the apiserver and the kubelet.
	if node_enabled || [[ -d "$node_dir" ]]; then node_down; fi
	# Reverse start order, one tier at a time (the apiservers must be gone
	# before etcd stops, or they hang in their shutdown retrying etcd).
	stop kube-controller-manager
	stop kube-apiserver-b kube-apiserver-a kube-apiserver
	# etcd members one by one: a leader stopped together with its peers tries
	# to hand leadership to a dying peer and waits 7 s for it.
	for name in etcd-2 etcd-1 etcd-0 etcd; do stop "$name"; done
	wait_reaped "${stopped_pids[@]}"
	rm -rf "$etcd_data" "$cp_dir"/etcd-[0-9] "$cp_dir"/apiserver-certs "$cp_dir"/apiserver-certs-[ab] \
		"$run/ports.env" "$kubeconfig" "$kubeconfig_a" "$kubeconfig_b" "$kcm_kubeconfig"
	[[ -z "$node_leftovers" ]] || die "the node left behind: $node_leftovers"
	log "down"
}

# stop|kill|start|restart COMPONENT: fault injection on the running control
# plane. A stopped etcd member takes up to ~9 s to exit while apiservers watch
# through it (etcd waits 5 s + 2 election timeouts for open streams); `kill`
# is immediate and loses nothing etcd acknowledged (--unsafe-no-fsync only
# skips fsync, the data is written).
cmd_fault() {
	local action=$1 name=${2:-} c ok=0 t0
	[[ -n "$name" ]] || die "usage: $0 $action COMPONENT"
	mkdir -p "$run"
	lock
	[[ -f "$run/ports.env" ]] || die "no control plane is up ($run/ports.env is missing); run \`$0 up\` first"
	load_ports
	for c in "${components[@]}"; do
		if [[ "$c" == "$name" ]]; then ok=1; fi
	done
	((ok)) || die "'$name' is not a component of the $mode control plane; components: ${components[*]}"
	if [[ "$action" == stop || "$action" == restart ]]; then
		if pid_of "$name" >/dev/null; then stop "$name"; else log "$name is not running"; fi
	fi
	if [[ "$action" == kill ]]; then
		local pid i
		if pid="$(pid_of "$name")"; then
			kill -KILL "$pid" 2>/dev/null || true
			for i in $(seq 50); do
				alive "$pid" || break
				sleep 0.1
			done
			log "killed $name (pid $pid, SIGKILL)"
		else
			log "$name is not running"
		fi
		rm -f "$run/$name.pid"
	fi
	if [[ "$action" == start || "$action" == restart ]]; then
		mkdir -p "$logs"
		ensure_binaries
		t0=$(date +%s%N)
		if pid_of "$name" >/dev/null; then
			log "$name already running (pid $(pid_of "$name"))"
		else
			launch "$name"
		fi
		wait_healthy "$name"
		log "$name healthy (waited $((($(date +%s%N) - t0) / 1000000))ms)"
	fi
}

cmd_env() {
	load_ports
	printf 'export KUBECONFIG=%q\n' "$kubeconfig"
	printf 'export PATH=%q:"$PATH"\n' "$bin"
	if [[ "$mode" == ha ]]; then
		printf 'export KUBECONFIG_A=%q KUBECONFIG_B=%q\n' "$kubeconfig_a" "$kubeconfig_b"
	fi
}

cmd_status() {
	load_ports
	local name pid up=0 port
	[[ "$mode" == single ]] || echo "mode: $mode"
	echo "kubernetes: $version"
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
		if [[ "$mode" == single ]]; then
			echo "etcd: http://127.0.0.1:$etcd_client_port (peer $etcd_peer_port)"
		else
			for name in "${etcds[@]}"; do
				port="$(etcd_client_of "$name")"
				if etcd_healthy "$port" 2>/dev/null; then
					echo "$name: http://127.0.0.1:$port (peer $(etcd_peer_of "$name")) healthy"
				else
					echo "$name: http://127.0.0.1:$port (peer $(etcd_peer_of "$name")) NOT healthy"
				fi
			done
		fi
		for name in "${apiservers[@]}"; do
			port="$(apiserver_port_of "$name")"
			if apiserver_ready "$port" 2>/dev/null; then
				echo "$name: https://127.0.0.1:$port ready"
			else
				echo "$name: https://127.0.0.1:$port NOT ready"
			fi
		done
		echo "KUBECONFIG=$kubeconfig"
		if [[ "$mode" == ha ]]; then echo "KUBECONFIG_A=$kubeconfig_a KUBECONFIG_B=$kubeconfig_b"; fi
	fi
	((up == ${#components[@]}))
}

# HA only: every member healthy and in the member list, both apiservers ready.
selftest_ha() {
	local name port members ids names
	for name in "${etcds[@]}"; do
		port="$(etcd_client_of "$name")"
		etcd_healthy "$port" || die "$name (client port $port) is not healthy"
		members="$(etcd_member_list "$port")" || die "$name: no member list"
		# A member added but never started has an ID and no name.
		ids="$(grep -o '"ID":"[0-9]*"' <<<"$members" | sort -u | wc -l)"
		names="$(grep -o '"name":"cds-guard-[0-9]"' <<<"$members" | sort -u | wc -l)"
		((ids == etcd_members_ha && names == etcd_members_ha)) ||
			die "$name does not list $etcd_members_ha started members: $members"
	done
	echo "etcd: $etcd_members_ha members, all healthy, each lists all $etcd_members_ha"
	for name in "${apiservers[@]}"; do
		apiserver_ready "$(apiserver_port_of "$name")" || die "$name is not ready"
	done
	kubectl --kubeconfig "$kubeconfig_b" version
}

# HA only: what one apiserver writes, the other reads at once (a GET without
# resourceVersion is a consistent read).
selftest_ha_cross() {
	local ns=$1 v
	kubectl --kubeconfig "$kubeconfig_a" -n "$ns" create configmap via-a --from-literal=k=a
	v="$(kubectl --kubeconfig "$kubeconfig_b" -n "$ns" get configmap via-a -o jsonpath='{.data.k}')"
	[[ "$v" == a ]] || die "apiserver b read '$v' for a ConfigMap just written through a"
	kubectl --kubeconfig "$kubeconfig_b" -n "$ns" create configmap via-b --from-literal=k=b
	v="$(kubectl --kubeconfig "$kubeconfig_a" -n "$ns" get configmap via-b -o jsonpath='{.data.k}')"
	[[ "$v" == b ]] || die "apiserver a read '$v' for a ConfigMap just written through b"
	kubectl --kubeconfig "$kubeconfig_b" -n "$ns" delete configmap via-a
	kubectl --kubeconfig "$kubeconfig_a" -n "$ns" get configmap via-a 2>/dev/null &&
		die "apiserver a still returns a ConfigMap deleted through b"
	kubectl --kubeconfig "$kubeconfig_a" -n "$ns" delete configmap via-b
	echo "apiservers a and b read each other's writes"
}

# End-to-end check of what the tests rely on; leaves nothing behind.
cmd_selftest() {
	load_ports
	export KUBECONFIG="$kubeconfig" PATH="$bin:$PATH"
	local ns="cp-selftest-$$" t
	if [[ "$mode" == ha ]]; then selftest_ha; fi
	kubectl version
	kubectl create namespace "$ns"
	kubectl -n "$ns" run pause --image=registry.k8s.io/pause:3.10 --restart=Never
	kubectl -n "$ns" get pod pause -o jsonpath='{.status.phase}{"\n"}'
	kubectl -n "$ns" create secret generic s1 --from-literal=k=v
	kubectl -n "$ns" get secret s1 -o jsonpath='{.data.k}{"\n"}' | base64 -d
	echo
	if [[ "$mode" == ha ]]; then selftest_ha_cross "$ns"; fi
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

cmd_sa_kubeconfig() { # NAMESPACE SA OUT
	local namespace=$1 sa=$2 out=$3 token
	load_ports
	[[ -f "$kubeconfig" ]] || die "no control plane: run '$0 up' first"
	token="$("$bin/kubectl" --kubeconfig "$kubeconfig" -n "$namespace" create token "$sa" --duration=24h)"
	(
		umask 077
		cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cds-guard-test
  cluster:
    server: https://127.0.0.1:$apiserver_port
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: $namespace:$sa
  user:
    token: $token
contexts:
- name: cds-guard-test
  context:
    cluster: cds-guard-test
    user: $namespace:$sa
    namespace: $namespace
current-context: cds-guard-test
EOF
		mv "$out.tmp" "$out"
	)
}

case "${1:-}" in
image-load)
	[[ $# -eq 2 ]] || die "usage: $0 image-load NAME:TAG"
	load_ports
	node_image_load "$2"
	;;
sa-kubeconfig)
	[[ $# -eq 4 ]] || die "usage: $0 sa-kubeconfig NAMESPACE SA OUT"
	cmd_sa_kubeconfig "$2" "$3" "$4"
	;;
up)
	shift
	cmd_up "$@"
	;;
down) cmd_down ;;
env) cmd_env ;;
registry) node_registry_env ;;
status) cmd_status ;;
selftest) cmd_selftest ;;
stop | kill | start | restart) cmd_fault "$1" "${2:-}" ;;
*)
	echo "usage: $0 up [--ha|--node] | down | image-load NAME:TAG | env | registry | status | selftest | sa-kubeconfig NAMESPACE SA OUT | stop|kill|start|restart COMPONENT" >&2
	exit 2
	;;
esac
