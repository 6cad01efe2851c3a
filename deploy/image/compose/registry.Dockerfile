# A local stand-in for the schema registry of compose.yaml, for machines that
# cannot pull confluentinc/cp-schema-registry: the AxonOps Schema Registry
# binary `make up` builds from the Go module proxy (build context
# `registry-bin`), in memory, on port 8081, as the local stack runs it. It
# speaks the same REST API; it ignores Confluent's SCHEMA_REGISTRY_* settings.
FROM debian:bookworm-slim
# hadolint ignore=DL3022
COPY --from=registry-bin schema-registry /usr/local/bin/schema-registry
COPY deploy/image/compose/registry.yaml /etc/schema-registry/config.yaml
USER 10001:10001
EXPOSE 8081
# Confluent's variables are unset: this registry reads SCHEMA_REGISTRY_* too.
ENTRYPOINT ["/bin/sh", "-c", "for v in $(env | sed -n 's/^\\(SCHEMA_REGISTRY_[A-Z_]*\\)=.*/\\1/p'); do unset \"$v\"; done; exec schema-registry -config /etc/schema-registry/config.yaml"]
