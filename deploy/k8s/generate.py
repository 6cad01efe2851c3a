#!/usr/bin/env python3
"""Writes the deploy files that list or repeat the services, from templates.

Inputs:
  deploy/template/       the files, with {{...}} placeholders (README.md there);
                         template/<path> is written to deploy/<path>, and
                         template/k8s/base/SERVICE/* once per service, to
                         deploy/k8s/base/<name>/;
  deploy/k8s/services.toml  the services and the deploy decisions per service
                         (settings, resources, replicas, summary, ...);
  the binaries           `<name> describe --format json` (the service's name,
                         its input and output topics) and `<name> --help`
                         (the environment variable naming each topic), from
                         --bin-dir, else $STREAMS_BIN_DIR, else
                         $CARGO_TARGET_DIR/debug (/var/tmp/streams-target/debug).

Outputs (each file of deploy/template/): deploy/k8s/base/ (each service's
StatefulSet, Service, PodDisruptionBudget and settings, and the list of
services); the overlays' kustomization.yaml (their replicas); the per-service
patches of the components kafka-mtls, kafka-oidc, kafka-sasl and queries;
the absent() selectors of components/monitoring/prometheus-rules.yaml; the
binaries deploy/docker/Dockerfile copies; the services of
deploy/docker/compose.yaml.

  python3 deploy/k8s/generate.py          write what differs
  python3 deploy/k8s/generate.py --check  write nothing; exit 1 naming each
                                          file that differs (deploy/validate.sh)
  python3 deploy/k8s/generate.py --list   the services' names, one a line, in
                                          the table's order; reads no binary
                                          (deploy/services.sh)

Python 3.11 or newer (tomllib), the standard library only.
"""

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

K8S = Path(__file__).resolve().parent
DEPLOY = K8S.parent
REPO = DEPLOY.parent
TEMPLATE = DEPLOY / "template"
TABLE = K8S / "services.toml"
PER_SERVICE_DIR = ("k8s", "base", "SERVICE")
# compose.yaml publishes each service's metrics port on the host at this plus
# its place in the table (1, 2, ...).
COMPOSE_PORT_BASE = 9100

# Keys whose values are Kubernetes quantities: a bare number would be a YAML
# number, so it is quoted, as `cpu: "1"`.
QUANTITIES = ("cpu_request", "memory_request", "cpu_limit", "memory_limit", "storage")
REPLICAS = ("dev_replicas", "prod_replicas")
OPTIONAL_BLOCKS = ("extra_env", "termination_grace", "compose_env")
BLOCKS = ("settings", *OPTIONAL_BLOCKS)
TABLE_KEYS = {"name", "summary", "settings", *OPTIONAL_BLOCKS, *QUANTITIES, *REPLICAS}

PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")
# {{#word key}} or {{#word key separator}}, {{/word}}
DIRECTIVE = re.compile(r"^(\s*)\{\{([#/])(\w+)(?: (\w+))?(?: ([^\s{}]+))?\}\}\s*$")
BLOCK_LINE = re.compile(r"^(\s*)\{\{([a-z_]+)\}\}\s*$")


class Error(Exception):
    pass


# --- what the binaries say --------------------------------------------------


def bin_dir(arg):
    if arg:
        return Path(arg)
    if os.environ.get("STREAMS_BIN_DIR"):
        return Path(os.environ["STREAMS_BIN_DIR"])
    return Path(os.environ.get("CARGO_TARGET_DIR", "/var/tmp/streams-target")) / "debug"


