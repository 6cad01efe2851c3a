#!/usr/bin/env bash
# End-to-end check of a running local stack (see stack.sh), using only the Kafka jars' own
# tools and curl. Safe to run against a stack someone is using: it works on uniquely named
# topics/subjects and deletes them afterwards (the registry's id counter still advances).
#   deploy/local/smoke.sh         exit 0 when every check passes
set -euo pipefail

STACK_HOME="${STACK_HOME:-/var/tmp/streams-stack}"
KAFKA="127.0.0.1:${KAFKA_PORT:-9092}"
SR="http://127.0.0.1:${SCHEMA_REGISTRY_PORT:-8081}"
LIBS="$STACK_HOME/kafka-libs"
SUFFIX="$$-$(date +%s)"
TOPIC="stack-smoke-$SUFFIX"
TX_TOPIC="stack-smoke-tx-$SUFFIX"
SUBJECT="stack-smoke-$SUFFIX-value"
CT='Content-Type: application/vnd.schemaregistry.v1+json'

pass=0 fail=0
ok()  { printf 'ok   %s\n' "$*"; pass=$((pass + 1)); }
bad() { printf 'FAIL %s\n' "$*"; fail=$((fail + 1)); }
check() { local what="$1"; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

# Tools log warnings only, to stderr (config written by stack.sh up).
k() {
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$STACK_HOME/kafka/tools-log4j2.properties" -cp "$LIBS/*" "$@"
}

cleanup() {
  k org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA" --delete \
    --topic "$TOPIC|$TX_TOPIC" >/dev/null 2>&1 || true
  curl -s -o /dev/null -X DELETE "$SR/subjects/$SUBJECT" || true
  curl -s -o /dev/null -X DELETE "$SR/subjects/$SUBJECT?permanent=true" || true
  rm -f "${BODY:-}"
}
trap cleanup EXIT

# ---- Kafka ----------------------------------------------------------------------------------
create_topic() {
  k org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA" --create --topic "$TOPIC" \
    --partitions 2 >/dev/null
}
check "create topic with 2 partitions" create_topic

produce_plain() {
  printf 'k1:hello\nk2:world\n' | k org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$KAFKA" \
    --topic "$TOPIC" --reader-property parse.key=true --reader-property key.separator=: 2>/dev/null
}
check "console producer" produce_plain

consume_plain() {
  local out
  out="$(k org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$KAFKA" --topic "$TOPIC" \
    --group "$TOPIC-g" --from-beginning --max-messages 2 --timeout-ms 20000 2>/dev/null | sort | tr '\n' ' ')"
  [ "$out" = "hello world " ]
}
check "console consumer (group) reads both records" consume_plain

# Exactly-once streams need transactions: __transaction_state must be creatable with RF 1.
produce_tx() {
  k org.apache.kafka.tools.ProducerPerformance --topic "$TX_TOPIC" --num-records 100 --record-size 50 \
    --throughput -1 --transactional-id "$TX_TOPIC-tx" --transaction-duration-ms 100 \
    --producer-props bootstrap.servers="$KAFKA" >/dev/null 2>&1
}
check "transactional producer commits" produce_tx

consume_committed() {
  local n
  n="$(k org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$KAFKA" --topic "$TX_TOPIC" \
    --from-beginning --isolation-level read_committed --max-messages 100 --timeout-ms 20000 2>/dev/null | wc -l)"
  [ "$n" -eq 100 ]
}
check "read_committed consumer sees 100 committed records" consume_committed

tx_listed() {
  k org.apache.kafka.tools.TransactionsCommand --bootstrap-server "$KAFKA" list 2>/dev/null \
    | grep -Eq "^$TX_TOPIC-tx[[:space:]].*CompleteCommit"
}
check "TransactionsCommand lists the committed transaction" tx_listed

# ---- Schema registry ------------------------------------------------------------------------
V1='{"schema":"{\"type\":\"record\",\"name\":\"T\",\"fields\":[{\"name\":\"a\",\"type\":\"string\"}]}"}'
# Adds a field without default: a BACKWARD-incompatible change (new reader can't read old data).
V2_BAD='{"schema":"{\"type\":\"record\",\"name\":\"T\",\"fields\":[{\"name\":\"a\",\"type\":\"string\"},{\"name\":\"b\",\"type\":\"int\"}]}"}'
V2_OK='{"schema":"{\"type\":\"record\",\"name\":\"T\",\"fields\":[{\"name\":\"a\",\"type\":\"string\"},{\"name\":\"b\",\"type\":\"int\",\"default\":0}]}"}'

BODY="$(mktemp)"
http() { curl -s -o "$BODY" -w '%{http_code}' "$@"; }

code="$(http -X POST -H "$CT" --data "$V1" "$SR/subjects/$SUBJECT/versions")"
id="$(sed -n 's/.*"id":\([0-9]*\).*/\1/p' "$BODY")"
registered() { [ "$code" = 200 ] && [ -n "$id" ]; }
check "POST /subjects/{s}/versions -> 200 with id (got $code, id ${id:-none})" registered

code="$(http "$SR/schemas/ids/${id:-0}")"
check "GET /schemas/ids/{id} -> 200 with the schema (got $code)" \
  grep -q '\\"name\\":\\"a\\"' "$BODY"

code="$(http "$SR/config")"
check "GET /config default is BACKWARD (got $code $(cat "$BODY"))" \
  grep -q '"compatibilityLevel":"BACKWARD"' "$BODY"

code="$(http -X POST -H "$CT" --data "$V2_BAD" "$SR/subjects/$SUBJECT/versions")"
check "incompatible change rejected with 409 (got $code)" [ "$code" = 409 ]

code="$(http -X POST -H "$CT" --data "$V2_OK" "$SR/subjects/$SUBJECT/versions")"
check "compatible change (field with default) accepted (got $code)" [ "$code" = 200 ]

code="$(http -X PUT -H "$CT" --data '{"compatibility":"FULL"}' "$SR/config/$SUBJECT")"
check "PUT /config/{s} -> 200 (got $code)" [ "$code" = 200 ]

printf '%d passed, %d failed\n' "$pass" "$fail"
[ "$fail" -eq 0 ]
