"""Bar charts of benchmark results: one PNG per benchmark JSON file.

    python benchmarks/plot.py RESULTS_DIR OUTPUT_DIR

reads every ``*.json`` written by a benchmark script with ``--json`` in RESULTS_DIR
and writes ``<benchmark>.png`` (``<json file name>.png`` when several files hold the
same benchmark) into OUTPUT_DIR (e.g. ``docs/performance/``): one panel
per section, a bar per row (its time, the reference bar highlighted), labelled with
the time and the ratio to the reference. Needs matplotlib (``pip install matplotlib``).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import QUANTITIES  # noqa: E402

REFERENCE_COLOR = "#7f7f7f"
FIBERLITE_COLOR = "#1f77b4"
OTHER_COLOR = "#ff7f0e"
FORMATS = dict(QUANTITIES.values())  # the key of a row's value ("seconds", "bytes"): how it prints


def load(folder: str) -> list[dict[str, Any]]:
    """The benchmark documents in ``folder`` (files that are not one are ignored)."""
    documents = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(path) as source:
                document = json.load(source)
        except (OSError, ValueError):
            continue
        if isinstance(document, dict) and "benchmark" in document and "results" in document:
            document["_path"] = path
            documents.append(document)
    return documents


def _sections(document: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    rows = [r for r in document["results"] if _value_key(r)]
    described = document.get("sections") or []
    keys = [s["key"] for s in described]
    for row in rows:  # documents without a section list still plot
        if row["section"] not in keys:
            keys.append(row["section"])
            described.append({"key": row["section"], "title": row.get("section_title", row["section"]),
                              "unit": row.get("unit", ""), "reference": row.get("reference")})
    by_key = {s["key"]: s for s in described}
    return [(by_key[k], [r for r in rows if r["section"] == k]) for k in keys
            if any(r["section"] == k for r in rows)]


def _color(name: str, reference: str | None) -> str:
    if name == reference:
        return REFERENCE_COLOR
    return FIBERLITE_COLOR if name.lower().startswith("fiberlite") else OTHER_COLOR


def plot(document: dict[str, Any], out_dir: str, filename: str | None = None) -> str:
    """Write the chart of one benchmark document (``<benchmark>.png``); return its path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = _sections(document)
    if not sections:
        raise ValueError(f"{document.get('_path', document['benchmark'])}: no measured rows to plot")
    heights = [0.5 * len(rows) + 1.2 for _, rows in sections]
    fig, axes = plt.subplots(len(sections), 1, figsize=(9, sum(heights) + 0.8),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (section, rows) in zip(axes[:, 0], sections):
        names = [r["name"] for r in rows]
        key = _value_key(rows[0])
        values = [r[key] for r in rows]
        scale, unit = _scale(max(values), key)
        bars = ax.barh(range(len(rows)), [v * scale for v in values],
                       color=[_color(n, section.get("reference")) for n in names])
        ax.set_yticks(range(len(rows)), names)
        ax.invert_yaxis()
        stat = rows[0].get("stat", "median")
        ax.set_xlabel(f"{stat} {unit} per {section.get('unit', '')}")
        reference = section.get("reference")
        ax.set_title(section["title"] + (f"  (ratio vs {reference})" if reference else ""), fontsize=10)
        for bar, row in zip(bars, rows):
            label = FORMATS[key](row[key])
            if row.get("ratio") is not None:
                label += f"  {row['ratio']:.2f}x"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label,
                    va="center", fontsize=8)
        ax.set_xlim(0, max(values) * scale * 1.35)
        ax.grid(axis="x", alpha=0.3)
    machine = document.get("machine", {})
    cores = machine.get("cores_available", machine.get("cores_logical"))
    fig.suptitle(f"{document['benchmark']} — {machine.get('cpu_model', '?')}, {cores} cores, "
                 f"Python {machine.get('python', '?')}", fontsize=10)
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, filename or f"{document['benchmark']}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _value_key(row: dict[str, Any]) -> str | None:
    """Where a measured row keeps its value ("seconds", "bytes"); None for a skipped row."""
    return next((key for key in FORMATS if key in row), None)


def _scale(largest: float, key: str = "seconds") -> tuple[float, str]:
    if key == "bytes":
        return 1 / (1 << 20), "MiB"
    if largest < 1e-3:
        return 1e6, "us"
    if largest < 1:
        return 1e3, "ms"
    return 1.0, "s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot benchmark JSON results as PNG bar charts.")
    p.add_argument("results", help="folder with the JSON files written by the benchmarks (--json)")
    p.add_argument("output", help="folder for the PNG charts (created if missing)")
    args = p.parse_args(argv)
    documents = load(args.results)
    if not documents:
        print(f"no benchmark JSON files in {args.results}", file=sys.stderr)
        return 1
    names = [d["benchmark"] for d in documents]
    for document in documents:
        # two files of the same benchmark (say, two machines): name the charts after the files
        stem = os.path.splitext(os.path.basename(document["_path"]))[0]
        filename = None if names.count(document["benchmark"]) == 1 else stem + ".png"
        print(plot(document, args.output, filename))
    return 0


if __name__ == "__main__":
    sys.exit(main())