def run(binary, args, env):
    if not binary.is_file():
        raise Error(f"{binary} is not built (`make build`, or set STREAMS_BIN_DIR)")
    done = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise Error(f"{binary} {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


HELP_OPTION = re.compile(r"^\s*(?:-\w, )?--([a-z0-9-]+)")
HELP_ENV = re.compile(r"\[env: ([A-Z0-9_]+)")
HELP_DEFAULT = re.compile(r"\[default: ([^\]]*)\]")


def help_flags(text):
    """{flag: (env or None, default or None)} of each option of clap's long
    --help, but --help and --version; an env whose value clap hides (a
    secret's) is named too. deploy/local/check-flag-tables.py uses it."""
    flags, current = {}, None
    for line in text.splitlines():
        if option := HELP_OPTION.match(line):
            current = option.group(1)
            flags[current] = [None, None]
        elif current:
            if env := HELP_ENV.search(line):
                flags[current][0] = env.group(1)
            if default := HELP_DEFAULT.search(line):
                flags[current][1] = default.group(1)
    flags.pop("help", None)
    flags.pop("version", None)
    return {flag: tuple(value) for flag, value in flags.items()}


def external_topics(description):
    """Inputs (in stage order), then outputs; internal topics are the service's own."""
    sources = [s["topic"] for st in description["stages"] for s in st["sources"] if not s["internal"]]
    sinks = [st["sink"]["topic"] for st in description["stages"] if st.get("sink") and not st["sink"]["internal"]]
    return list(dict.fromkeys(sources + sinks))


def describe(binary):
    """The service's name and [(topic variable, topic)] from its binary."""
    flags = [(env, default) for env, default in help_flags(run(binary, ["--help"], dict(os.environ))).values() if env]
    # Without the caller's settings, so that describe reports the defaults
    # that --help lists.
    env = {k: v for k, v in os.environ.items() if k not in {e for e, _ in flags}}
    description = json.loads(run(binary, ["describe", "--format", "json"], env))
    by_default = {}
    for env_name, default in flags:
        if env_name.endswith("_TOPIC") and default is not None:
            by_default.setdefault(default, []).append(env_name)
    topics = []
    for topic in external_topics(description):
        names = by_default.get(topic, [])
        if len(names) != 1:
            raise Error(
                f"{binary.name}: topic {topic} is the default of {len(names)} *_TOPIC variables "
                f"in --help ({', '.join(names) or 'none'}), not one"
            )
        topics.append((names[0], topic))
    return description["service"], topics


# --- the table ----------------------------------------------------------------


def quantity(value):
    text = str(value)
    return f'"{text}"' if re.fullmatch(r"[0-9.]+", text) else text


def settings_lines(name, topics, settings):
    """ConfigMap literals: the derived topic variables, then the table's."""
    literals = [[env, value] for env, value in topics]
    rest = []
    for entry in settings:
        if entry.startswith("#"):
            rest.append(entry)
            continue
        key, sep, value = entry.partition("=")
        if not sep:
            raise Error(f"services.toml: {name}: setting {entry!r} is not VAR=value")
        for literal in literals:
            if literal[0] == key:
                literal[1] = value
                break
        else:
            rest.append(f"- {key}={value}")
    return "\n".join([f"- {k}={v}" for k, v in literals] + rest)


def read_table():
    """[defaults] and the [[service]] tables, in their order."""
    table = tomllib.loads(TABLE.read_text())
    services = table.get("service", [])
    names = [s.get("name") for s in services]
    if None in names:
        raise Error("services.toml: a [[service]] without a name")
    if len(set(names)) != len(names):
        raise Error("services.toml: a name appears twice")
    return table.get("defaults", {}), services


def services_values(bins):
    defaults, services = read_table()
    names = [s["name"] for s in services]
    crates = sorted(p.parent.name for p in (REPO / "services").glob("*/Cargo.toml"))
    if sorted(names) != crates:
        raise Error(
            f"services.toml names {', '.join(sorted(names))}; services/ has {', '.join(crates)}: "
            "a [[service]] table per crate of services/"
        )
    out = []
    for position, entry in enumerate(services, start=1):
        name = entry["name"]
        unknown = (set(entry) | set(defaults)) - TABLE_KEYS
        if unknown:
            raise Error(f"services.toml: {name}: unknown keys {', '.join(sorted(unknown))}")
        merged = {**defaults, **entry}
        described, topics = describe(bins / name)
        if described != name:
            raise Error(f"{bins / name} describes itself as {described}, not {name}")
        values = {"name": name, "summary": merged.get("summary", "")}
        for key in QUANTITIES:
            if key not in merged:
                raise Error(f"services.toml: {name}: no {key} (nor in [defaults])")
            values[key] = quantity(merged[key])
        for key in REPLICAS:
            count = merged.get(key)
            if type(count) is not int or count < 1:
                raise Error(f"services.toml: {name}: {key}: want a whole number, at least 1 (here or in [defaults])")
            values[key] = count
        values["compose_port"] = COMPOSE_PORT_BASE + position
        values["settings"] = settings_lines(name, topics, merged.get("settings", []))
        for key in OPTIONAL_BLOCKS:
            if merged.get(key, "").strip():
                values[key] = merged[key].strip("\n")
        out.append(values)
    return out


# --- the template -------------------------------------------------------------


def substitute(line, values, where):
    def one(m):
        key = m.group(1)
        if key not in values:
            raise Error(f"{where}: no value for {{{{{key}}}}}")
        if key in BLOCKS:
            raise Error(f"{where}: {{{{{key}}}}} is a block: alone on its line")
        return str(values[key])

    return PLACEHOLDER.sub(one, line)


def indent(block, prefix):
    return [prefix + line if line else "" for line in block.split("\n")]


def joined(repetitions, separator):
    """The repetitions' lines, each repetition after the first starting with
    `separator ` (after its first line's indentation)."""
    out = []
    for n, lines in enumerate(repetitions):
        if n and separator and lines:
            first = lines[0]
            indentation = first[: len(first) - len(first.lstrip())]
            lines = [f"{indentation}{separator} {first.lstrip()}", *lines[1:]]
        out += lines
    return out


def render(lines, values, services, where):
    """Template lines to output lines. {{#each service}} repeats its lines
    per service ({{#each service or}}: joined by `or`); {{#default KEY}}
    gives its lines unless KEY has a value; {{#if KEY}} gives them only if it
    has one; a {{KEY}} alone on a line is a block, indented as the placeholder
    and dropped when empty."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if m := DIRECTIVE.match(line):
            prefix, kind, word, key, separator = m.groups()
            if kind == "/":
                raise Error(f"{where}:{i + 1}: {{{{/{word}}}}} without its opening")
            end, depth = i + 1, 1
            while end < len(lines):
                if d := DIRECTIVE.match(lines[end]):
                    depth += 1 if d.group(2) == "#" else -1
                    if depth == 0:
                        break
                end += 1
            if end == len(lines):
                raise Error(f"{where}:{i + 1}: {{{{#{word}}}}} is not closed")
            body = lines[i + 1 : end]
            if word == "each" and key == "service":
                out += joined([render(body, service, services, where) for service in services], separator)
            elif word == "default" and key in OPTIONAL_BLOCKS and not separator:
                if values.get(key):
                    out += indent(values[key], prefix)
                else:
                    out += render(body, values, services, where)
            elif word == "if" and key in OPTIONAL_BLOCKS and not separator:
                if values.get(key):
                    out += render(body, values, services, where)
            else:
                raise Error(f"{where}:{i + 1}: unknown directive {line.strip()}")
            i = end + 1
            continue
        if (m := BLOCK_LINE.match(line)) and m.group(2) in BLOCKS:
            block = values.get(m.group(2))
            if block:
                out += indent(block, m.group(1))
        else:
            out.append(substitute(line, values, f"{where}:{i + 1}"))
        i += 1
    return out


def render_file(path, values, services):
    text = path.read_text()
    where = str(path.relative_to(REPO))
    lines = render(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), values, services, where)
    return "\n".join(lines) + "\n"


def outputs(services):
    """{output path relative to deploy/: (content, template path)}"""
    files = {}
    per_service = len(PER_SERVICE_DIR)
    for template in sorted(p for p in TEMPLATE.rglob("*") if p.is_file() and p.name != "README.md"):
        rel = template.relative_to(TEMPLATE)
        if rel.parts[:per_service] == PER_SERVICE_DIR:
            for service in services:
                out = Path(*PER_SERVICE_DIR[:-1], service["name"], *rel.parts[per_service:])
                files[out] = (render_file(template, service, services), template)
        else:
            files[rel] = (render_file(template, {}, services), template)
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    parser.add_argument("--list", action="store_true", help="print the services' names, one a line; write nothing")
    parser.add_argument("--bin-dir", help="the built binaries (default $STREAMS_BIN_DIR)")
    args = parser.parse_args()
    try:
        if args.list:
            _, listed = read_table()
            print("\n".join(s["name"] for s in listed))
            return 0
        services = services_values(bin_dir(args.bin_dir))
        files = outputs(services)
    except Error as e:
        print(f"generate.py: {e}", file=sys.stderr)
        return 2
    differ = []
    for rel, (content, template) in files.items():
        path = DEPLOY / rel
        current = path.read_text() if path.exists() else None
        if current == content:
            continue
        differ.append(rel)
        shown = path.relative_to(REPO)
        if args.check:
            what = "missing" if current is None else "differs from what deploy/k8s/generate.py writes"
            print(f"{shown}: {what} (template {template.relative_to(REPO)})", file=sys.stderr)
            if current is not None:
                sys.stderr.writelines(
                    difflib.unified_diff(
                        current.splitlines(True), content.splitlines(True), f"{shown} (now)", f"{shown} (generated)"
                    )
                )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            print(f"wrote {shown}")
    # A service dropped from the table leaves its directory behind: named, not deleted.
    names = {s["name"] for s in services}
    stale = sorted(p for p in (K8S / "base").iterdir() if p.is_dir() and p.name not in names)
    for path in stale:
        print(f"{path.relative_to(REPO)}: not a service of deploy/k8s/services.toml; remove it", file=sys.stderr)
    if args.check and (differ or stale):
        print(
            "generate.py --check: the files above are generated: edit deploy/template/ or "
            "deploy/k8s/services.toml, then `make deploy-generate`",
            file=sys.stderr,
        )
        return 1
    if not args.check:
        print(f"{len(files) - len(differ)} of {len(files)} files already up to date")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
