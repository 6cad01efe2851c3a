# Sourced: SERVICES, the stream processors of deploy/k8s/services.toml in the
# table's order, so that a service added there reaches every script that
# loops over the services (generate.py --list reads the table only, no
# binary).
# shellcheck shell=bash
services_list="$(python3 "$(dirname "${BASH_SOURCE[0]}")/k8s/generate.py" --list)"
mapfile -t SERVICES <<<"$services_list"
unset services_list
