#!/usr/bin/env bash
# `make k8s-test`: deploy/k8s applied with `kubectl apply -k` to the single-node cluster of
# cluster.sh, and what a team does with it on day one and day two, checked:
#
#   1. the dev overlay (overlays/dev here: queries and monitoring added) comes up, and the
#      example data of tests/fixtures goes in, one part before each step below; sessionizer's
#      is generated (3,000 users on two partitions) and its expected sessions computed;
#   2. day two, each step timed until every pod is ready again: scale 1 -> 2, a pod deleted
#      with --force --grace-period=0, `kubectl rollout restart`, an image change, scale
#      2 -> 3 -> 2, and a node drain that the PodDisruptionBudgets hold up;
#   3. every service's output read back from its topic: exact;
#   4. interactive queries from another pod through the headless Services, answered by the
#      pod that owns the key whichever pod is asked (forwarded by its DNS name);
#   5. Prometheus, run by the Prometheus Operator from the ServiceMonitor and PrometheusRule,
#      scraping every pod; one service stopped (scaled to 0) fires StreamsServiceAbsent,
#      which resolves once it is back;
#   6. the prod overlay (three instances per service, SASL_SSL with each service's own user
#      and ACLs) against the secured cluster: exact output, every pod scraped.
#
# Each run starts from nothing: the namespaces, the cluster's Kafka data and the volumes are
# wiped first. What the run made stays up afterwards, for a look (`make k8s-down` stops it).
# The step times go to $K8S_TEST_RESULTS (default: a file in the work dir).
set -euo pipefail
cd "$(dirname "$0")/../../.."
REPO="$PWD"
CLUSTER=(bash deploy/k8s/cluster/cluster.sh)
eval "$("${CLUSTER[@]}" env)"
NS=streams-dev
# SERVICES: the services of deploy/k8s/services.toml, which the overlays deploy.
source deploy/services.sh
IMAGE=localhost/streams-services:latest
# The same image under another name: changing a StatefulSet's image to it is an image change.
NEXT_IMAGE=localhost/streams-services:k8s-test-next
BIN_DIR="${CARGO_TARGET_DIR:-target}/debug"
STREAMCTL="$BIN_DIR/streamctl"
WAIT_READY_TIMEOUT=300

work="$(mktemp -d "${TMPDIR:-/tmp}/k8s-test.XXXXXX")"
results="${K8S_TEST_RESULTS:-$work/steps.tsv}"
step() { printf '[k8s-test] %s\n' "$*"; }
fail() { printf '[k8s-test] FAILED: %s (work dir %s)\n' "$*" "$work" >&2; exit 1; }
on_exit() {
  local status=$?
  if [ "$status" != 0 ]; then
    kubectl -n "$NS" get pods -o wide >&2 2>/dev/null || true
    kubectl -n "$NS" get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 30 >&2 || true
  fi
}
trap on_exit EXIT

