#!/usr/bin/env bash
# A single-node Kubernetes on this machine, for applying deploy/k8s for real:
# no Docker, no systemd, nothing pulled from an image registry.
#
#   cluster.sh install   build what is missing (Kubernetes, CoreDNS, Prometheus and the
#                        Prometheus Operator from the Go module proxy; the images the cluster
#                        itself runs), install the Debian packages
#   cluster.sh up        start it all (idempotent), wait until the node is Ready
#   cluster.sh down      stop everything `up` started, pods included; keep the data
#   cluster.sh clean     down + delete the cluster's data, certificates and volumes
#   cluster.sh status    what runs (always exits 0)
#   cluster.sh load-image IMAGE   podman image -> the node's containerd
#   cluster.sh env       the KUBECONFIG and PATH lines to source for kubectl
#   cluster.sh volumes   offer the local volumes again whose claims are gone
#   cluster.sh stack ARGS  deploy/local/stack.sh for the pods' Kafka and registry (up, clean, ...)
#   cluster.sh secured-stack ARGS  deploy/local/cluster.sh (three SASL_SSL brokers and a TLS
#                        registry) on the node's address, for the prod overlay
#
# The parts, all processes of this machine (docs/deploy.md, "A real cluster on this machine"):
#   etcd (Debian etcd-server) -> kube-apiserver, kube-controller-manager, kube-scheduler;
#   containerd (Debian) with runc and the bridge CNI plugin -> kubelet; kube-proxy (iptables);
#   CoreDNS answering cluster.local on the node's address; a Kafka and a schema registry
#   (deploy/local/stack.sh) listening on the node's address, which pods reach directly.
# The node's address is the pods' bridge gateway, so pods, the host's processes and the
# control plane all reach each other on one subnet.
#
# Env: K8S_HOME (/var/tmp/streams-k8s), K8S_UP_TIMEOUT (120 s), STACK_HOME (the local
# stack's, whose Kafka jars and registry binary are reused).
set -euo pipefail

K8S_HOME="${K8S_HOME:-/var/tmp/streams-k8s}"
K8S_UP_TIMEOUT="${K8S_UP_TIMEOUT:-120}"
KUBERNETES_VERSION=v1.35.4
NODE_NAME=streams-node
BRIDGE=streams0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
KUBERNETES_SERVICE_IP=10.96.0.1
ETCD_PORT=32379
# Kafka and the registry for the pods, beside (not instead of) the local stack on 127.0.0.1.
CLUSTER_KAFKA_PORT=39092
CLUSTER_KAFKA_CONTROLLER_PORT=39093
CLUSTER_REGISTRY_PORT=38081
PAUSE_IMAGE=localhost/streams-pause:1
# Prometheus v3.10.0 is the Go module's v0.310.0 (tools/prometheus).
PROMETHEUS_VERSION=v3.10.0
PROMETHEUS_IMAGE=localhost/prometheus:$PROMETHEUS_VERSION
CONFIG_RELOADER_IMAGE=localhost/prometheus-config-reloader:v0.85.0
# Local volumes offered to claims (StorageClass "local", the default).
VOLUME_COUNT=24
VOLUME_SIZE=20Gi

LOG_TAG=k8s
# The local stack's helpers: log, die, and process handling (spawn, live_pid, stop_pid).
# shellcheck source=../../local/stack.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../local/stack.sh"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/../../.." && pwd)"
TOOLS="$SCRIPT_DIR/tools"
PKI="$K8S_HOME/pki"
LOGS="$K8S_HOME/logs"
RUN="$K8S_HOME/run"
CONF="$K8S_HOME/conf"
CONTAINERD_SOCK=/run/streams-k8s/containerd.sock
KUBELET_DIR="$K8S_HOME/kubelet"
VOLUMES="$K8S_HOME/volumes"
export KUBECONFIG="$PKI/admin.kubeconfig"

# stack.sh's, with the way out that fits here.
die_log() {
  local file="$1"; shift
  if [ -f "$file" ]; then
    printf '[k8s] ---- last lines of %s ----\n' "$file" >&2
    tail -n 30 "$file" >&2
  fi
  die "$* (log: $file; what already runs stops with 'cluster.sh down')"
}

