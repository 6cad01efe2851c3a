# Streams services: build, test and demo on a local Kafka + schema registry.
# `make help` lists the targets.

# Build cache outside the checkout, so fresh clones (and CI) build warm.
export CARGO_TARGET_DIR ?= /var/tmp/streams-target
CARGO ?= cargo

include deploy/local/stack.mk
include deploy/local/cluster.mk
include deploy/k8s/cluster/cluster.mk

.PHONY: help deps build test test-unit lint demo bench bench-scale bench-model bench-embed bench-restore bench-failover bench-pause bench-queries models

help: ## list targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

deps: ## install the Debian packages the build needs (cmake, libclang, ...)
	@bash deploy/local/build-deps.sh

build: deps ## build every binary (debug)
	$(CARGO) build --workspace --bins

# Test binaries run side by side, LANES (2) at a time: deploy/local/run-tests.py.
test: build validate-deploy up models image-test ## all tests: unit + end-to-end against the local stack (started if needed)
	rm -rf "$${E2E_SCRATCH_DIR:-$${TMPDIR:-/tmp}/streams-e2e}"
	CARGO=$(CARGO) python3 deploy/local/run-tests.py

.PHONY: image image-test compose-demo
image: deps ## the release image streams-services:latest with podman, no daemon, nothing pulled (docs/deploy.md)
	STREAMS_BUILD_COMMIT=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) $(CARGO) build --release --bins
	@bash deploy/image/build.sh release localhost/streams-services:latest

compose-demo: image ## deploy/docker/compose.yaml up with podman-compose, the example data in, results checked (docs/deploy.md)
	@bash deploy/image/compose-demo.sh

# The container tests' image (tests/tests/container.rs): the debug binaries `build` made.
image-test: build
	@bash deploy/image/build.sh debug localhost/streams-services:test

.PHONY: validate-deploy
validate-deploy: build ## offline checks of deploy/: Dockerfile lint, k8s overlays, compose schema, alert rules, Strimzi KafkaUser, flag drift (docs/deploy.md)
	@bash deploy/validate.sh

# The binaries describe themselves (name, topics): built first, read from
# $STREAMS_BIN_DIR, else $(CARGO_TARGET_DIR)/debug.
.PHONY: deploy-generate
deploy-generate: build ## write the deploy files that list the services (k8s base, overlays, components, alert, Dockerfile, compose.yaml) from deploy/template/ and deploy/k8s/services.toml (docs/deploy.md)
	python3 deploy/k8s/generate.py

# The broker-free test-driver tests (tests/tests/driver_*.rs).
DRIVER_TESTS := $(patsubst tests/tests/%.rs,--test %,$(wildcard tests/tests/driver_*.rs))

test-unit: deps ## unit, doc and test-driver tests: every rule of every service, no stack needed
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test --workspace --doc
	$(CARGO) test -p e2e-tests $(DRIVER_TESTS)

models: ## fetch the embedding model of embed-batcher into MODELS_DIR (default /var/tmp/streams-models)
	@bash deploy/local/models.sh

lint: ## rustfmt check, clippy with warnings as errors, doc-comment links, Markdown links and anchors (offline)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@bash deploy/local/check-docs.sh

demo: build up models ## run every service on the example data (tests/fixtures) and show the results
	@bash deploy/local/demo.sh

bench: deps up ## throughput of every service on the local stack (release build; see BENCHMARKS.md)
	$(CARGO) build --release --bins
	@bash bench/throughput.sh

bench-scale: deps up ## throughput, RSS, restore, latency, failover as state grows past memory, vs Kafka Streams (release; bench/README.md)
	$(CARGO) build --release --bins
	@bash bench/scale.sh

bench-model: deps models ## embed-batcher's model vs sentence-transformers: embeddings/s and memory (release; see BENCHMARKS.md)
	@bash bench/embed/model_bench.sh

bench-embed: deps up models ## embed-batcher end to end with the local model: articles/s in, rows/s out (release; see BENCHMARKS.md)
	@bash bench/embed/e2e_bench.sh

bench-restore: deps up ## changelog restore speed of one joiner task: 600 000 orders + 600 000 shipments (release; see BENCHMARKS.md)
	@bash bench/restore.sh

bench-failover: deps up ## failover time after a kill -9, without and with a standby replica, 1M sessions in state (release; bench/failover.sh)
	$(CARGO) build --release --bins
	@bash bench/failover.sh

bench-pause: deps up ## how long unmoved tasks stop while a 4th instance joins and one is killed, 1M sessions, ours vs Kafka Streams (release; bench/pause.py)
	$(CARGO) build --release --bins
	@bash bench/pause.sh

bench-queries: deps up ## interactive queries' rate and p99, alone and during processing, vs RocksDB point reads (release; bench/queries.py)
	$(CARGO) build --release --bins
	@bash bench/queries.sh
