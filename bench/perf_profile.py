"""CPU profiles of a running system for the benchmarks (`BENCH_PROFILE=1`).

`perf record` samples every thread of the process at PROFILE_HZ with DWARF
call graphs (release builds keep no frame pointers); `perf script` and
inferno (`inferno-collapse-perf`, `inferno-flamegraph`, installed from
crates.io into PROFILE_TOOLS on first use) turn the samples into a flame
graph (SVG) and a table of the functions that hold the largest inclusive
share of the samples. The perf data stays in the run's work directory: it
is large and tied to the binary that made it.
"""

import collections
import os
import pathlib
import shutil
import signal
import subprocess

HZ = int(os.environ.get("PROFILE_HZ", "199"))
TOOLS = pathlib.Path(os.environ.get("PROFILE_TOOLS", "/var/tmp/streams-tools/inferno"))
INFERNO_VERSION = "0.12.8"


def inferno(tool):
    """The path of an inferno tool, installed on first use."""
    found = shutil.which(tool) or (TOOLS / "bin" / tool if (TOOLS / "bin" / tool).exists() else None)
    if found:
        return str(found)
    subprocess.run(["cargo", "install", "--locked", "--quiet", "--root", str(TOOLS),
                    "--version", INFERNO_VERSION, "inferno"], check=True)
    return str(TOOLS / "bin" / tool)


class Recording:
    """`perf record` attached to `pid` until `stop()`."""

    def __init__(self, pid, data):
        self.data = data
        self.process = subprocess.Popen(
            ["perf", "record", "-F", str(HZ), "--call-graph", "dwarf,16384", "-p", str(pid),
             "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        self.process.wait(120)


def fold(data, folded):
    """Collapses the samples of `data` into `folded` (one stack per line)."""
    with open(folded, "w") as out:
        script = subprocess.Popen(["perf", "script", "-i", str(data), "--no-inline"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        subprocess.run([inferno("inferno-collapse-perf")], stdin=script.stdout, stdout=out, check=True)
        script.wait()


def flame_graph(folded, svg, title):
    with open(folded) as stacks, open(svg, "w") as out:
        subprocess.run([inferno("inferno-flamegraph"), "--title", title, "--width", "1600",
                        "--minwidth", "1.0"],
                       stdin=stacks, stdout=out, check=True)


def shares(folded, top=30):
    """Each function's inclusive share of the samples (a function counted
    once per stack), and each thread's, largest first. Samples weigh their
    period: nanoseconds of CPU for perf's cpu-clock event (a machine without
    hardware counters, such as a VM)."""
    total, functions, threads = 0, collections.Counter(), collections.Counter()
    for line in pathlib.Path(folded).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        count = int(count)
        total += count
        frames = stack.split(";")
        threads[frames[0]] += count
        for frame in set(frames[1:]):
            functions[frame] += count
    share = lambda c: round(c / total, 4) if total else 0.0  # noqa: E731 - a one-line helper
    return {"samples": total,
            "threads": [(name, share(c)) for name, c in threads.most_common(12)],
            "functions": [(name, share(c)) for name, c in functions.most_common(top)]}


def profile(system, watch, stem, title):
    """Runs `watch()` on a started `system` under `perf record`; writes
    `stem`.svg and returns the shares (or why there are none)."""
    if shutil.which("perf") is None:
        return {"error": "perf is not installed"}
    data, folded = system.state_dir.parent / f"{system.app}.perf.data", system.state_dir.parent / f"{system.app}.folded"
    recording = Recording(system.process.pid, data)
    try:
        outcome = watch()
    finally:
        recording.stop()
    fold(data, folded)
    flame_graph(folded, stem.with_suffix(".svg"), title)
    return {"watch": outcome, "svg": stem.with_suffix(".svg").name} | shares(folded)
