#!/bin/sh
# The apache/kafka image's configuration rule: every KAFKA_<NAME> variable
# is the property <name> with `_` read as `.`; the storage is formatted on
# first start (CLUSTER_ID, or a fixed id for this single-node stand-in).
set -eu
props=/var/lib/kafka/server.properties
env | grep '^KAFKA_' | grep -v '^KAFKA_HEAP_OPTS=' | while IFS='=' read -r name value; do
  echo "$(echo "${name#KAFKA_}" | tr 'A-Z_' 'a-z.')=$value"
done >"$props"
echo "log.dirs=/var/lib/kafka/data" >>"$props"
java_cmd() { java -cp '/opt/kafka/libs/*' "$@"; }
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  java_cmd -Xmx256m kafka.tools.StorageTool format -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$props"
fi
# shellcheck disable=SC2086 # a list of JVM flags
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} -cp '/opt/kafka/libs/*' kafka.Kafka "$props"
