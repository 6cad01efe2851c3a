#!/usr/bin/env bash
# A secured three-broker Kafka cluster (KRaft) + schema registry, beside the single-broker stack.
#
#   cluster.sh up             start (idempotent); first start makes the CA, certificates,
#                             passwords, users and ACLs; writes $CLUSTER_HOME/<user>.flags and
#                             <user>-{mtls,plain,oidc}.flags (one per login method)
#   cluster.sh down           stop everything (data, users and ACLs kept)
#   cluster.sh clean          down + delete data, certificates and credentials
#   cluster.sh kill N         kill -9 broker N (1-3)
#   cluster.sh start N        start broker N again and wait until it answers
#   cluster.sh status         which brokers run
#   cluster.sh acl ARGS       Kafka's AclCommand as admin (--file F: one call per line of F, at once)
#
# Each node is broker and controller at once (combined mode, a quorum of three voters), so
# the cluster keeps working with any two nodes up. Clients log in as User:<name> four ways:
#   SASL_SSL on 127.0.0.1:19092-19094 (CLUSTER_PORT + 0..2) with SCRAM-SHA-512, PLAIN (its own
#   password per user) or OAUTHBEARER (OIDC: a JWT from the local issuer, validated against
#   its JWKS), or mutual TLS on 127.0.0.1:19122-19124 (CLUSTER_PORT + 30..32: a client
#   certificate with CN=<name> signed by the cluster's CA, no SASL).
# The OIDC issuer (deploy/local/Issuer.java, run with the JDK) serves the client_credentials
# grant and its JWKS on https://127.0.0.1:18443 (CLUSTER_OIDC_PORT) with the brokers'
# certificate. Brokers and controllers talk TLS with client certificates among themselves.
# Env: STACK_HOME, CLUSTER_PORT (19092), CLUSTER_REGISTRY_PORT (18081), CLUSTER_OIDC_PORT
# (18443), CLUSTER_HEAP_OPTS. See docs/local-stack.md, "The secured cluster".
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=cluster
# The single-broker stack's helpers and install steps (jars, registry binary, process handling).
# shellcheck source=stack.sh
source "$SCRIPT_DIR/stack.sh"

CLUSTER_HOME="$STACK_HOME/cluster"
CLUSTER_PORT="${CLUSTER_PORT:-19092}"                 # clients: CLUSTER_PORT + n - 1
CLUSTER_REGISTRY_PORT="${CLUSTER_REGISTRY_PORT:-18081}"
CLUSTER_OIDC_PORT="${CLUSTER_OIDC_PORT:-18443}"         # the OIDC issuer (HTTPS)
# Three brokers share 2 cores and the tests' services: small heaps start fast and suffice
# for the tests' few hundred partitions.
CLUSTER_HEAP_OPTS="${CLUSTER_HEAP_OPTS:--Xms128m -Xmx384m}"
NODES=(1 2 3)
# One user per service (SERVICES, the services of deploy/k8s/services.toml): its application
# id is the prefix of its topics, group and transactional ids, and of the tests' unique
# application ids.
# shellcheck source=../services.sh
source "$SCRIPT_DIR/../services.sh"
# acl-probe holds no ACL of its own: tests grant it exactly what a service lists
# (tests/tests/cluster_acls.rs).
USERS=(admin "${SERVICES[@]}" acl-probe)
REGISTRY_USER=registry

TLS="$CLUSTER_HOME/tls"
SECRETS="$CLUSTER_HOME/secrets"                        # passwords, one file per user (0600)
CLIENT_CERTS="$TLS/clients"                            # <user>.pem, CN=<user> (key: $SECRETS/<user>-client.key)
KAFKA_DIR="$CLUSTER_HOME/kafka"                        # tool configs (kafka_java reads it)
LOGS="$CLUSTER_HOME/logs"
RUN="$CLUSTER_HOME/run"
REGISTRY_DIR="$CLUSTER_HOME/registry"
REGISTRY_LOG="$LOGS/schema-registry.log"
REGISTRY_PID="$RUN/schema-registry.pid"
ADMIN_JAVA="$SECRETS/admin-java.properties"            # admin credentials for the Java tools
ISSUER_DIR="$CLUSTER_HOME/issuer"
ISSUER_LOG="$LOGS/issuer.log"
ISSUER_PID="$RUN/issuer.pid"
ISSUER_URL="https://$HOST:$CLUSTER_OIDC_PORT"          # the tokens' iss
OIDC_AUDIENCE=kafka                                    # the tokens' aud, what the brokers expect
OIDC_SCOPE=kafka

