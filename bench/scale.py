#!/usr/bin/env python3
"""`make bench-scale`: the cost curve as state outgrows memory.

For the sessionizer, the order-shipment-joiner and window-aggregator with
`--group-by customer_id`, at growing numbers of keys in state (about 1x, 10x
and 100x of what fits in the default `--state-memory-limit`, 256 MiB), ours
and Kafka Streams (bench/peers/kafka-streams) on the same input:

* steady records/s (`loadgen watch`: 10 % to 90 % of the input committed),
  peak RSS (VmHWM), the keys our state holds at the end
  (`streams_state_keys`) and the state directory's bytes on disk (`du`);
* restore: the state directory wiped, the same application started again,
  from launch until it is ready (ours: `/readyz`, and the "restored
  changelog" log lines; Kafka Streams: its log's transition to RUNNING);
* at-least-once latency at half the slower system's steady rate, on a
  fresh input that first fills the state with the same keys
  (`loadgen fill --keys --start-ms` just behind the wall clock, then
  `loadgen rate --keys`, as run.py measures latency), for the sizes up to
  SCALE_LATENCY_MAX_KEYS; the sessionizer and the joiner only (the
  window-aggregator's hour-long windows write nothing within a run);
* failover after a kill -9, without and with a standby (bench/failover.sh,
  the sessionizer with that many open sessions), ours only, for the sizes
  up to SCALE_FAILOVER_MAX_KEYS.

The inputs (`loadgen fill --keys N`, bench/loadgen/src/generate.rs, "keyed
inputs"): every key stays in state to the end of the input. Sessionizer: N
users, a LOGIN each then activities, no LOGOUT, all within 20 s of event time
(`--session-timeout 1h` in every run, for the latency runs' sake); joiner: N
orders over a day and a shipment each 10 minutes to a day later (2 N records,
all within the 7-day window); window-aggregator: orders of N customers over
half an hour, windows of an hour (`--window-size 1h --window-advance 1h`).

Memory: ours runs with its default `--state-memory-limit` (256 MiB); Kafka
Streams with a heap of the same size (SCALE_KS_JAVA_OPTS) and RocksDB at its
defaults (off the heap, outside any JVM flag).

Writes bench/results/<date>-scale.{json,md,svg}; deletes each size's topics
once measured. Environment (run.py's BIN_DIR and BENCH_LATENCY_SECONDS too):
  SCALE_ONLY              regex of services (default all three)
  SCALE_SYSTEMS           default "ours kafka-streams"
  SCALE_SESSIONIZER_KEYS  default "100000 1000000 10000000"
  SCALE_JOINER_KEYS       default "100000 1000000 10000000"
  SCALE_WINDOW_KEYS       default "100000 1000000 10000000"
  SCALE_RECORDS_PER_KEY   sessionizer and window-aggregator records per key (2)
  SCALE_KS_MAX_KEYS       Kafka Streams up to this size only (default: every size)
  SCALE_LATENCY_MAX_KEYS  latency runs up to this size (default 1000000; 0: none)
  SCALE_FAILOVER_MAX_KEYS failover runs up to this size (default 1000000; 0: none)
  SCALE_RESTORE           0 to skip the restore runs
  SCALE_TIMEOUT           seconds per run before it counts as failed (1800)
  SCALE_KS_JAVA_OPTS      default "-Xms256m -Xmx256m -XX:+ExitOnOutOfMemoryError"
  SCALE_TAG               suffix of the results' names (default "scale")
"""

import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import run
from run import BIN, ROOT, System, fmt, loadgen, log

ONLY = re.compile(os.environ.get("SCALE_ONLY", "."))
SYSTEMS = os.environ.get("SCALE_SYSTEMS", "ours kafka-streams").split()
RECORDS_PER_KEY = int(os.environ.get("SCALE_RECORDS_PER_KEY", "2"))
LATENCY_MAX_KEYS = int(os.environ.get("SCALE_LATENCY_MAX_KEYS", "1000000"))
KS_MAX_KEYS = int(os.environ.get("SCALE_KS_MAX_KEYS", "0")) or None
FAILOVER_MAX_KEYS = int(os.environ.get("SCALE_FAILOVER_MAX_KEYS", "1000000"))
RESTORE = os.environ.get("SCALE_RESTORE", "1") != "0"
TIMEOUT = int(os.environ.get("SCALE_TIMEOUT", "1800"))
TAG = os.environ.get("SCALE_TAG", "scale")
STATE_MEMORY_LIMIT_MIB = 256
run.JAVA_OPTS = os.environ.get("SCALE_KS_JAVA_OPTS",
                               "-Xms256m -Xmx256m -XX:+ExitOnOutOfMemoryError").split()
