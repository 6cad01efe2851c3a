#!/usr/bin/env bash
# Local dev stack without Docker: single-node Kafka (KRaft) + AxonOps Schema Registry.
#
#   stack.sh install   fetch Kafka jars (Maven) and build the registry binary (Go), if missing
#   stack.sh up        start both (idempotent), wait until they answer, print elapsed time
#   stack.sh down      stop what `up` started (pid files), keep Kafka data
#   stack.sh status    running/stopped + whether each port answers (always exits 0)
#   stack.sh clean     down + delete Kafka data, logs and registry config (keeps jars/binary)
#   stack.sh restart-kafka  stop and start the broker only (data kept)
#
# Env: STACK_HOME (/var/tmp/streams-stack), STACK_HOST (127.0.0.1, the address both listen on
#      and Kafka advertises), KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT (9093),
#      SCHEMA_REGISTRY_PORT (8081), KAFKA_HEAP_OPTS (-Xms256m -Xmx1g), STACK_WIPE=1 (fresh
#      cluster on up), STACK_UP_TIMEOUT (90 s), STACK_STOP_TIMEOUT (15 s).
# See docs/local-stack.md.
set -euo pipefail

# ---- settings -------------------------------------------------------------------------------
# Outside the repo on purpose: survives clean clones, and CI on the same machine reuses the cache.
STACK_HOME="${STACK_HOME:-/var/tmp/streams-stack}"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
SCHEMA_REGISTRY_PORT="${SCHEMA_REGISTRY_PORT:-8081}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
STACK_UP_TIMEOUT="${STACK_UP_TIMEOUT:-90}"
STACK_STOP_TIMEOUT="${STACK_STOP_TIMEOUT:-15}"
HOST="${STACK_HOST:-127.0.0.1}"

# Pinned registry version. v0.2.1 is the release the Go module proxy serves (newer tags are not
# available through it); bump here and `install` rebuilds.
REGISTRY_MODULE=github.com/axonops/axonops-schema-registry
REGISTRY_VERSION=v0.2.1

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_POM="$SCRIPT_DIR/kafka/pom.xml"

LIBS="$STACK_HOME/kafka-libs"
BIN="$STACK_HOME/bin"
REGISTRY_BIN="$BIN/schema-registry"
KAFKA_DIR="$STACK_HOME/kafka"          # generated configs
KAFKA_DATA="$STACK_HOME/kafka/data"    # log.dirs + KRaft metadata log
REGISTRY_DIR="$STACK_HOME/registry"    # generated config
LOGS="$STACK_HOME/logs"
RUN="$STACK_HOME/run"                  # pid files
KAFKA_LOG="$LOGS/kafka.log"
REGISTRY_LOG="$LOGS/schema-registry.log"
KAFKA_PID="$RUN/kafka.pid"
REGISTRY_PID="$RUN/schema-registry.pid"

LOG_TAG="${LOG_TAG:-stack}"
log() { printf '[%s] %s\n' "$LOG_TAG" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }
# For startup failures: show the end of the log so CI output alone explains what went wrong.
die_log() {
  local file="$1"; shift
  if [ -f "$file" ]; then
    printf '[%s] ---- last lines of %s ----\n' "$LOG_TAG" "$file" >&2
    tail -n 25 "$file" >&2
    printf '[%s] ----\n' "$LOG_TAG" >&2
  fi
  die "$* (log: $file; anything still running can be stopped with 'stack.sh down')"
}

now_ms() { date +%s%3N; }

# ---- toolchain lookup -----------------------------------------------------------------------
need_java() {
  command -v java >/dev/null 2>&1 || die "java not found on PATH (Kafka 4.x needs Java 17+)."
}

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else die "go not found (PATH or /usr/local/go/bin); it is needed once to build the schema registry."
  fi
}

