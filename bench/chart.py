#!/usr/bin/env python3
"""Draws bench/results/<date>.json as an SVG: steady and whole-run records/s
and peak RSS per use case, shape and system (median bars, min-max whiskers),
with ours over Kafka Streams on the steady rate. Standard library only.

    python3 bench/chart.py bench/results/<date>.json bench/results/<date>.svg
"""

import json
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


def main():
    results = json.load(open(sys.argv[1]))
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
    height = legend_y + 50
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(out) + "\n</svg>\n")
    with open(sys.argv[2], "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