RUN_ID = f"scale-{int(time.time())}"
HOUR_MS = 3_600_000
DAY_MS = 86_400_000

SERVICES = {
    "sessionizer": {
        "keys": os.environ.get("SCALE_SESSIONIZER_KEYS", "100000 1000000 10000000"),
        "flags": {"ours": ["--session-timeout", "1h"],
                  "kafka-streams": ["--session-timeout-ms", str(HOUR_MS)]},
        # A latency run's prefill: its 20 s of event time end just before now.
        "prefill_start": lambda now: now - 30_000,
    },
    "order-shipment-joiner": {
        "keys": os.environ.get("SCALE_JOINER_KEYS", "100000 1000000 10000000"),
        "flags": {},
        # Orders over a day, shipments up to a day later: all in the past.
        "prefill_start": lambda now: now - 2 * DAY_MS - 60_000,
    },
    "window-aggregator": {
        "keys": os.environ.get("SCALE_WINDOW_KEYS", "100000 1000000 10000000"),
        "flags": {"ours": ["--group-by", "customer_id", "--window-size", "1h", "--window-advance", "1h"],
                  "kafka-streams": ["--group-by", "customer_id", "--window-size-ms", str(HOUR_MS),
                                    "--window-advance-ms", str(HOUR_MS)]},
        "prefill_start": None,
    },
}


def records_per_input(service, keys):
    # The joiner: one order per key, and one shipment per order.
    return keys if service == "order-shipment-joiner" else keys * RECORDS_PER_KEY


def fill(service, keys, topics, start_ms=None):
    args = ["fill", "--use-case", service, "--topics", ",".join(topics),
            "--records", records_per_input(service, keys), "--keys", keys]
    if start_ms is not None:
        args += ["--start-ms", start_ms]
    return loadgen(*args)


def start(name, service, inputs, app, guarantee):
    system = System(name, service, "base", inputs, app, guarantee)
    system.cmd += SERVICES[service]["flags"].get(name, [])
    return system.start()


