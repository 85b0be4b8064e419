"""The plots of BENCHMARKS.md, drawn from the benchmarks' JSON output.

Two figures, each written as a small PNG beside a JSON file holding exactly the numbers
drawn (so a figure can be checked, and redrawn without the raw runs):

* ``quality_by_language``: NDCG@10 per language on the dev split, one bar per series, from
  ``quality.py --json`` (modes ``lexical``, ``dense``, ``hybrid``) and ``peers.py --json``
  (``semble-*``) files: pass them with ``--quality``, in order of precedence (a mode found
  in an earlier file is not taken again from a later one);
* ``cost_by_size``: a lexical-only first index, a no-op index and a cold query against the
  repository's size, from ``scaling.py --json``.

Usage::

    python benchmarks/plots.py --quality .cache/q/lexical.json .cache/q/minilm.json \\
        .cache/q/semble.json --scaling .cache/scaling.json
    python benchmarks/plots.py                 # redraw both from benchmarks/plots/*.json

Needs matplotlib (in the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "plots"

#: Series drawn, in this order, when the inputs have them: (mode, label, colour).
SERIES = (
    ("lexical", "codesearch lexical (no model)", "#1f77b4"),
    ("hybrid", "codesearch hybrid (MiniLM)", "#08306b"),
    ("semble-hybrid", "semble 0.7.0 hybrid (static model from MiniLM)", "#ff7f0e"),
    ("semble-bm25+ranking", "semble BM25 + its ranking", "#fdae6b"),
    ("semble-bm25", "semble BM25 alone", "#cccccc"),
)


def quality_summary(paths: list[Path]) -> dict:
    """Per series: overall NDCG@10 and per language (mean, queries), first file wins."""
    by_mode: dict[str, list[dict]] = {}
    for path in paths:
        queries = json.loads(path.read_text())["queries"]
        for mode in sorted({q["mode"] for q in queries}):
            by_mode.setdefault(mode, [q for q in queries if q["mode"] == mode])
    series = []
    repos: dict[str, set[str]] = defaultdict(set)
    for mode, label, colour in SERIES:
        rows = by_mode.get(mode)
        if not rows:
            continue
        langs: dict[str, list[float]] = defaultdict(list)
        for q in rows:
            langs[q["language"]].append(q["ndcg"])
            repos[q["language"]].add(q["repo"])
        series.append({
            "mode": mode, "label": label, "colour": colour, "queries": len(rows),
            "overall": round(statistics.mean(q["ndcg"] for q in rows), 4),
            "languages": {k: [round(statistics.mean(v), 4), len(v)] for k, v in sorted(langs.items())},
        })
    return {"metric": "NDCG@10, semble dev split (20 repositories, 401 queries)", "series": series,
            "repos": {k: sorted(v) for k, v in sorted(repos.items())}}


def quality_table(summary: dict) -> str:
    """The plotted figures as a Markdown table, one row per language."""
    series = summary["series"]
    lines = ["| language (repository) | queries | " + " | ".join(s["label"] for s in series) + " |",
             "|---|---:|" + "---:|" * len(series)]
    first = series[0]["languages"]
    for lang in sorted(first):
        cells = " | ".join(f"{s['languages'][lang][0]:.3f}" if lang in s["languages"] else "" for s in series)
        where = ", ".join(summary.get("repos", {}).get(lang, []))
        lines.append(f"| {lang} ({where}) | {first[lang][1]} | {cells} |")
    lines.append("| **all** | " + str(series[0]["queries"]) + " | "
                 + " | ".join(f"**{s['overall']:.3f}**" for s in series) + " |")
    return "\n".join(lines)


def cost_table(data: dict) -> str:
    """The plotted figures as a Markdown table, one row per size."""
    lines = ["| files | MB | chunks | first index: wall / CPU-s / peak RSS | no-op index: wall / CPU-s "
             "| cold lexical query: wall / CPU-s / peak RSS | index on disk | load |",
             "|---:|---:|---:|---|---|---|---:|---:|"]
    for r in data["rows"]:
        f, n, q = r["first_index"], r["noop_index"], r["cold_query"]
        lines.append(f"| {r['files']:,} | {r['source_mb']} | {r['chunks']:,} "
                     f"| {f['wall_s']:.1f} s / {f['cpu_s']:.1f} / {f['peak_rss_mib']:.0f} MiB "
                     f"| {n['wall_s']:.2f} s / {n['cpu_s']:.2f} "
                     f"| {q['wall_s']:.2f} s / {q['cpu_s']:.2f} / {q['peak_rss_mib']:.0f} MiB "
                     f"| {r['index_mib']:.0f} MiB | {f['load']:.1f} |")
    return "\n".join(lines)


def plot_quality(summary: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = summary["series"]
    first = series[0]["languages"]
    # Languages sorted by the first series' score: the weak ones at the top of the chart.
    langs = sorted(first, key=lambda k: first[k][0])
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(langs) + 1.2), dpi=90)
    height = 0.8 / len(series)
    for i, s in enumerate(series):  # the first series on top within each language
        ys = [j + ((len(series) - 1) / 2 - i) * height for j in range(len(langs))]
        xs = [s["languages"].get(k, [0.0])[0] for k in langs]
        ax.barh(ys, xs, height=height, color=s["colour"], label=f"{s['label']}: {s['overall']:.3f}")
    ax.set_yticks(range(len(langs)))
    ax.set_yticklabels([f"{k} ({first[k][1]})" for k in langs], fontsize=8)
    ax.set_xlim(0.3, 1.0)
    ax.set_xlabel("NDCG@10 (queries per language in brackets)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(summary["metric"], fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.45, -0.06),
              title="overall NDCG@10", title_fontsize=7, ncol=1, frameon=False)
    fig.savefig(png, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)


def plot_cost(data: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    files = [r["files"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    left.plot(files, [r["first_index"]["cpu_s"] for r in rows], "o-", color="#08306b", label="first index, CPU-s")
    left.plot(files, [r["first_index"]["wall_s"] for r in rows], "o--", color="#6baed6",
              label="first index, wall s (shared machine)")
    left.plot(files, [r["cold_query"]["cpu_s"] for r in rows], "s-", color="#ff7f0e", label="cold query, CPU-s")
    left.plot(files, [r["noop_index"]["cpu_s"] for r in rows], "^-", color="#2ca02c", label="no-op index, CPU-s")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("files in the repository", fontsize=8)
    left.set_ylabel("seconds", fontsize=8)
    left.legend(fontsize=7)
    left.grid(alpha=0.3, which="both")
    right.plot(files, [r["first_index"]["peak_rss_mib"] for r in rows], "o-", color="#08306b",
               label="first index, peak RSS")
    right.plot(files, [r["cold_query"]["peak_rss_mib"] for r in rows], "s-", color="#ff7f0e",
               label="cold query, peak RSS")
    right.plot(files, [r["index_mib"] for r in rows], "d-", color="#7f7f7f", label="index on disk")
    right.set_xscale("log")
    right.set_xlabel("files in the repository", fontsize=8)
    right.set_ylabel("MiB", fontsize=8)
    right.legend(fontsize=7)
    right.grid(alpha=0.3, which="both")
    for ax in (left, right):
        ax.tick_params(labelsize=8)
    fig.suptitle(f"Lexical-only index against size: samples of {Path(data['tree']).name}, "
                 f"{data['cpu']}, {data['date']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quality", type=Path, nargs="*", default=[], help="quality.py / peers.py --json files")
    ap.add_argument("--scaling", type=Path, default=None, help="a scaling.py --json file")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--markdown", action="store_true", help="also print the plotted figures as Markdown tables")
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    quality_json, cost_json = args.out / "quality_by_language.json", args.out / "cost_by_size.json"
    if args.quality:
        quality_json.write_text(json.dumps(quality_summary(args.quality), indent=1) + "\n")
    if args.scaling:
        cost_json.write_text(json.dumps(json.loads(args.scaling.read_text()), indent=1) + "\n")
    if quality_json.exists():
        plot_quality(json.loads(quality_json.read_text()), quality_json.with_suffix(".png"))
        print(f"wrote {quality_json.with_suffix('.png')}")
        if args.markdown:
            print(quality_table(json.loads(quality_json.read_text())))
    if cost_json.exists():
        plot_cost(json.loads(cost_json.read_text()), cost_json.with_suffix(".png"))
        print(f"wrote {cost_json.with_suffix('.png')}")
        if args.markdown:
            print(cost_table(json.loads(cost_json.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
