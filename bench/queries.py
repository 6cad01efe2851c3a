#!/usr/bin/env python3
"""`make bench-queries`: interactive queries, alone and against processing.

One release sessionizer with `--query-addr` on the local stack, state from a
keyed input (`loadgen fill --keys N`, bench/README.md "make bench-scale": N
users, a LOGIN each then activities, every session open to the end,
`--session-timeout 1h`), queried with `GET /stores/main/sessions/keys/user-<i>`
for random i < N (`querygen`, bench/querygen). Per round, each a fresh
application id on the same backlog (run.py's `System`), the runs in a
rotating order:

* processing alone: records/s over a window of QUERIES_SECONDS, from the
  service's `streams_records_consumed_total`, starting once 2 N records are
  in (every key has a session in committed state);
* processing with queries: the same window while `querygen` runs at each
  fixed rate of QUERIES_RATES, and as fast as QUERIES_CONNECTIONS clients
  get answers: records/s, and the queries' rate and latency;
* queries on the idle service (after the processing-alone run has consumed
  its whole backlog: `loadgen watch`): 1 and QUERIES_CONNECTIONS clients as
  fast as answered, and each fixed rate; then QUERIES_CONNECTIONS clients
  again with a new connection per query (every other run keeps one
  connection alive per client);
* the ceiling (`readbench`, the service stopped): random point reads of the
  same task's RocksDB, opened as the service opens it, on 1 and 2 threads:
  `get_pinned_cf` alone, and the query server's read path without HTTP
  (snapshot, checkpoint, value, msgpack to JSON, the answer serialized).

Every window also records the CPU seconds of the service (by thread name:
the query server's tokio threads apart from processing), of `querygen` and
of the broker, and the processing's CPU per record and the query server's
per answer: on a machine shared with other work the wall-clock rates are
what the scheduler gave, the CPU per unit of work much less so. Writes
bench/results/<date>-<tag>.{json,md}.

Environment (run.py's BIN_DIR too):
  QUERIES_KEYS            users in state (default 100000)
  QUERIES_RECORDS_PER_KEY input records per user: the backlog (default 30)
  QUERIES_ROUNDS          rounds (default 2)
  QUERIES_SECONDS         measured window per run, seconds (default 8)
  QUERIES_RATES           fixed query rates per second (default "100 1000")
  QUERIES_CONNECTIONS     clients of the as-fast-as-answered runs (default 4)
  QUERIES_TAG             suffix of the results' names (default "queries")
"""

import datetime
import json
import os
import pathlib
import signal
import statistics
import subprocess
import time
import urllib.request

import run
from run import BIN, ROOT, System, fmt, loadgen, log

KEYS = int(os.environ.get("QUERIES_KEYS", "100000"))
RECORDS_PER_KEY = int(os.environ.get("QUERIES_RECORDS_PER_KEY", "30"))
ROUNDS = int(os.environ.get("QUERIES_ROUNDS", "2"))
SECONDS = float(os.environ.get("QUERIES_SECONDS", "8"))
RATES = [int(r) for r in os.environ.get("QUERIES_RATES", "100 1000").split()]
CONNECTIONS = int(os.environ.get("QUERIES_CONNECTIONS", "4"))
TAG = os.environ.get("QUERIES_TAG", "queries")
RUN_ID = f"queries-{int(time.time())}"
STORE_PATH = "/stores/main/sessions/keys/user-{}"
# Every user's LOGIN and one more event each: all keys are in committed state.
WARMUP_RECORDS = 2 * KEYS
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_port = [19700]


def consumed(system, topic):
    """The service's input records consumed so far (its /metrics)."""
    with urllib.request.urlopen(f"http://{system.metrics_addr}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    prefix = f'streams_records_consumed_total{{topic="{topic}"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


def thread_cpu(pid):
    """CPU seconds per thread name of process `pid` (threads alive now)."""
    by_name = {}
    for stat in pathlib.Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        by_name[name] = by_name.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return by_name


def process_cpu(pid):
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, TypeError):
        return None