def metric_sum(system, series):
    """The sum of a metric's series on ours' /metrics (None: not there)."""
    try:
        with urllib.request.urlopen(f"http://{system.metrics_addr}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(series + "{") or line.startswith(series + " ")]
    return sum(values) if values else None


def disk_bytes(path):
    result = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return int(result.stdout.split()[0]) if result.returncode == 0 else None


def keep_log(system, suffix):
    """Keeps a stopped system's log beside the next one of the same app."""
    path = run.WORK / f"{system.app}.log"
    if path.exists():
        path.rename(run.WORK / f"{system.app}-{suffix}.log")


def throughput(name, service, keys, inputs):
    app = f"{RUN_ID}-{service}-{keys}-{name}"
    system = start(name, service, inputs, app, "exactly_once_v2")
    try:
        outcome = system.watch(timeout=TIMEOUT)
        outcome.pop("metrics", None)
        outcome["state_dir_bytes"] = disk_bytes(system.state_dir)
        if name == "ours":
            outcome["state_keys"] = metric_sum(system, "streams_state_keys")
        outcome["app"] = app
        return outcome
    finally:
        system.stop()
        keep_log(system, "throughput")


# Kafka Streams' log (slf4j-simple, no timestamps): restore() notes when
# each of these first appears, polling every 100 ms.
KS_RESTORE_START = "was added to the state updater"
KS_RESTORE_END = "completed restoration"


def ready(system, seen):
    """Ours: /readyz answers 200 (every task restored); Kafka Streams: its
    log says the client is RUNNING. `seen`: the first time each of the
    Kafka Streams log markers appeared."""
    if system.name == "ours":
        try:
            with urllib.request.urlopen(f"http://{system.metrics_addr}/readyz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False
    text = (run.WORK / f"{system.app}.log").read_text(errors="replace")
    for marker in (KS_RESTORE_START, KS_RESTORE_END):
        if marker in text:
            seen.setdefault(marker, time.monotonic())
    return "to RUNNING" in text


def restore(name, service, app, inputs):
    """The state directory is gone (System.stop removed it): the same app
    restarts and rebuilds its state from the changelogs."""
    system = start(name, service, inputs, app, "exactly_once_v2")
    launched = time.monotonic()
    outcome = {"ok": False}
    seen = {}
    try:
        while time.monotonic() - launched < TIMEOUT:
            if system.process.poll() is not None:
                outcome["error"] = f"exited with {system.process.returncode}"
                break
            if ready(system, seen):
                outcome = {"ok": True, "launch_to_ready_s": time.monotonic() - launched}
                break
            time.sleep(0.1)
        else:
            outcome["error"] = f"not ready after {TIMEOUT} s"
        outcome["rss_peak_mib"] = run_rss(system)
        if name == "ours":
            outcome["restored_records_metric"] = metric_sum(system, "streams_restored_records_total")
    finally:
        system.stop()
    text = (run.WORK / f"{app}.log").read_text(errors="replace")
    keep_log(system, "restore")
    if name == "ours":
        stores = []
        for line in text.splitlines():
            if line.startswith("{") and '"restored changelog"' in line:
                fields = json.loads(line).get("fields", {})
                stores.append({k: fields.get(k) for k in ("topic", "partition", "records", "elapsed_ms")})
        outcome["stores"] = stores
        if stores:
            records = sum(s["records"] for s in stores)
            ms = max(s["elapsed_ms"] for s in stores)
            outcome |= {"restored_records": records, "restore_ms": ms,
                        "restore_records_per_s": records / max(ms, 1) * 1000,
                        # Per store: its records over the task's restore time
                        # (a task reads its changelogs together).
                        "restore_records_per_s_per_store": [s["records"] / max(ms, 1) * 1000 for s in stores]}
    else:
        # The 45 s before the restore starts are the group waiting for the
        # stopped instance's session to expire (Kafka Streams does not leave
        # the group on close): not counted.
        records = sum(int(n) for n in re.findall(r"with a total number of (\d+) records", text))
        outcome["restored_records"] = records
        if KS_RESTORE_START in seen and KS_RESTORE_END in seen:
            ms = (seen[KS_RESTORE_END] - seen[KS_RESTORE_START]) * 1000
            outcome |= {"restore_ms": ms, "restore_records_per_s": records / max(ms, 1) * 1000}
    return outcome


def run_rss(system):
    """Peak RSS (VmHWM) of a running system, MiB."""
    try:
        status = pathlib.Path(f"/proc/{system.process.pid}/status").read_text()
    except OSError:
        return None
    kib = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(kib[0]) / 1024 if kib else None


def latency(name, service, keys, rate):
    app = f"{RUN_ID}-{service}-{keys}-lat-{name}"
    inputs = [f"{app}-in{i}" for i in range(run.USE_CASES[service]["inputs"])]
    prefill = fill(service, keys, inputs, SERVICES[service]["prefill_start"](int(time.time() * 1000)))
    system = start(name, service, inputs, app, "at_least_once")
    outcome = {"rate": rate, "prefill": prefill}
    try:
        outcome["prefill_watch"] = {k: v for k, v in system.watch(timeout=TIMEOUT).items() if k != "metrics"}
        outcome |= run.measure_latency(system, "base", rate, ["--keys", keys])
        log(f"latency {service} {keys:,} keys {name} at {rate:,}/s: p50 {outcome['p50_ms']} ms, "
            f"p99 {outcome['p99_ms']} ms ({outcome['count']} rows)")
    except Exception as error:  # noqa: BLE001 - recorded, the run goes on
        outcome |= {"ok": False, "error": str(error)}
        log(f"latency {service} {keys:,} keys {name}: FAILED {error}")
    finally:
        system.stop()
        keep_log(system, "latency")
    return outcome


def failover(keys):
    results = run.WORK / f"failover-{keys}.json"
    env = os.environ | {"FAILOVER_USERS": str(keys), "FAILOVER_RESULTS": str(results),
                        "FAILOVER_RUN": f"{RUN_ID}-sessionizer-{keys}-failover", "BIN_DIR": str(BIN), "BENCH_RUNS": "1"}
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "bench/failover.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    outcome = {"ok": done.returncode == 0, "wall_s": time.monotonic() - started}
    if results.exists():
        outcome["runs"] = [{k: r.get(k) for k in ("standby_replicas", "failover_s", "detected_s", "takeover_s",
                                                  "restored_records", "restore_elapsed_ms", "rows_correct")}
                           for r in json.loads(results.read_text())["runs"]]
    if not outcome["ok"]:
        outcome["error"] = done.stderr[-2000:]
    return outcome


def measure(service, keys):
    """Every measurement of one service at one size."""
    started = time.monotonic()
    prefix = f"{RUN_ID}-{service}-{keys}"
    inputs = [f"{prefix}-in{i}" for i in range(run.USE_CASES[service]["inputs"])]
    point = {"service": service, "keys": keys, "systems": {}}
    log(f"{service}, {keys:,} keys: fill")
    point["fill"] = fill(service, keys, inputs)
    point["records"] = point["fill"]["records"]
    systems = [n for n in SYSTEMS if n != "kafka-streams" or KS_MAX_KEYS is None or keys <= KS_MAX_KEYS]
    for name in systems:
        outcome = throughput(name, service, keys, inputs)
        point["systems"][name] = {"throughput": outcome}
        log(f"{service}, {keys:,} keys, {name}: {fmt(outcome.get('steady_records_per_s'))} records/s steady, "
            f"peak RSS {fmt(outcome.get('rss_peak_mib'))} MiB, state {fmt((outcome.get('state_dir_bytes') or 0) / 2**20)} "
            f"MiB on disk, {fmt(outcome.get('state_keys'))} keys" if outcome.get("ok") else
            f"{service}, {keys:,} keys, {name}: FAILED {outcome.get('error')}")
        if RESTORE and outcome.get("ok"):
            result = restore(name, service, outcome["app"], inputs)
            point["systems"][name]["restore"] = result
            log(f"{service}, {keys:,} keys, {name}: restore, ready after {fmt(result.get('launch_to_ready_s'), 2)} s, "
                f"{fmt(result.get('restored_records'))} records at {fmt(result.get('restore_records_per_s'))}/s "
                f"{result.get('restore_log_ms', '')} {result.get('error', '')}")
    steady = [s["throughput"].get("steady_records_per_s") for s in point["systems"].values()]
    steady = [v for v in steady if v]
    if SERVICES[service]["prefill_start"] and keys <= LATENCY_MAX_KEYS and steady:
        rate = round(0.5 * min(steady))
        for name in systems:
            point["systems"][name]["latency"] = latency(name, service, keys, rate)
    if service == "sessionizer" and keys <= FAILOVER_MAX_KEYS and "ours" in SYSTEMS:
        log(f"{service}, {keys:,} keys: failover (bench/failover.sh)")
        point["systems"]["ours"]["failover"] = result = failover(keys)
        log(f"{service}, {keys:,} keys: failover {result.get('runs')} {result.get('error', '')}")
    deleted = loadgen("topics", "--delete-prefix", prefix, check=False).get("deleted", [])
    point["topics_deleted"] = len(deleted)
    point["wall_s"] = time.monotonic() - started
    log(f"{service}, {keys:,} keys: done in {point['wall_s'] / 60:.1f} min")
    return point


def main():
    run.WORK.mkdir(parents=True, exist_ok=True)
    run.wait_for_broker()
    started = time.time()
    results = {
        "meta": {
            "run": RUN_ID, "date": datetime.date.today().isoformat(),
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                     cwd=ROOT).stdout.strip(),
            "uncommitted_changes": subprocess.run(
                ["git", "status", "--porcelain", "--", "shared", "services", "Cargo.lock"],
                capture_output=True, text=True, cwd=ROOT).stdout.split("\n")[:-1],
            "cpus": os.cpu_count(), "systems": SYSTEMS, "records_per_key": RECORDS_PER_KEY,
            "state_memory_limit_mib": STATE_MEMORY_LIMIT_MIB, "ks_java_opts": run.JAVA_OPTS,
            "latency_max_keys": LATENCY_MAX_KEYS, "ks_max_keys": KS_MAX_KEYS, "failover_max_keys": FAILOVER_MAX_KEYS,
            "latency_seconds": run.LATENCY_SECONDS, "load_average_before": os.getloadavg(),
        },
        "points": [],
    }
    for service, spec in SERVICES.items():
        if not ONLY.search(service):
            continue
        for keys in [int(float(k)) for k in spec["keys"].split()]:
            results["points"].append(measure(service, keys))
            write(results, started)
    write(results, started, final=True)


def cell(value, digits=0):
    return fmt(value, digits) if value is not None else "–"


def tables(results):
    meta = results["meta"]
    lines = [f"Run `{meta['run']}` at commit {meta['commit']}, {meta['cpus']} cores; ours with "
             f"`--state-memory-limit` {meta['state_memory_limit_mib']} MiB, Kafka Streams with "
             f"`{' '.join(meta['ks_java_opts'])}` and RocksDB's defaults; {meta['records_per_key']} records per key "
             f"(the joiner: an order and a shipment); load average {meta['load_average_before'][0]:.1f} before, "
             f"{meta.get('load_average_after', [0])[0]:.1f} after; {meta.get('minutes', 0):.1f} minutes.", "",
             "Steady: input records/s from 10 % to 90 % committed (exactly_once_v2); p99: at-least-once, "
             "at half the slower system's steady rate, over the prefilled keys; restore: the state directory "
             "wiped, the same app started again: launch to ready (Kafka Streams: ~45 s of it the group waiting "
             "for the stopped member's session to expire), and the changelog restore itself (ours: its log; "
             "Kafka Streams: its state updater's log lines, to 0.1 s) and its records/s; keys in state: "
             "ours' `streams_state_keys` (RocksDB's estimate, every store); "
             "failover: kill -9 of one of three sessionizers until the moved tasks write again, "
             "without / with a standby (bench/failover.sh).", ""]
    for service in SERVICES:
        points = [p for p in results["points"] if p["service"] == service]
        if not points:
            continue
        lines += [f"### {service}", "",
                  "| keys | input records | system | steady records/s | vs smallest size | p99 ms (rate/s) "
                  "| peak RSS MiB | state on disk MiB | keys in state (estimate) | restore: ready s | restore s | restore records/s "
                  "| failover s, 0 / 1 standby | size's wall time min |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        first = {}
        for p in points:
            for name, s in p["systems"].items():
                t = s["throughput"]
                steady = t.get("steady_records_per_s")
                if first.get(name) is None:
                    first[name] = steady
                lat = s.get("latency") or {}
                rest = s.get("restore") or {}
                fo = {r["standby_replicas"]: r["failover_s"] for r in (s.get("failover") or {}).get("runs", [])}
                disk = t.get("state_dir_bytes")
                lines.append(
                    f"| {fmt(p['keys'])} | {fmt(p['records'])} | {name} | "
                    + (f"{cell(steady)} | {cell(steady / first[name], 2) + '×' if steady and first[name] else '–'}"
                       if t.get("ok") else f"failed: {str(t.get('error'))[:60]} | –")
                    + f" | {cell(lat.get('p99_ms')) + ' (' + fmt(lat['rate']) + ')' if lat.get('ok') else '–'}"
                    f" | {cell(t.get('rss_peak_mib'))} | {cell(disk / 2**20 if disk else None)}"
                    f" | {cell(t.get('state_keys'))} | {cell(rest.get('launch_to_ready_s'), 2)}"
                    f" | {cell(rest['restore_ms'] / 1000 if rest.get('restore_ms') is not None else None, 2)}"
                    f" | {cell(rest.get('restore_records_per_s'))}"
                    f" | {' / '.join(cell(fo.get(n), 2) for n in (0, 1)) if fo else '–'}"
                    f" | {p.get('wall_s', 0) / 60:.1f} |")
        lines.append("")
    return "\n".join(lines)


def write(results, started, final=False):
    results["meta"]["load_average_after"] = os.getloadavg()
    results["meta"]["minutes"] = (time.time() - started) / 60
    out_dir = ROOT / "bench/results"
    stem = out_dir / f"{results['meta']['date']}-{TAG}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = tables(results)
    stem.with_suffix(".md").write_text(text)
    subprocess.run([sys.executable, str(ROOT / "bench/chart.py"), str(stem.with_suffix(".json")),
                    str(stem.with_suffix(".svg"))], check=False)
    if final:
        print(text)
        log(f"results: {stem}.json, .md, .svg")
        if not os.environ.get("SCALE_KEEP"):
            shutil.rmtree(run.WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
