"""DenseIndex exact vs IVF (float16 lists) on clustered unit vectors: build, memory, latency, recall@10.

    python benchmarks/dense_bench.py                    # 100,000 x 384
    python benchmarks/dense_bench.py --n 50000 --dim 768

Recall@10 is measured against exact inner-product search over the same vectors.
Latency is one query per call (as a search request would), p50 and p95.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from codesearch.indexes.dense import DenseIndex


def clustered(n: int, dim: int, n_clusters: int, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(1234).standard_normal((n_clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, n_clusters, n)] + noise * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=1.0, help="per-dim noise around a centre")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()

    vectors = clustered(args.n, args.dim, args.clusters, args.noise, 0)
    queries = clustered(args.queries, args.dim, args.clusters, args.noise, 1)
    ids = np.arange(args.n, dtype=np.int64) * 7 + 3  # store-like, non-contiguous ids
    print(f"{args.n} vectors x {args.dim} dims, {args.queries} queries")

    print("| index | build s | bytes/vector | p50 ms | p95 ms | recall@10 vs exact |")
    print("|---|---|---|---|---|---|")
    truth = None
    for name, threshold in [("exact (IndexFlatIP)", 10**12), ("IVF float16 (auto)", 0)]:
        index = DenseIndex(args.dim, exact_threshold=threshold)
        t = time.perf_counter()
        index.add(ids, vectors)
        build = time.perf_counter() - t
        latencies, results = [], []
        for q in queries:
            t = time.perf_counter()
            results += index.search(q[None], 10)
            latencies.append(1000 * (time.perf_counter() - t))
        if truth is None:
            truth = results
        recall = np.mean([len(set(r[0].tolist()) & set(t[0].tolist())) / 10 for r, t in zip(results, truth)])
        with tempfile.TemporaryDirectory() as tmp:
            index.save(Path(tmp) / "dense")
            size = sum(p.stat().st_size for p in (Path(tmp) / "dense").iterdir())
        label = name
        if index.kind == "ivf":
            label += f" nlist {index._base.lists.nlist}, nprobe {index._nprobe()}"
        print(
            f"| {label} | {build:.1f} | {size / len(index):.0f} | {np.percentile(latencies, 50):.2f} | "
            f"{np.percentile(latencies, 95):.2f} | {recall:.3f} |"
        )


if __name__ == "__main__":
    main()
