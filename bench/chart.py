#!/usr/bin/env python3
"""Draws bench/results/<date>.json as an SVG: steady and whole-run records/s
and peak RSS per use case, shape and system (median bars, min-max whiskers),
with ours over Kafka Streams on the steady rate; or, for bench/scale.py's
results (<date>-scale.json), steady records/s and peak RSS against the keys
in state, per service and system. Standard library only.

    python3 bench/chart.py bench/results/<date>.json bench/results/<date>.svg
"""

import json
import math
import sys
from xml.sax.saxutils import escape

COLORS = {"ours": "#1f77b4", "kafka-streams": "#ff7f0e", "rawcopy": "#7f7f7f"}
GROUP_WIDTH = 130
PANEL = 300
MARGIN_LEFT, MARGIN_TOP = 80, 50


def nice_max(value):
    if value <= 0:
        return 1
    step = 10 ** (len(str(int(value))) - 1)
    for multiple in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if multiple * step >= value:
            return multiple * step
    return 10 * step


def label(value):
    if value >= 1_000_000:
        return f"{value / 1_000_000:.2f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1_000:
        return f"{value / 1000:.1f}k"
    return f"{value:.0f}"


def panel(out, top, width, title, unit, groups, key, notes=None):
    """One bar chart: `groups` is [(use case, shape, {system: summary})];
    `notes`, a text under each group's name."""
    systems = []
    for _, _, per in groups:
        systems += [s for s in per if s not in systems]
    top_value = nice_max(max([per[s][key]["max"] for _, _, per in groups for s in per
                              if per[s].get(key)] + [1]))
    plot_w = width - MARGIN_LEFT - 20
    plot_h = PANEL - 90
    base = top + 40 + plot_h
    out.append(f'<text x="{MARGIN_LEFT}" y="{top + 20}" font-size="15" font-weight="bold">{escape(title)}</text>')
    for i in range(5):
        value = top_value * i / 4
        y = base - plot_h * i / 4
        out.append(f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{MARGIN_LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{label(value)}</text>')
    out.append(f'<text x="16" y="{base - plot_h / 2:.1f}" font-size="11" transform="rotate(-90 16 {base - plot_h / 2:.1f})" '
               f'text-anchor="middle">{escape(unit)}</text>')
    group_w = plot_w / max(1, len(groups))
    bar_w = min(50, (group_w - 30) / max(1, len(systems)))
    for g, (use_case, shape, per) in enumerate(groups):
        x0 = MARGIN_LEFT + g * group_w + (group_w - bar_w * len(systems)) / 2
        center = MARGIN_LEFT + g * group_w + group_w / 2
        for s, system in enumerate(systems):
            stats = per.get(system, {}).get(key)
            if not stats:
                continue
            x = x0 + s * bar_w
            h = plot_h * stats["median"] / top_value
            out.append(f'<rect x="{x + 2:.1f}" y="{base - h:.1f}" width="{bar_w - 4:.1f}" height="{h:.1f}" '
                       f'fill="{COLORS.get(system, "#2ca02c")}"><title>{escape(system)}: {stats["median"]:.0f} '
                       f'(min {stats["min"]:.0f}, max {stats["max"]:.0f})</title></rect>')
            cx = x + bar_w / 2
            y_min = base - plot_h * stats["min"] / top_value
            y_max = base - plot_h * stats["max"] / top_value
            out.append(f'<line x1="{cx:.1f}" y1="{y_min:.1f}" x2="{cx:.1f}" y2="{y_max:.1f}" stroke="#000"/>')
            out.append(f'<line x1="{cx - 4:.1f}" y1="{y_max:.1f}" x2="{cx + 4:.1f}" y2="{y_max:.1f}" stroke="#000"/>')
            out.append(f'<line x1="{cx - 4:.1f}" y1="{y_min:.1f}" x2="{cx + 4:.1f}" y2="{y_min:.1f}" stroke="#000"/>')
            out.append(f'<text x="{cx:.1f}" y="{y_max - 4:.1f}" font-size="10" text-anchor="middle">'
                       f'{label(stats["median"])}</text>')
        out.append(f'<text x="{center:.1f}" y="{base + 16:.1f}" font-size="11" '
                   f'text-anchor="middle">{escape(use_case)}</text>')
        out.append(f'<text x="{center:.1f}" y="{base + 30:.1f}" font-size="11" fill="#555" '
                   f'text-anchor="middle">{escape(shape)}</text>')
        if notes and notes[g]:
            out.append(f'<text x="{center:.1f}" y="{base + 44:.1f}" font-size="11" font-weight="bold" '
                       f'text-anchor="middle">{escape(notes[g])}</text>')
    return systems


def line_panel(out, left, top, width, height, title, series, y_label):
    """Values against keys on a log-10 x axis: `series` is {system: [(keys, value)]}."""
    xs = sorted({x for points in series.values() for x, _ in points}) or [1, 10]
    lo, hi = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)))
    hi = max(hi, lo + 1)
    top_value = nice_max(max([v for points in series.values() for _, v in points] + [1]))
    plot_l, plot_r, plot_t, plot_b = left + 60, left + width - 15, top + 30, top + height - 35
    out.append(f'<text x="{plot_l}" y="{top + 16}" font-size="13" font-weight="bold">{escape(title)}</text>')

    def x_of(keys):
        return plot_l + (plot_r - plot_l) * (math.log10(keys) - lo) / (hi - lo)

    def y_of(value):
        return plot_b - (plot_b - plot_t) * value / top_value
    for i in range(5):
        value = top_value * i / 4
        out.append(f'<line x1="{plot_l}" y1="{y_of(value):.1f}" x2="{plot_r}" y2="{y_of(value):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{plot_l - 6}" y="{y_of(value) + 4:.1f}" font-size="11" '
                   f'text-anchor="end">{label(value)}</text>')
    for exponent in range(lo, hi + 1):
        x = x_of(10 ** exponent)
        out.append(f'<line x1="{x:.1f}" y1="{plot_t}" x2="{x:.1f}" y2="{plot_b}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{plot_b + 15}" font-size="11" text-anchor="middle">'
                   f'{label(10 ** exponent)}</text>')
    out.append(f'<text x="{(plot_l + plot_r) / 2:.1f}" y="{plot_b + 30}" font-size="11" '
               f'text-anchor="middle">keys in state</text>')
    out.append(f'<text x="{left + 14}" y="{(plot_t + plot_b) / 2:.1f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 {left + 14} {(plot_t + plot_b) / 2:.1f})">{escape(y_label)}</text>')
    for system, points in series.items():
        color = COLORS.get(system, "#2ca02c")
        path = " ".join(f"{x_of(x):.1f},{y_of(v):.1f}" for x, v in sorted(points))
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, v in points:
            out.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(v):.1f}" r="3.5" fill="{color}">'
                       f'<title>{escape(system)}: {v:.0f} at {x} keys</title></circle>')
            out.append(f'<text x="{x_of(x) + 5:.1f}" y="{y_of(v) - 5:.1f}" font-size="10">{label(v)}</text>')