# ---- install --------------------------------------------------------------------------------
# Each Go tool is built from its own module under tools/ (go.mod pins the release) into a
# directory named by that module's hash: a version bump rebuilds, anything else reuses.
tool_dir() { echo "$K8S_HOME/bin/$1-$(cat "$TOOLS/$1/go.mod" "$TOOLS/$1/go.sum" | sha256sum | cut -c1-12)"; }
KUBE_BIN="$(tool_dir kubernetes)"
COREDNS_BIN="$(tool_dir coredns)"
PROMETHEUS_BIN="$(tool_dir prometheus)"
OPERATOR_BIN="$(tool_dir prometheus-operator)"

build_tool() { # module-dir out-dir ldflags packages...
  local module="$1" out="$2" ldflags="$3"; shift 3
  [ -f "$out/.complete" ] && return 0
  log "building $* into $out (once per version in tools/$module)"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  local started=$SECONDS
  (cd "$TOOLS/$module" && GOFLAGS=-mod=readonly CGO_ENABLED=0 \
     go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp/" "$@") \
    || die "building $module failed (output above)"
  touch "$out.tmp/.complete"
  rm -rf "$out"; mv "$out.tmp" "$out"
  log "built $module in $((SECONDS - started)) s"
}

install_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v openssl >/dev/null || missing+=(openssl)
  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(libc6-dev)
  [ "${#missing[@]}" = 0 ] && return 0
  log "installing ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The images the cluster itself runs, each one static binary on an empty base, saved as
# archives that `up` loads into the node's containerd: the pod sandbox (pause.c), and
# Prometheus and its config reloader for the Prometheus Operator.
image_from_binary() { # image binary-path; runs as nobody unless the pod says otherwise
  local image="$1" binary="$2" name archive dir
  archive="$K8S_HOME/images/$(echo "$image" | tr '/:' '__').tar"
  podman image exists "$image" && [ -f "$archive" ] && return 0
  log "building the image $image"
  dir="$(mktemp -d)"
  cp "$binary" "$dir/"
  name="$(basename "$binary")"
  printf 'FROM scratch\nCOPY %s /bin/%s\nUSER 65534:65534\nENTRYPOINT ["/bin/%s"]\n' \
    "$name" "$name" "$name" >"$dir/Containerfile"
  podman build --quiet --pull=never -t "$image" "$dir" >/dev/null
  mkdir -p "$K8S_HOME/images"
  podman save --quiet --format docker-archive -o "$archive.tmp" "$image"
  mv "$archive.tmp" "$archive"
  rm -rf "$dir"
}

install_images() {
  # shellcheck source=../../image/env.sh
  source "$REPO/deploy/image/env.sh"
  local build; build="$(mktemp -d)"
  gcc -Os -static -o "$build/pause" "$SCRIPT_DIR/pause.c"
  image_from_binary "$PAUSE_IMAGE" "$build/pause"
  rm -rf "$build"
  image_from_binary "$PROMETHEUS_IMAGE" "$PROMETHEUS_BIN/prometheus"
  image_from_binary "$CONFIG_RELOADER_IMAGE" "$OPERATOR_BIN/prometheus-config-reloader"
}

cmd_install() {
  mkdir -p "$K8S_HOME/bin"
  install_packages
  local v=$KUBERNETES_VERSION minor=${KUBERNETES_VERSION#v1.} version_flags=""
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  build_tool kubernetes "$KUBE_BIN" "$version_flags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl
  build_tool coredns "$COREDNS_BIN" "" github.com/coredns/coredns
  build_tool prometheus "$PROMETHEUS_BIN" "" github.com/prometheus/prometheus/cmd/prometheus
  build_tool prometheus-operator "$OPERATOR_BIN" "" \
    github.com/prometheus-operator/prometheus-operator/cmd/operator \
    github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader
  bash "$REPO/deploy/local/stack.sh" install >/dev/null
  install_images
  log "installed: $KUBE_BIN, $COREDNS_BIN, $PROMETHEUS_BIN, $OPERATOR_BIN"
}

# ---- certificates and kubeconfigs -----------------------------------------------------------
cert() { # name subject [extensions]
  local name="$1" subject="$2" ext="${3:-}"
  [ -f "$PKI/$name.crt" ] && return 0
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subject" \
    -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth,serverAuth" ${ext:+"$ext"} >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

kubeconfig() { # name (a client certificate of that name)
  local file="$PKI/$1.kubeconfig"
  [ -f "$file" ] && return 0
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: streams
    cluster:
      server: https://$NODE_IP:6443
      certificate-authority: $PKI/ca.crt
users:
  - name: $1
    user:
      client-certificate: $PKI/$1.crt
      client-key: $PKI/$1.key
contexts:
  - name: streams
    context: {cluster: streams, user: $1}
current-context: streams
EOF
}

write_pki() {
  mkdir -p "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl req -x509 -new -newkey rsa:2048 -nodes -days 3650 -subj "/CN=streams-k8s-ca" \
      -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  fi
  [ -f "$PKI/service-accounts.key" ] || {
    openssl genrsa -out "$PKI/service-accounts.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/service-accounts.key" -pubout -out "$PKI/service-accounts.pub" 2>/dev/null
  }
  cert apiserver "/CN=kube-apiserver" "subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE_NAME,IP:$KUBERNETES_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert admin "/O=system:masters/CN=admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "subjectAltName=DNS:$NODE_NAME,IP:$NODE_IP"
  cert kube-proxy "/CN=system:kube-proxy"
  for name in admin controller-manager scheduler kubelet kube-proxy; do kubeconfig "$name"; done
}

# ---- configuration files --------------------------------------------------------------------
write_configs() {
  mkdir -p "$CONF/cni" "$LOGS" "$RUN" "$KUBELET_DIR" "$(dirname "$CONTAINERD_SOCK")"
  cat >"$CONF/containerd.toml" <<EOF
version = 2
root = "$K8S_HOME/containerd"
state = "/run/streams-k8s/containerd"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine's root lacks CAP_SYS_RESOURCE: no process may lower its OOM score, so the
  # kubelet's scores for sandboxes (-998) and guaranteed pods are raised to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # No systemd here: cgroups are managed through the cgroup v1 file system.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CONF/cni"
EOF
  cat >"$CONF/cni/10-streams.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "streams",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
               "dataDir": "$K8S_HOME/cni-ipam"}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
  cat >"$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
# This machine mounts cgroup v1 controllers (a cgroup2 mount beside them) and runs no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
podCIDR: $POD_CIDR
# The disk is shared with everything else on the machine: evict only when it is nearly full.
evictionHard: {nodefs.available: "2%", imagefs.available: "2%", memory.available: "200Mi"}
imageGCHighThresholdPercent: 98
EOF
  cat >"$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $PKI/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
# The machine's conntrack table is left as it is.
conntrack: {maxPerCore: 0}
EOF
  cat >"$CONF/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa {
        kubeconfig $PKI/admin.kubeconfig
        pods insecure
    }
    forward . /etc/resolv.conf
}
EOF
}

