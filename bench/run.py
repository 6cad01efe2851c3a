#!/usr/bin/env python3
"""`make bench`: our services vs Kafka Streams vs a raw copy, on the local stack.

Three systems per use case and input shape, on the same broker, the same input
topics and the same settings (1 partition, exactly_once_v2, commit every 100 ms):

* ours: the service's release binary;
* kafka-streams: the same use case on Kafka Streams 4.4 (bench/peers/kafka-streams);
* rawcopy: consume -> decode -> encode -> produce, transactional (bench/rawcopy),
  the physical limit of the stack; for the joiner, the same bytes as the
  joiner moves (COPY_THROUGH: its shipments through a repartition topic and
  back, its orders decoded only).

Shapes (bench/README.md has what each is per use case): `base`, the original
input, and `output-heavy`, about one output per input; a shape is the input
`loadgen fill --shape` writes and the service flags in SHAPE_FLAGS.

Phases (see BENCHMARKS.md for the method), each per use case and shape:

1. check: each system on a small input; the peer's output must equal ours
   (`streamctl consume`, as sorted JSON lines), the copy's its input;
2. fill: `loadgen fill` writes the full inputs once, at full speed;
3. throughput: BENCH_RUNS rounds, the systems alternating (the order rotates
   every round); `loadgen watch` measures each run from outside the process:
   the whole run, its middle (10 % to 90 % of the input committed: the
   steady rate), the start-up and the drain at the end of the input;
4. latency: a fixed input rate of half the slower of ours and Kafka Streams
   (median whole-run records/s), each system under each guarantee.

Writes bench/results/<date>.json, .md (tables) and .svg (chart).

Environment:
  BENCH_SCALE        multiplies the full record counts (default 1: 1M
                     events, 500k+500k orders/shipments, 1M+1M readings, 2M
                     marketplace orders, 500k in the output-heavy shape)
  BENCH_RUNS         throughput runs per system (default 3)
  BENCH_ONLY         regex: use cases to run (default all)
  BENCH_SHAPES       input shapes to run (default "base output-heavy")
  BENCH_SYSTEMS      systems to run (default "ours kafka-streams rawcopy")
  BENCH_LATENCY      0 to skip the latency phase
  BENCH_LATENCY_GUARANTEES  default "exactly_once_v2 at_least_once"
  BENCH_LATENCY_SECONDS     measured seconds per latency run (default 10, after 3 s warm-up)
  BENCH_LATENCY_RATE        a fixed input rate (records/s) for the latency runs instead of
                            half the slower system's median (to compare builds at one rate)
  BIN_DIR            release binaries (default $CARGO_TARGET_DIR/release)
  KS_JAVA_OPTS       JVM flags of the peer (default "-Xms256m -Xmx1g")
  BENCH_PARTITIONS   partitions of every input and output topic (default 1)
  BENCH_THREADS      processing threads of ours (--stream-threads) and of Kafka
                     Streams (num.stream.threads) (default 1); the raw copy has one
  BENCH_PIN          a CPU list (e.g. "1"): every system under test runs under
                     `taskset -c` on it (pin the broker to the other cores
                     yourself, e.g. `taskset -a -p -c 0 <broker pid>`)
  BENCH_TAG          suffix of the results' file names (<date>-<tag>.*)
  BENCH_PROFILE      1: after the throughput runs, one more run of ours per use case
                     and shape under `perf record` (not counted in the rates): a flame
                     graph <date>-<tag>-profile-<use case>-<shape>.svg and the functions'
                     shares of the CPU samples in the tables (bench/profile.py)
"""

import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

