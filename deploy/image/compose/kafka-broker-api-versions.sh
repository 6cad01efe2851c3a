#!/bin/sh
# The health check compose.yaml runs, at the path the apache/kafka image has it.
exec java -Xmx128m -XX:TieredStopAtLevel=1 -cp '/opt/kafka/libs/*' \
  org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
