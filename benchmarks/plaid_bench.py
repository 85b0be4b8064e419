"""PLAID vs brute-force MaxSim on synthetic token vectors shaped like ColBERT output.

Prints, for exact float16 search and PLAID at 2 and 4 bits: build time, index bytes per
token, query latency p50/p95 (one query at a time, as a search request would), recall@10
against brute-force float32 MaxSim, and source@1 (the query's own document ranked first).

    python benchmarks/plaid_bench.py                     # 10,000 docs x ~100 tokens x 48 dims
    python benchmarks/plaid_bench.py --docs 2000 --queries 50
    python benchmarks/plaid_bench.py --memory            # peak memory of one 4M-token add
    python benchmarks/plaid_bench.py --sample            # a codec trained on a sample vs on everything

The data: ``--topics`` random directions; each document mixes 4 of them, each token is a
topic plus Gaussian noise, L2-normalised; each query is 32 noisy tokens of one document.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from codesearch.indexes.plaid import PlaidIndex, maxsim_search


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_corpus(n_docs: int, tokens: int, dim: int, n_topics: int, noise: float, seed: int):
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((n_topics, dim))
    lens = np.clip(rng.normal(tokens, tokens / 4, n_docs).astype(int), 8, 4 * tokens)
    docs = []
    for n in lens:
        picked = rng.choice(rng.integers(0, n_topics, 4), n)
        docs.append(unit(topics[picked] + noise * rng.standard_normal((n, dim))))
    return docs


def make_queries(docs, n: int, q_tokens: int, seed: int):
    rng = np.random.default_rng(seed + 1)
    out = []
    sources = rng.integers(0, len(docs), n)
    for i in sources:
        d = docs[i]
        out.append(unit(d[rng.choice(len(d), q_tokens)] + 0.3 * rng.standard_normal((q_tokens, d.shape[1]))))
    return out, sources


def source_at_1(results, sources) -> float:
    """How often the document a query was cut from comes first: retrieval quality itself."""
    return float(np.mean([len(r[0]) > 0 and r[0][0] == s for r, s in zip(results, sources)]))


def recall_at_10(results, truth) -> float:
    return float(np.mean([len(set(r[0][:10].tolist()) & set(t[0][:10].tolist())) / 10 for r, t in zip(results, truth)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=100, help="mean tokens per document")
    parser.add_argument("--dim", type=int, default=48)
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--noise", type=float, default=0.6, help="token noise around its topic")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--q-tokens", type=int, default=32)
    parser.add_argument("--nprobe", type=int, default=None, help="override PlaidIndex default")
    parser.add_argument("--ndocs", type=int, default=None, help="override PlaidIndex default")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    docs = make_corpus(args.docs, args.tokens, args.dim, args.topics, args.noise, args.seed)
    ids = np.arange(len(docs), dtype=np.int64)
    queries, sources = make_queries(docs, args.queries, args.q_tokens, args.seed)
    n_tokens = sum(len(d) for d in docs)
    print(f"{len(docs)} docs, {n_tokens} tokens, dim {args.dim}, {len(queries)} queries x {args.q_tokens} tokens")

    t = time.perf_counter()
    truth = maxsim_search(queries, ids, docs, 10)
    print(
        f"brute force float32 MaxSim: {1000 * (time.perf_counter() - t) / len(queries):.1f} ms/query, "
        f"source doc at rank 1: {source_at_1(truth, sources):.3f}"
    )

    search_kw = {k: v for k, v in (("nprobe", args.nprobe), ("ndocs", args.ndocs)) if v}
    print("| index | build s | bytes/token | p50 ms | p95 ms | recall@10 vs exact | source@1 |")
    print("|---|---|---|---|---|---|---|")
    for name, kwargs in [
        ("exact fp16", {"mode": "exact"}),
        ("PLAID 2-bit", {"mode": "plaid", "nbits": 2}),
        ("PLAID 4-bit", {"mode": "plaid", "nbits": 4}),
    ]:
        index = PlaidIndex(args.dim, **kwargs)
        t = time.perf_counter()
        index.add(ids, docs)
        build = time.perf_counter() - t
        index.search(queries[:2], 10, **search_kw)  # warm-up: builds the inverted lists
        latencies, results = [], []
        for q in queries:
            t = time.perf_counter()
            results += index.search([q], 10, **search_kw)
            latencies.append(1000 * (time.perf_counter() - t))
        extra = ""
        if index.kind == "plaid":
            extra = f" ({len(index._codec.centroids)} centroids, build error {index.build_error:.3f})"
        print(
            f"| {name}{extra} | {build:.1f} | {index.nbytes() / index.n_tokens:.1f} | "
            f"{np.percentile(latencies, 50):.1f} | {np.percentile(latencies, 95):.1f} | "
            f"{recall_at_10(results, truth):.3f} | {source_at_1(results, sources):.3f} |"
        )


def build_memory(n_docs: int = 16_000, n_tokens: int = 250, dim: int = 48) -> None:
    """Peak memory that one ``add`` of ``n_docs x n_tokens`` random tokens crossing into
    PLAID (1,024 centroids, 2 bits) takes above its inputs (a first index's publication)."""
    import resource

    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((n_tokens, dim)).astype(np.float32) for _ in range(n_docs)]
    docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    t = time.perf_counter()
    PlaidIndex(dim, nbits=2, mode="plaid", n_centroids=1024).add(np.arange(n_docs), docs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"{n_docs * n_tokens / 1e6:.0f}M tokens ({n_docs * n_tokens * dim * 4 / 1e9:.2f} GB float32): "
          f"peak RSS +{peak - base:.2f} GB above the inputs, {time.perf_counter() - t:.1f} s")


