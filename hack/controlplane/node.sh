# A real node for the local control plane, in the shape of Kubernetes' own
# hack/local-up-cluster.sh: every component on the host. Sourced by cluster.sh (it uses
# its helpers: start, stop, pid_of, wait_for, log, die) for `up --node`, `down` and
# `image-load`.
#
# What the node adds to the control plane:
#   containerd (Debian's, its own config, root, state and socket; CRI with
#     restrict_oom_score_adj, since root here cannot lower an OOM score), runc, and
#     the CNI plugins' bridge on cdsguard0 (10.244.0.0/24; the host is 10.244.0.1);
#   kubelet, kube-scheduler and kube-proxy (iptables mode), built by build.sh from the
#     same Kubernetes release as the control plane;
#   two local images in containerd's k8s.io namespace: the sandbox ("pause", a static C
#     program built here) and local/busybox (Debian's busybox-static), for plain pods;
#   a registry at 10.244.0.1:5443 (hack/tools/registry: TLS from the cluster's CA,
#     basic authentication): containerd trusts its CA and pulls with the credentials
#     of a pod's imagePullSecrets, as production nodes pull (`cluster.sh registry`);
#   the control plane's node flags: the apiserver listens on every address and
#     advertises the bridge's (pods reach it at the `kubernetes` Service through
#     kube-proxy) and calls kubelets with a client certificate; the ServiceAccount
#     admission plugin is on (pods get their tokens); the controller-manager also runs
#     the controllers a Deployment, a Service and a PodDisruptionBudget need.
#
# Pod traffic stays on the machine: the bridge masquerades nothing and pods get one
# route only, to the Service range through the host; no default route.
#
# Webhook Services are reached as in any cluster: the apiserver dials the Service's
# ClusterIP, which kube-proxy's rules send to a ready endpoint. kube-proxy is needed
# anyway: pods find the apiserver at the `kubernetes` Service's ClusterIP.

node_name=cds-guard-node
node_dir="$cp_dir/node"
node_bridge=cdsguard0
node_ip=10.244.0.1
pod_cidr=10.244.0.0/24
service_cidr=10.0.0.0/24
containerd_sock="$node_dir/containerd/containerd.sock"
pause_image=local/pause:3.10
busybox_image=local/busybox:1.35.0
# The kernel settings the kubelet changes when it starts (vm.overcommit_memory,
# kernel.panic, kernel.panic_on_oops): saved by `up --node`, put back by `down`.
node_sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
node_components=(containerd registry kubelet kube-proxy kube-scheduler)
registry_addr="$node_ip:5443"
registry_dir="$node_dir/registry"
registry_user=cds-guard

node_enabled() { [[ "${node:-0}" == 1 ]]; }

ctr_k8s() { ctr --address "$containerd_sock" --namespace k8s.io "$@"; }