import perf_profile

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(os.environ.get("BIN_DIR") or
                   pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release")
JAR = ROOT / "bench/peers/kafka-streams/target/ks-peer.jar"
# 1 and not less: the fastest runs then have ~10 commits from 10 % to 90 % of
# their input, what the steady rate is measured on (bench/README.md).
SCALE = float(os.environ.get("BENCH_SCALE", "1"))
SHAPES = os.environ.get("BENCH_SHAPES", "base output-heavy").split()
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
ONLY = re.compile(os.environ.get("BENCH_ONLY", "."))
SYSTEMS = os.environ.get("BENCH_SYSTEMS", "ours kafka-streams rawcopy").split()
LATENCY = os.environ.get("BENCH_LATENCY", "1") != "0"
PROFILE = os.environ.get("BENCH_PROFILE", "0") != "0"
LATENCY_GUARANTEES = os.environ.get("BENCH_LATENCY_GUARANTEES", "exactly_once_v2 at_least_once").split()
LATENCY_SECONDS = float(os.environ.get("BENCH_LATENCY_SECONDS", "10"))
LATENCY_RATE = int(os.environ.get("BENCH_LATENCY_RATE", "0"))
WARMUP_SECONDS = 3.0
# Load produced after the measured window, so that its last records do not
# wait for the end of the input.
TAIL_SECONDS = 2.0
JAVA_OPTS = os.environ.get("KS_JAVA_OPTS", "-Xms256m -Xmx1g").split()
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "1"))
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
PIN = os.environ.get("BENCH_PIN", "")
TAG = os.environ.get("BENCH_TAG", "")
RUN = f"bench-{int(time.time())}"
WORK = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / RUN

# Full-size record counts per input topic.
USE_CASES = {
    "sessionizer": {"records": 1_000_000, "inputs": 1, "binary": "sessionizer",
                    "flags": ["--input-topic", "{in0}", "--output-topic", "{out}"]},
    "order-shipment-joiner": {"records": 500_000, "inputs": 2, "binary": "order-shipment-joiner",
                              "flags": ["--orders-topic", "{in0}", "--shipments-topic", "{in1}",
                                        "--output-topic", "{out}"]},
    "sensor-fusion": {"records": 1_000_000, "inputs": 2, "binary": "sensor-fusion",
                      "flags": ["--temperature-topic", "{in0}", "--humidity-topic", "{in1}",
                                "--output-topic", "{out}"]},
    "window-aggregator": {"records": 2_000_000, "inputs": 1, "binary": "window-aggregator",
                          "flags": ["--input-topic", "{in0}", "--output-topic", "{out}"]},
}
# Output-heavy runs write about a million rows each: window-aggregator's
# ~1.8 per order, so it reads a quarter of its base input.
SHAPE_RECORDS = {("window-aggregator", "output-heavy"): 500_000}
# Small inputs for the equality check.
CHECK_RECORDS = {"sessionizer": 5_000, "order-shipment-joiner": 2_000,
                 "sensor-fusion": 20_000, "window-aggregator": 10_000}
# Service flags per shape and system, beside the shape's input.
SHAPE_FLAGS = {
    ("sensor-fusion", "output-heavy"): {"ours": {"--window-interval": "15s"},
                                        "kafka-streams": {"--window-interval-ms": "15000"}},
    ("window-aggregator", "output-heavy"): {"ours": {"--group-by": "customer_id"},
                                            "kafka-streams": {"--group-by": "customer_id"}},
}
# An input that reaches a system's last stage through an internal topic: (its
# index, the topic, the group that reads it). The steady rate follows that
# reader, not a first stage running ahead (loadgen watch --through).
THROUGH = {
    ("ours", "order-shipment-joiner"): (1, "{app}-shipments-by-order-repartition", "{app}"),
    ("kafka-streams", "order-shipment-joiner"): (1, "{app}-shipments-by-order-repartition", "{app}"),
    ("ours", "window-aggregator"): (0, "{app}-window-partials-repartition", "{app}-final"),
    ("kafka-streams", "window-aggregator"): (0, "{app}-orders-by-group-repartition", "{app}"),
    ("rawcopy", "order-shipment-joiner"): (1, "{app}-shipments-by-order-repartition", "{app}"),
}
# The raw copy of a use case whose service re-keys an input moves the same
# bytes (rawcopy --repartition-through): that input goes through a
# repartition topic and back before it is written, the other input is read
# and decoded only. (input index compared in the check, repartition topic)
COPY_THROUGH = {"order-shipment-joiner": (1, "{app}-shipments-by-order-repartition")}
# Latency runs: windows short enough to close within the run (over a shape's).
LIVE_FLAGS = {
    "sensor-fusion": {"ours": {"--window-interval": "1s"},
                      "kafka-streams": {"--window-interval-ms": "1000"}},
    "window-aggregator": {"ours": {"--window-size": "200ms", "--window-advance": "100ms"},
                          "kafka-streams": {"--window-size-ms": "200", "--window-advance-ms": "100"}},
}