# ---- processes ------------------------------------------------------------------------------
# One process of the node: its pid file $RUN/<name>.pid, its log $LOGS/<name>.log, and <name>
# in its command line (every binary's path or name holds it).
process_pid() { live_pid "$RUN/$1.pid" "$1"; }

start_process() { # name command...
  local name="$1"; shift
  process_pid "$name" >/dev/null && return 0
  spawn "$RUN/$name.pid" "$LOGS/$name.log" "$@"
}

stop_process() { # name
  local pid
  pid="$(process_pid "$1")" || return 0
  stop_pid "$1" "$pid" "$RUN/$1.pid"
}

wait_for() { # what seconds command...
  local what="$1" deadline=$((SECONDS + $2)); shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.5
  done
  log "$what"
}


kubectl() { "$KUBE_BIN/kubectl" "$@"; }

# The pods' Kafka and registry: the local stack's script on the node's address and ports of
# their own, its jars and registry binary shared with the local stack.
node_stack() {
  mkdir -p "$K8S_HOME/stack"
  local shared="${STACK_HOME:-/var/tmp/streams-stack}" item
  for item in kafka-libs bin; do
    [ -e "$K8S_HOME/stack/$item" ] || ln -s "$shared/$item" "$K8S_HOME/stack/$item"
  done
  STACK_HOME="$K8S_HOME/stack" STACK_HOST="$NODE_IP" KAFKA_PORT=$CLUSTER_KAFKA_PORT \
    KAFKA_CONTROLLER_PORT=$CLUSTER_KAFKA_CONTROLLER_PORT SCHEMA_REGISTRY_PORT=$CLUSTER_REGISTRY_PORT \
    LOG_TAG=k8s-stack bash "$REPO/deploy/local/stack.sh" "$@"
}

