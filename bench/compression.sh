#!/usr/bin/env bash
# bench/compression.sh: which `--compression-type` should the services use?
#
# For the records the services write (window-aggregator's and the
# sessionizer's output rows, from a run of each service on a loadgen input)
# and the loadgen inputs themselves (orders, user events), all Avro in the
# Confluent wire format, and for each codec none, gzip, snappy, lz4, zstd:
#
#   * bytes per record on the broker: the record batches in the topic's log
#     segment under the broker's log dir ($STACK_HOME/kafka/data, see
#     deploy/local/stack.sh), the transaction marker left out;
#   * the producer's CPU per record: the same N records (a JSON-lines dump
#     of the topic) written with each codec by the same program, `streamctl
#     produce --kafka compression.type=X` (the runtime's `Delivery`, the
#     services' producer: idempotent, transactional), user+sys of the process
#     (`/usr/bin/time`) minus the `none` run's in the same round; and, where
#     `perf` works, the CPU in the codec's own functions (perf samples in the
#     LZ4/ZSTD/snappy/zlib symbols, their share times the process's CPU),
#     which the rest of the process's noise does not blur;
#   * the consumer's CPU per record: `streamctl consume` of each topic, the
#     same two ways (decompression).
#   * for lz4 and zstd, the same batches (the `none` topic's uncompressed
#     record sections, cut at the batch size) through the optimised lz4 and
#     zstd command-line tools (`lz4 -b1`, `zstd -b3`: librdkafka's default
#     levels): what the codecs cost when compiled with optimisation, since
#     a debug build's librdkafka, lz4, snappy and zstd are compiled -O0
#     (BENCHMARKS.md, "Compression"); gzip is the system's zlib either way.
#
# Batches: every producer run writes batches of exactly
# COMPRESSION_BATCH_RECORDS records (`batch.num.messages`, `linger.ms=100`),
# so that all codecs compress the same batches; the ratio depends on it.
#
# Inputs are deterministic: `loadgen fill --seed 42` in the output-heavy
# shapes (bench/README.md, "Shapes"), the services on event time. Rounds run
# the codecs in a rotating order. Topics (and the registry subjects of this
# run) are deleted at the end unless COMPRESSION_KEEP=1.
#
# Usage: bash bench/compression.sh   (the local stack up: `make up`)
# Prints a Markdown table on standard output, progress on standard error;
# the raw measurements stay in $TMPDIR/compression-<time>/{results,optimised}.tsv.
#
# Environment:
#   COMPRESSION_RECORDS        records per kind and run (default 150000)
#   COMPRESSION_RUNS           rounds (default 3)
#   COMPRESSION_CODECS         default "none gzip snappy lz4 zstd" (none first: the baseline)
#   COMPRESSION_KINDS          default "wa-out sess-out wa-in sess-in"
#   COMPRESSION_BATCH_RECORDS  records per batch (default 2000)
#   COMPRESSION_PERF=0         no perf attribution
#   COMPRESSION_KEEP=1         keep the topics and the work directory
#   BIN_DIR                    the binaries (default $CARGO_TARGET_DIR/debug)
#   STACK_HOME                 the local stack (default /var/tmp/streams-stack)
#
# Takes ~15 minutes with the defaults on the 2-core machine (debug build; 904 s on
# 2026-12-05), and ~300 MB of broker log until the topics are deleted at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="${BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/streams-target}/debug}"
STACK_HOME="${STACK_HOME:-/var/tmp/streams-stack}"
KAFKA_DATA="${KAFKA_DATA:-$STACK_HOME/kafka/data}"
RECORDS="${COMPRESSION_RECORDS:-150000}"
RUNS="${COMPRESSION_RUNS:-3}"
read -r -a CODECS <<<"${COMPRESSION_CODECS:-none gzip snappy lz4 zstd}"
read -r -a KINDS <<<"${COMPRESSION_KINDS:-wa-out sess-out wa-in sess-in}"
BATCH="${COMPRESSION_BATCH_RECORDS:-2000}"
PERF="${COMPRESSION_PERF:-1}"
KEEP="${COMPRESSION_KEEP:-0}"
PREFIX="compression-$(date +%s)"
WORK="${TMPDIR:-/tmp}/$PREFIX"
SCHEMAS="$ROOT/shared/schemas/avro"
STREAMCTL="$BIN_DIR/streamctl"
LOADGEN="$BIN_DIR/loadgen"

