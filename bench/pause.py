#!/usr/bin/env python3
"""`make bench-pause`: how long the tasks that do not move stop producing
while a group changes: a fourth instance joins, then one is killed with
kill -9. Ours (classic protocol, and KIP-848 with `--group-protocol
consumer`) beside Kafka Streams 4.4 (its default assignor).

Per system and round, on the local stack, exactly-once, commit every 100 ms:

1. three instances of the sessionizer on a fresh input topic with 6
   partitions (`session.timeout.ms` 6 s, heartbeats every second; KIP-848
   groups use the broker's session timeout, 45 s by default);
2. PAUSE_KEYS users (default 1 000 000) log in: that many sessions in
   state, open for the whole run (session timeout 1 h);
3. a steady PAUSE_RATE events/s (default 1 000) of those users, event time =
   wall clock, half of them a LOGOUT that ends its session with a row: each
   of the 6 output partitions gets rows with every commit;
4. after PAUSE_BASELINE_S (default 20 s) a fourth instance starts; after
   PAUSE_JOIN_S more (default 40 s) the first instance is killed with
   kill -9; the run ends PAUSE_KILL_S (default 60 s) after that.

`loadgen pauses` times the gaps between committed rows on each output
partition (a read_committed consumer) and samples the owner of each input
partition every 200 ms. Per event, a partition "did not move" when its
owner just before the event owns it at the end of the event's window too.
Measured per event: the longest gap of the partitions that did not move
("unmoved pause"), the longest gap of those that moved ("moved pause"), and
before any event the longest gap of all ("baseline gap": the commit
interval plus the consumer's own batching).

Environment: PAUSE_SYSTEMS (default "ours ours-consumer-protocol
kafka-streams"), BENCH_RUNS (rounds, default 1), PAUSE_STANDBYS (standby
replicas of ours and the peer, default 0), BIN_DIR, KS_JAVA_OPTS, BENCH_TAG.
Writes bench/results/<date>[-<tag>]-pause.json and prints a table; the
instances' logs stay in $TMPDIR/pause-<time>.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from run import BIN, JAR, JAVA_OPTS, ROOT, TAG, loadgen, log, stop_process

SYSTEMS = os.environ.get("PAUSE_SYSTEMS", "ours ours-consumer-protocol kafka-streams").split()
ROUNDS = int(os.environ.get("BENCH_RUNS", "1"))
KEYS = int(os.environ.get("PAUSE_KEYS", "1000000"))
RATE = float(os.environ.get("PAUSE_RATE", "1000"))
STANDBYS = int(os.environ.get("PAUSE_STANDBYS", "0"))
BASELINE_S = float(os.environ.get("PAUSE_BASELINE_S", "20"))
JOIN_S = float(os.environ.get("PAUSE_JOIN_S", "40"))
KILL_S = float(os.environ.get("PAUSE_KILL_S", "60"))
PARTITIONS, INSTANCES = 6, 3
SESSION_TIMEOUT_MS = 6000
SESSION_GAP_MS = 3_600_000
RUN = f"pause-{int(time.time())}"
WORK = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / RUN
_port = [19700]


def streamctl(*args):
    subprocess.run([str(BIN / "streamctl"), *map(str, args)], check=True, capture_output=True)


class Instance:
    def __init__(self, system, app, topics, index):
        self.log_path = WORK / f"{app}-{index}.log"
        state = WORK / f"{app}-state-{index}"
        if system == "kafka-streams":
            command = ["java", *JAVA_OPTS, "-jar", str(JAR), "sessionizer", "--application-id", app,
                       "--inputs", topics[0], "--output", topics[1], "--state-dir", str(state),
                       "--schemas-dir", str(ROOT / "shared/schemas/avro"),
                       "--session-timeout-ms", str(SESSION_GAP_MS),
                       "--standby-replicas", str(STANDBYS),
                       "--group-session-timeout-ms", str(SESSION_TIMEOUT_MS)]
        else:
            _port[0] += 1
            command = [str(BIN / "sessionizer"), "--input-topic", topics[0],
                       "--output-topic", topics[1], "--application-id", app,
                       "--state-dir", str(state), "--http-addr", f"127.0.0.1:{_port[0]}",
                       "--log-format", "json", "--session-timeout", "1h"]
            if system == "ours-consumer-protocol":
                command += ["--group-protocol", "consumer"]
            else:
                command += ["--kafka", f"session.timeout.ms={SESSION_TIMEOUT_MS}",
                            "--kafka", "heartbeat.interval.ms=1000"]
            if STANDBYS:
                command += ["--standby-replicas", str(STANDBYS)]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def check_alive(self):
        if self.proc.poll() is not None:
            raise SystemExit(f"an instance exited with {self.proc.returncode}: see {self.log_path}")

    def stop(self):
        stop_process(self.proc, 60)
        self.log.close()


def owners_at(samples, at_ms):
    """The owners (input partition -> member) of the last sample at or before `at_ms`."""
    current = {}
    for sample in samples:
        if sample["at_ms"] > at_ms:
            break
        current = {int(p): member for p, member in sample["owners"].items()}
    return current


def longest_gap(gaps, partitions, from_ms, to_ms):
    """The longest time (s) without a row on one of `partitions` within
    [from_ms, to_ms]: gaps clipped to it, so that the silence after a kill
    does not count in the window before it."""
    lengths = [(min(g["to_ms"], to_ms) - max(g["from_ms"], from_ms)) / 1000 for g in gaps
               if g["partition"] in partitions and g["from_ms"] < to_ms and g["to_ms"] > from_ms]
    return max(lengths, default=0.0)


def event_result(followed, name, at_ms, until_ms):
    before = owners_at(followed["owners"], at_ms)
    after = owners_at(followed["owners"], until_ms)
    unmoved = {p for p in range(PARTITIONS) if p in before and before.get(p) == after.get(p)}
    moved = set(range(PARTITIONS)) - unmoved
    return {
        "event": name,
        "unmoved_partitions": sorted(unmoved),
        "moved_partitions": sorted(moved),
        "unmoved_pause_s": longest_gap(followed["gaps"], unmoved, at_ms, until_ms),
        "moved_pause_s": longest_gap(followed["gaps"], moved, at_ms, until_ms),
        "members_before": len(set(before.values())),
        "members_after": len(set(after.values())),
    }


def run_once(system, round_):
    app = f"{RUN}-{system}-r{round_}"
    topics = (f"{app}-in", f"{app}-out")
    for topic in topics:
        streamctl("topics", "create", topic, "--partitions", PARTITIONS)
    instances = [Instance(system, app, topics, i) for i in range(INSTANCES)]
    follower = None
    try:
        log(f"{app}: {KEYS:,} logins")
        loadgen("fill", "--use-case", "sessionizer", "--topics", topics[0], "--records", KEYS,
                "--keys", KEYS, "--partitions", PARTITIONS,
                "--start-ms", int(time.time() * 1000) - 60_000)
        if system != "ours-consumer-protocol":
            loadgen("wait-ready", "--group", app, "--members", INSTANCES, "--timeout-secs", 300)
        watched = loadgen("watch", "--pid", instances[0].proc.pid, "--group", app,
                          "--inputs", topics[0], "--outputs", topics[1], "--timeout-secs", 1200,
                          check=False)
        for instance in instances:
            instance.check_alive()
        if not watched.get("ok", True) or "wall_s" not in watched:
            raise SystemExit(f"{app}: the logins were not processed: {watched}")
        log(f"{app}: state built in {watched['wall_s']:.1f} s; steady input at {RATE:g}/s")
        total_s = BASELINE_S + JOIN_S + KILL_S
        follower = subprocess.Popen([str(BIN / "loadgen"), "pauses", "--output", topics[1],
                                     "--group", app, "--input", topics[0],
                                     "--seconds", str(total_s + 5)],
                                    stdout=subprocess.PIPE, text=True)
        rate = subprocess.Popen([str(BIN / "loadgen"), "rate", "--use-case", "sessionizer",
                                 "--topics", topics[0], "--rate", str(RATE),
                                 "--seconds", str(total_s + 5), "--keys", str(KEYS),
                                 "--partitions", str(PARTITIONS)],
                                stdout=subprocess.DEVNULL)
        started = time.time()
        time.sleep(BASELINE_S)
        joined_ms = int(time.time() * 1000)
        log(f"{app}: a fourth instance joins")
        instances.append(Instance(system, app, topics, INSTANCES))
        time.sleep(JOIN_S)
        killed_ms = int(time.time() * 1000)
        log(f"{app}: kill -9 of the first instance")
        instances[0].proc.send_signal(signal.SIGKILL)
        instances[0].proc.wait()
        output, _ = follower.communicate(timeout=total_s + 120)
        rate.wait()
        followed = json.loads(output.strip().splitlines()[-1])
        for instance in instances[1:]:
            instance.check_alive()
        ended_ms = followed["ended_ms"] - 5000
        result = {
            "system": system, "round": round_, "keys": KEYS, "rate": RATE, "standbys": STANDBYS,
            "baseline_gap_s": longest_gap(followed["gaps"], set(range(PARTITIONS)),
                                          int(started * 1000) + 5000, joined_ms),
            "events": [event_result(followed, "join", joined_ms, killed_ms),
                       event_result(followed, "kill -9", killed_ms, ended_ms)],
            "rows": sum(followed["records"]),
            "gaps": followed["gaps"], "owners": followed["owners"],
        }
        log(f"{app}: " + json.dumps({k: v for k, v in result.items()
                                     if k not in ("gaps", "owners")}))
        return result
    finally:
        if follower and follower.poll() is None:
            follower.kill()
        for instance in instances:
            instance.stop()
        for path in WORK.glob(f"{app}-state-*"):
            shutil.rmtree(path, ignore_errors=True)


def main():
    WORK.mkdir(parents=True)
    results = []
    for round_ in range(1, ROUNDS + 1):
        # The systems alternate their order from round to round.
        for system in (SYSTEMS if round_ % 2 else list(reversed(SYSTEMS))):
            results.append(run_once(system, round_))
    header = ("system", "round", "baseline gap s", "join: unmoved pause s", "join: moved pause s",
              "kill: unmoved pause s", "kill: moved pause s", "unmoved (join / kill)")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for r in results:
        join, kill = r["events"]
        print(" | ".join(str(v) for v in (
            r["system"], r["round"], f"{r['baseline_gap_s']:.2f}",
            f"{join['unmoved_pause_s']:.2f}", f"{join['moved_pause_s']:.2f}",
            f"{kill['unmoved_pause_s']:.2f}", f"{kill['moved_pause_s']:.2f}",
            f"{len(join['unmoved_partitions'])} / {len(kill['unmoved_partitions'])}")))
    name = f"{time.strftime('%Y-%m-%d')}{'-' + TAG if TAG else ''}-pause.json"
    path = ROOT / "bench/results" / name
    summary = {"date": time.strftime("%Y-%m-%d"), "service": "sessionizer", "keys": KEYS,
               "rate": RATE, "partitions": PARTITIONS, "instances": INSTANCES,
               "session_timeout_ms": SESSION_TIMEOUT_MS, "processing_guarantee": "exactly_once_v2",
               "cpus": os.cpu_count(), "runs": results}
    path.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"results in {path}; the instances' logs in {WORK}")


if __name__ == "__main__":
    sys.exit(main())
