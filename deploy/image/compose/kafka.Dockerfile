# A local stand-in for apache/kafka (compose.yaml's default), for machines
# that cannot pull it: the Kafka jars `make up` fetches from Maven Central
# (build context `kafka-libs`) on the local Debian base, configured the way
# the apache/kafka image is, from KAFKA_* variables (KAFKA_NODE_ID ->
# node.id), with the same health-check script path. compose-demo.sh builds it.
FROM debian:bookworm-slim
# The JRE's postinst registers man pages, whose directory the trimmed base lacks.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/kafka/bin /var/lib/kafka/data
# hadolint ignore=DL3022
COPY --from=kafka-libs . /opt/kafka/libs/
COPY deploy/image/compose/kafka-start.sh /opt/kafka/bin/kafka-start.sh
COPY deploy/image/compose/kafka-broker-api-versions.sh /opt/kafka/bin/kafka-broker-api-versions.sh
EXPOSE 9092 9093
CMD ["/opt/kafka/bin/kafka-start.sh"]