log() { printf '[compression] %s\n' "$*" >&2; }
die() { printf '[compression] ERROR: %s\n' "$*" >&2; exit 1; }

for bin in streamctl loadgen window-aggregator sessionizer; do
  [ -x "$BIN_DIR/$bin" ] || die "$BIN_DIR/$bin missing (cargo build --bins, or set BIN_DIR)"
done
[ -d "$KAFKA_DATA" ] || die "no broker log dir at $KAFKA_DATA (set STACK_HOME or KAFKA_DATA)"
[ "${CODECS[0]}" = none ] || die "COMPRESSION_CODECS must start with none (the baseline)"
"$STREAMCTL" topics list >/dev/null || die "no broker at 127.0.0.1:9092 (make up)"
mkdir -p "$WORK"
if [ "$PERF" != 0 ] && ! { command -v perf >/dev/null && perf record -q -o "$WORK/probe.data" -- true 2>/dev/null; }; then
  log "perf does not work here: no attribution to the codecs' functions"
  PERF=0
fi
rm -f "$WORK/probe.data"

SERVICE_PID=""
cleanup() {
  if [ -n "$SERVICE_PID" ]; then kill -TERM "$SERVICE_PID" 2>/dev/null || true; wait "$SERVICE_PID" 2>/dev/null || true; fi
  if [ "$KEEP" != 1 ]; then
    "$LOADGEN" topics --delete-prefix "$PREFIX" >/dev/null 2>&1 || true
    # The subjects the producers and services registered (soft, then hard delete).
    for subject in $(curl -sf http://127.0.0.1:8081/subjects | python3 -c \
        'import json,sys; print(" ".join(s for s in json.load(sys.stdin) if s.startswith(sys.argv[1])))' "$PREFIX" 2>/dev/null); do
      curl -sf -X DELETE "http://127.0.0.1:8081/subjects/$subject" >/dev/null 2>&1 || true
      curl -sf -X DELETE "http://127.0.0.1:8081/subjects/$subject?permanent=true" >/dev/null 2>&1 || true
    done
    find "$WORK" -mindepth 1 -maxdepth 1 ! -name '*.tsv' -exec rm -rf {} +
  fi
}
trap cleanup EXIT

schema_of() {
  case "$1" in
    wa-out) echo "$SCHEMAS/order-window-counts.avsc" ;;
    sess-out) echo "$SCHEMAS/user-sessions.avsc" ;;
    wa-in) echo "$SCHEMAS/orders-marketplace.avsc" ;;
    sess-in) echo "$SCHEMAS/user-events.avsc" ;;
    *) die "unknown kind $1" ;;
  esac
}

# The record batches of a topic's partition 0 on the broker: data bytes
# (batch headers included, transaction markers not), batches, records.
segment() {
  python3 - "$KAFKA_DATA/$1-0" <<'PY'
import glob, os, struct, sys
size = batches = records = 0
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    data = open(path, "rb").read()
    i = 0
    while i + 61 <= len(data):
        length, = struct.unpack_from(">i", data, i + 8)
        attributes, = struct.unpack_from(">h", data, i + 21)
        if not attributes & 0x20:  # not a control batch (transaction marker)
            size += 12 + length
            batches += 1
            records += struct.unpack_from(">i", data, i + 57)[0]
        i += 12 + length
print(size, batches, records)
PY
}

# Runs a command, timed (and sampled by perf): prints "user sys wall share"
# where share is the fraction of the process's samples in codec $1's
# functions ("-" without perf).
measure() {
  local codec="$1" tag="$2"; shift 2
  local timing="$WORK/$tag.time" samples="$WORK/$tag.perf"
  if [ "$PERF" != 0 ]; then
    perf record -q -F 999 -o "$samples" -- /usr/bin/time -f '%U %S %e' -o "$timing" "$@"
  else
    /usr/bin/time -f '%U %S %e' -o "$timing" "$@"
  fi
  local share="-"
  if [ "$PERF" != 0 ]; then
    share=$(perf report -i "$samples" --stdio --no-children --sort dso,sym -t '|' -q 2>/dev/null |
      python3 "$WORK/share.py" "$codec")
    rm -f "$samples"
  fi
  echo "$(tail -n 1 "$timing") $share"
}