# ---- packages: Debian's containerd, runc, CNI plugins, iptables; once per machine ----
node_install() {
	local missing=()
	command -v containerd >/dev/null || missing+=(containerd)
	command -v runc >/dev/null || missing+=(runc)
	[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
	command -v iptables >/dev/null || missing+=(iptables)
	command -v conntrack >/dev/null || missing+=(conntrack)
	[[ -x /bin/busybox ]] || missing+=(busybox-static)
	command -v gcc >/dev/null || missing+=(gcc libc6-dev)
	((${#missing[@]} == 0)) && return 0
	log "installing ${missing[*]} from Debian's packages"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---- certificates of the node's components, added to the control plane's PKI ----
node_pki() {
	(
		cd "$pki"
		ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
		client_ext="$(printf '%s\n' "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth")"
		# sign NAME SUBJECT [EXTENSIONS], once; a client certificate by default
		sign() {
			[[ -f "$1.crt" ]] && return 0
			openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
			openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
				-days 3650 -out "$1.crt" -extfile <(printf '%s\n' "${3:-$client_ext}") 2>/dev/null
			rm -f "$1.csr"
			chmod 600 "$1.key"
		}
		sign kubelet "/O=system:nodes/CN=system:node:$node_name"
		sign kube-scheduler "/CN=system:kube-scheduler"
		sign kube-proxy "/CN=system:kube-proxy"
		# The apiserver's client certificate for kubelets (logs, exec).
		sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
		# The registry's serving certificate, for the node's address.
		sign registry "/CN=cds-guard-registry" "$(printf '%s\n' \
			"keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
			"subjectAltName=IP:$node_ip")"
	)
}

# ---- the apiserver's and the controller-manager's flags for a cluster with a node ----
node_apiserver_flags() {
	node_enabled || return 0
	printf '%s\n' --bind-address=0.0.0.0 "--advertise-address=$node_ip" \
		--endpoint-reconciler-type=lease \
		"--kubelet-client-certificate=$pki/apiserver-kubelet-client.crt" \
		"--kubelet-client-key=$pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP
}
node_kcm_controllers() {
	node_enabled || return 0
	printf ',%s' endpoints-controller \
		endpointslice-controller serviceaccount-controller disruption-controller \
		node-lifecycle-controller root-ca-certificate-publisher-controller \
		pod-garbage-collector-controller job-controller
}
node_kcm_flags() {
	node_enabled || return 0
	printf '%s\n' "--root-ca-file=$pki/ca.crt"
}

# ---- images: OCI archives made here, imported into containerd's k8s.io namespace ----
# oci_archive OUT NAME:TAG ROOTFS ENTRYPOINT_JSON: a one-layer OCI image archive.
oci_archive() {
	local out=$1 ref=$2 rootfs=$3 entrypoint=$4 dir layer config manifest
	dir="$(mktemp -d)"
	mkdir -p "$dir/blobs/sha256"
	tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$dir/layer.tar" .
	layer="$(sha256sum <"$dir/layer.tar" | cut -c1-64)"
	mv "$dir/layer.tar" "$dir/blobs/sha256/$layer"
	printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$entrypoint" "$layer" >"$dir/config.json"
	config="$(sha256sum <"$dir/config.json" | cut -c1-64)"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%d}]}' \
		"$config" "$(stat -c %s "$dir/config.json")" "$layer" "$(stat -c %s "$dir/blobs/sha256/$layer")" >"$dir/manifest.json"
	manifest="$(sha256sum <"$dir/manifest.json" | cut -c1-64)"
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"io.containerd.image.name":"docker.io/%s","org.opencontainers.image.ref.name":"%s"}}]}' \
		"$manifest" "$(stat -c %s "$dir/manifest.json")" "$ref" "${ref##*:}" >"$dir/index.json"
	mv "$dir/config.json" "$dir/blobs/sha256/$config"
	mv "$dir/manifest.json" "$dir/blobs/sha256/$manifest"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
	tar -C "$dir" -cf "$out" oci-layout index.json blobs
	rm -rf "$dir"
}

# The sandbox image: a static program that sleeps until it is told to stop and reaps
# what the pod's other processes leave behind, as Kubernetes' pause does.
node_pause_image() {
	local dir="$node_dir/images/pause"
	rm -rf "$dir"
	mkdir -p "$dir/rootfs"
	cat >"$dir/pause.c" <<'EOF'
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
	struct sigaction on_stop = {.sa_handler = stop}, on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	sigaction(SIGINT, &on_stop, 0);
	sigaction(SIGTERM, &on_stop, 0);
	sigaction(SIGCHLD, &on_child, 0);
	for (;;) pause();
}
EOF
	gcc -static -Os -s -o "$dir/rootfs/pause" "$dir/pause.c"
	oci_archive "$dir.tar" "$pause_image" "$dir/rootfs" '["/pause"]'
	echo "$dir.tar"
}

# A busybox image (Debian's static busybox, its applets as links): plain pods' image.
node_busybox_image() {
	local dir="$node_dir/images/busybox" applet
	rm -rf "$dir"
	mkdir -p "$dir/rootfs/bin" "$dir/rootfs/tmp"
	cp /bin/busybox "$dir/rootfs/bin/busybox"
	for applet in sh sleep cat env echo test true false ls; do ln -s busybox "$dir/rootfs/bin/$applet"; done
	chmod 1777 "$dir/rootfs/tmp"
	oci_archive "$dir.tar" "$busybox_image" "$dir/rootfs" '["/bin/sh"]'
	echo "$dir.tar"
}

