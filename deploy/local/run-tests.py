#!/usr/bin/env python3
"""Runs every test of the workspace, test binaries side by side (`make test`).

Builds all test binaries once (`cargo test --workspace --no-run`), then runs
them in LANES lanes against the one local stack:

  * Two jobs run alone among the end-to-end tests: while one runs, the
    other lanes take only tests that need no broker (unit, doc and driver
    tests). First `broker_restart`, which restarts the local broker. Then
    the start of the secured cluster the cluster tests use
    (`deploy/local/cluster.sh up`: three brokers, a registry and an OIDC
    issuer starting take both cores for a minute and a half; end-to-end
    tests beside it had exactly-once transactions outlive their 10 s
    timeout, and the broker's stop in the restart, beside it, outlived
    what stack.sh waits for).
  * Then the end-to-end tests, longest first, and the broker-free tests
    left over. The cluster tests share the secured cluster, so they run
    one after another, as one job, which then stops it (`make cluster-up`
    starts it again). Every other end-to-end test uses
    topics, application ids, state directories and ports of its own
    (`e2e_tests::unique`), so any two run side by side.

Each binary's output goes to <scratch>/test-logs/<name>.log and is printed
whole, with its duration, when the binary ends. Every binary runs whatever
fails (as with `cargo test --no-fail-fast`); the end shows each one's
duration and which failed, and the exit status is 1 if any did.

Usage: run-tests.py [ARGS given to every test binary, e.g. --nocapture]
Env: LANES (default 2), E2E_SCRATCH_DIR (default $TMPDIR/streams-e2e), CARGO.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

E2E_PACKAGE = "e2e-tests"
BROKER_RESTART = "broker_restart"
CLUSTER_START = "cluster start"
# Jobs that run alone among the end-to-end tests, in this order.
ALONE = [BROKER_RESTART, CLUSTER_START]
CLUSTER = ["cluster", "cluster_acls", "cluster_logins"]
# The jobs that take longest (the table each run prints ends with the
# durations), each kind started longest first so that the lanes end
# together; the rest follow by name.
LONGEST_FIRST = [
    "cluster",
    "embed_forward_progress",
    "order_shipment_joiner",
    "fault_tolerance",
    "window_aggregator",
    "embed_batcher",
    "sensor_fusion",
    "signals",
    "embed_jobs",
    "driver_order_shipment_joiner",
    "driver_window_aggregator",
    "embed-batcher (test model)",
]

print_lock = threading.Lock()


def say(text):
    with print_lock:
        print(text, flush=True)


def minutes(seconds):
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


class Job:
    """Test binaries run one after another; most jobs hold one. Each command
    is (name, argv, working directory)."""

    def __init__(self, commands, needs_broker):
        self.commands = commands
        self.name = commands[0][0]
        self.needs_broker = needs_broker


def package_name(package_id):
    """The package of a cargo package id: `path+file:///w/tests#e2e-tests@0.1.0`,
    or `path+file:///w/services/sessionizer#0.1.0` when the directory has its name."""
    path, _, fragment = package_id.partition("#")
    name, at, _ = fragment.partition("@")
    return name if at else path.rstrip("/").rsplit("/", 1)[-1]


def build(cargo, test_args):
    """Builds every test binary; returns (name, argv, directory, needs the stack) each."""
    command = [cargo, "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    process = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if process.returncode != 0:
        sys.exit(f"[test] {' '.join(command)} failed")
    binaries = []
    for line in process.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message["profile"]["test"]:
            continue
        package = package_name(message["package_id"])
        kind, target = message["target"]["kind"][0], message["target"]["name"]
        end_to_end = package == E2E_PACKAGE and kind == "test"
        name = target if end_to_end else f"{package} ({kind} {target})"
        needs_stack = end_to_end and not target.startswith("driver_")
        directory = str(Path(message["manifest_path"]).parent)
        binaries.append((name, [message["executable"], *test_args], directory, needs_stack))
    return binaries


def plan(binaries, cargo, test_args):
    """Every job, in the order the lanes take them."""
    restart, end_to_end, broker_free, cluster = [], [], [], []
    for name, argv, directory, needs_stack in sorted(binaries):
        command = (name, argv, directory)
        if name == BROKER_RESTART:
            restart.append(Job([command], True))
        elif name in CLUSTER:
            cluster.append(command)
        elif needs_stack:
            end_to_end.append(Job([command], True))
        else:
            broker_free.append(Job([command], False))
    doc_tests = [cargo, "test", "--workspace", "--doc", "--", *test_args]
    broker_free.append(Job([("doc tests", doc_tests, os.getcwd())], False))
    cluster_start = []
    if cluster:
        cluster.sort(key=lambda command: CLUSTER.index(command[0]))
        # Stopped when its tests end: its three brokers, busy with the tests'
        # replicas, would take CPU from the tests after them.
        down = ["bash", "deploy/local/cluster.sh", "down"]
        end_to_end.append(Job([*cluster, ("cluster stop", down, os.getcwd())], True))
        # The cluster tests start it themselves if it is not up (a no-op if it is).
        up = ["bash", "deploy/local/cluster.sh", "up"]
        cluster_start.append(Job([(CLUSTER_START, up, os.getcwd())], True))

    def rank(job):
        listed = job.name in LONGEST_FIRST
        return (LONGEST_FIRST.index(job.name) if listed else len(LONGEST_FIRST), job.name)

    return restart + cluster_start + sorted(end_to_end, key=rank) + sorted(broker_free, key=rank)


def run_command(command, cargo, logs, lane):
    name, argv, directory = command
    log = logs / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") + ".log")
    # What `cargo test` gives a test binary that these tests read.
    env = dict(os.environ, CARGO=cargo, CARGO_MANIFEST_DIR=directory)
    started = time.monotonic()
    with open(log, "w") as out:
        status = subprocess.run(
            argv, cwd=directory, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    seconds = time.monotonic() - started
    verdict = "ok" if status == 0 else f"FAILED (exit {status})"
    with print_lock:
        print(f"\n──── {name}: {verdict} in {minutes(seconds)} (lane {lane}; {log}) ────", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        sys.stdout.flush()
    return (name, status == 0, seconds, lane)


def run_all(jobs, lanes, cargo, logs, results):
    queue = list(jobs)
    changed = threading.Condition()
    alone = False  # whether a job of ALONE runs

    def next_job():
        """The next job a lane may start now, or None when all have started."""
        nonlocal alone
        with changed:
            while queue:
                if queue[0].name in ALONE and not alone:
                    alone = True
                    return queue.pop(0)
                for index, job in enumerate(queue):
                    if not ((alone or queue[0].name in ALONE) and job.needs_broker):
                        return queue.pop(index)
                changed.wait()
            return None

    def lane_loop(lane):
        nonlocal alone
        while (job := next_job()) is not None:
            for command in job.commands:
                results.append(run_command(command, cargo, logs, lane))
            if job.name in ALONE:
                with changed:
                    alone = False
                    changed.notify_all()

    threads = [threading.Thread(target=lane_loop, args=(lane,), daemon=True) for lane in range(1, lanes + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        # A timeout, so that Ctrl-C reaches this thread (the test binaries,
        # in the same process group, get the SIGINT themselves).
        while thread.is_alive():
            thread.join(timeout=1)


def main():
    cargo = os.environ.get("CARGO", "cargo")
    lanes = int(os.environ.get("LANES", "2"))
    test_args = sys.argv[1:]
    scratch = Path(os.environ.get("E2E_SCRATCH_DIR") or Path(tempfile.gettempdir()) / "streams-e2e")
    logs = scratch / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    binaries = build(cargo, test_args)
    built = time.monotonic() - started
    jobs = plan(binaries, cargo, test_args)
    say(f"[test] {len(binaries)} test binaries built in {minutes(built)}; {lanes} lanes")
    say("[test] order: " + ", ".join(" → ".join(command[0] for command in job.commands) for job in jobs))
    results = []
    try:
        run_all(jobs, lanes, cargo, logs, results)
    except KeyboardInterrupt:
        sys.exit("\n[test] interrupted")

    failed = [name for name, passed, _, _ in results if not passed]
    print("\n[test] durations (longest first):")
    print(f"  {'binary':<52} {'lane':>4}  {'time':>9}  result")
    for name, passed, seconds, lane in sorted(results, key=lambda r: -r[2]):
        print(f"  {name:<52} {lane:>4}  {minutes(seconds):>9}  {'ok' if passed else 'FAILED'}")
    print(f"[test] {len(results)} test binaries in {minutes(time.monotonic() - started)} (build included)")
    if failed:
        print(f"[test] {len(failed)} failed: {', '.join(failed)} (logs in {logs})")
        sys.exit(1)
    print("[test] all passed")


if __name__ == "__main__":
    main()