cat >"$WORK/share.py" <<'PY'
# perf report lines "percent%|dso|[.] symbol" on stdin: the share of the
# samples in the functions of the codec in argv[1] (compression and
# decompression), as a fraction.
import re, sys
codec = sys.argv[1]
SYMBOLS = {
    "lz4": r"(LZ4|rd_kafka_lz4|XXH32|XXH_|read_long_length_no_check|ctxTypeID_to_size)",
    "zstd": r"(ZSTD|FSE_|HUF_|HIST_|ZDICT|COVER|POOL_|BIT_|MEM_|ERR_|rd_kafka_zstd)",
    "snappy": r"(rd_kafka_snappy|sn_compress|compress_fragment|emit_copy|emit_literal"
              r"|find_match_length|get_hash_table|hash_bytes|decompress_all_tags"
              r"|internal_uncompress|refill_tag|writer_|incremental_copy|init_snappy"
              r"|exit_snappy|varint_encode32|varint_parse32_with_limit|read_uncompressed_length"
              r"|get_eight_bytes_at|get_u32_at_offset|get_unaligned|put_unaligned"
              r"|unaligned_copy64|find_lsb_set_non_zero64|log2_floor|n_bytes_after_addr|sink_peek)",
    "gzip": r"(rd_gz|rd_kafka_gzip)",
}
pattern = re.compile(r"^(?:" + SYMBOLS.get(codec, r"(?!)") + r")")
total = 0.0
for line in sys.stdin:
    parts = [p.strip() for p in line.split("|")]
    if len(parts) < 3 or not parts[0].endswith("%"):
        continue
    percent = float(parts[0].rstrip("%"))
    dso, symbol = parts[1], re.sub(r"^\[.\]\s*", "", parts[2])
    if pattern.match(symbol) or (codec == "gzip" and dso.startswith("libz.so")):
        total += percent
print(f"{total / 100:.5f}")
PY

# ---- 1. the records: loadgen inputs, and the services' outputs on them -------------------
started=$(date +%s)
log "work directory $WORK; load: $(cut -d' ' -f1-3 /proc/loadavg)"
wa_in="$PREFIX-wa-in" sess_in="$PREFIX-sess-in"
# window-aggregator --group-by customer_id writes ~1.8 rows per order, the
# sessionizer ~1 per event (less the sessions still open at the end).
log "loadgen fill: $RECORDS orders, $((RECORDS * 105 / 100 + 5000)) user events (output-heavy, seed 42)"
"$LOADGEN" fill --use-case window-aggregator --shape output-heavy --topics "$wa_in" \
  --records "$RECORDS" --seed 42 >/dev/null
"$LOADGEN" fill --use-case sessionizer --shape output-heavy --topics "$sess_in" \
  --records "$((RECORDS * 105 / 100 + 5000))" --seed 42 >/dev/null

run_service() {  # name app input output [flags...]
  local name="$1" app="$2" input="$3" output="$4"; shift 4
  local through=()
  [ "$name" = window-aggregator ] && through=(--through "$input=$app-window-partials-repartition@$app-final")
  "$LOADGEN" topics --create "$output" >/dev/null
  "$BIN_DIR/$name" --input-topic "$input" --output-topic "$output" --application-id "$app" \
    --processing-guarantee exactly_once_v2 --state-dir "$WORK/state-$app" --http-addr 127.0.0.1:0 \
    --log-format json --compression-type none "$@" >"$WORK/$app.log" 2>&1 &
  SERVICE_PID=$!
  local watched
  watched=$("$LOADGEN" watch --pid "$SERVICE_PID" --group "$app" --inputs "$input" --outputs "$output" \
    --timeout-secs 900 "${through[@]}")
  kill -TERM "$SERVICE_PID"; wait "$SERVICE_PID" || true; SERVICE_PID=""
  echo "$watched" | grep -q '"ok":true' || die "$name did not finish: $watched (log $WORK/$app.log)"
  log "$name: $(echo "$watched" | python3 -c 'import json,sys; w=json.load(sys.stdin); print(w["output_end_offset"], "rows in", round(w["wall_s"], 1), "s")')"
}
log "window-aggregator --group-by customer_id and the sessionizer, --compression-type none"
run_service window-aggregator "$PREFIX-wa" "$wa_in" "$PREFIX-wa-out" --group-by customer_id
run_service sessionizer "$PREFIX-sess" "$sess_in" "$PREFIX-sess-out"