def scale_chart(results):
    """bench/scale.py's results: per service, steady records/s and peak RSS
    against the keys in state, one line per system."""
    services = list(dict.fromkeys(p["service"] for p in results["points"]))
    width, height = 1000, 280
    out = []
    systems = []
    for row, service in enumerate(services):
        per = {"steady_records_per_s": {}, "rss_peak_mib": {}}
        for p in results["points"]:
            if p["service"] != service:
                continue
            for system, s in p["systems"].items():
                systems += [system] if system not in systems else []
                for key, series in per.items():
                    value = s["throughput"].get(key)
                    if value is not None:
                        series.setdefault(system, []).append((p["keys"], value))
        line_panel(out, 0, row * height, width / 2, height, f"{service}: steady records/s",
                   per["steady_records_per_s"], "records/s")
        line_panel(out, width / 2, row * height, width / 2, height, f"{service}: peak RSS (VmHWM), MiB",
                   per["rss_peak_mib"], "MiB")
    legend_y = len(services) * height + 10
    for i, system in enumerate(systems):
        x = MARGIN_LEFT + i * 160
        out.append(f'<rect x="{x}" y="{legend_y}" width="14" height="14" fill="{COLORS.get(system, "#2ca02c")}"/>')
        out.append(f'<text x="{x + 20}" y="{legend_y + 12}" font-size="12">{escape(system)}</text>')
    meta = results["meta"]
    out.append(f'<text x="{MARGIN_LEFT}" y="{legend_y + 36}" font-size="11" fill="#555">'
               f'{escape(meta["date"])}, commit {escape(meta["commit"][:12])}, {meta["cpus"]} cores; ours '
               f'--state-memory-limit {meta["state_memory_limit_mib"]} MiB, Kafka Streams '
               f'{escape(" ".join(meta["ks_java_opts"]))} + RocksDB defaults</text>')
    return width, legend_y + 50, out


def main():
    results = json.load(open(sys.argv[1]))
    if "points" in results:
        write_svg(sys.argv[2], *scale_chart(results))
        return
    meta = results["meta"]
    groups = [(use_case, shape, per["systems"]) for use_case, shapes in results["summary"].items()
              for shape, per in shapes.items()]
    ratios = [per["ours_vs_kafka_streams"]["steady_records_per_s"] for shapes in results["summary"].values()
              for per in shapes.values()]
    width = max(900, MARGIN_LEFT + 20 + GROUP_WIDTH * len(groups))
    out = []
    systems = panel(out, 0, width, "Steady: input records/s from 10 % to 90 % of the input committed "
                    "(exactly_once_v2, median, min-max)",
                    "records/s", groups, "steady_records_per_s",
                    notes=[f"ours/KS {ratio:.1f}×" if ratio else "" for ratio in ratios])
    panel(out, PANEL, width, "Whole run: input records per second from the first commit to the last output",
          "records/s", groups, "records_per_s")
    panel(out, 2 * PANEL, width, "Peak RSS (VmHWM), MiB", "MiB", groups, "rss_peak_mib")
    legend_y = 3 * PANEL + 10
    for i, system in enumerate(systems):
        x = MARGIN_LEFT + i * 160
        out.append(f'<rect x="{x}" y="{legend_y}" width="14" height="14" fill="{COLORS.get(system, "#2ca02c")}"/>')
        out.append(f'<text x="{x + 20}" y="{legend_y + 12}" font-size="12">{escape(system)}</text>')
    out.append(f'<text x="{MARGIN_LEFT}" y="{legend_y + 36}" font-size="11" fill="#555">'
               f'{escape(meta["date"])}, commit {escape(meta["commit"])}, {meta["cpus"]} cores, scale {meta["scale"]}, '
               f'{meta["runs"]} runs per system, local Kafka broker on the same machine</text>')
    write_svg(sys.argv[2], width, legend_y + 50, out)


def write_svg(path, width, height, out):
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(out) + "\n</svg>\n")
    with open(path, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