client_port()     { echo $((CLUSTER_PORT + $1 - 1)); }
internal_port()   { echo $((CLUSTER_PORT + 10 + $1 - 1)); }
controller_port() { echo $((CLUSTER_PORT + 20 + $1 - 1)); }
mtls_port()       { echo $((CLUSTER_PORT + 30 + $1 - 1)); }
node_dir()        { echo "$CLUSTER_HOME/node-$1"; }
node_pidfile()    { echo "$RUN/node-$1.pid"; }
node_log()        { echo "$LOGS/node-$1.log"; }
node_pid()        { live_pid "$(node_pidfile "$1")" "node-$1/server.properties"; }
bootstrap()       { local n out=(); for n in "${NODES[@]}"; do out+=("$HOST:$("${1:-client_port}" "$n")"); done
                    (IFS=,; echo "${out[*]}"); }
password()        { cat "$SECRETS/$1.password"; }
plain_password()  { cat "$SECRETS/$1.plain-password"; }
oidc_secret()     { cat "$SECRETS/$1.oidc-secret"; }
issuer_pid()      { live_pid "$ISSUER_PID" Issuer.java; }
check_node()      { case "${1:-}" in 1|2|3) ;; *) die "BROKER must be 1, 2 or 3 (got '${1:-}')" ;; esac; }

