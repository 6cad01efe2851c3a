# The single-node Kubernetes of deploy/k8s/cluster/cluster.sh, and the test that applies
# deploy/k8s to it (docs/deploy.md, "A real cluster on this machine"). Included from the
# top-level Makefile.

K8S_CLUSTER_DIR := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: k8s-up k8s-down k8s-clean k8s-status k8s-test

k8s-up: ## a single-node Kubernetes 1.35 here (built from the Go module proxy once); kubectl: source <(bash deploy/k8s/cluster/cluster.sh env)
	@bash $(K8S_CLUSTER_DIR)/cluster.sh up

k8s-down: ## stop the Kubernetes node and everything on it (data kept)
	@bash $(K8S_CLUSTER_DIR)/cluster.sh down

k8s-clean: ## stop it and delete its data, certificates and volumes (binaries kept)
	@bash $(K8S_CLUSTER_DIR)/cluster.sh clean

k8s-status: ## which of the node's processes run, and the node
	@bash $(K8S_CLUSTER_DIR)/cluster.sh status

k8s-test: build image ## deploy/k8s applied to that node: exact output, day-two steps timed, queries, Prometheus and one alert (about 20 min)
	@bash $(K8S_CLUSTER_DIR)/test.sh