class Window:
    """CPU of the service (per thread name) and the broker over a span."""

    def __init__(self, system):
        self.pid, self.broker = system.process.pid, run.broker_pid()
        self.start = time.time()
        self.threads, self.broker_cpu = thread_cpu(self.pid), process_cpu(self.broker)

    def close(self):
        elapsed = time.time() - self.start
        after = thread_cpu(self.pid)
        threads = {name: round(cpu - self.threads.get(name, 0.0), 2) for name, cpu in after.items()
                   if cpu - self.threads.get(name, 0.0) > 0}
        broker = process_cpu(self.broker)
        # The query server runs on the tokio runtime (its reads in
        # spawn_blocking, named alike); processing on every other thread.
        queries = sum(cpu for name, cpu in threads.items() if name.startswith("tokio"))
        return {"elapsed_s": elapsed, "service_cpu_s": round(sum(threads.values()), 2),
                "query_cpu_s": round(queries, 2),
                "processing_cpu_s": round(sum(threads.values()) - queries, 2),
                "service_threads_cpu_s": dict(sorted(threads.items(), key=lambda item: -item[1])),
                "broker_cpu_s": round(broker - self.broker_cpu, 2)
                if broker is not None and self.broker_cpu is not None else None}


def querygen(port, seconds, rate=0, connections=CONNECTIONS, per_query=False):
    """Starts a query load on the service at `port` (each client on one
    kept-alive connection, or with `per_query` a connection per query);
    `.communicate()` ends it."""
    return subprocess.Popen([str(BIN / "querygen"), "--addr", f"127.0.0.1:{port}", "--path", STORE_PATH,
                             "--keys", str(KEYS), "--connections", str(connections), "--seconds",
                             str(seconds), "--rate", str(rate)]
                            + (["--connection-per-query"] if per_query else []),
                            stdout=subprocess.PIPE, text=True)


def finish(process):
    out, _ = process.communicate(timeout=SECONDS + 60)
    return json.loads(out.strip().splitlines()[-1])


def queried(system, port, label, rate=0, connections=CONNECTIONS, per_query=False):
    """Queries on the idle service for one window."""
    window = Window(system)
    answer = finish(querygen(port, SECONDS, rate, connections, per_query))
    outcome = {"label": label, "rate": rate, "connections": connections, "queries": answer} | window.close()
    log(f"  idle, {label}: {fmt(answer['ok_qps'])} answers/s, p50 {answer['p50_ms']} ms, "
        f"p99 {answer['p99_ms']} ms, max {answer['max_ms']} ms, statuses {answer['statuses']}, "
        f"query server CPU {outcome['query_cpu_s']} s")
    return outcome


