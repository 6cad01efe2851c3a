#!/usr/bin/env bash
# `make bench-failover`: how long the tasks of an instance killed with
# kill -9 take to produce output again on the survivors, without standby
# replicas (full restore from the changelogs) and with `--standby-replicas 1`
# (the survivors kept them warm and restore only the changelog tail).
#
# Per configuration (FAILOVER_STANDBYS, default "0 1") and round (BENCH_RUNS,
# default 1): three release sessionizers, exactly-once, one consumer group,
# `session.timeout.ms` FAILOVER_SESSION_TIMEOUT_MS (6000), on a fresh input
# topic with 6 partitions. Once the range assignor has given each instance
# its two tasks, FAILOVER_USERS distinct users (default 1 000 000) send one
# LOGIN each, all within 20 s of event time, so every session stays open:
# that many sessions and timers in state. When all input is consumed and
# (with standbys) every standby reports lag 0, the instance holding tasks 2
# and 3 is killed with SIGKILL (the middle one of the range order: the
# survivors keep their own tasks and take only the killed one's), and one
# LOGOUT per partition is produced at once. Measured from the kill:
#
#   * the LOGOUT rows of the moved tasks' partitions (first and last; each
#     must say `LOGIN > LOGOUT`, i.e. the session state came along): the
#     last one is "failover s",
#   * when the group noticed the kill ("detected s": the survivors' first
#     "tasks set aside" log line, the eager rebalance's revocation; about the
#     session timeout) and what follows it ("takeover s" = failover -
#     detected: rebalance, task openings and restores, first commit),
#   * the survivors ready again with all six tasks (`/readyz` and the
#     per-task gauges, polled every 100 ms),
#   * the survivors' restored changelog records (`streams_restored_records_total`
#     and the "restored changelog" log lines after the kill).
#
# Prints a table and writes bench/results/<date>-failover.json
# (FAILOVER_RESULTS overrides the path). Needs the release binaries
# (sessionizer, streamctl; BIN_DIR overrides the directory) and the local
# stack. FAILOVER_KEEP=1 keeps the work directory (logs, state);
# FAILOVER_RUN names the run (its topics' prefix; bench/scale.py sets it).
set -euo pipefail
cd "$(dirname "$0")/.."

export BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
export STREAMCTL="${STREAMCTL:-$BIN/streamctl}"
export USERS="${FAILOVER_USERS:-1000000}"
export STANDBYS="${FAILOVER_STANDBYS:-0 1}"
export ROUNDS="${BENCH_RUNS:-1}"
export SESSION_TIMEOUT_MS="${FAILOVER_SESSION_TIMEOUT_MS:-6000}"
export RUN="${FAILOVER_RUN:-failover-$(date +%s)}"
export WORK="${TMPDIR:-/tmp}/$RUN"
export RESULTS="${FAILOVER_RESULTS:-bench/results/$(date +%F)-failover.json}"
export SCHEMA="shared/schemas/avro/user-events.avsc"

for binary in sessionizer streamctl; do
  [ -x "$BIN/$binary" ] || { echo "$BIN/$binary is not built (cargo build --release --bins)" >&2; exit 1; }
done
mkdir -p "$WORK" "$(dirname "$RESULTS")"
trap '[ -n "${FAILOVER_KEEP:-}" ] || rm -rf "$WORK"' EXIT

python3 - <<'PY'
import datetime, json, os, shutil, signal, socket, subprocess, sys, threading, time
import urllib.error, urllib.request

sys.path.insert(0, "bench")
from run import stop_process  # noqa: E402

BIN, STREAMCTL, WORK = os.environ["BIN"], os.environ["STREAMCTL"], os.environ["WORK"]
RUN, SCHEMA, RESULTS = os.environ["RUN"], os.environ["SCHEMA"], os.environ["RESULTS"]
USERS = int(os.environ["USERS"])
STANDBYS = [int(n) for n in os.environ["STANDBYS"].split()]
ROUNDS = int(os.environ["ROUNDS"])
SESSION_TIMEOUT_MS = int(os.environ["SESSION_TIMEOUT_MS"])
PARTITIONS, INSTANCES = 6, 3
BASE = 1_783_345_153_000
# Every LOGIN within 20 s of event time, below the 30 s session timeout:
# no session ends, all stay in state.
SPREAD_MS = 20_000
CHUNK = 250_000  # lines per `streamctl produce` (one transaction each)


def log(message):
    print(f"[bench-failover] {message}", file=sys.stderr, flush=True)