# ---- install --------------------------------------------------------------------------------
install_kafka() {
  # Stamp = hash of the pom: editing the pom (e.g. a version bump) triggers a re-fetch.
  local want have=""
  want="$(sha256sum "$KAFKA_POM" | cut -d' ' -f1)"
  [ -f "$LIBS/.pom.sha256" ] && have="$(cat "$LIBS/.pom.sha256")"
  if [ "$want" = "$have" ] && compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH; it is needed once to fetch the Kafka jars."
  log "fetching Kafka jars with Maven into $LIBS"
  # Copy into a temp dir and swap, so an interrupted fetch never leaves a half-filled cache.
  local tmp="$LIBS.tmp.$$"
  rm -rf "$tmp"
  # Output goes to a file and is shown only on failure (Maven's -q still prints ANSI noise).
  local mvnlog="$STACK_HOME/maven-fetch.log"
  if ! mvn -q -B -f "$KAFKA_POM" dependency:copy-dependencies \
         -DincludeScope=runtime -DoutputDirectory="$tmp" >"$mvnlog" 2>&1; then
    cat "$mvnlog" >&2; rm -rf "$tmp"
    die "Maven could not fetch the Kafka jars (log: $mvnlog)."
  fi
  echo "$want" > "$tmp/.pom.sha256"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  local jars=("$LIBS"/*.jar)
  log "Kafka jars: ${#jars[@]} files ($(basename "$LIBS"/kafka_2.13-*.jar))"
}

install_registry() {
  if [ -x "$REGISTRY_BIN" ] && "$REGISTRY_BIN" -version 2>/dev/null | grep -q " $REGISTRY_VERSION "; then
    return 0
  fi
  local go
  go="$(find_go)"
  log "building AxonOps Schema Registry $REGISTRY_VERSION into $BIN (first time ~1-2 min)"
  # Not `go install pkg@version`: that also lists all versions to check deprecation, and the module
  # proxy answers 403 for this module's version list. Downloading the pinned version and building
  # it in its own module (its go.mod/go.sum, read-only) is equivalent and avoids that lookup.
  local dir
  dir="$(cd /tmp && GOFLAGS='' "$go" mod download -json "$REGISTRY_MODULE@$REGISTRY_VERSION" \
          | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    die "go mod download $REGISTRY_MODULE@$REGISTRY_VERSION failed."
  fi
  mkdir -p "$BIN"
  (cd "$dir" && GOFLAGS=-mod=readonly CGO_ENABLED=0 "$go" build -trimpath \
      -ldflags "-s -w -X main.version=$REGISTRY_VERSION" -o "$REGISTRY_BIN.tmp" ./cmd/schema-registry) \
    || die "building the schema registry failed (see output above)."
  mv "$REGISTRY_BIN.tmp" "$REGISTRY_BIN"
  log "registry: $("$REGISTRY_BIN" -version)"
}

cmd_install() {
  mkdir -p "$STACK_HOME"
  install_kafka
  install_registry
  log "installed: jars in $LIBS, registry at $REGISTRY_BIN"
}

# ---- process helpers ------------------------------------------------------------------------
# Prints the pid if the pid file points at a live process whose command line contains $2
# (guards against a recycled pid belonging to something else); removes stale pid files.
live_pid() {
  local file="$1" marker="$2" pid
  [ -f "$file" ] || return 1
  pid="$(cat "$file" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
     && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$marker"; then
    echo "$pid"; return 0
  fi
  rm -f "$file"
  return 1
}
kafka_pid()    { live_pid "$KAFKA_PID" kafka.Kafka; }
registry_pid() { live_pid "$REGISTRY_PID" "$REGISTRY_BIN"; }

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# Start "$@" detached (own session, so Ctrl-C in the caller's terminal does not reach it) with
# output appended to $2; the child writes its own pid before exec'ing, so the pid is exact.
# fd 9 (the stack lock) is closed so the long-running process does not keep holding the lock.
spawn() {
  local pidfile="$1" logfile="$2"; shift 2
  # shellcheck disable=SC2016 # $$ and $@ are meant for the inner bash
  setsid nohup bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" >>"$logfile" 2>&1 </dev/null 9>&- &
  local tries=50
  while [ "$tries" -gt 0 ]; do [ -s "$pidfile" ] && return 0; sleep 0.1; tries=$((tries - 1)); done
  die_log "$logfile" "process did not start"
}

stop_pid() {
  local name="$1" pid="$2" pidfile="$3" waited=0
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((STACK_STOP_TIMEOUT * 10)) ]; then
      log "$name did not exit after ${STACK_STOP_TIMEOUT}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      # Gone, its ports free, before a start (restart-kafka) checks them.
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
      break
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  rm -f "$pidfile"
}

# Runs a class from the Kafka jars (tools, storage tool) with a quiet console logger.
kafka_java() {
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$KAFKA_DIR/tools-log4j2.properties" -cp "$LIBS/*" "$@"
}

# ---- Kafka ----------------------------------------------------------------------------------
write_kafka_config() {
  mkdir -p "$KAFKA_DIR" "$KAFKA_DATA" "$LOGS" "$RUN"
  # Regenerated on every up, so port/env changes apply without wiping data.
  cat > "$KAFKA_DIR/server.properties" <<EOF
# Generated by deploy/local/stack.sh - edits are overwritten on the next 'up'.
# Single node: one process is both KRaft controller and broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DATA

# Everything internal must fit on one broker (defaults assume 3), or consumer groups,
# transactions (exactly-once streams) and share groups fail to initialise.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1

# Dev ergonomics: no 3 s wait before the first rebalance; topics appear on first use.
group.initial.rebalance.delay.ms=0
num.partitions=1
auto.create.topics.enable=true
EOF

  write_kafka_logging
}

# log4j2 files of the broker (logs to stdout, captured into its log file; the chatty
# per-request loggers stay quiet) and of the CLI tools (warnings only, to stderr, so their
# stdout stays machine-readable); the secured cluster (cluster.sh) uses them too.
write_kafka_logging() {
  mkdir -p "$KAFKA_DIR"
  cat > "$KAFKA_DIR/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.statechange.name = state.change.logger
logger.statechange.level = warn
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = warn
EOF

  cat > "$KAFKA_DIR/tools-log4j2.properties" <<'EOF'
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
EOF
}

# KRaft needs its storage formatted with a cluster id once; meta.properties marks it done.
format_kafka_storage() {
  [ -f "$KAFKA_DATA/meta.properties" ] && return 0
  # Cluster id = 16 random bytes, base64url without padding (what `kafka-storage random-uuid`
  # prints); done in shell to save a JVM start. A leading '-' would look like a CLI flag.
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    case "$id" in -*) ;; *) break ;; esac
  done
  log "formatting Kafka storage (cluster id $id)"
  kafka_java kafka.tools.StorageTool format -t "$id" -c "$KAFKA_DIR/server.properties" \
    >>"$KAFKA_LOG" 2>&1 || die_log "$KAFKA_LOG" "Kafka storage format failed"
}

start_kafka() {
  if port_open "$KAFKA_PORT" || port_open "$KAFKA_CONTROLLER_PORT"; then
    die "port $KAFKA_PORT or $KAFKA_CONTROLLER_PORT is already in use by a process this script did not start."
  fi
  write_kafka_config
  if [ "${STACK_WIPE:-0}" = 1 ]; then
    log "STACK_WIPE=1: deleting Kafka data in $KAFKA_DATA"
    rm -rf "$KAFKA_DATA"; mkdir -p "$KAFKA_DATA"
  fi
  # One log per run; the previous one is kept for post-mortems.
  [ -f "$KAFKA_LOG" ] && mv -f "$KAFKA_LOG" "$KAFKA_LOG.prev"
  format_kafka_storage
  log "starting Kafka on $HOST:$KAFKA_PORT (controller $HOST:$KAFKA_CONTROLLER_PORT), log: $KAFKA_LOG"
  # shellcheck disable=SC2086 # KAFKA_HEAP_OPTS is a list of JVM flags
  spawn "$KAFKA_PID" "$KAFKA_LOG" java $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
    -cp "$LIBS/*" kafka.Kafka "$KAFKA_DIR/server.properties"
}

# Healthy = the broker answers a real metadata request (listing topics via the Admin client).
kafka_answers() {
  local secs="${1:-10}"
  timeout "$secs" java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$KAFKA_DIR/tools-log4j2.properties" -cp "$LIBS/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$HOST:$KAFKA_PORT" --list \
    >/dev/null 2>&1
}

# ---- Schema registry ------------------------------------------------------------------------
write_registry_config() {
  mkdir -p "$REGISTRY_DIR" "$LOGS" "$RUN"
  cat > "$REGISTRY_DIR/config.yaml" <<EOF
# Generated by deploy/local/stack.sh - edits are overwritten on the next 'up'.
server:
  host: "$HOST"
  port: $SCHEMA_REGISTRY_PORT
# In-memory: nothing to run besides the binary. Schemas are lost when the registry stops.
storage:
  type: memory
# Same default as Confluent Schema Registry.
compatibility:
  default_level: BACKWARD
logging:
  level: info
  format: json
# No auth block: authentication is disabled by default.
EOF
}

start_registry() {
  port_open "$SCHEMA_REGISTRY_PORT" \
    && die "port $SCHEMA_REGISTRY_PORT is already in use by a process this script did not start."
  write_registry_config
  [ -f "$REGISTRY_LOG" ] && mv -f "$REGISTRY_LOG" "$REGISTRY_LOG.prev"
  log "starting schema registry on http://$HOST:$SCHEMA_REGISTRY_PORT (in-memory), log: $REGISTRY_LOG"
  spawn_registry
}

# Starts the registry on its generated config. The registry lets any SCHEMA_REGISTRY_* env var
# (PORT, HOST, STORAGE_TYPE, AUTH_TYPE, ...) override its config file; they are all dropped so
# only the generated config applies, except the ones named as arguments, which the caller has
# exported (a secret passes so, never in argv).
spawn_registry() {
  local unset_env=() v
  for v in $(compgen -e); do
    case "$v" in
      SCHEMA_REGISTRY_*) [[ " $* " == *" $v "* ]] || unset_env+=(-u "$v") ;;
    esac
  done
  spawn "$REGISTRY_PID" "$REGISTRY_LOG" env "${unset_env[@]}" \
    "$REGISTRY_BIN" -config "$REGISTRY_DIR/config.yaml"
}

registry_answers() {
  curl -sf -m 2 -o /dev/null "http://$HOST:$SCHEMA_REGISTRY_PORT/subjects"
}

# ---- commands -------------------------------------------------------------------------------
cmd_up() {
  need_java
  command -v curl >/dev/null 2>&1 || die "curl not found on PATH (used for the registry health check)."
  local t0 deadline
  t0="$(now_ms)"

  if kafka_pid >/dev/null && registry_pid >/dev/null && [ "${STACK_WIPE:-0}" != 1 ] \
     && registry_answers && kafka_answers 15; then
    log "already running and healthy: Kafka $HOST:$KAFKA_PORT, registry http://$HOST:$SCHEMA_REGISTRY_PORT"
    return 0
  fi
  # A wipe needs a stopped broker; restart the registry too so both start empty and consistent.
  if [ "${STACK_WIPE:-0}" = 1 ]; then
    cmd_down
  fi

  install_kafka
  install_registry

  local started_registry=0 kafka_data_existed=0
  [ -f "$KAFKA_DATA/meta.properties" ] && [ "${STACK_WIPE:-0}" != 1 ] && kafka_data_existed=1
  # Registry first: it is ready in milliseconds while the JVM boots.
  registry_pid >/dev/null || { start_registry; started_registry=1; }
  kafka_pid >/dev/null || start_kafka

  deadline=$(( $(date +%s) + STACK_UP_TIMEOUT ))
  until registry_answers; do
    registry_pid >/dev/null || die_log "$REGISTRY_LOG" "schema registry exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$REGISTRY_LOG" "schema registry did not answer GET /subjects within ${STACK_UP_TIMEOUT}s"
    sleep 0.1
  done
  # Cheap TCP wait first, then one real metadata request (its JVM costs ~1 s, so don't spin it).
  until port_open "$KAFKA_PORT"; do
    kafka_pid >/dev/null || die_log "$KAFKA_LOG" "Kafka exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$KAFKA_LOG" "Kafka did not open $HOST:$KAFKA_PORT within ${STACK_UP_TIMEOUT}s"
    sleep 0.2
  done
  until kafka_answers "$(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 ))"; do
    kafka_pid >/dev/null || die_log "$KAFKA_LOG" "Kafka exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$KAFKA_LOG" "Kafka did not answer a metadata request within ${STACK_UP_TIMEOUT}s"
    sleep 0.5
  done

  if [ "$started_registry" = 1 ] && [ "$kafka_data_existed" = 1 ]; then
    log "note: the registry starts empty (in-memory) but Kafka kept its data; records written" \
        "earlier reference schema ids that no longer exist. Use STACK_WIPE=1 for a consistent reset."
  fi
  local ms=$(( $(now_ms) - t0 ))
  log "up: Kafka $HOST:$KAFKA_PORT, registry http://$HOST:$SCHEMA_REGISTRY_PORT ($((ms / 1000)).$(printf '%03d' $((ms % 1000)))s)"
}

cmd_down() {
  local pid any=0
  if pid="$(registry_pid)"; then stop_pid "schema registry" "$pid" "$REGISTRY_PID"; any=1; fi
  if pid="$(kafka_pid)"; then stop_pid kafka "$pid" "$KAFKA_PID"; any=1; fi
  if [ "$any" = 1 ]; then log "stopped (Kafka data kept in $KAFKA_DATA)"; else log "nothing running"; fi
}

# Restarts only the broker (data kept), e.g. to test that clients reconnect.
cmd_restart_kafka() {
  local pid
  if pid="$(kafka_pid)"; then stop_pid kafka "$pid" "$KAFKA_PID"; fi
  cmd_up
}

cmd_status() {
  local pid state answer
  if pid="$(kafka_pid)"; then state="running (pid $pid)"; else state="stopped"; fi
  if ! port_open "$KAFKA_PORT"; then answer="not listening"
  elif [ -d "$LIBS" ] && command -v java >/dev/null 2>&1 && kafka_answers 10; then answer="answers metadata requests"
  else answer="port open, no metadata answer"; fi
  printf 'kafka            %-22s %s:%s  %s\n' "$state" "$HOST" "$KAFKA_PORT" "$answer"

  if pid="$(registry_pid)"; then state="running (pid $pid)"; else state="stopped"; fi
  if registry_answers; then answer="answers GET /subjects"
  elif port_open "$SCHEMA_REGISTRY_PORT"; then answer="port open, no HTTP answer"
  else answer="not listening"; fi
  printf 'schema-registry  %-22s %s:%s  %s\n' "$state" "$HOST" "$SCHEMA_REGISTRY_PORT" "$answer"
  printf 'STACK_HOME       %s\n' "$STACK_HOME"
}

cmd_clean() {
  cmd_down
  log "removing Kafka data, generated configs and logs under $STACK_HOME (jars and binary kept)"
  rm -rf "$KAFKA_DIR" "$REGISTRY_DIR" "$LOGS" "$RUN"
}

# Serialise mutating commands (e.g. two CI jobs sharing STACK_HOME); status needs no lock.
lock() {
  mkdir -p "$STACK_HOME"
  exec 9>"$STACK_HOME/.lock"
  flock -w 120 9 || die "another stack.sh is holding $STACK_HOME/.lock"
}

# Sourced (by cluster.sh, for the helpers above): define, run nothing.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
  install|up|down|clean|restart-kafka) lock ;;
esac
case "${1:-}" in
  install) cmd_install ;;
  up)      cmd_up ;;
  down)    cmd_down ;;
  status)  cmd_status ;;
  clean)   cmd_clean ;;
  restart-kafka) cmd_restart_kafka ;;
  *) echo "usage: $0 {install|up|down|status|clean|restart-kafka}" >&2; exit 2 ;;
esac