# The dev overlay's Kafka and registry; the prod overlay's are the secured cluster's.
STREAMCTL_CONNECTION=(--bootstrap-servers 10.244.0.1:39092 --schema-registry-url http://10.244.0.1:38081)
streamctl() { "$STREAMCTL" "${STREAMCTL_CONNECTION[@]}" "$@" 2>>"$work/streamctl.log"; }
EXAMPLE_REPO="$REPO"
# shellcheck source=../../local/example-data.sh
source deploy/local/example-data.sh
# sessionizer gets more than its fixture: 3,000 generated users' events on two partitions, so
# that its tasks move between pods at each step, and the sessions the model expects of them.
SESSIONS_DATASET="$BIN_DIR/sessions-dataset"

# The input topics (the defaults `<service> describe` lists) of a service that the example
# data gives no input, created empty, so that its pods start and become ready; its output
# is not checked. Run after example_create_topics.
create_inputs_without_example_data() {
  local i service inputs topic fed=" "
  for ((i = 0; i < ${#EXAMPLE_INPUTS[@]}; i += 3)); do fed+="${EXAMPLE_INPUTS[i]} "; done
  for service in "${SERVICES[@]}"; do
    inputs="$("$BIN_DIR/$service" describe --format json | python3 -c '
import json, sys
stages = json.load(sys.stdin)["stages"]
print(" ".join(dict.fromkeys(s["topic"] for st in stages for s in st["sources"] if not s["internal"])))')"
    for topic in $inputs; do
      [[ "$fed" == *" $topic "* ]] && continue
      step "$service: no example data for its input $topic (deploy/local/example-data.sh): created empty, its output not checked"
      streamctl topics create "$topic" --partitions 1 >/dev/null
    done
  done
}

# ---- readiness ------------------------------------------------------------------------------
# Every StatefulSet at its replicas, all of them ready, updated and on its current revision,
# and no pod of the services terminating. `kubectl rollout status` alone may read a status
# that the controller has not yet updated after a force delete.
all_ready() {
  kubectl -n "$NS" get statefulsets,pods -l app.kubernetes.io/part-of=streams-services -o json \
    | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
sets = [i for i in items if i["kind"] == "StatefulSet"]
pods = [i for i in items if i["kind"] == "Pod"]
def ready(p):
    return not p["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
ok = len(sets) == int(sys.argv[1]) and all(
    s["status"].get("readyReplicas", 0) == s["spec"]["replicas"]
    and s["status"].get("updatedReplicas", 0) == s["spec"]["replicas"]
    and s["status"].get("currentRevision") == s["status"].get("updateRevision")
    and s["status"].get("observedGeneration") == s["metadata"]["generation"]
    for s in sets)
ok = ok and len(pods) == sum(s["spec"]["replicas"] for s in sets) and all(ready(p) for p in pods)
sys.exit(0 if ok else 1)' "${#SERVICES[@]}"
}

# The pods the StatefulSets of $NS ask for: their replicas, summed.
pod_count() {
  kubectl -n "$NS" get statefulsets -l app.kubernetes.io/part-of=streams-services \
    -o jsonpath='{range .items[*]}{.spec.replicas}{"\n"}{end}' | awk '{ sum += $1 } END { print sum + 0 }'
}

wait_ready() {
  local deadline=$((SECONDS + WAIT_READY_TIMEOUT))
  sleep 2
  until all_ready; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the services were not all ready within ${WAIT_READY_TIMEOUT}s"
    sleep 1
  done
}

# ---- the example data in parts --------------------------------------------------------------
PARTS=8
split_inputs() {
  local i
  for ((i = 0; i < ${#EXAMPLE_INPUTS[@]}; i += 3)); do
    python3 - "$(in_repo "${EXAMPLE_INPUTS[i + 2]}" "$REPO")" "$work/parts/${EXAMPLE_INPUTS[i]}" "$PARTS" <<'PY'
import sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
parts = int(sys.argv[3])
for n in range(parts):
    with open(f"{sys.argv[2]}.{n + 1}", "w") as f:
        f.writelines(lines[len(lines) * n // parts:len(lines) * (n + 1) // parts])
PY
  done
}
part=0
produce_next_part() {
  local i
  part=$((part + 1))
  for ((i = 0; i < ${#EXAMPLE_INPUTS[@]}; i += 3)); do
    [ -s "$work/parts/${EXAMPLE_INPUTS[i]}.$part" ] \
      && example_produce "${EXAMPLE_INPUTS[i]}" "$work/parts/${EXAMPLE_INPUTS[i]}.$part"
  done
  return 0
}

# A day-two step: the command, the next part of the input while it takes effect, then the
# time until every pod is ready again.
timed_step() { # name command...
  local name="$1" started=$SECONDS; shift
  step "$name"
  "$@" >>"$work/steps.log" 2>&1
  produce_next_part
  wait_ready
  printf '%s\t%s\n' "$name" "$((SECONDS - started))" | tee -a "$results"
}

each_service() { # command... (the service's name is appended)
  local service
  for service in "${SERVICES[@]}"; do "$@" "$service"; done
}
scale() { local service="$2"; kubectl -n "$NS" scale "statefulset/$service" --replicas "$1"; }
rebalances_of_pod_1() { # service: "<service> <assignments received by <service>-1>"
  local ip
  ip="$(kubectl -n "$NS" get pod "$1-1" -o jsonpath='{.status.podIP}')"
  printf '%s %s ' "$1" "$(curl -sf -m 5 "http://$ip:9090/metrics" \
    | awk '/^streams_rebalances_total/ { sum += $NF } END { print sum + 0 }')"
}
force_delete() { kubectl -n "$NS" delete pod "$1-0" --force --grace-period=0; }
restart() { kubectl -n "$NS" rollout restart "statefulset/$1"; }
change_image() { kubectl -n "$NS" set image "statefulset/$1" "$1=$NEXT_IMAGE"; }

# The node is drained with the services at 2 replicas and maxUnavailable 1: one pod of each
# is evicted, and the second eviction is refused while the first is down (on one node it
# cannot come back until the node is uncordoned). The drain must report exactly that.
drain_against_budgets() {
  local out="$work/drain.log"
  if kubectl drain streams-node --ignore-daemonsets --delete-emptydir-data --timeout 40s \
      --pod-selector app.kubernetes.io/part-of=streams-services >"$out" 2>&1; then
    kubectl uncordon streams-node
    fail "the drain evicted every pod: the PodDisruptionBudgets did not hold (log $out)"
  fi
  kubectl uncordon streams-node
  local evicted refused
  evicted=$(grep -c 'evicted$' "$out" || true)
  refused=$(grep -c 'violate the pod.s disruption budget' "$out" || true)
  [ "$evicted" = "${#SERVICES[@]}" ] || fail "the drain evicted $evicted pods, not one per service (log $out)"
  [ "$refused" -gt 0 ] || fail "no eviction was refused for a disruption budget (log $out)"
  echo "drain: $evicted pods evicted, $refused evictions refused by the budgets"
}

# ---- start from nothing ---------------------------------------------------------------------
[ -x "$STREAMCTL" ] && [ -x "$SESSIONS_DATASET" ] || fail "no $STREAMCTL or $SESSIONS_DATASET: run make build"
"${CLUSTER[@]}" up
"${CLUSTER[@]}" load-image "$IMAGE"
source deploy/image/env.sh
podman tag "$IMAGE" "$NEXT_IMAGE"
"${CLUSTER[@]}" load-image "$NEXT_IMAGE"

step "wiping the previous run: namespaces streams-dev and streams, the cluster's Kafka, the volumes"
# The prod overlay of a previous run too: its embed-batcher would hide dev's absence below.
kubectl delete namespace streams-dev streams --ignore-not-found --wait --timeout 180s >/dev/null
"${CLUSTER[@]}" secured-stack down >/dev/null
kubectl delete -f deploy/k8s/cluster/monitoring/prometheus.yaml --ignore-not-found --wait --timeout 180s >/dev/null
"${CLUSTER[@]}" stack clean >/dev/null
"${CLUSTER[@]}" stack up >/dev/null
"${CLUSTER[@]}" volumes
"$SESSIONS_DATASET" "$work/user-events.jsonl" "$work/user-sessions.expected.jsonl"
example_replace user-events 2 "$work/user-events.jsonl" user-sessions "$work/user-sessions.expected.jsonl"
mkdir -p "$work/parts"
split_inputs
example_create_topics
create_inputs_without_example_data

printf 'step\tseconds\n' >"$results"
step "applying deploy/k8s/cluster/overlays/dev (the dev overlay, with queries and monitoring)"
started=$SECONDS
kubectl apply -f deploy/k8s/overlays/dev/namespace.yaml >/dev/null
for service in "${SERVICES[@]}"; do
  kubectl -n "$NS" create secret generic "$service-query-token" \
    --from-literal "token=$(openssl rand -hex 24)" >/dev/null
done
kubectl apply -k deploy/k8s/cluster/overlays/dev >"$work/apply.log"
kubectl apply -f deploy/k8s/cluster/monitoring/prometheus.yaml >>"$work/apply.log"
produce_next_part
wait_ready
printf 'apply the dev overlay\t%s\n' "$((SECONDS - started))" | tee -a "$results"
# The namespace enforces Pod Security "restricted": the services' pods passed it, and a pod
# that asks for more is refused.
if kubectl -n "$NS" run pod-security-probe --image "$IMAGE" --image-pull-policy Never \
    --restart Never --privileged --command -- true >"$work/pod-security.log" 2>&1; then
  fail "a privileged pod was admitted to $NS"
fi
grep -q 'violates PodSecurity "restricted' "$work/pod-security.log" \
  || fail "the privileged pod was refused, but not by Pod Security: $(cat "$work/pod-security.log")"

# ---- day two ----------------------------------------------------------------------------------
timed_step "scale 1 -> 2" each_service scale 2
# Static membership (INSTANCE_ID, the pod's name): a pod that is back within
# session.timeout.ms gets its partitions again without a rebalance, so the other pod of each
# service receives no new assignment.
survivors_before="$(each_service rebalances_of_pod_1)"
timed_step "delete pod -0 with --force --grace-period=0" each_service force_delete
survivors_after="$(each_service rebalances_of_pod_1)"
[ "$survivors_before" = "$survivors_after" ] \
  || fail "pod -0's return rebalanced the others (assignments received by each -1, before: $survivors_before; after: $survivors_after)"
timed_step "rollout restart" each_service restart
timed_step "image change" each_service change_image
timed_step "scale 2 -> 3" each_service scale 3
timed_step "scale 3 -> 2" each_service scale 2
timed_step "drain the node (budgets hold it up), uncordon" drain_against_budgets
[ "$part" = "$PARTS" ] || fail "produced $part parts of $PARTS"

step "reading every output topic back"
example_check_all "$work" "$REPO" || fail "an output differs from what the example data should give"

# ---- interactive queries through the headless Services -----------------------------------------
# A client pod (labelled as the NetworkPolicies let in) asks each window-aggregator pod over
# HTTP by its DNS name, with the service's token: every answer comes from the one pod that
# owns the single partition, so the other pod has forwarded the query to it by its name.
step "interactive queries from another pod"
kubectl -n "$NS" run query-client --image "$IMAGE" --image-pull-policy Never --restart Never \
  --labels streams.example/query-client=true \
  --overrides '{"spec":{"securityContext":{"runAsNonRoot":true,"runAsUser":10001,"seccompProfile":{"type":"RuntimeDefault"}},"containers":[{"name":"query-client","image":"'"$IMAGE"'","imagePullPolicy":"Never","command":["sleep","infinity"],"securityContext":{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}}]}}' \
  >/dev/null
kubectl -n "$NS" wait --for condition=Ready pod/query-client --timeout 120s >/dev/null
token="$(kubectl -n "$NS" get secret window-aggregator-query-token -o jsonpath='{.data.token}' | base64 -d)"
query() { # pod path: the body of GET path, asked of pod.window-aggregator
  kubectl -n "$NS" exec query-client -- bash -c '
    exec 3<>"/dev/tcp/$1.window-aggregator/8090"
    printf "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" "$2" "$1" "$3" >&3
    cat <&3' query "$1" "$2" "$token" | tr -d '\r' | sed '1,/^$/d'
}
servers=""
for pod in window-aggregator-0 window-aggregator-1; do
  query "$pod" "/stores/final/open-windows/range?limit=5" >"$work/query-$pod.json"
  servers+="$(python3 -c '
import json, sys
answer = json.load(open(sys.argv[1]))
print(",".join(sorted({p["served_by"]["instance"] for p in answer["partitions"]})))' "$work/query-$pod.json") "
done
read -r first second <<<"$servers"
[ -n "$first" ] && [ "$first" = "$second" ] \
  || fail "the two pods' answers came from '$first' and '$second', not from the one owner (see $work/query-*.json)"
echo "queries: both pods answered, each time from $first"

# ---- Prometheus, from the ServiceMonitor and the PrometheusRule ---------------------------------
prometheus_api() { # path [PromQL expression, for /api/v1/query]
  local ip
  ip="$(kubectl -n monitoring get pod prometheus-streams-0 -o jsonpath='{.status.podIP}')"
  curl -sf -m 10 -G "http://$ip:9090$1" ${2:+--data-urlencode "query=$2"}
}
# Succeeds when the expression's single value is $2.
prometheus_value_is() { # expression value
  prometheus_api /api/v1/query "$1" | python3 -c '
import json, sys
try:
    result = json.load(sys.stdin)["data"]["result"]
except ValueError:  # no answer yet
    sys.exit(1)
sys.exit(not result or result[0]["value"][1] != sys.argv[1])' "$2"
}
step "Prometheus: every pod scraped, the rules loaded"
kubectl -n monitoring wait --for condition=Ready pod/prometheus-streams-0 --timeout 180s >/dev/null
deadline=$((SECONDS + 180))
pods="$(pod_count)"
until prometheus_value_is 'count(up{job="streams-services",namespace="streams-dev"} == 1)' "$pods"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "Prometheus does not scrape the $pods pods (targets: $(prometheus_api /api/v1/targets | head -c 2000))"
  sleep 5
done
prometheus_api /api/v1/rules | python3 -c '
import json, sys
groups = json.load(sys.stdin)["data"]["groups"]
alerts = {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
print(f"rules: {len(alerts)} alerts loaded")
sys.exit("StreamsServiceAbsent" not in alerts or len(alerts) < 10)' || fail "the PrometheusRule's alerts are not loaded"

alert_state() { # alertname service: firing, pending or nothing
  prometheus_api /api/v1/alerts | python3 -c '
import json, sys
for a in json.load(sys.stdin)["data"]["alerts"]:
    if a["labels"]["alertname"] == sys.argv[1] and a["labels"].get("service") == sys.argv[2]:
        print(a["state"])' "$1" "$2"
}
wait_alert() { # alertname service state-or-empty timeout
  local deadline=$((SECONDS + $4))
  until [ "$(alert_state "$1" "$2")" = "$3" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$1 for $2 not '$3' within $4 s"
    sleep 10
  done
}
step "embed-batcher stopped: StreamsServiceAbsent must fire (after its 10 minutes), then resolve"
started=$SECONDS
kubectl -n "$NS" scale statefulset/embed-batcher --replicas 0 >/dev/null
wait_alert StreamsServiceAbsent embed-batcher firing 900
printf 'StreamsServiceAbsent firing after the service stopped\t%s\n' "$((SECONDS - started))" | tee -a "$results"
started=$SECONDS
kubectl -n "$NS" scale statefulset/embed-batcher --replicas 2 >/dev/null
wait_alert StreamsServiceAbsent embed-batcher "" 300
printf 'StreamsServiceAbsent resolved after it returned\t%s\n' "$((SECONDS - started))" | tee -a "$results"

# ---- the prod overlay ---------------------------------------------------------------------------
step "the prod overlay against the secured cluster (dev's namespace deleted first)"
kubectl delete namespace "$NS" --wait --timeout 180s >/dev/null
NS=streams
"${CLUSTER[@]}" volumes
"${CLUSTER[@]}" secured-stack clean >/dev/null
"${CLUSTER[@]}" secured-stack up >"$work/secured-stack.log"
secured="$K8S_HOME/stack/cluster"
# The admin's flags for streamctl (topics, the example data, reading results back).
mapfile -t STREAMCTL_CONNECTION < <(tr ' ' '\n' <"$secured/admin.flags")
example_create_topics
create_inputs_without_example_data
started=$SECONDS
kubectl apply -f deploy/k8s/overlays/prod/namespace.yaml >/dev/null
# Each service's own user: its properties with the CA's path as mounted in the pod.
for service in "${SERVICES[@]}"; do
  mkdir -p "$work/prod/$service"
  sed -e 's#^ssl.ca.location=.*#ssl.ca.location=/etc/streams/kafka/ca.pem#' \
      -e 's#^schema.registry.ssl.ca.location=.*#schema.registry.ssl.ca.location=/etc/streams/kafka/ca.pem#' \
      "$secured/secrets/$service.properties" >"$work/prod/$service/client.properties"
  kubectl -n "$NS" create secret generic "$service-kafka-credentials" \
    --from-file "$work/prod/$service/client.properties" --from-file "ca.pem=$secured/tls/ca.pem" >/dev/null
done
kubectl apply -k deploy/k8s/cluster/overlays/prod >"$work/apply-prod.log"
example_produce_all
wait_ready
pods="$(pod_count)"
printf 'apply the prod overlay (%s pods)\t%s\n' "$pods" "$((SECONDS - started))" | tee -a "$results"
example_check_all "$work" "$REPO" || fail "an output of the prod overlay differs"
deadline=$((SECONDS + 180))
until prometheus_value_is 'count(up{job="streams-services",namespace="streams"} == 1)' "$pods"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "Prometheus does not scrape the $pods pods of the prod overlay"
  sleep 5
done
echo "prometheus: the $pods pods of the prod overlay are scraped"

step "passed; step times in $results"
column -t -s $'\t' "$results"