# ---- credentials, made once per cluster ------------------------------------------------------
make_tls() {
  [ -f "$TLS/ca.pem" ] && return 0
  command -v openssl >/dev/null 2>&1 || die "openssl not found on PATH (make deps installs it)."
  log "making a CA and certificates with openssl in $TLS"
  mkdir -p "$TLS"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=streams-local-ca" \
    -keyout "$TLS/ca.key" -out "$TLS/ca.pem" 2>/dev/null
  # One certificate for every broker, controller and the registry (all on $HOST); its CN
  # is the brokers' principal among themselves, a super user.
  openssl req -newkey rsa:2048 -nodes -subj "/CN=broker" \
    -keyout "$TLS/server.key" -out "$TLS/server.csr" 2>/dev/null
  openssl x509 -req -in "$TLS/server.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" \
    -CAcreateserial -days 3650 -out "$TLS/server.pem" \
    -extfile <(printf 'subjectAltName=IP:%s,IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' "$HOST") \
    2>/dev/null
  # Kafka's PEM key store wants a PKCS#8 key followed by the certificate in one file.
  openssl pkcs8 -topk8 -nocrypt -in "$TLS/server.key" -out "$TLS/server-pkcs8.key"
  cat "$TLS/server-pkcs8.key" "$TLS/server.pem" > "$TLS/keystore.pem"
  rm -f "$TLS/server.csr"
  chmod 600 "$TLS"/*.key "$TLS/keystore.pem"
}

# One random secret per file (0600), made once: the SCRAM password of every user and the
# registry's; per Kafka user also a PLAIN password and an OIDC client secret of its own.
make_passwords() {
  mkdir -p "$SECRETS"; chmod 700 "$SECRETS"
  local user file
  for user in "${USERS[@]}" "$REGISTRY_USER"; do
    [ -f "$SECRETS/$user.password" ] && continue
    (umask 077; openssl rand -hex 16 > "$SECRETS/$user.password")
  done
  for user in "${USERS[@]}"; do
    for file in "$SECRETS/$user.plain-password" "$SECRETS/$user.oidc-secret"; do
      [ -f "$file" ] && continue
      (umask 077; openssl rand -hex 16 > "$file")
    done
  done
}

# Per user a TLS client certificate, CN=<user> (the brokers' ssl.principal.mapping.rules make
# that User:<user>), signed by the cluster's CA, with its key in PKCS#8 PEM (0600); and the
# issuer's token signing key. Each made once, also for a cluster made before they existed.
make_client_certs() {
  local user key csr
  mkdir -p "$CLIENT_CERTS"
  for user in "${USERS[@]}"; do
    key="$SECRETS/$user-client.key"
    [ -f "$CLIENT_CERTS/$user.pem" ] && [ -f "$key" ] && continue
    csr="$CLIENT_CERTS/$user.csr"
    (umask 077; openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$key" 2>/dev/null)
    openssl req -new -key "$key" -subj "/CN=$user" -out "$csr" 2>/dev/null
    openssl x509 -req -in "$csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" -CAcreateserial \
      -days 825 -out "$CLIENT_CERTS/$user.pem" \
      -extfile <(printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n') \
      2>/dev/null || die "could not sign the client certificate of $user"
    rm -f "$csr"
  done
  [ -f "$SECRETS/issuer-signing.key" ] || \
    (umask 077; openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 \
       -out "$SECRETS/issuer-signing.key" 2>/dev/null)
}

# Per user: a librdkafka properties file (0600) and the flags that name it.
write_client_files() {
  local user props
  for user in "${USERS[@]}"; do
    props="$SECRETS/$user.properties"
    (umask 077; cat > "$props" <<EOF
# Generated by deploy/local/cluster.sh: credentials of Kafka user $user. Keep private.
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=$user
sasl.password=$(password "$user")
ssl.ca.location=$TLS/ca.pem
schema.registry.basic.auth.user.info=$REGISTRY_USER:$(password "$REGISTRY_USER")
schema.registry.ssl.ca.location=$TLS/ca.pem
EOF
)
    printf -- '--bootstrap-servers %s\n--schema-registry-url https://%s:%s\n--kafka-config-file %s\n' \
      "$(bootstrap)" "$HOST" "$CLUSTER_REGISTRY_PORT" "$props" > "$CLUSTER_HOME/$user.flags"
    write_login_files "$user"
  done
  (umask 077; cat > "$ADMIN_JAVA" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(password admin)";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS/ca.pem
EOF
)
}

# The same user's other logins, one properties file (0600) and one flags file per method:
# <user>-mtls (SSL listener, client certificate), <user>-plain (SASL/PLAIN), <user>-oidc
# (SASL/OAUTHBEARER with a token from the issuer). The registry lines are copied from the
# SCRAM file, $SECRETS/<user>.properties, written just before.
write_login_files() {
  local user="$1" method login servers props registry
  registry="$(grep '^schema\.registry\.' "$SECRETS/$user.properties")"
  for method in mtls plain oidc; do
    servers="$(bootstrap)"
    case "$method" in
      mtls)
        servers="$(bootstrap mtls_port)"
        login="security.protocol=SSL
ssl.certificate.location=$CLIENT_CERTS/$user.pem
ssl.key.location=$SECRETS/$user-client.key" ;;
      plain)
        login="security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.username=$user
sasl.password=$(plain_password "$user")" ;;
      oidc)
        login="security.protocol=SASL_SSL
sasl.mechanism=OAUTHBEARER
sasl.oauthbearer.method=oidc
sasl.oauthbearer.client.id=$user
sasl.oauthbearer.client.secret=$(oidc_secret "$user")
sasl.oauthbearer.token.endpoint.url=$ISSUER_URL/token
sasl.oauthbearer.scope=$OIDC_SCOPE
https.ca.location=$TLS/ca.pem" ;;
    esac
    props="$SECRETS/$user-$method.properties"
    (umask 077; cat > "$props" <<EOF
# Generated by deploy/local/cluster.sh: $method login of Kafka user $user. Keep private.
$login
ssl.ca.location=$TLS/ca.pem
$registry
EOF
)
    printf -- '--bootstrap-servers %s\n--schema-registry-url https://%s:%s\n--kafka-config-file %s\n' \
      "$servers" "$HOST" "$CLUSTER_REGISTRY_PORT" "$props" > "$CLUSTER_HOME/$user-$method.flags"
  done
}

# ---- brokers --------------------------------------------------------------------------------
write_node_config() {
  local n="$1" dir voters="" v plain_users="" user
  dir="$(node_dir "$n")"
  mkdir -p "$dir/data" "$LOGS" "$RUN"
  for v in "${NODES[@]}"; do voters+="${voters:+,}$v@$HOST:$(controller_port "$v")"; done
  for user in "${USERS[@]}"; do plain_users+=" user_$user=\"$(plain_password "$user")\""; done
  # 0600: the PLAIN passwords are in it.
  (umask 077; cat > "$dir/server.properties" <<EOF
# Generated by deploy/local/cluster.sh - edits are overwritten on the next 'up'.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=CLIENT://$HOST:$(client_port "$n"),MTLS://$HOST:$(mtls_port "$n"),INTERNAL://$HOST:$(internal_port "$n"),CONTROLLER://$HOST:$(controller_port "$n")
advertised.listeners=CLIENT://$HOST:$(client_port "$n"),MTLS://$HOST:$(mtls_port "$n"),INTERNAL://$HOST:$(internal_port "$n")
listener.security.protocol.map=CLIENT:SASL_SSL,MTLS:SSL,INTERNAL:SSL,CONTROLLER:SSL
inter.broker.listener.name=INTERNAL
controller.listener.names=CONTROLLER
log.dirs=$dir/data

# TLS everywhere; brokers and controllers prove themselves with the CA's certificate, and so
# do the clients of the MTLS listener (User:<CN>, no SASL).
ssl.keystore.type=PEM
ssl.keystore.location=$TLS/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS/ca.pem
ssl.client.auth=required
listener.name.client.ssl.client.auth=none
listener.name.mtls.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]*).*\$/\$1/,DEFAULT
# The CLIENT listener's SASL mechanisms; each maps a login to User:<name>.
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN,OAUTHBEARER
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.client.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required$plain_users;
# OAUTHBEARER: RS256 JWTs of the local issuer, checked against its JWKS (fetched over HTTPS,
# trusting the cluster's CA: the JAAS options are the JWKS client's TLS settings); sub is the
# user name. The URLs are also in the JVM's org.apache.kafka.sasl.oauthbearer.allowed.urls.
# The login module also logs the broker itself in, with Kafka's default (unsecured) token
# maker, which needs a subject: that token is never sent (brokers talk SSL among themselves).
listener.name.client.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker" ssl.truststore.type="PEM" ssl.truststore.location="$TLS/ca.pem";
listener.name.client.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
sasl.oauthbearer.jwks.endpoint.url=$ISSUER_URL/jwks
sasl.oauthbearer.expected.audience=$OIDC_AUDIENCE
sasl.oauthbearer.expected.issuer=$ISSUER_URL

# Deny what no ACL grants.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:broker

# Every topic on all three brokers; a write is acknowledged once two have it.
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
# Fewer internal partitions than the defaults (50): they are created on first use.
offsets.topic.num.partitions=6
transaction.state.log.num.partitions=6
unclean.leader.election.enable=false
auto.create.topics.enable=false
num.partitions=1
group.initial.rebalance.delay.ms=0
EOF
)
  chmod 600 "$dir/server.properties"   # also a file written before it held passwords
}

# Formats every node with one cluster id; the SCRAM users go into the first metadata records,
# so they exist before any broker listens.
format_nodes() {
  local n id user argfile
  [ -f "$(node_dir 1)/data/meta.properties" ] && return 0
  id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=' | sed 's/^-/A/')"
  log "formatting three nodes (cluster id $id) with users: ${USERS[*]}"
  for n in "${NODES[@]}"; do
    # The passwords go to the storage tool in a java @argfile (0600), not in
    # argv, where ps and /proc/<pid>/cmdline would show them.
    argfile="$SECRETS/format-$n.args"
    (
      umask 077
      printf '%s\n' kafka.tools.StorageTool format -t "$id" -c "$(node_dir "$n")/server.properties"
      for user in "${USERS[@]}"; do
        printf -- '--add-scram\nSCRAM-SHA-512=[name=%s,password=%s]\n' "$user" "$(password "$user")"
      done
    ) > "$argfile"
    kafka_java "@$argfile" >>"$(node_log "$n")" 2>&1 &
  done
  for n in "${NODES[@]}"; do wait -n || die_log "$(node_log 1)" "Kafka storage format failed"; done
  rm -f "$SECRETS"/format-*.args
}

start_node() {
  local n="$1" log
  log="$(node_log "$n")"
  node_pid "$n" >/dev/null && return 0
  port_open "$(client_port "$n")" && die "port $(client_port "$n") is in use by a process this script did not start."
  write_node_config "$n"
  sha256sum < "$(node_dir "$n")/server.properties" > "$RUN/node-$n.config"
  [ -f "$log" ] && mv -f "$log" "$log.prev"
  # shellcheck disable=SC2086 # CLUSTER_HEAP_OPTS is a list of JVM flags
  spawn "$(node_pidfile "$n")" "$log" java $CLUSTER_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
    -Dorg.apache.kafka.sasl.oauthbearer.allowed.urls="$ISSUER_URL/jwks,$ISSUER_URL/token" \
    -cp "$LIBS/*" kafka.Kafka "$(node_dir "$n")/server.properties"
}

wait_node_port() {
  local n="$1" deadline="$2"
  until port_open "$(client_port "$n")"; do
    node_pid "$n" >/dev/null || die_log "$(node_log "$n")" "node $n exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$(node_log "$n")" "node $n did not open its port within ${STACK_UP_TIMEOUT}s"
    sleep 0.2
  done
}

# The brokers the cluster's metadata lists as live (unfenced), counted with the admin user.
live_brokers() {
  timeout 20 java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$KAFKA_DIR/tools-log4j2.properties" -cp "$LIBS/*" \
    org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "$(bootstrap)" \
    --command-config "$ADMIN_JAVA" 2>/dev/null | grep -c '(id: ' || true
}

# Partitions with fewer in-sync replicas than replicas (empty once a restarted broker caught up).
under_replicated() {
  kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" \
    --command-config "$ADMIN_JAVA" --describe --under-replicated-partitions 2>/dev/null
}

wait_brokers() {
  local want="$1" deadline="$2"
  until [ "$(live_brokers)" -ge "$want" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$(node_log 1)" "fewer than $want brokers live after ${STACK_UP_TIMEOUT}s"
    sleep 0.5
  done
}

# The service binaries that list their own ACLs (`<service> acls`).
BIN_DIR="${STREAMS_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/streams-target}/debug}"

# The ACLs of one service as `AclCommand` arguments, one grant a line, listed by the service
# itself (`<service> acls`, docs/deploy.md "ACLs"): its default topic names and application id,
# all as prefixes, since the tests' topics and application ids are these names plus a suffix.
service_acls() {
  local svc="$1" bin="$BIN_DIR/$1"
  [ -x "$bin" ] || die "$bin not found: build the services first (make build)."
  # A clean environment: a service reads its flags from the environment too.
  # shellcheck disable=SC2016 # the service prints these two variables for the user to set
  env -i PATH="$PATH" "$bin" acls --principal "User:$svc" --resource-pattern-type prefixed \
      --format kafka-acls \
    | sed -n 's/^kafka-acls --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" //p'
}

# Grants each service exactly the ACLs it lists. One AclCommand (a JVM) per grant, all at once;
# redone when the list changes.
grant_acls() {
  local svc line acls listing="" stamp pids=() pid
  for svc in "${SERVICES[@]}"; do
    acls="$(service_acls "$svc")"
    [ -n "$acls" ] || die "$svc listed no ACLs"
    listing+="$acls"$'\n'
  done
  stamp="$(printf '%s' "$listing" | sha256sum | cut -d' ' -f1)"
  [ "$(cat "$CLUSTER_HOME/.acls" 2>/dev/null)" = "$stamp" ] && return 0
  log "granting ACLs, as each service lists them: ${SERVICES[*]}"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    local args=()
    eval "args=($line)"   # the service quotes each name in single quotes
    kafka_java org.apache.kafka.tools.AclCommand --bootstrap-server "$(bootstrap)" \
      --command-config "$ADMIN_JAVA" "${args[@]}" >>"$LOGS/acls.log" 2>&1 &
    pids+=($!)
  done <<<"$listing"
  for pid in "${pids[@]}"; do wait "$pid" || die_log "$LOGS/acls.log" "granting ACLs failed"; done
  echo "$stamp" > "$CLUSTER_HOME/.acls"
}

# ---- registry: TLS; basic auth, JWT bearer tokens, client certificates ----------------------
# (It keeps schemas in memory, it does not use Kafka.) Its one user, $REGISTRY_USER, logs in
# three ways, tried in this order: HTTP basic (the password), a bearer token (an RS256 JWT with
# sub=$REGISTRY_USER, checked against $TLS/registry-jwt.pub) or a client certificate
# (CN=$REGISTRY_USER). The registry asks every client for a certificate but cannot require one
# without refusing the other two logins (its client_auth "verify" requires a certificate from
# everyone), and in the mode that leaves it optional ("request") Go does not check the chain:
# any certificate's CN is taken as the user. Good enough for a cluster on 127.0.0.1; a real
# registry with mTLS uses "verify".
REGISTRY_JWT_ISSUER=streams-local-cluster
REGISTRY_JWT_AUDIENCE=schema-registry

base64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

# The registry user's token and client certificate, each made once, and the properties lines
# that use them in place of schema.registry.basic.auth.user.info (0600):
# $SECRETS/registry-bearer.properties and $SECRETS/registry-mtls.properties.
make_registry_logins() {
  local key="$SECRETS/registry-jwt.key" token="$SECRETS/registry.token" now header payload
  if [ ! -f "$token" ] || [ ! -f "$TLS/registry-jwt.pub" ]; then
    (umask 077; openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$key" 2>/dev/null)
    openssl pkey -in "$key" -pubout -out "$TLS/registry-jwt.pub"
    now="$(date +%s)"
    header="$(printf '{"alg":"RS256","typ":"JWT"}' | base64url)"
    # Valid for ten years; role is what the registry's RBAC would read (RBAC is off here).
    payload="$(printf '{"sub":"%s","iss":"%s","aud":"%s","role":"developer","iat":%d,"exp":%d}' \
      "$REGISTRY_USER" "$REGISTRY_JWT_ISSUER" "$REGISTRY_JWT_AUDIENCE" "$now" $((now + 3650 * 86400)) \
      | base64url)"
    (umask 077; printf '%s.%s.%s\n' "$header" "$payload" \
      "$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign "$key" -binary | base64url)" \
      > "$token")
  fi
  if [ ! -f "$TLS/registry-client.pem" ] || [ ! -f "$SECRETS/registry-client.key" ]; then
    # PKCS#8 (BEGIN PRIVATE KEY), the format the services read.
    (umask 077; openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 \
      -out "$SECRETS/registry-client.key" 2>/dev/null)
    openssl req -new -key "$SECRETS/registry-client.key" -subj "/CN=$REGISTRY_USER" \
      -out "$TLS/registry-client.csr" 2>/dev/null
    openssl x509 -req -in "$TLS/registry-client.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" \
      -CAcreateserial -days 825 -out "$TLS/registry-client.pem" \
      -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null \
      || die "could not sign the registry client certificate"
    rm -f "$TLS/registry-client.csr"
  fi
  (umask 077; cat > "$SECRETS/registry-bearer.properties" <<EOF
# Generated by deploy/local/cluster.sh: registry user $REGISTRY_USER by bearer token (a JWT),
# lines for a client properties file in place of schema.registry.basic.auth.user.info.
schema.registry.bearer.auth.token.location=$token
EOF
)
  (umask 077; cat > "$SECRETS/registry-mtls.properties" <<EOF
# Generated by deploy/local/cluster.sh: registry user $REGISTRY_USER by client certificate,
# lines for a client properties file in place of schema.registry.basic.auth.user.info.
schema.registry.ssl.certificate.location=$TLS/registry-client.pem
schema.registry.ssl.key.location=$SECRETS/registry-client.key
EOF
)
}

write_registry_tls_config() {
  cat <<EOF
# Generated by deploy/local/cluster.sh - edits are overwritten on the next 'up'.
server:
  host: "$HOST"
  port: $CLUSTER_REGISTRY_PORT
storage:
  type: memory
compatibility:
  default_level: BACKWARD
logging:
  level: info
  format: json
security:
  tls:
    enabled: true
    cert_file: $TLS/server.pem
    key_file: $TLS/server.key
    # Ask for a client certificate (the mtls login) without requiring one; not verified.
    client_auth: request
  auth:
    enabled: true
    methods: [basic, jwt, mtls]
    bootstrap:
      enabled: true
      username: $REGISTRY_USER
    jwt:
      public_key_file: $TLS/registry-jwt.pub
      algorithm: RS256
      issuer: $REGISTRY_JWT_ISSUER
      audience: $REGISTRY_JWT_AUDIENCE
EOF
}

start_registry_tls() {
  local config="$REGISTRY_DIR/config.yaml" pid
  make_registry_logins
  mkdir -p "$REGISTRY_DIR"
  write_registry_tls_config > "$config.new"
  if pid="$(registry_pid)"; then
    if cmp -s "$config.new" "$config"; then rm -f "$config.new"; return 0; fi
    log "the registry's configuration changed: restarting it (its schemas, kept in memory, are lost)"
    stop_pid "schema registry" "$pid" "$REGISTRY_PID"
  fi
  mv -f "$config.new" "$config"
  port_open "$CLUSTER_REGISTRY_PORT" && die "port $CLUSTER_REGISTRY_PORT is in use by a process this script did not start."
  [ -f "$REGISTRY_LOG" ] && mv -f "$REGISTRY_LOG" "$REGISTRY_LOG.prev"
  log "starting schema registry on https://$HOST:$CLUSTER_REGISTRY_PORT (basic auth, JWT, client certificates), log: $REGISTRY_LOG"
  # The password goes through the environment (readable by this user only), not argv.
  (
    SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD="$(password "$REGISTRY_USER")"
    export SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD
    spawn_registry SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD
  )
}

registry_tls_answers() {
  curl -sf -m 2 -o /dev/null --cacert "$TLS/ca.pem" \
    -K <(printf 'user = "%s:%s"\n' "$REGISTRY_USER" "$(password "$REGISTRY_USER")") \
    "https://$HOST:$CLUSTER_REGISTRY_PORT/subjects"
}

# ---- the OIDC issuer: client_credentials tokens (RS256 JWTs) and their JWKS, over HTTPS ------
# A single-file Java program (deploy/local/Issuer.java) run by the JDK's source launcher. Its
# config names files only; the client secrets it reads from $SECRETS/<user>.oidc-secret.
start_issuer() {
  issuer_pid >/dev/null && return 0
  port_open "$CLUSTER_OIDC_PORT" && die "port $CLUSTER_OIDC_PORT is in use by a process this script did not start."
  command -v javac >/dev/null 2>&1 \
    || die "javac not found: the OIDC issuer runs as a Java source file and needs a JDK, not only a JRE."
  mkdir -p "$ISSUER_DIR" "$LOGS" "$RUN"
  cat > "$ISSUER_DIR/issuer.properties" <<EOF
# Generated by deploy/local/cluster.sh - edits are overwritten on the next 'up'.
host=$HOST
port=$CLUSTER_OIDC_PORT
issuer=$ISSUER_URL
audience=$OIDC_AUDIENCE
scopes=$OIDC_SCOPE
lifetime.seconds=3600
tls.certificate=$TLS/server.pem
tls.key=$TLS/server-pkcs8.key
signing.key=$SECRETS/issuer-signing.key
clients=${USERS[*]}
client.secrets.dir=$SECRETS
EOF
  [ -f "$ISSUER_LOG" ] && mv -f "$ISSUER_LOG" "$ISSUER_LOG.prev"
  log "starting the OIDC issuer on $ISSUER_URL, log: $ISSUER_LOG"
  spawn "$ISSUER_PID" "$ISSUER_LOG" java -Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    "$SCRIPT_DIR/Issuer.java" "$ISSUER_DIR/issuer.properties"
}

issuer_answers() {
  curl -sf -m 2 -o /dev/null --cacert "$TLS/ca.pem" "$ISSUER_URL/.well-known/openid-configuration"
}

wait_issuer() {
  local deadline="$1"
  until issuer_answers; do
    issuer_pid >/dev/null || die_log "$ISSUER_LOG" "the OIDC issuer exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$ISSUER_LOG" "the OIDC issuer did not answer within ${STACK_UP_TIMEOUT}s"
    sleep 0.1
  done
}

# ---- commands -------------------------------------------------------------------------------
cmd_cluster_up() {
  need_java
  local t0 deadline n
  t0="$(now_ms)"
  install_kafka
  install_registry
  make_tls
  make_passwords
  make_client_certs
  write_client_files
  write_kafka_logging
  for n in "${NODES[@]}"; do
    write_node_config "$n"
    # A node that runs keeps the configuration it started with.
    if node_pid "$n" >/dev/null \
       && ! sha256sum < "$(node_dir "$n")/server.properties" | cmp -s - "$RUN/node-$n.config" 2>/dev/null; then
      log "WARNING: node $n runs with an older configuration (listeners, logins); 'cluster.sh roll' applies the new one"
    fi
  done
  # The issuer compiles itself while the storage is formatted; the brokers fetch its JWKS
  # when they start, so it answers before they do.
  start_issuer
  format_nodes
  start_registry_tls
  wait_issuer $(( $(date +%s) + STACK_UP_TIMEOUT ))
  for n in "${NODES[@]}"; do start_node "$n"; done
  deadline=$(( $(date +%s) + STACK_UP_TIMEOUT ))
  for n in "${NODES[@]}"; do wait_node_port "$n" "$deadline"; done
  wait_brokers 3 "$deadline"
  until registry_tls_answers; do
    registry_pid >/dev/null || die_log "$REGISTRY_LOG" "schema registry exited during startup"
    [ "$(date +%s)" -lt "$deadline" ] || die_log "$REGISTRY_LOG" "schema registry did not answer within ${STACK_UP_TIMEOUT}s"
    sleep 0.1
  done
  grant_acls
  local ms=$(( $(now_ms) - t0 ))
  log "up: brokers $(bootstrap) (SASL_SSL: SCRAM-SHA-512, PLAIN, OAUTHBEARER), $(bootstrap mtls_port)" \
      "(mTLS), registry https://$HOST:$CLUSTER_REGISTRY_PORT, OIDC issuer $ISSUER_URL; client flags in" \
      "$CLUSTER_HOME/<user>[-mtls|-plain|-oidc].flags ($((ms / 1000)).$(printf '%03d' $((ms % 1000)))s)"
}

cmd_cluster_down() {
  local n pid
  if pid="$(registry_pid)"; then stop_pid "schema registry" "$pid" "$REGISTRY_PID"; fi
  if pid="$(issuer_pid)"; then stop_pid "OIDC issuer" "$pid" "$ISSUER_PID"; fi
  # In parallel: each broker's controlled shutdown waits for the others' answers anyway.
  for n in "${NODES[@]}"; do
    if pid="$(node_pid "$n")"; then stop_pid "node $n" "$pid" "$(node_pidfile "$n")" & fi
  done
  wait
}

cmd_cluster_kill() {
  local n="$1" pid
  check_node "$n"
  pid="$(node_pid "$n")" || die "node $n is not running"
  log "kill -9 node $n (pid $pid)"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$(node_pidfile "$n")"
}

cmd_cluster_start() {
  local n="$1"
  check_node "$n"
  [ -f "$(node_dir "$n")/data/meta.properties" ] || die "the cluster was never started; run cluster.sh up"
  start_node "$n"
  wait_node_port "$n" $(( $(date +%s) + STACK_UP_TIMEOUT ))
  log "node $n is up"
}

# Stops and starts one broker at a time (SIGTERM: controlled shutdown moves its leaders away),
# each time waiting until every partition is fully in sync again.
cmd_cluster_roll() {
  local n pid deadline
  for n in "${NODES[@]}"; do
    pid="$(node_pid "$n")" || die "node $n is not running"
    stop_pid "node $n" "$pid" "$(node_pidfile "$n")"
    cmd_cluster_start "$n"
    deadline=$(( $(date +%s) + STACK_UP_TIMEOUT ))
    while [ -n "$(under_replicated)" ]; do
      [ "$(date +%s)" -lt "$deadline" ] || die "partitions still under-replicated ${STACK_UP_TIMEOUT}s after node $n restarted"
      sleep 0.5
    done
  done
}

cmd_cluster_status() {
  local n pid
  for n in "${NODES[@]}"; do
    if pid="$(node_pid "$n")"; then echo "node $n  running (pid $pid)  $HOST:$(client_port "$n") (SASL_SSL), $HOST:$(mtls_port "$n") (mTLS)"
    else echo "node $n  stopped"; fi
  done
  if pid="$(registry_pid)"; then echo "registry running (pid $pid)  https://$HOST:$CLUSTER_REGISTRY_PORT"
  else echo "registry stopped"; fi
  if pid="$(issuer_pid)"; then echo "issuer   running (pid $pid)  $ISSUER_URL"
  else echo "issuer   stopped"; fi
}

cmd_cluster_clean() {
  cmd_cluster_down
  log "removing $CLUSTER_HOME (data, certificates, credentials)"
  rm -rf "$CLUSTER_HOME"
}

cluster_lock() {
  mkdir -p "$CLUSTER_HOME"
  exec 9>"$CLUSTER_HOME/.lock"
  flock -w 300 9 || die "another cluster.sh is holding $CLUSTER_HOME/.lock"
}

case "${1:-}" in
  up|down|clean|kill|start|roll) cluster_lock ;;
esac
# Runs Kafka's AclCommand as the admin user: `cluster.sh acl --add --allow-principal ...`; the
# lines of a file, each the arguments of one call, side by side: `cluster.sh acl --file F`.
cmd_cluster_acl() {
  local run=(kafka_java org.apache.kafka.tools.AclCommand --bootstrap-server "$(bootstrap)"
             --command-config "$ADMIN_JAVA")
  if [ "${1:-}" != --file ]; then "${run[@]}" "$@"; return; fi
  local line pids=() pid
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    local args=()
    eval "args=($line)"
    "${run[@]}" "${args[@]}" >>"$LOGS/acls.log" 2>&1 &
    pids+=($!)
  done <"$2"
  for pid in "${pids[@]}"; do wait "$pid" || die_log "$LOGS/acls.log" "AclCommand failed"; done
}

case "${1:-}" in
  up)     cmd_cluster_up ;;
  acl)    shift; cmd_cluster_acl "$@" ;;
  down)   cmd_cluster_down ;;
  clean)  cmd_cluster_clean ;;
  kill)   cmd_cluster_kill "${2:-}" ;;
  start)  cmd_cluster_start "${2:-}" ;;
  roll)   cmd_cluster_roll ;;
  status) cmd_cluster_status ;;
  *) echo "usage: $0 {up|down|clean|kill N|start N|roll|status|acl ARGS|acl --file F}" >&2; exit 2 ;;
esac
