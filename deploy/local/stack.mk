# Local dev stack targets (Kafka 4.x KRaft + AxonOps Schema Registry, no Docker).
# Included from the top-level Makefile:  include deploy/local/stack.mk
# State lives in $(STACK_HOME) (default /var/tmp/streams-stack); see docs/local-stack.md.

# Resolve the script next to this file, whatever directory make runs from.
# ':=' captures the path now, before later includes change MAKEFILE_LIST.
STACK_SH := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))/stack.sh

.PHONY: up down status stack-install stack-clean stack-smoke

up: ## start Kafka (127.0.0.1:9092) + schema registry (127.0.0.1:8081); STACK_WIPE=1 for a fresh cluster
	@bash $(STACK_SH) up

down: ## stop the local stack (keeps Kafka data)
	@bash $(STACK_SH) down

status: ## show whether Kafka and the registry are running and answering
	@bash $(STACK_SH) status

stack-install: ## fetch Kafka jars (Maven) and build the registry binary (Go) into STACK_HOME
	@bash $(STACK_SH) install

stack-clean: ## stop the stack and delete its data and logs (keeps jars and binary)
	@bash $(STACK_SH) clean

stack-smoke: ## end-to-end check of the running stack (topics, produce/consume, transactions, registry)
	@bash $(dir $(STACK_SH))smoke.sh