def murmur2(data):
    """Kafka's murmur2 (the Java client's Utils.murmur2), as an unsigned 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[whole:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def partition_of(key):
    return (murmur2(key.encode()) & 0x7FFFFFFF) % PARTITIONS


# The values of Kafka's own partitioner tests (as tests/src/lib.rs checks).
assert murmur2(b"21") & 0x7FFFFFFF == -973_932_308 & 0x7FFFFFFF
assert murmur2(b"abc") & 0x7FFFFFFF == 479_470_107


def streamctl(*args):
    result = subprocess.run([STREAMCTL, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"streamctl {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def event(user, kind, time_ms):
    return json.dumps({"key": user, "value": {"user_id": user, "event_type": kind,
                                              "event_time": time_ms}})


# The input, generated once: user-0 .. user-(USERS-1), one LOGIN each, in
# event-time order (so no event is late on its partition).
chunks = []
for start in range(0, USERS, CHUNK):
    path = os.path.join(WORK, f"logins-{start // CHUNK:03}.jsonl")
    with open(path, "w") as file:
        for u in range(start, min(start + CHUNK, USERS)):
            file.write(event(f"user-{u}", "LOGIN", BASE + u * SPREAD_MS // USERS) + "\n")
    chunks.append(path)
# One LOGOUT per partition, of the first user of that partition: its row
# says `LOGIN > LOGOUT` only if the task has the user's session.
logout_users = {}
for u in range(USERS):
    logout_users.setdefault(partition_of(f"user-{u}"), f"user-{u}")
    if len(logout_users) == PARTITIONS:
        break
logouts = os.path.join(WORK, "logouts.jsonl")
with open(logouts, "w") as file:
    for p in range(PARTITIONS):
        file.write(event(logout_users[p], "LOGOUT", BASE + SPREAD_MS + 1) + "\n")
partition_of_user = {user: p for p, user in logout_users.items()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sum_series(text, name):
    """The sum of every series of `name` (any labels), or None if there is none."""
    total = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series == name or series.startswith(name + "{"):
            total = (total or 0.0) + float(value)
    return total


def active_tasks(text):
    return {int(line.split('"')[1]) for line in text.splitlines()
            if line.startswith('streams_timers_pending{task="')}


class Instance:
    def __init__(self, app, topics, standbys, index):
        self.port = free_port()
        self.state = os.path.join(WORK, f"{app}-state-{index}")
        self.log_path = os.path.join(WORK, f"{app}-{index}.log")
        command = [f"{BIN}/sessionizer", "--input-topic", topics[0], "--output-topic", topics[1],
                   "--application-id", app, "--state-dir", self.state,
                   "--http-addr", f"127.0.0.1:{self.port}", "--log-format", "json",
                   "--kafka", f"session.timeout.ms={SESSION_TIMEOUT_MS}",
                   "--kafka", "heartbeat.interval.ms=1000"]
        if standbys:
            command += ["--standby-replicas", str(standbys)]
        with open(self.log_path, "w") as log_file:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file)

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, ""
        except OSError:
            return None, ""

    def metrics(self):
        status, text = self.get("/metrics")
        return text if status == 200 else ""

    def ready(self):
        return self.get("/readyz")[0] == 200

    def log_size(self):
        return os.path.getsize(self.log_path)

    def log_fields(self, offset=0):
        """(epoch seconds, `fields`) of the JSON log lines from byte `offset` on."""
        with open(self.log_path, "rb") as file:
            file.seek(offset)
            lines = file.read().decode(errors="replace").splitlines()
        fields = []
        for line in lines:
            if line.startswith("{"):
                try:
                    entry = json.loads(line)
                    at = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
                    fields.append((at.timestamp(), entry.get("fields", {})))
                except (ValueError, KeyError):
                    pass
        return fields

    def check_alive(self):
        if self.proc.poll() is not None:
            with open(self.log_path) as file:
                tail = file.read()[-4000:]
            raise SystemExit(f"an instance exited with {self.proc.returncode}:\n{tail}")

    def stop(self):
        stop_process(self.proc, 60)


def wait_until(what, timeout_s, condition, instances):
    deadline = time.monotonic() + timeout_s
    while True:
        for instance in instances:
            instance.check_alive()
        if condition():
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def changelog_offsets(app, partitions):
    """End offsets (transaction markers included) of the app's changelogs on `partitions`."""
    total = 0
    for topic in streamctl("topics", "list").split():
        if topic.startswith(app + "-") and topic.endswith("-changelog"):
            for line in streamctl("topics", "describe", topic).splitlines():
                words = line.split()
                if words[:1] == ["partition"] and int(words[1]) in partitions:
                    total += int(line.rsplit("..", 1)[1])
    return total