# ---- containerd, CNI, kubelet and kube-proxy configuration ----
node_configs() {
	mkdir -p "$node_dir"/{containerd,cni/net.d,cni/ipam,kubelet/root,kubelet/pki,kubelet/pod-logs}
	cat >"$node_dir/containerd/config.toml" <<EOF
version = 2
root = "$node_dir/containerd/root"
state = "$node_dir/containerd/state"
# Snapshotters this host cannot use; overlayfs is the one.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "$containerd_sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$pause_image"
  # Root here lacks CAP_SYS_RESOURCE: without this, runc fails to create any sandbox.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node_dir/cni/net.d"
    max_conf_num = 1
  # Per-registry trust: certs.d/<host:port>/hosts.toml (the node's registry). A table of
  # its own, last: the keys after a table header belong to it.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$node_dir/containerd/certs.d"
EOF
	mkdir -p "$node_dir/containerd/certs.d/$registry_addr" "$registry_dir"
	printf '%s\n' "server = \"https://$registry_addr\"" "[host.\"https://$registry_addr\"]" \
		'  capabilities = ["pull", "resolve"]' "  ca = \"$pki/ca.crt\"" \
		>"$node_dir/containerd/certs.d/$registry_addr/hosts.toml"
	# The registry's one account; pulls carry it from a pod's imagePullSecrets, pushes
	# (crane, helm) from the docker-config file beside it.
	if [[ ! -s "$registry_dir/credentials" ]]; then
		(umask 077 && echo "$registry_user:$(openssl rand -hex 16)" >"$registry_dir/credentials")
		(umask 077 && printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$registry_addr" \
			"$(tr -d '\n' <"$registry_dir/credentials" | base64 -w0)" >"$registry_dir/config.json")
	fi
	# No ipMasq, no default route: a pod reaches the host (the apiserver through the
	# kubernetes Service) and other pods, nothing beyond the machine.
	cat >"$node_dir/cni/net.d/10-cds-guard.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cds-guard-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$node_bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$node_dir/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$node_ip"}]],
        "routes": [{"dst": "$service_cidr"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
	# This host is cgroup v1; 1.35+ refuse it unless told (failCgroupV1, a field since
	# 1.31: 1.30 decodes an unknown field only leniently, with a warning, so it gets none).
	local cgroup_v1="failCgroupV1: false"
	((k8s_minor >= 31)) || cgroup_v1="# failCgroupV1: not in $version; it runs on cgroup v1"
	cat >"$node_dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host is cgroup v1 (see node.sh), and containerd 1.6 does not report its
# cgroup driver.
$cgroup_v1
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$containerd_sock
address: $node_ip
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
podLogsDir: $node_dir/kubelet/pod-logs
# Nothing serves DNS here; pods need none.
resolvConf: ""
# Images cannot be pulled again here: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A test node shares its disk with builds: evict only when it is truly full (1% of a
# large disk is gigabytes, and disk pressure taints the node: no pod would start).
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, imagefs.available: 256Mi, nodefs.inodesFree: 1%}
serializeImagePulls: false
EOF
	write_kubeconfig "$node_dir/kubelet/kubeconfig" kubelet "system:node:$node_name"
	write_kubeconfig "$node_dir/kube-scheduler.kubeconfig" kube-scheduler system:kube-scheduler
	write_kubeconfig "$node_dir/kube-proxy.kubeconfig" kube-proxy system:kube-proxy
}

# ---- the host's side: the bridge, the kernel settings the kubelet changes ----
node_host_up() {
	if [[ ! -f "$node_dir/sysctls.saved" ]]; then
		local key
		for key in "${node_sysctls[@]}"; do echo "$key=$(sysctl -n "$key")"; done >"$node_dir/sysctls.saved"
	fi
	if ! ip link show "$node_bridge" >/dev/null 2>&1; then
		ip link add "$node_bridge" type bridge
	fi
	ip addr replace "$node_ip/24" dev "$node_bridge"
	ip link set "$node_bridge" up
}

# ---- start and stop ----
node_launch() { # node_launch NAME
	case "$1" in
	containerd)
		start containerd --config "$node_dir/containerd/config.toml" --log-level warn
		;;
	kube-proxy)
		# --iptables-localhost-nodeports=false: no route_localnet on the host.
		# NodePorts on the node's IP only: `primary` from 1.31; 1.30 refuses it ("must be
		# a valid CIDR") and gets the CIDR that `primary` stands for.
		local nodeport_addresses=primary
		((k8s_minor >= 31)) || nodeport_addresses="$node_ip/32"
		start kube-proxy --kubeconfig="$node_dir/kube-proxy.kubeconfig" \
			--hostname-override="$node_name" --proxy-mode=iptables --cluster-cidr="$pod_cidr" \
			--conntrack-max-per-core=0 --iptables-localhost-nodeports=false --nodeport-addresses="$nodeport_addresses" \
			--healthz-bind-address=127.0.0.1:10256 --metrics-bind-address=127.0.0.1:10249
		;;
	kubelet)
		start kubelet --config="$node_dir/kubelet/config.yaml" \
			--kubeconfig="$node_dir/kubelet/kubeconfig" --root-dir="$node_dir/kubelet/root" \
			--cert-dir="$node_dir/kubelet/pki" --hostname-override="$node_name" --node-ip="$node_ip"
		;;
	registry)
		start registry -address="$registry_addr" -tls-cert="$pki/registry.crt" -tls-key="$pki/registry.key" \
			-credentials="$registry_dir/credentials"
		;;
	kube-scheduler)
		start kube-scheduler --kubeconfig="$node_dir/kube-scheduler.kubeconfig" \
			--authentication-kubeconfig="$node_dir/kube-scheduler.kubeconfig" \
			--authorization-kubeconfig="$node_dir/kube-scheduler.kubeconfig" \
			--leader-elect=false --secure-port=0
		;;
	esac
}

