# The secured three-broker cluster beside the local stack (deploy/local/cluster.sh,
# docs/local-stack.md "The secured cluster"). Included from the top-level Makefile.

CLUSTER_SH := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))/cluster.sh

.PHONY: cluster-up cluster-down cluster-clean cluster-kill cluster-start cluster-status

cluster-up: build ## start 3 SASL_SSL brokers (127.0.0.1:19092-19094) + a TLS registry (18081); writes $STACK_HOME/cluster/<user>.flags
	@bash $(CLUSTER_SH) up

cluster-down: ## stop the cluster (data, users, ACLs kept)
	@bash $(CLUSTER_SH) down

cluster-clean: ## stop the cluster and delete its data, certificates and credentials
	@bash $(CLUSTER_SH) clean

cluster-kill: ## kill -9 one broker: make cluster-kill BROKER=2
	@bash $(CLUSTER_SH) kill $(BROKER)

cluster-start: ## start one broker again: make cluster-start BROKER=2
	@bash $(CLUSTER_SH) start $(BROKER)

cluster-status: ## which brokers of the cluster run
	@bash $(CLUSTER_SH) status