class OutputWatcher:
    """`streamctl consume` on the output, noting when each row arrives."""

    def __init__(self, topic):
        self.rows = []
        self.proc = subprocess.Popen([STREAMCTL, "consume", "--topic", topic, "--from-beginning"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        for line in self.proc.stdout:
            if line.strip():
                self.rows.append((time.monotonic(), json.loads(line)))

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run_once(standbys, round_):
    app = f"{RUN}-s{standbys}-r{round_}"
    topics = (f"{app}-in", f"{app}-out")
    for topic in topics:
        streamctl("topics", "create", topic, "--partitions", str(PARTITIONS))
    instances = [Instance(app, topics, standbys, i) for i in range(INSTANCES)]
    watcher = None
    try:
        # The input comes once each instance holds its two tasks, so that the
        # state is built where it stays (no restores before the kill).
        owned = []

        def balanced():
            nonlocal owned
            owned = [active_tasks(i.metrics()) for i in instances]
            return (all(i.ready() for i in instances)
                    and all(len(t) == PARTITIONS // INSTANCES for t in owned)
                    and set().union(*owned) == set(range(PARTITIONS)))

        wait_until("three instances with two tasks each", 180, balanced, instances)
        log(f"{app}: tasks {[sorted(t) for t in owned]}; producing {USERS:,} LOGINs")
        started = time.monotonic()
        for chunk in chunks:
            streamctl("produce", "--topic", topics[0], "--schema", SCHEMA, "--file", chunk)
        produce_s = time.monotonic() - started
        consumed = f'streams_records_consumed_total{{topic="{topics[0]}"}}'
        wait_until("the input consumed", 1800,
                   lambda: sum(sum_series(i.metrics(), consumed) or 0 for i in instances) >= USERS,
                   instances)
        consumed_s = time.monotonic() - started
        commits = [sum_series(i.metrics(), "streams_commits_total") or 0 for i in instances]
        wait_until("a commit after the input", 60,
                   lambda: all((sum_series(i.metrics(), "streams_commits_total") or 0) > c
                               for i, c in zip(instances, commits)), instances)
        if standbys:
            def caught_up():
                texts = [i.metrics() for i in instances]
                return all((sum_series(t, "streams_standby_tasks") or 0) >= 1
                           and sum_series(t, "streams_standby_lag_records") == 0 for t in texts)
            wait_until("every standby at lag 0", 1800, caught_up, instances)
        else:
            time.sleep(2)
        standby_caught_up_s = time.monotonic() - started

        # The victim: the instance holding the middle tasks (2 and 3).
        victim_index = next(n for n, t in enumerate(owned) if PARTITIONS // 2 in t)
        moved = sorted(owned[victim_index])
        victim = instances[victim_index]
        survivors = [i for n, i in enumerate(instances) if n != victim_index]
        before = [i.metrics() for i in instances]
        state_keys = [sum_series(t, "streams_state_keys") for t in before]
        standby_tasks = [sum_series(t, "streams_standby_tasks") for t in before]
        standby_records = [sum_series(t, "streams_standby_records_total") for t in before]
        restored_before = [sum_series(i.metrics(), "streams_restored_records_total") or 0
                           for i in survivors]
        moved_changelog = changelog_offsets(app, set(moved))
        log_offsets = [i.log_size() for i in survivors]
        watcher = OutputWatcher(topics[1])
        time.sleep(2)  # the watcher is assigned and at the end (no rows yet)
        early_rows = len(watcher.rows)

        log(f"{app}: kill -9 of the instance with tasks {moved}")
        victim.proc.send_signal(signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), time.time()
        victim.proc.wait()
        streamctl("produce", "--topic", topics[0], "--schema", SCHEMA, "--file", logouts)
        logouts_produced_s = time.monotonic() - killed_at

        ready_s = None
        deadline = killed_at + 600
        while time.monotonic() < deadline:
            for instance in survivors:
                instance.check_alive()
            if ready_s is None:
                now = time.monotonic()
                texts = [i.metrics() for i in survivors]
                if (set().union(*(active_tasks(t) for t in texts)) == set(range(PARTITIONS))
                        and all(i.ready() for i in survivors)):
                    ready_s = now - killed_at
            arrived = {partition_of_user.get(row.get("key")) for _, row in watcher.rows}
            if ready_s is not None and set(range(PARTITIONS)) <= arrived:
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{app}: not every LOGOUT row within 600 s of the kill")
        time.sleep(1)

        rows = {}
        for at, row in watcher.rows[early_rows:]:
            p = partition_of_user.get(row.get("key"))
            if p is not None and p not in rows:
                rows[p] = (at - killed_at, row["value"])
        correct = all(rows[p][1].get("event_sequence") == "LOGIN > LOGOUT" for p in rows)
        after = [i.metrics() for i in survivors]
        restored = [(sum_series(t, "streams_restored_records_total") or 0) - b
                    for t, b in zip(after, restored_before)]
        restores, readies, closes, standbys_started = [], [], [], 0
        for instance, offset in zip(survivors, log_offsets):
            for at, f in instance.log_fields(offset):
                message = f.get("message")
                if message == "restored changelog":
                    restores.append({k: f.get(k) for k in
                                     ("topic", "partition", "records", "elapsed_ms")})
                elif message == "task ready" and f.get("partition") in moved:
                    readies.append({"partition": f["partition"], "elapsed_ms": f["elapsed_ms"],
                                    "after_kill_s": round(at - killed_wall, 3)})
                elif message in ("task closed", "tasks set aside for the rebalance"):
                    closes.append(at)
                elif message == "standby started":
                    standbys_started += 1
        # The group noticing the kill: the survivors' revocation (eager
        # rebalance: they set every task aside) starts the takeover.
        detected_s = min(closes) - killed_wall if closes else None
        failover_s = max(rows[p][0] for p in moved)
        result = {
            "standby_replicas": standbys, "round": round_, "users": USERS,
            "moved_tasks": moved,
            "failover_s": failover_s,
            "detected_s": detected_s,
            "takeover_s": failover_s - detected_s if detected_s is not None else None,
            "first_moved_row_s": min(rows[p][0] for p in moved),
            "survivor_rows_s": max(rows[p][0] for p in rows if p not in moved),
            "survivors_ready_s": ready_s,
            "logouts_produced_s": logouts_produced_s,
            "restored_records": sum(restored),
            "restored_records_per_survivor": restored,
            "restore_elapsed_ms": max((r["elapsed_ms"] for r in restores), default=0),
            "restores": restores,
            "moved_task_ready": readies,
            "standbys_started_after_kill": standbys_started,
            "moved_changelog_offsets": moved_changelog,
            "state_keys_before_kill": state_keys,
            "victim_state_keys": state_keys[victim_index],
            "standby_tasks_before_kill": standby_tasks,
            "standby_records_before_kill": standby_records,
            "rows_correct": correct,
            "produce_s": produce_s, "consumed_s": consumed_s,
            "standby_caught_up_s": standby_caught_up_s,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "load": os.getloadavg()[0],
        }
        log(f"{app}: " + json.dumps({k: v for k, v in result.items() if k != "restores"}))
        if not correct:
            log(f"{app}: a LOGOUT row lacks its LOGIN: the moved state was not all there: {rows}")
        return result
    finally:
        if watcher:
            watcher.stop()
        for instance in instances:
            instance.stop()
        for instance in instances:
            shutil.rmtree(instance.state, ignore_errors=True)


results = []
for round_ in range(1, ROUNDS + 1):
    # Alternate the order of the configurations from round to round.
    for standbys in (STANDBYS if round_ % 2 else list(reversed(STANDBYS))):
        results.append(run_once(standbys, round_))

header = ("standbys", "round", "failover s", "detected s", "takeover s", "ready s",
          "restored records", "restore ms", "moved changelog", "correct")


def seconds(value):
    return "-" if value is None else f"{value:.2f}"


print(" | ".join(header))
print(" | ".join("---" for _ in header))
for r in results:
    print(" | ".join(str(v) for v in (
        r["standby_replicas"], r["round"], seconds(r["failover_s"]), seconds(r["detected_s"]),
        seconds(r["takeover_s"]), seconds(r["survivors_ready_s"]),
        f"{r['restored_records']:,.0f}", r["restore_elapsed_ms"],
        f"{r['moved_changelog_offsets']:,}", r["rows_correct"])))
summary = {
    "date": time.strftime("%Y-%m-%d"), "service": "sessionizer", "users": USERS,
    "partitions": PARTITIONS, "instances": INSTANCES, "session_timeout_ms": SESSION_TIMEOUT_MS,
    "processing_guarantee": "exactly_once_v2", "cpus": os.cpu_count(), "runs": results,
}
with open(RESULTS, "w") as file:
    json.dump(summary, file, indent=2)
    file.write("\n")
log(f"results in {RESULTS}")
if not all(r["rows_correct"] for r in results):
    sys.exit(1)
PY
