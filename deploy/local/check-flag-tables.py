#!/usr/bin/env python3
"""Checks each service's flag table (docs/services/<service>.md, "## Flags")
against the binary's `--help`: the same flags, each with the same
environment variable and, where `--help` gives one, the same default. The
flags every service shares (the runtime's, documented once in the README)
are left out of both: a flag in every service's `--help`, with the same
variable and default in each, is a common one.

  python3 deploy/local/check-flag-tables.py [BIN_DIR]

BIN_DIR: the debug binaries (default $CARGO_TARGET_DIR/debug, else
/var/tmp/streams-target/debug). Exit 1 naming every difference.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy/k8s"))
from generate import help_flags  # noqa: E402  (one parser of --help for both)

ROW = re.compile(r"^\| `--([a-z0-9-]+)` \| `([A-Z0-9_]+)` \| ([^|]*) \|")


def table_flags(document):
    """{flag: (env, default cell)} from the document's "## Flags" table."""
    rows, inside = {}, False
    for line in document.read_text().splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Flags"
        elif inside and (row := ROW.match(line)):
            rows[row.group(1)] = (row.group(2), row.group(3).strip())
    return rows


def main():
    default_dir = Path(os.environ.get("CARGO_TARGET_DIR", "/var/tmp/streams-target")) / "debug"
    bin_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else default_dir
    services = subprocess.run(
        [sys.executable, str(REPO / "deploy/k8s/generate.py"), "--list"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    helps = {
        service: help_flags(
            subprocess.run([bin_dir / service, "--help"], capture_output=True, text=True, check=True).stdout
        )
        for service in services
    }
    # Common: in every service, with the same variable and default in each
    # (`--output-topic` is in every one, with a default of its own).
    common = {
        flag
        for flag in set.intersection(*(set(flags) for flags in helps.values()))
        if len({flags[flag] for flags in helps.values()}) == 1
    }
    problems = []
    for service, flags in helps.items():
        document = REPO / "docs/services" / f"{service}.md"
        table = table_flags(document)
        where = document.relative_to(REPO)
        own = {flag: value for flag, value in flags.items() if flag not in common}
        for flag in sorted(own.keys() - table.keys()):
            problems.append(f"{where}: --{flag} is in `{service} --help` but not in the table")
        for flag in sorted(table.keys() - own.keys()):
            problems.append(f"{where}: --{flag} is in the table but not a flag of {service} alone")
        for flag in sorted(own.keys() & table.keys()):
            (env, default), (table_env, table_default) = own[flag], table[flag]
            if env != table_env:
                problems.append(f"{where}: --{flag}: env {table_env} in the table, {env} in --help")
            # A default in words (`the available cores`) is the table's to say.
            worded = default is None or " " in default
            if not worded and not table_default.startswith(f"`{default}`"):
                problems.append(
                    f"{where}: --{flag}: default {table_default} in the table, `{default}` in --help"
                )
    for problem in problems:
        print(f"[flag-tables] {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"[flag-tables] the flag tables of {', '.join(services)} match their --help")


if __name__ == "__main__":
    main()