_port = [19400]


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


BROKER_PIDFILE = pathlib.Path(os.environ.get("BENCH_BROKER_PIDFILE", "/var/tmp/streams-stack/run/kafka.pid"))
_broker_restarts = [0]


def broker_pid():
    """The local broker's pid (deploy/local/stack.sh writes it), to notice restarts."""
    try:
        return BROKER_PIDFILE.read_text().strip()
    except OSError:
        return None


def wait_for_broker(timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if subprocess.run([str(BIN / "streamctl"), "topics", "list"], capture_output=True).returncode == 0:
            return
        time.sleep(2)
    raise RuntimeError("the broker did not come back")


def attempts(label, run_once, ok=lambda outcome: outcome.get("ok")):
    """Runs `run_once` up to three times: again when it failed or the broker
    restarted meanwhile (other users of the shared stack restart it)."""
    outcome = None
    for attempt in range(3):
        before = broker_pid()
        try:
            outcome = run_once()
        except Exception as error:  # noqa: BLE001 - retried, then recorded
            outcome = {"ok": False, "error": str(error)}
        restarted = broker_pid() != before
        if restarted:
            _broker_restarts[0] += 1
        if ok(outcome) and not restarted:
            outcome["attempts"] = attempt + 1
            return outcome
        log(f"{label}: {'the broker restarted' if restarted else 'failed'} "
            f"({outcome.get('error', '')}); {'retrying' if attempt < 2 else 'giving up'}")
        wait_for_broker()
    outcome["attempts"] = 3
    return outcome


def loadgen(*args, check=True):
    """Runs loadgen; returns its JSON answer."""
    result = subprocess.run([str(BIN / "loadgen"), *map(str, args)], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"loadgen {args[0]} failed: {result.stderr.strip()} {result.stdout.strip()}")
    line = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "{}"
    return json.loads(line)


def stop_process(process, timeout):
    """SIGTERM, then SIGKILL if `process` has not exited within `timeout` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def service_flags(name, use_case, shape, live):
    flags = SHAPE_FLAGS.get((use_case, shape), {}).get(name, {})
    if live:
        flags = flags | LIVE_FLAGS.get(use_case, {}).get(name, {})
    return [part for flag in flags.items() for part in flag]


class System:
    """One running system under test."""

    def __init__(self, name, use_case, shape, inputs, app, guarantee, live=False):
        self.name, self.use_case, self.inputs, self.app = name, use_case, inputs, app
        spec = USE_CASES[use_case]
        self.outputs = ([f"{app}-out-{i}" for i in range(len(inputs))] if name == "rawcopy"
                        else [f"{app}-out"])
        self.state_dir = WORK / f"state-{app}"
        self.metrics_addr = None
        self.groups = [app]
        self.through = None
        if name == "ours":
            _port[0] += 1
            self.metrics_addr = f"127.0.0.1:{_port[0]}"
            fill = {f"in{i}": t for i, t in enumerate(inputs)} | {"out": self.outputs[0]}
            self.cmd = [str(BIN / spec["binary"]), *[f.format(**fill) for f in spec["flags"]],
                        "--application-id", app, "--processing-guarantee", guarantee,
                        "--state-dir", str(self.state_dir), "--http-addr", self.metrics_addr,
                        "--log-format", "json", "--stream-threads", str(THREADS),
                        *service_flags(name, use_case, shape, live)]
            if use_case == "window-aggregator":
                self.groups.append(f"{app}-final")
        elif name == "kafka-streams":
            self.cmd = ["java", *JAVA_OPTS, "-jar", str(JAR), use_case, "--application-id", app,
                        "--inputs", ",".join(inputs), "--output", self.outputs[0],
                        "--processing-guarantee", guarantee, "--state-dir", str(self.state_dir),
                        "--schemas-dir", str(ROOT / "shared/schemas/avro"),
                        "--stream-threads", str(THREADS), *service_flags(name, use_case, shape, live)]
        else:
            self.cmd = [str(BIN / "rawcopy"), "--use-case", use_case, "--inputs", ",".join(inputs),
                        "--outputs", ",".join(self.outputs), "--application-id", app,
                        "--processing-guarantee", guarantee]
            if use_case in COPY_THROUGH:
                self.through = COPY_THROUGH[use_case][1].format(app=app)
                self.cmd += ["--repartition-through", self.through]
        self.process = None

    def start(self):
        loadgen("topics", "--create", ",".join(self.outputs + ([self.through] if self.through else [])),
                "--partitions", PARTITIONS)
        self.log = open(WORK / f"{self.app}.log", "w")
        cmd = ["taskset", "-c", PIN, *self.cmd] if PIN else self.cmd
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def watch(self, timeout=1200):
        args = ["watch", "--pid", self.process.pid, "--group", self.app,
                "--inputs", ",".join(self.inputs), "--outputs", ",".join(self.outputs),
                "--timeout-secs", timeout]
        if self.metrics_addr:
            args += ["--metrics-addr", self.metrics_addr]
        if (self.name, self.use_case) in THROUGH:
            index, topic, group = THROUGH[self.name, self.use_case]
            args += ["--through", f"{self.inputs[index]}={topic}@{group}".format(app=self.app)]
        return loadgen(*args, check=False)

    def stop(self):
        if self.process:
            stop_process(self.process, 20)
            self.log.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)


def consume(topic):
    result = subprocess.run([str(BIN / "streamctl"), "consume", "--topic", topic, "--from-beginning",
                             "--until-end"], capture_output=True, text=True, check=True)
    return [line for line in result.stdout.splitlines() if line.strip()]


def values_of(line):
    """The value of a consumed line (`streamctl consume`'s JSON), as text."""
    return json.dumps(json.loads(line).get("value"), sort_keys=True)


def compare(expected, actual):
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    return {"equal": sorted(expected) == sorted(actual), "same_order": expected == actual,
            "rows_expected": len(expected), "rows": len(actual),
            "missing_examples": missing[:3], "extra_examples": extra[:3]}


def check(use_case, shape):
    """Runs every system on a small input and compares outputs."""
    n = CHECK_RECORDS[use_case]
    # Topics of their own per attempt: a retry must not read a failed
    # attempt's output.
    prefix = f"{RUN}-check-{use_case}-{shape}-{int(time.time())}"
    inputs = [f"{prefix}-in{i}" for i in range(USE_CASES[use_case]["inputs"])]
    loadgen("fill", "--use-case", use_case, "--shape", shape, "--topics", ",".join(inputs),
            "--records", n, "--seed", 7, "--partitions", PARTITIONS)
    systems = [System(name, use_case, shape, inputs, f"{prefix}-{name}", "exactly_once_v2")
               for name in SYSTEMS]
    for system in systems:
        system.start()
    results = {}
    try:
        for system in systems:
            results[system.name] = {"watch": system.watch(timeout=300)}
    finally:
        for system in systems:
            system.stop()
    outputs = {s.name: [line for topic in s.outputs for line in consume(topic)] for s in systems}
    for system in systems:
        if system.name == "rawcopy" and use_case in COPY_THROUGH:
            # Re-keyed on the way: the copied input's values, whatever their keys.
            index = COPY_THROUGH[use_case][0]
            results["rawcopy"]["vs"] = f"input {index} (values)"
            results["rawcopy"] |= compare([values_of(l) for l in consume(inputs[index])],
                                          [values_of(l) for l in outputs["rawcopy"]])
        elif system.name == "rawcopy":
            results["rawcopy"]["vs"] = "input"
            results["rawcopy"] |= compare([l for t in inputs for l in consume(t)], outputs["rawcopy"])
        elif system.name != "ours" and "ours" in outputs:
            results[system.name]["vs"] = "ours"
            results[system.name] |= compare(outputs["ours"], outputs[system.name])
    if "ours" in outputs:
        results["ours"]["rows"] = len(outputs["ours"])
    for name, outcome in results.items():
        if "equal" in outcome:
            log(f"check {use_case} ({shape}): {name} vs {outcome['vs']}: "
                f"{'EQUAL' if outcome['equal'] else 'DIFFERENT'} ({outcome['rows']} rows, "
                f"{outcome['rows_expected']} expected{', same order' if outcome['same_order'] else ''})")
    return results


def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def main():
    WORK.mkdir(parents=True, exist_ok=True)
    wait_for_broker()
    use_cases = [u for u in USE_CASES if ONLY.search(u)]
    started = time.time()
    load_before = os.getloadavg()
    log(f"run {RUN}: scale {SCALE}, {RUNS} runs, systems {SYSTEMS}, use cases {use_cases}, shapes {SHAPES}; "
        f"load average {load_before[0]:.1f}; work dir {WORK}")
    results = {
        "meta": {
            "run": RUN, "date": datetime.date.today().isoformat(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True, cwd=ROOT).stdout.strip(),
            "uncommitted_changes": subprocess.run(
                ["git", "status", "--porcelain", "--", "shared", "services", "Cargo.lock"],
                capture_output=True, text=True, cwd=ROOT).stdout.split("\n")[:-1],
            "cpus": os.cpu_count(), "scale": SCALE, "runs": RUNS, "shapes": SHAPES,
            "partitions": PARTITIONS, "threads": THREADS,
            "java": subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0],
            "java_opts": JAVA_OPTS, "load_average_before": load_before, "pinned_to_cpus": PIN,
        },
        "check": {}, "fill": {}, "throughput": [], "latency": [], "profiles": [],
    }

    cases = [(use_case, shape) for use_case in use_cases for shape in SHAPES]
    for use_case, shape in cases:
        log(f"check: {use_case} ({shape}) on a small input")
        results["check"].setdefault(use_case, {})[shape] = attempts(
            f"check {use_case} ({shape})", lambda: check(use_case, shape),
            ok=lambda r: all(v.get("watch", {}).get("ok") for v in r.values() if isinstance(v, dict)))

    inputs = {}
    for use_case, shape in cases:
        n = int(SHAPE_RECORDS.get((use_case, shape), USE_CASES[use_case]["records"]) * SCALE)
        log(f"fill: {use_case} ({shape}), {n} records per input")

        def fill_once():
            prefix = f"{RUN}-{use_case}-{shape}-{int(time.time())}"
            topics = [f"{prefix}-in{i}" for i in range(USE_CASES[use_case]["inputs"])]
            return loadgen("fill", "--use-case", use_case, "--shape", shape, "--topics", ",".join(topics),
                           "--records", n, "--partitions", PARTITIONS) | {"topics": topics, "ok": True}
        fill = results["fill"].setdefault(use_case, {})[shape] = attempts(
            f"fill {use_case} ({shape})", fill_once)
        inputs[use_case, shape] = fill["topics"]
        log(f"  {fill['records']} records at {fill['records_per_s']:,.0f}/s")

    for run in range(RUNS):
        order = SYSTEMS[run % len(SYSTEMS):] + SYSTEMS[:run % len(SYSTEMS)]
        for use_case, shape in cases:
            for name in order:
                label = f"throughput {use_case} ({shape}) {name} #{run}"
                outcome = attempts(label, lambda: throughput_run(use_case, shape, name, inputs[use_case, shape], run))
                outcome |= {"use_case": use_case, "shape": shape, "system": name, "run": run,
                            "load_average": os.getloadavg()[0]}
                results["throughput"].append(outcome)
                if outcome.get("ok"):
                    log(f"{label}: {fmt(outcome.get('steady_records_per_s'))} records/s steady, "
                        f"{fmt(outcome['records_per_s'])} whole run, startup {fmt(outcome['startup_s'], 2)} s, "
                        f"drain {fmt(outcome.get('drain_s'), 2)} s, "
                        f"{fmt(outcome['records_per_cpu_s'])} per CPU-s, peak RSS {fmt(outcome['rss_peak_mib'])} MiB, "
                        f"load {outcome['load_average']:.1f}")
                else:
                    log(f"{label}: FAILED {outcome.get('error')}")

    if PROFILE and "ours" in SYSTEMS:
        for use_case, shape in cases:
            results["profiles"].append(attempts(f"profile {use_case} ({shape})",
                                                lambda: profile_run(use_case, shape, inputs[use_case, shape],
                                                                    results["meta"]["date"])))

    results["summary"] = summarize(results["throughput"], cases)
    for use_case, shape in cases:
        summary = results["summary"][use_case][shape]
        ratio = summary["ours_vs_kafka_streams"]
        log(f"summary {use_case} ({shape}): ours / Kafka Streams {fmt(ratio['steady_records_per_s'], 2)}x "
            f"steady, {fmt(ratio['records_per_s'], 2)}x whole run")
        # The check compares outputs on a small input only; at full size, a
        # peer that skipped work (e.g. dropped records as late) shows here.
        ours, peer = (summary["systems"].get(n, {}).get("output_end_offset") for n in ("ours", "kafka-streams"))
        if ours and peer is not None and abs(peer - ours) > 0.1 * ours:
            log(f"WARNING {use_case} ({shape}): output end offsets differ, ours {ours}, Kafka Streams {peer}")

    if LATENCY:
        for use_case, shape in cases:
            systems = results["summary"][use_case][shape]["systems"]
            medians = [systems[n]["records_per_s"]["median"] for n in ("ours", "kafka-streams")
                       if n in systems and systems[n]["records_per_s"]]
            if not (medians or LATENCY_RATE):
                continue
            rate = LATENCY_RATE or round(0.5 * min(medians))
            for guarantee in LATENCY_GUARANTEES:
                for name in SYSTEMS:
                    results["latency"].append(attempts(
                        f"latency {use_case} ({shape}) {name} {guarantee}",
                        lambda: latency_run(use_case, shape, name, guarantee, rate)))

    results["meta"]["broker_restarts_seen"] = _broker_restarts[0]
    results["meta"]["load_average_after"] = os.getloadavg()
    results["meta"]["minutes"] = (time.time() - started) / 60
    write_results(results)


SUMMARY_KEYS = ["steady_records_per_s", "records_per_s", "records_per_cpu_s", "cpu_s", "wall_s",
                "rss_peak_mib", "startup_s", "drain_s", "steady_commits"]


def summarize(throughput, cases):
    """Per use case and shape: each system's spread over its runs, and ours
    over Kafka Streams (medians), steady and whole-run."""
    summary = {}
    for use_case, shape in cases:
        systems = {}
        for name in SYSTEMS:
            runs = [r for r in throughput if (r["use_case"], r["shape"], r["system"]) == (use_case, shape, name)
                    and r.get("ok")]
            systems[name] = {key: spread([r.get(key) for r in runs]) for key in SUMMARY_KEYS} | {
                "records": runs[0]["records"] if runs else None,
                "output_end_offset": runs[0]["output_end_offset"] if runs else None}
        summary.setdefault(use_case, {})[shape] = {
            "systems": systems,
            "ours_vs_kafka_streams": {key: median_ratio(systems, key)
                                      for key in ("steady_records_per_s", "records_per_s")}}
    return summary


def median_ratio(systems, key):
    ours, peer = (systems.get(name, {}).get(key) for name in ("ours", "kafka-streams"))
    return ours["median"] / peer["median"] if ours and peer else None


def throughput_run(use_case, shape, name, inputs, run):
    app = f"{RUN}-{use_case}-{shape}-{name}-t{run}-{int(time.time())}"
    system = System(name, use_case, shape, inputs, app, "exactly_once_v2").start()
    try:
        return system.watch()
    finally:
        system.stop()


def profile_run(use_case, shape, inputs, date):
    """One run of ours under `perf record` (bench/profile.py)."""
    app = f"{RUN}-{use_case}-{shape}-ours-profile-{int(time.time())}"
    system = System("ours", use_case, shape, inputs, app, "exactly_once_v2").start()
    stem = ROOT / "bench/results" / "-".join(filter(None, [date, TAG, "profile", use_case, shape]))
    try:
        outcome = perf_profile.profile(system, system.watch, stem, f"{use_case} ({shape}), {date}")
    finally:
        system.stop()
    log(f"profile {use_case} ({shape}): {outcome.get('samples')} samples, {outcome.get('svg')}")
    return outcome | {"use_case": use_case, "shape": shape, "ok": "error" not in outcome}


def latency_run(use_case, shape, name, guarantee, rate):
    app = f"{RUN}-lat-{use_case}-{shape}-{name}-{guarantee.replace('_', '')}-{int(time.time())}"
    inputs = [f"{app}-in{i}" for i in range(USE_CASES[use_case]["inputs"])]
    loadgen("topics", "--create", ",".join(inputs), "--partitions", PARTITIONS)
    system = System(name, use_case, shape, inputs, app, guarantee, live=True).start()
    outcome = {"use_case": use_case, "shape": shape, "system": name, "guarantee": guarantee, "rate": rate}
    try:
        outcome |= measure_latency(system, shape, rate)
        log(f"latency {use_case} ({shape}) {name} {guarantee} at {rate:,}/s: p50 {outcome['p50_ms']} ms, "
            f"p99 {outcome['p99_ms']} ms ({outcome['count']} rows)")
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        outcome |= {"ok": False, "error": str(error)}
        log(f"latency {use_case} ({shape}) {name} {guarantee}: FAILED {error}")
    finally:
        system.stop()
    return outcome


def measure_latency(system, shape, rate, rate_args=()):
    """Produces `rate` records/s on a started system's inputs (`loadgen rate`,
    `rate_args` added) and reads its outputs meanwhile (`loadgen latency`):
    the end-to-end latency of the rows of the measured window."""
    outcome = {"ready": loadgen("wait-ready", "--pid", system.process.pid,
                                *[a for g in system.groups for a in ("--group", g)])}
    start = int(time.time() * 1000) + 1000
    from_ms = start + int(WARMUP_SECONDS * 1000)
    to_ms = from_ms + int(LATENCY_SECONDS * 1000)
    stop_ms = to_ms + int(TAIL_SECONDS * 1000)
    meter = subprocess.Popen([str(BIN / "loadgen"), "latency", "--use-case", system.use_case, "--kind",
                              "copy" if system.name == "rawcopy" else "service",
                              "--outputs", ",".join(system.outputs), "--inputs", ",".join(system.inputs),
                              "--from-ms", str(from_ms), "--to-ms", str(to_ms),
                              "--stop-at-ms", str(stop_ms)], stdout=subprocess.PIPE, text=True)
    time.sleep(max(0.0, start / 1000 - time.time()))
    # The load goes on through the tail: a record of the measured window
    # must not wait for the end of the input (a merge waits up to
    # --max-task-idle for an input that stopped; the joiner's last second
    # of shipments did, adding ~1 s to a tenth of its rows).
    outcome["load"] = loadgen("rate", "--use-case", system.use_case, "--shape", shape,
                              "--topics", ",".join(system.inputs), "--rate", rate, "--seconds",
                              WARMUP_SECONDS + LATENCY_SECONDS + TAIL_SECONDS, *rate_args)
    out, _ = meter.communicate(timeout=300)
    return outcome | json.loads(out.strip().splitlines()[-1]) | {"ok": True}


def fmt(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}".replace(",", " ")


def tables(results):
    lines = []
    meta = results["meta"]
    lines.append(f"Run `{meta['run']}` at commit {meta['commit']}, {meta['cpus']} cores, scale {meta['scale']}, "
                 f"{meta.get('partitions', 1)} partitions, {meta.get('threads', 1)} processing threads, "
                 f"{meta['runs']} runs per system; load average {meta['load_average_before'][0]:.1f} before, "
                 f"{meta['load_average_after'][0]:.1f} after; {meta['minutes']:.1f} minutes"
                 + (f"; systems pinned to CPUs {meta['pinned_to_cpus']}." if meta.get("pinned_to_cpus") else "."))
    lines.append("")
    lines.append("Throughput, exactly_once_v2 (median of the runs, [min – max]). Steady: input records/s "
                 "from 10 % to 90 % of the input committed; whole run: from the first commit to the last "
                 "output; startup: launch to first commit; drain: the end of the input beyond the steady "
                 "rate (bench/README.md):")
    lines.append("")
    lines.append("| use case | shape | input records | system | steady records/s | ours / KS, steady | "
                 "whole-run records/s | ours / KS, whole run | records per CPU-second | CPU s | peak RSS MiB "
                 "| startup s | drain s |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def spread_cell(stats, digits=0):
        if not stats:
            return "–"
        return f"{fmt(stats['median'], digits)} [{fmt(stats['min'], digits)} – {fmt(stats['max'], digits)}]"
    for use_case, shapes in results["summary"].items():
        for shape, summary in shapes.items():
            ratio = summary["ours_vs_kafka_streams"]
            for name, s in summary["systems"].items():
                head = f"| {use_case} | {shape} | {fmt(s['records'])} | {name} |"
                if not s["records_per_s"]:
                    lines.append(head + " failed |" + " |" * 8)
                    continue
                steady_ratio, whole_ratio = (f"**{fmt(ratio[key], 2)}×**" if name == "ours" and ratio[key]
                                             else "" for key in ("steady_records_per_s", "records_per_s"))
                lines.append(
                    f"{head} {spread_cell(s['steady_records_per_s'])} | {steady_ratio} "
                    f"| {spread_cell(s['records_per_s'])} | {whole_ratio} | {spread_cell(s['records_per_cpu_s'])} "
                    f"| {fmt(s['cpu_s']['median'], 1)} | {spread_cell(s['rss_peak_mib'])} "
                    f"| {fmt(s['startup_s']['median'], 2)} | {fmt((s['drain_s'] or {}).get('median'), 2)} |")
    if results["latency"]:
        lines.append("")
        lines.append("End-to-end latency at a fixed rate (half the slower of ours and Kafka Streams), ms:")
        lines.append("")
        lines.append("| use case | shape | rate/s | guarantee | system | p50 | p99 | max | rows measured |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in results["latency"]:
            head = f"| {r['use_case']} | {r['shape']} | {fmt(r['rate'])} | {r['guarantee']} | {r['system']} |"
            if r.get("ok"):
                lines.append(f"{head} {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | {fmt(r['max_ms'])} | {fmt(r['count'])} |")
            else:
                lines.append(f"{head} failed | | | |")
    lines.append("")
    lines.append("Output equality on a small input (peer vs ours, copy vs input):")
    lines.append("")
    lines.append("| use case | shape | system | rows | expected | equal as a multiset | same order |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for use_case, shapes in results["check"].items():
        for shape, systems in shapes.items():
            for name, c in systems.items():
                if isinstance(c, dict) and "equal" in c:
                    lines.append(f"| {use_case} | {shape} | {name} vs {c['vs']} | {c['rows']} | {c['rows_expected']} | "
                                 f"{'yes' if c['equal'] else '**no**'} | {'yes' if c['same_order'] else 'no'} |")
    phase_lines = phases(results)
    if phase_lines:
        lines += ["", "Where our processing thread spends its time (`streams_thread_phase_seconds_total`, "
                  "share of the thread's accounted time, last throughput run):", ""] + phase_lines
    for p in results.get("profiles", []):
        if not p.get("ok"):
            continue
        lines += ["", f"CPU profile of ours, {p['use_case']} ({p['shape']}): {p['samples']} ns of CPU sampled at "
                  f"{perf_profile.HZ} Hz (`perf record --call-graph dwarf`), flame graph {p['svg']}; "
                  "inclusive shares of the samples:", "",
                  "| thread | share |", "| --- | --- |"]
        lines += [f"| {name} | {100 * share:.1f} % |" for name, share in p["threads"]]
        lines += ["", "| function | share |", "| --- | --- |"]
        lines += [f"| `{name.replace('|', '/')}` | {100 * share:.1f} % |" for name, share in p["functions"]]
    return "\n".join(lines) + "\n"


def phases(results):
    rows = {}
    names = []
    for r in results["throughput"]:
        if r["system"] != "ours" or not r.get("ok") or not r.get("metrics"):
            continue
        per_stage = {}
        for series, value in r["metrics"].items():
            m = re.match(r'streams_thread_phase_seconds_total\{(.*)\}', series)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            stage = labels.get("stage", "")
            per_stage.setdefault(stage, {})[labels.get("phase")] = value
        for stage, values in per_stage.items():
            total = sum(values.values()) or 1
            label = f"{r['use_case']} ({r['shape']}" + (f", {stage} stage)" if stage else ")")
            rows[label] = {k: v / total for k, v in values.items()} | {"_total": total}
            names += [k for k in values if k not in names]
    if not rows:
        return []
    out = ["| service | seconds | " + " | ".join(names) + " |", "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for label, values in rows.items():
        out.append(f"| {label} | {values['_total']:.1f} | " +
                   " | ".join(f"{100 * values.get(n, 0):.0f} %" for n in names) + " |")
    return out


def write_results(results):
    out_dir = ROOT / "bench/results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / "-".join(filter(None, [results["meta"]["date"], TAG]))
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = tables(results)
    stem.with_suffix(".md").write_text(text)
    subprocess.run([sys.executable, str(ROOT / "bench/chart.py"), str(stem.with_suffix(".json")),
                    str(stem.with_suffix(".svg"))], check=False)
    print(text)
    log(f"results: {stem}.json, .md, .svg")


if __name__ == "__main__":
    main()