def readbench(system):
    task_dirs = sorted(system.state_dir.glob("*/task-0"))
    if not task_dirs:
        return {"error": f"no task directory under {system.state_dir}"}
    results = []
    for threads in (1, 2):
        result = subprocess.run([str(BIN / "readbench"), "--task-dir", str(task_dirs[0]), "--store", "sessions",
                                 "--key-template", "user-{}", "--keys", str(KEYS), "--threads", str(threads)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            return {"error": result.stderr.strip()}
        results.append(json.loads(result.stdout.strip().splitlines()[-1]))
        log(f"  readbench, {threads} thread(s): get {fmt(results[-1]['get_reads_per_s'])}/s, "
            f"query path {fmt(results[-1]['query_path_reads_per_s'])}/s, "
            f"{results[-1]['mean_value_bytes']:.0f} value bytes")
    return {"runs": results}


def processing_run(mode, topic, total, round_number):
    """One fresh service on the backlog; the measured window with the
    queries of `mode` (None, a rate, or 0: as fast as answered)."""
    label = "alone" if mode is None else ("max" if mode == 0 else f"{mode}/s")
    app = f"{RUN_ID}-r{round_number}-{label.replace('/s', 'qps')}-{int(time.time())}"
    _port[0] += 1
    port = _port[0]
    system = System("ours", "sessionizer", "base", [topic], app, "exactly_once_v2")
    system.cmd += ["--session-timeout", "1h", "--query-addr", f"127.0.0.1:{port}",
                   "--query-advertised-url", f"http://127.0.0.1:{port}"]
    system.start()
    outcome = {"mode": label, "round": round_number, "app": app, "load_average": os.getloadavg()[0]}
    try:
        deadline = time.time() + 120
        while True:
            try:
                if consumed(system, topic) >= WARMUP_RECORDS:
                    break
            except OSError:
                pass
            if system.process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the service did not take in {WARMUP_RECORDS} records (see {app}.log)")
            time.sleep(0.05)
        before, window = consumed(system, topic), Window(system)
        load = querygen(port, SECONDS, mode) if mode is not None else None
        time.sleep(SECONDS)
        after = consumed(system, topic)
        outcome |= window.close()
        outcome["records_per_s"] = (after - before) / outcome["elapsed_s"]
        outcome["processing_cpu_us_per_record"] = 1e6 * outcome["processing_cpu_s"] / max(after - before, 1)
        # The backlog must outlast the window, or its rate is not a steady one.
        outcome["backlog_lasted"] = after < total
        if load is not None:
            outcome["queries"] = finish(load)
        q = outcome.get("queries")
        log(f"round {round_number}, {label}: {fmt(outcome['records_per_s'])} records/s"
            + ("" if outcome["backlog_lasted"] else " (BACKLOG RAN OUT)")
            + (f"; queries {fmt(q['ok_qps'])}/s answered, p50 {q['p50_ms']} ms, p99 {q['p99_ms']} ms, "
               f"max {q['max_ms']} ms, statuses {q['statuses']}" if q else "")
            + f"; processing CPU {outcome['processing_cpu_us_per_record']:.1f} µs/record, "
            f"query server CPU {outcome['query_cpu_s']} s, load {outcome['load_average']:.1f}")
        if mode is None:
            # The rest of the backlog, then the idle service.
            outcome["watch"] = system.watch()
            outcome["idle"] = [queried(system, port, "1 client", 0, 1),
                               queried(system, port, f"{CONNECTIONS} clients", 0, CONNECTIONS),
                               queried(system, port, f"{CONNECTIONS} clients, a connection per query", 0,
                                       CONNECTIONS, per_query=True)]
            outcome["idle"] += [queried(system, port, f"{rate}/s", rate) for rate in RATES]
            system.process.send_signal(signal.SIGTERM)
            system.process.wait(30)
            outcome["readbench"] = readbench(system)
        outcome["ok"] = True
    except Exception as error:  # noqa: BLE001 - recorded, the rounds go on
        outcome |= {"ok": False, "error": str(error)}
        log(f"round {round_number}, {label}: FAILED {error}")
    finally:
        system.stop()
        # Its changelog and endpoints topics: the broker's disk is shared.
        loadgen("topics", "--delete-prefix", app, check=False)
    return outcome


def main():
    run.WORK.mkdir(parents=True, exist_ok=True)
    run.wait_for_broker()
    started, load_before = time.time(), os.getloadavg()
    topic = f"{RUN_ID}-in0"
    total = KEYS * RECORDS_PER_KEY
    log(f"{RUN_ID}: {KEYS} users, {total} records; load average {load_before[0]:.1f}; work dir {run.WORK}")
    fill = loadgen("fill", "--use-case", "sessionizer", "--topics", topic, "--records", total, "--keys", KEYS)
    log(f"  filled at {fmt(fill['records_per_s'])} records/s")
    modes = [None, *RATES, 0]
    results = {"meta": {
        "run": RUN_ID, "date": datetime.date.today().isoformat(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "bin_dir": str(BIN), "cpus": os.cpu_count(), "keys": KEYS, "records": total, "rounds": ROUNDS, "seconds": SECONDS,
        "rates": RATES, "connections": CONNECTIONS, "load_average_before": load_before, "fill": fill,
    }, "runs": []}
    for round_number in range(ROUNDS):
        shift = round_number % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            results["runs"].append(processing_run(mode, topic, total, round_number))
    loadgen("topics", "--delete-prefix", RUN_ID)
    results["meta"]["load_average_after"] = os.getloadavg()
    results["meta"]["minutes"] = (time.time() - started) / 60
    write_results(results)


def summary(results):
    runs = [r for r in results["runs"] if r.get("ok") and r.get("backlog_lasted")]
    alone = [r["records_per_s"] for r in runs if r["mode"] == "alone"]
    rows = []
    for label in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == label]
        rates = [r["records_per_s"] for r in mine]
        queries = [r["queries"] for r in mine if "queries" in r]
        row = {"mode": label, "records_per_s": rates, "median": statistics.median(rates),
               "slowdown": 1 - statistics.median(rates) / statistics.median(alone) if alone else None,
               "cpu_us_per_record": [r["processing_cpu_us_per_record"] for r in mine],
               "query_cpu_s": statistics.median(r["query_cpu_s"] for r in mine)}
        row["cpu_us_per_record_median"] = statistics.median(row["cpu_us_per_record"])
        if queries:
            for key in ("ok_qps", "p50_ms", "p99_ms", "max_ms", "client_cpu_s"):
                row[key] = statistics.median(q[key] for q in queries if q[key] is not None)
            row["query_cpu_us_per_answer"] = statistics.median(
                1e6 * r["query_cpu_s"] / max(r["queries"]["answered"], 1) for r in mine)
        rows.append(row)
    return rows


def write_results(results):
    results["summary"] = summary(results)
    meta = results["meta"]
    lines = [f"Run `{meta['run']}` at commit {meta['commit']}, {meta['cpus']} cores, {meta['keys']} users "
             f"({meta['records']} records of backlog), {meta['rounds']} rounds of {meta['seconds']:.0f} s windows; "
             f"load average {meta['load_average_before'][0]:.1f} before, {meta['load_average_after'][0]:.1f} "
             f"after; {meta['minutes']:.1f} minutes.", "",
             "Processing (records/s over the window, each round) with queries at a rate:", "",
             "| queries | records/s per round | median | slowdown | processing CPU µs/record per round "
             "| median | answers/s | p50 ms | p99 ms | max ms | query server CPU s (µs/answer) | querygen CPU s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in results["summary"]:
        per_answer = f" ({fmt(row['query_cpu_us_per_answer'])})" if "query_cpu_us_per_answer" in row else ""
        lines.append(f"| {row['mode']} | {', '.join(fmt(r) for r in row['records_per_s'])} | {fmt(row['median'])} "
                     f"| {fmt(100 * row['slowdown'], 1) if row['slowdown'] is not None else '–'} % "
                     f"| {', '.join(fmt(c, 1) for c in row['cpu_us_per_record'])} "
                     f"| {fmt(row['cpu_us_per_record_median'], 1)} "
                     f"| {fmt(row.get('ok_qps'))} | {fmt(row.get('p50_ms'), 2)} | {fmt(row.get('p99_ms'), 2)} "
                     f"| {fmt(row.get('max_ms'), 1)} | {fmt(row['query_cpu_s'], 2)}{per_answer} "
                     f"| {fmt(row.get('client_cpu_s'), 2)} |")
    lines += ["", "Queries on the idle service (each round):", "",
              "| round | load | answers/s | p50 ms | p99 ms | max ms | query server CPU s | µs/answer "
              "| querygen CPU s | statuses |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["runs"]:
        for idle in r.get("idle", []):
            q = idle["queries"]
            lines.append(f"| {r['round']} | {idle['label']} | {fmt(q['ok_qps'])} | {fmt(q['p50_ms'], 2)} "
                         f"| {fmt(q['p99_ms'], 2)} | {fmt(q['max_ms'], 1)} | {fmt(idle['query_cpu_s'], 2)} "
                         f"| {fmt(1e6 * idle['query_cpu_s'] / max(q['answered'], 1))} "
                         f"| {fmt(q['client_cpu_s'], 2)} | {q['statuses']} |")
    lines += ["", "The ceiling: RocksDB point reads of the same task (`readbench`, the service stopped), "
              "per second and per CPU-second:", "",
              "| round | threads | get_pinned_cf reads/s | per CPU-s | query path reads/s | per CPU-s "
              "| value bytes | answer bytes |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["runs"]:
        for b in r.get("readbench", {}).get("runs", []):
            lines.append(f"| {r['round']} | {b['threads']} | {fmt(b['get_reads_per_s'])} "
                         f"| {fmt(b['get_reads_per_cpu_s'])} | {fmt(b['query_path_reads_per_s'])} "
                         f"| {fmt(b['query_path_reads_per_cpu_s'])} | {b['mean_value_bytes']:.0f} "
                         f"| {b['query_path_mean_answer_bytes']:.0f} |")
    failed = [f"{r['mode']} (round {r['round']}): {r.get('error', 'backlog ran out')}" for r in results["runs"]
              if not (r.get("ok") and r.get("backlog_lasted"))]
    if failed:
        lines += ["", "Not counted: " + "; ".join(failed)]
    text = "\n".join(lines) + "\n"
    stem = ROOT / "bench/results" / "-".join(filter(None, [meta["date"], TAG]))
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(text)
    log(f"results: {stem}.json, .md")


if __name__ == "__main__":
    main()