node_healthy() { # node_healthy NAME
	case "$1" in
	containerd) wait_for containerd "its socket" ctr --address "$containerd_sock" version ;;
	registry) wait_for registry "/v2/ with its credentials" registry_answers ;;
	kube-proxy) wait_for kube-proxy "/healthz" curl -fsS http://127.0.0.1:10256/healthz ;;
	kubelet) wait_for kubelet "/healthz" curl -fsS http://127.0.0.1:10248/healthz ;;
	kube-scheduler) sleep 1; pid_of kube-scheduler >/dev/null || die "kube-scheduler exited; see $logs/kube-scheduler.log" ;;
	esac
}

node_registry_env() {
	[[ -s "$registry_dir/credentials" ]] || die "no registry: run \`$0 up --node\` first"
	local credentials
	credentials="$(<"$registry_dir/credentials")"
	printf 'REGISTRY=%q\nREGISTRY_CA=%q\nREGISTRY_USER=%q\nREGISTRY_PASSWORD=%q\nDOCKER_CONFIG=%q\n' \
		"$registry_addr" "$pki/ca.crt" "${credentials%%:*}" "${credentials#*:}" "$registry_dir"
}

registry_answers() {
	curl -fsS --cacert "$pki/ca.crt" -u "$(<"$registry_dir/credentials")" "https://$registry_addr/v2/"
}

node_node_ready() {
	"$bin/kubectl" --kubeconfig "$kubeconfig" wait node "$node_name" --for=condition=Ready --timeout=5s
}
# The kubelet registers the node with the not-ready taint; the node-lifecycle controller
# lifts it once Ready, and adds others on pressure or a lost heartbeat. Pods schedule only
# once no NoSchedule/NoExecute taint is left.
node_taints() {
	"$bin/kubectl" --kubeconfig "$kubeconfig" get node "$node_name" \
		-o jsonpath='{range .spec.taints[*]}{.key}:{.effect} {end}'
}
node_schedulable() {
	local taints
	taints="$(node_taints)" || return 1
	[[ ! "$taints" =~ No(Schedule|Execute) ]]
}
node_report() { # what keeps pods off the node: its taints and conditions
	log "node $node_name taints: $(node_taints 2>&1)"
	"$bin/kubectl" --kubeconfig "$kubeconfig" get node "$node_name" \
		-o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}: {.message}){"\n"}{end}' >&2 || true
	df -h "$node_dir" >&2 || true
}

node_up() {
	node_install
	# The registry is one of hack/tools' binaries (cached: a link when built before).
	[[ -x "$repo/target/tools/bin/registry" ]] || "$repo/hack/tools/build.sh" test >&2
	mkdir -p "$node_dir"
	node_pki
	node_configs
	node_host_up
	local name
	for name in "${node_components[@]}"; do
		if pid_of "$name" >/dev/null; then
			log "$name already running (pid $(pid_of "$name"))"
			continue
		fi
		node_launch "$name"
		node_healthy "$name"
		if [[ "$name" == containerd ]]; then
			ctr_k8s images import "$(node_pause_image)" >/dev/null
			ctr_k8s images import "$(node_busybox_image)" >/dev/null
		fi
	done
	wait_for kubelet "node $node_name Ready" node_node_ready
	if ! (wait_for kubelet "node $node_name without NoSchedule taints" node_schedulable); then
		node_report
		die "node $node_name is Ready but pods cannot schedule on it"
	fi
	log "node $node_name ready: pods on $pod_cidr (bridge $node_bridge), images $pause_image, $busybox_image"
}