# The secured cluster of deploy/local/cluster.sh on the node's address: SASL_SSL brokers on
# 39192-39194, a TLS registry on 38181; <user>.flags and the users' properties under
# $K8S_HOME/stack/cluster. Started only by what needs it (the prod overlay's test).
node_secured_stack() {
  node_stack install >/dev/null
  STACK_HOME="$K8S_HOME/stack" STACK_HOST="$NODE_IP" CLUSTER_PORT=39192 CLUSTER_REGISTRY_PORT=38181 \
    CLUSTER_OIDC_PORT=38443 bash "$REPO/deploy/local/cluster.sh" "$@"
}

network_up() {
  # The bridge exists before the first pod, so the host's Kafka and CoreDNS can listen on it.
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr show dev "$BRIDGE" | grep -q "inet $NODE_IP/" || ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  modprobe br_netfilter 2>/dev/null || true
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

cmd_up() {
  [ "$(id -u)" = 0 ] || die "a kubelet needs root"
  [ -f "$KUBE_BIN/.complete" ] && [ -f "$OPERATOR_BIN/.complete" ] || cmd_install
  local started=$SECONDS
  write_pki
  write_configs
  network_up

  start_process etcd etcd --name "$NODE_NAME" --data-dir "$K8S_HOME/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
    --initial-cluster "$NODE_NAME=http://127.0.0.1:32380"
  start_process kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" --advertise-address "$NODE_IP" --secure-port 6443 \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --service-account-key-file "$PKI/service-accounts.pub" \
    --service-account-signing-key-file "$PKI/service-accounts.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --kubelet-preferred-address-types InternalIP
  wait_for "API server answers" "$K8S_UP_TIMEOUT" kubectl get --raw /readyz \
    || die_log "$LOGS/kube-apiserver.log" "the API server did not become ready"
  start_process kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$PKI/controller-manager.kubeconfig" --leader-elect=false \
    --use-service-account-credentials --service-account-private-key-file "$PKI/service-accounts.key" \
    --root-ca-file "$PKI/ca.crt" --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key"
  start_process kube-scheduler "$KUBE_BIN/kube-scheduler" --kubeconfig "$PKI/scheduler.kubeconfig" --leader-elect=false

  start_process containerd containerd --config "$CONF/containerd.toml"
  wait_for "containerd answers" 30 ctr --address "$CONTAINERD_SOCK" version \
    || die_log "$LOGS/containerd.log" "containerd did not start"
  for archive in "$K8S_HOME"/images/*.tar; do
    ctr --address "$CONTAINERD_SOCK" -n k8s.io images import "$archive" >/dev/null
  done
  start_process kubelet "$KUBE_BIN/kubelet" --config "$CONF/kubelet.yaml" --kubeconfig "$PKI/kubelet.kubeconfig" \
    --root-dir "$KUBELET_DIR" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
  start_process kube-proxy "$KUBE_BIN/kube-proxy" --config "$CONF/kube-proxy.yaml"
  start_process coredns "$COREDNS_BIN/coredns" -conf "$CONF/Corefile"

  node_stack up

  wait_for "node $NODE_NAME is Ready" "$K8S_UP_TIMEOUT" \
    kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s \
    || die_log "$LOGS/kubelet.log" "the node did not become Ready"
  apply_storage
  start_prometheus_operator
  log "up in $((SECONDS - started)) s; kubectl: source <(bash $0 env)"
}

# A StorageClass "local" (the default) and a pool of local volumes on this node: claims
# bind when their pod is scheduled, and the kubelet applies the pod's fsGroup to them.
# Volumes whose claim is gone (Released) are wiped and offered again.
apply_storage() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
  local released name
  released="$(kubectl get pv -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{"\n"}{end}')"
  for name in $released; do
    kubectl delete pv "$name" --wait=true >/dev/null
    rm -rf "${VOLUMES:?}/$name"
  done
  local i manifests=""
  for i in $(seq -w 1 "$VOLUME_COUNT"); do
    name="local-$i"
    mkdir -p "$VOLUMES/$name"
    manifests+="---
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name}
spec:
  capacity: {storage: $VOLUME_SIZE}
  accessModes: [ReadWriteOnce]
  storageClassName: local
  persistentVolumeReclaimPolicy: Retain
  local: {path: $VOLUMES/$name}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME]}]
"
  done
  printf '%s' "$manifests" | kubectl apply -f - >/dev/null
}

# The Prometheus Operator (tools/prometheus-operator), as a process of this machine with
# the admin identity: it turns Prometheus, ServiceMonitor and PrometheusRule objects into a
# Prometheus StatefulSet, its scrape configuration and its rule files, as in any cluster.
start_prometheus_operator() {
  local module
  module="$(cd "$TOOLS/prometheus-operator" && go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)"
  kubectl apply --server-side -f "$module/example/prometheus-operator-crd/" >/dev/null
  start_process prometheus-operator "$OPERATOR_BIN/operator" --apiserver "https://$NODE_IP:6443" \
    --ca-file "$PKI/ca.crt" --cert-file "$PKI/admin.crt" --key-file "$PKI/admin.key" \
    --prometheus-config-reloader "$CONFIG_RELOADER_IMAGE" --web.listen-address 127.0.0.1:38080 \
    --kubelet-service "" --cluster-domain cluster.local
}

cmd_load_image() {
  local image="${1:?usage: cluster.sh load-image IMAGE}" archive
  # shellcheck source=../../image/env.sh
  source "$REPO/deploy/image/env.sh"
  archive="$(mktemp "$K8S_HOME/image.XXXXXX.tar")"
  podman save --quiet --format docker-archive -o "$archive" "$image"
  ctr --address "$CONTAINERD_SOCK" -n k8s.io images import "$archive" >/dev/null
  rm -f "$archive"
  log "loaded $image into the node's containerd"
}

# Pods' containers live on in their shims after the kubelet stops: stop them and unmount
# what the kubelet mounted, so `down` leaves nothing running and `clean` can delete it all.
stop_pods() {
  if process_pid containerd >/dev/null; then
    local id
    for id in $(ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks list -q 2>/dev/null); do
      ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
  fi
  pkill -KILL -f "containerd-shim-runc-v2 -namespace k8s.io" 2>/dev/null || true
  grep -oE " ($KUBELET_DIR|/run/streams-k8s)(/[^ ]*)?" /proc/mounts | sort -r | while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done
}

cmd_down() {
  node_secured_stack down >/dev/null 2>&1 || true
  node_stack down >/dev/null 2>&1 || true
  for name in prometheus-operator coredns kube-proxy kubelet; do stop_process "$name"; done
  stop_pods
  for name in containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_process "$name"; done
  log "down"
}

cmd_clean() {
  cmd_down
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$PKI" "$CONF" "$K8S_HOME/etcd" "$K8S_HOME/containerd" "$KUBELET_DIR" "$VOLUMES" \
    "$K8S_HOME/cni-ipam" "$K8S_HOME/stack" "$LOGS" "$RUN" /run/streams-k8s
  log "cleaned (binaries kept in $K8S_HOME/bin)"
}

cmd_status() {
  local name
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy \
      coredns prometheus-operator; do
    if pid="$(process_pid "$name")"; then printf '%-24s running (pid %s)\n' "$name" "$pid"
    else printf '%-24s stopped\n' "$name"; fi
  done
  [ -f "$KUBE_BIN/kubectl" ] && kubectl get nodes 2>/dev/null || true
}

cmd_env() {
  echo "export K8S_HOME=$K8S_HOME KUBECONFIG=$PKI/admin.kubeconfig"
  echo "export PATH=$KUBE_BIN:\$PATH"
}

case "${1:-}" in
  install) cmd_install ;;
  up) cmd_up ;;
  down) cmd_down ;;
  clean) cmd_clean ;;
  status) cmd_status ;;
  load-image) shift; cmd_load_image "$@" ;;
  env) cmd_env ;;
  volumes) apply_storage ;;
  stack) shift; node_stack "$@" ;;
  secured-stack) shift; node_secured_stack "$@" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