def sampled_codec(n_docs: int = 5_000, tokens: int = 60, dim: int = 48, n_topics: int = 2000,
                  n_centroids: int = 1024) -> None:
    """A codec trained on a uniform sample of the documents (40 tokens per centroid, as an
    index run samples for its workers: `codesearch.indexing.codes`) against one trained on
    everything (the driver's build): held-out (build) error, the error over every token,
    recall@10 against exact MaxSim, source@1, and whether the drift check asks for a rebuild.
    Then the same with samples too small to stand for the collection."""
    from codesearch.indexes.plaid.coded import Coded, compress_documents, train_on_sample

    docs = make_corpus(n_docs, tokens, dim, n_topics, 0.6, 0)
    docs = [d.astype(np.float16).astype(np.float32) for d in docs]  # as stored
    ids = np.arange(len(docs), dtype=np.int64)
    queries, sources = make_queries(docs, 100, 32, 0)
    truth = maxsim_search(queries, ids, docs, 10)
    flat = np.concatenate(docs)
    print(f"{len(docs)} docs, {len(flat):,} tokens, {n_centroids} centroids")
    print("| codec | trained on (tokens) | train s | build (held-out) error | error, every token "
          "| recall@10 | source@1 | needs_rebuild |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")

    def row(name, index, n_train, took):
        codes, packed = index._codec.compress(flat)
        every = float(index._codec.error(flat, codes, packed).mean())
        res = index.search(queries, 10)
        print(f"| {name} | {n_train:,} | {took:.1f} | {index.build_error:.4f} | {every:.4f} | "
              f"{recall_at_10(res, truth):.3f} | {source_at_1(res, sources):.2f} | {index.needs_rebuild} |")

    t = time.perf_counter()
    full = PlaidIndex(dim, mode="plaid", n_centroids=n_centroids)
    full.add(ids, docs)
    row("everything (the driver today)", full, min(32 * n_centroids, int(0.9 * len(flat))), time.perf_counter() - t)
    rng = np.random.default_rng(1)
    for per in (160, 96, 40, 10):
        pick, got = [], 0
        for i in rng.permutation(len(docs)):
            if got >= per * n_centroids:
                break
            pick.append(i)
            got += len(docs[i])
        t = time.perf_counter()
        codec, error = train_on_sample([docs[i] for i in pick], nbits=4, n_centroids=n_centroids)
        took = time.perf_counter() - t
        index = PlaidIndex(dim, mode="plaid")
        index.add(ids, docs, coded=Coded(codec, error, compress_documents(codec, docs)))
        row(f"uniform sample, {per} tokens per centroid ({len(pick)} docs)", index, got, took)


if __name__ == "__main__":
    if sys.argv[1:] == ["--memory"]:
        build_memory()
    elif sys.argv[1:] == ["--sample"]:
        sampled_codec()
    else:
        main()
