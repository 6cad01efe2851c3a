# Sourced by the benchmark scripts (from the repository's root): what each
# checks and builds before it runs.

# The release binaries' directory.
BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"

# Fails unless each of the release binaries "$@" is built.
need_binaries() {
  local binary
  for binary in "$@"; do
    [ -x "$BIN/$binary" ] || { echo "missing $BIN/$binary: run cargo build --release --bins" >&2; exit 1; }
  done
}

# Builds the Kafka Streams peer (bench/peers/kafka-streams/target/ks-peer.jar)
# if it is missing or older than its sources: Java 17 and Maven, with its
# dependencies from Maven Central.
build_peer() {
  local peer=bench/peers/kafka-streams
  command -v java >/dev/null && command -v mvn >/dev/null \
    || { echo "the Kafka Streams peer needs java (17+) and mvn" >&2; exit 1; }
  if [ ! -f "$peer/target/ks-peer.jar" ] \
      || [ -n "$(find "$peer/pom.xml" "$peer/src" -newer "$peer/target/ks-peer.jar" -print -quit)" ]; then
    echo "building the Kafka Streams peer ($peer/target/ks-peer.jar)..." >&2
    mvn -q -B -f "$peer/pom.xml" package -DskipTests >&2
  fi
}