for kind in "${KINDS[@]}"; do
  "$STREAMCTL" consume --topic "$PREFIX-$kind" --from-beginning --until-end --max "$RECORDS" \
    >"$WORK/$kind.jsonl"
  lines=$(wc -l <"$WORK/$kind.jsonl")
  [ "$lines" = "$RECORDS" ] || die "$kind: $lines records, not $RECORDS"
done

# ---- 2. the same records with each codec, RUNS rounds ---------------------------------
printf 'kind\tcodec\trun\tside\tuser\tsys\twall\tshare\tbytes\tbatches\trecords\n' >"$WORK/results.tsv"
for run in $(seq 1 "$RUNS"); do
  order=("${CODECS[@]:$(((run - 1) % ${#CODECS[@]}))}" "${CODECS[@]:0:$(((run - 1) % ${#CODECS[@]}))}")
  for kind in "${KINDS[@]}"; do
    for codec in "${order[@]}"; do
      topic="$PREFIX-m-$kind-$codec-$run"
      "$STREAMCTL" topics create "$topic" >/dev/null
      read -r user sys wall share < <(measure "$codec" "$kind-$codec-$run-produce" \
        "$STREAMCTL" --kafka "compression.type=$codec" --kafka linger.ms=100 \
        --kafka "batch.num.messages=$BATCH" \
        produce --topic "$topic" --schema "$(schema_of "$kind")" --file "$WORK/$kind.jsonl" 2>/dev/null)
      read -r bytes batches records < <(segment "$topic")
      [ "$records" = "$RECORDS" ] || die "$topic: $records records on the broker, not $RECORDS"
      printf '%s\t%s\t%s\tproduce\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$codec" "$run" \
        "$user" "$sys" "$wall" "$share" "$bytes" "$batches" "$records" >>"$WORK/results.tsv"
      read -r cuser csys cwall cshare < <(measure "$codec" "$kind-$codec-$run-consume" \
        sh -c "'$STREAMCTL' consume --topic '$topic' --from-beginning --until-end >'$WORK/consumed'")
      consumed=$(wc -l <"$WORK/consumed")
      [ "$consumed" = "$RECORDS" ] || die "$topic: consumed $consumed records, not $RECORDS"
      printf '%s\t%s\t%s\tconsume\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$codec" "$run" \
        "$cuser" "$csys" "$cwall" "$cshare" "$bytes" "$batches" "$records" >>"$WORK/results.tsv"
      log "round $run $kind $codec: $((bytes / RECORDS)) B/record, producer ${user}+${sys} s, consumer ${cuser}+${csys} s, codec share ${share}/${cshare}"
    done
  done
done