# node_down: pods first (through the kubelet, which tears down their networks), then
# the components, then whatever is left (containers, mounts, namespaces, the bridge,
# rules, cgroups), and the kernel settings back. What stays behind is named in
# node_leftovers (empty when nothing does).
node_leftovers=""
node_down() {
	local k=("$bin/kubectl" --kubeconfig "$kubeconfig" --request-timeout=5s)
	if pid_of kubelet >/dev/null && [[ -f "$kubeconfig" ]]; then
		"${k[@]}" cordon "$node_name" >/dev/null 2>&1 || true
		"${k[@]}" delete pods --all-namespaces --field-selector "spec.nodeName=$node_name" \
			--grace-period=0 --force --wait=false >/dev/null 2>&1 || true
		local i
		for i in $(seq 60); do
			[[ -z "$(ctr_k8s containers ls -q 2>/dev/null)" ]] && break
			sleep 0.5
		done
	fi
	stop kube-scheduler kubelet kube-proxy
	# The Node object goes with its kubelet: a later node registers anew, schedulable.
	if [[ -f "$kubeconfig" ]]; then
		"${k[@]}" delete node "$node_name" --ignore-not-found >/dev/null 2>&1 || true
	fi
	if pid_of containerd >/dev/null; then
		local id
		for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
		sleep 0.5
		for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true; done
		for id in $(ctr_k8s containers ls -q 2>/dev/null); do ctr_k8s containers delete "$id" >/dev/null 2>&1 || true; done
	fi
	stop registry containerd
	# Shims of this containerd that outlived it.
	pkill -KILL -f "containerd-shim-runc-v2 .*-address $containerd_sock" 2>/dev/null || true
	# Mounts under the node's directories (volumes, rootfs, shm), deepest first.
	local mount
	for mount in $(findmnt -rn -o TARGET | grep -F "$node_dir/" | sort -r); do
		umount -l "$mount" 2>/dev/null || true
	done
	# The network namespaces containerd made for pods (cni-<uuid>), listed in its state.
	local ns
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-' || true); do
		ip netns delete "$ns" 2>/dev/null || true
	done
	ip link delete "$node_bridge" 2>/dev/null || true
	node_iptables_clean
	local cg
	for cg in /sys/fs/cgroup/*/kubepods; do
		[[ -d "$cg" ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	if [[ -f "$node_dir/sysctls.saved" ]]; then
		sysctl -q -p "$node_dir/sysctls.saved" >/dev/null 2>&1 || true
	fi
	node_leftovers="$(node_left_behind)"
	# --one-file-system: never into a mount that failed to go.
	[[ -n "$node_leftovers" ]] || rm -rf --one-file-system "$node_dir"
}

# The rules kube-proxy and the kubelet wrote (their chains are all named KUBE-*), in
# every table, IPv4 and IPv6: the jumps to them first, then the chains.
node_iptables_clean() {
	local tool table rule chain
	for tool in iptables ip6tables; do
		command -v "$tool" >/dev/null || continue
		for table in filter nat mangle; do
			while read -r rule; do
				# eval: iptables -S quotes a rule's comment as the shell would.
				eval "\"\$tool\" -t \"\$table\" ${rule/#-A/-D}" 2>/dev/null || true
			done < <("$tool" -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-')
			for chain in $("$tool" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
				"$tool" -t "$table" -F "$chain" 2>/dev/null || true
			done
			for chain in $("$tool" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}'); do
				"$tool" -t "$table" -X "$chain" 2>/dev/null || true
			done
		done
	done
}

# Names the node's processes, mounts, namespaces or bridge that remain, if any.
node_left_behind() {
	local left=()
	pgrep -f "containerd.*$node_dir" >/dev/null && left+=("processes: $(pgrep -af "containerd.*$node_dir" | head -3 | tr '\n' ';')")
	findmnt -rn -o TARGET | grep -qF "$node_dir/" && left+=("mounts: $(findmnt -rn -o TARGET | grep -F "$node_dir/" | head -3 | tr '\n' ' ')")
	ip netns list 2>/dev/null | grep -q '^cni-' && left+=("network namespaces: $(ip netns list | grep '^cni-' | head -3 | tr '\n' ' ')")
	ip link show "$node_bridge" >/dev/null 2>&1 && left+=("bridge $node_bridge")
	iptables -t nat -S 2>/dev/null | grep -q -- '-N KUBE-' && left+=("iptables chains KUBE-*")
	echo "${left[*]}"
}

# image-load NAME:TAG: an image of the local Docker engine (hack/docker.sh) onto the node.
node_image_load() {
	local image=$1
	pid_of containerd >/dev/null || die "no node: run \`$0 up --node\` first"
	"$repo/hack/docker.sh" save "$image" | ctr_k8s images import - >/dev/null
	log "$image loaded into the node's containerd (k8s.io namespace)"
	ctr_k8s images ls -q | grep -F "$image" >&2
}