# ---- 3. lz4 and zstd compiled with optimisation, on the same batches -----------------
printf 'kind\tcodec\trun\tin\tout\tcompress_mbps\tdecompress_mbps\n' >"$WORK/optimised.tsv"
if command -v lz4 >/dev/null && command -v zstd >/dev/null; then
  for kind in "${KINDS[@]}"; do
    # The uncompressed record sections of the none topic's batches: what
    # librdkafka compresses, one batch at a time.
    block=$(python3 - "$KAFKA_DATA/$PREFIX-m-$kind-none-1-0" "$WORK/$kind.sections" <<'PY'
import glob, os, struct, sys
out, sections = open(sys.argv[2], "wb"), 0
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    data, i = open(path, "rb").read(), 0
    while i + 61 <= len(data):
        length, = struct.unpack_from(">i", data, i + 8)
        attributes, = struct.unpack_from(">h", data, i + 21)
        if not attributes & 0x20:
            out.write(data[i + 61:i + 12 + length])
            sections += 1
        i += 12 + length
print(out.tell() // max(sections, 1))
PY
)
    for run in $(seq 1 "$RUNS"); do
      for codec in lz4 zstd; do
        if [ "$codec" = lz4 ]; then line=$(lz4 -b1 -i1 -B"$block" "$WORK/$kind.sections" 2>&1)
        else line=$(zstd -b3 -i1 -B"$block" "$WORK/$kind.sections" 2>&1); fi
        # "... : IN -> OUT (ratio), C MB/s ,D MB/s" (lz4) or "(xR), C MB/s, D MB/s" (zstd): the last.
        parsed=$(printf '%s' "$line" | tr '\r' '\n' | python3 -c '
import re, sys
m = re.findall(r":\s*(\d+) ->\s*(\d+) \([x0-9.]+\),\s*([0-9.]+) MB/s\s*,\s*([0-9.]+) MB/s", sys.stdin.read())
print(*m[-1] if m else ("-",) * 4)')
        printf '%s\t%s\t%s\t%s\n' "$kind" "$codec" "$run" "${parsed// /$'\t'}" >>"$WORK/optimised.tsv"
      done
    done
  done
else
  log "lz4 or zstd command-line tool missing: no optimised comparison"
fi

# ---- 4. the table ----------------------------------------------------------------------
log "done in $(($(date +%s) - started)) s; load: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$WORK" "$RECORDS" "$BATCH" "$RUNS" <<'PY'
import csv, statistics, sys
work, n, batch, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
NAMES = {"wa-out": "window-aggregator rows", "sess-out": "sessionizer rows",
         "wa-in": "orders (loadgen)", "sess-in": "user events (loadgen)"}
rows = list(csv.DictReader(open(f"{work}/results.tsv"), delimiter="\t"))
kinds = list(dict.fromkeys(r["kind"] for r in rows))
codecs = list(dict.fromkeys(r["codec"] for r in rows))
def cpu(r):
    return float(r["user"]) + float(r["sys"])
def get(kind, codec, side):
    return {int(r["run"]): r for r in rows if (r["kind"], r["codec"], r["side"]) == (kind, codec, side)}
def spread(values, digits=2):
    values = sorted(values)
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{values[0]:.{digits}f} – {values[-1]:.{digits}f}]"
perf = any(r["share"] != "-" for r in rows)
print(f"{n} records per kind and run, batches of {batch} records, {runs} runs: "
      "medians [min – max], µs of CPU per record.\n")
head = ["records", "codec", "bytes/record", "vs none", "producer CPU", "producer Δ vs none"]
head += ["producer, in the codec (perf)"] if perf else []
head += ["consumer Δ vs none"] + (["consumer, in the codec (perf)"] if perf else [])
print("| " + " | ".join(head) + " |")
print("|" + " --- |" * len(head))
for kind in kinds:
    base = {side: get(kind, "none", side) for side in ("produce", "consume")}
    none_bytes = statistics.median(int(r["bytes"]) for r in base["produce"].values())
    for codec in codecs:
        cells = [NAMES.get(kind, kind), codec]
        produced, consumed = get(kind, codec, "produce"), get(kind, codec, "consume")
        size = statistics.median(int(r["bytes"]) for r in produced.values())
        cells += [f"{size / n:.1f}", f"{none_bytes / size:.2f}×"]
        cells.append(spread([cpu(r) / n * 1e6 for r in produced.values()]))
        for side, runs_ in (("produce", produced), ("consume", consumed)):
            delta = [(cpu(r) - cpu(base[side][run])) / n * 1e6
                     for run, r in runs_.items() if run in base[side]]
            cells.append("–" if codec == "none" else spread(delta))
            if perf:
                cells.append("–" if codec == "none" else
                             spread([float(r["share"]) * cpu(r) / n * 1e6 for r in runs_.values()]))
        print("| " + " | ".join(cells) + " |")
opt = [r for r in csv.DictReader(open(f"{work}/optimised.tsv"), delimiter="\t") if r["in"] != "-"]
if opt:
    print("\nlz4 and zstd compiled with optimisation (`lz4 -b1`, `zstd -b3`, the command-line "
          "tools), on the `none` topic's batches (their record sections, cut at the mean batch's size):\n")
    print("| records | codec | bytes/record, in → out | compress µs/record | decompress µs/record |")
    print("| --- | --- | --- | --- | --- |")
    for kind in kinds:
        for codec in ("lz4", "zstd"):
            mine = [r for r in opt if (r["kind"], r["codec"]) == (kind, codec)]
            if not mine:
                continue
            bytes_in, bytes_out = int(mine[0]["in"]) / n, int(mine[0]["out"]) / n
            comp = [int(r["in"]) / n / float(r["compress_mbps"]) for r in mine]
            decomp = [int(r["in"]) / n / float(r["decompress_mbps"]) for r in mine]
            print(f"| {NAMES.get(kind, kind)} | {codec} | {bytes_in:.1f} → {bytes_out:.1f} | "
                  f"{spread(comp, 3)} | {spread(decomp, 3)} |")
PY
