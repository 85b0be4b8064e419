"""The encode stage on Ray against the local encoder, on this machine with the same cores.

Model: a random ModernBERT of about LateOn-Code-edge's compute per token (hidden 256, 8
layers, 4 heads, intermediate 384, local window 128; built with tests/fixtures/models.py, no
download) with a dense CLS head, bf16 on both paths (the CPU default here). Texts: real code,
the Python sources of the installed `torch/nn` package cut into 10-line pieces, in batches
of 8 texts (smaller than the pipeline's 64, so that a short run still has many batches;
per-batch costs weigh more than in a real run). Measured, in one run:

  local   encoder.encode per batch in this process, torch on all N cores
  ray     RayEncoder.encode_batches on a local Ray cluster of N CPUs, N actors x 1 thread
          (--one-actor: also 1 actor x N threads), after the actors loaded the model (start-up
          timed apart)

local and ray alternate (--rounds), so the machine's load hits both alike. Also printed: the
largest batch, each actor's memory, the writer's own ceiling (Store.put_vectors, one
transaction per batch, dense 768-dim and ColBERT 128-dim x 300-token vectors), and a
projection of 100M tokens on 1, 4 and 16 GPU workers.

    python benchmarks/ray_overhead.py              # a few minutes on 2 busy cores
    python benchmarks/ray_overhead.py --texts 640 --batch 64 --rounds 3
    python benchmarks/ray_overhead.py --driver ROOT MODEL [--rate TOK_S]   # the driver side of a run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from codesearch.encoder.base import BatchEncoder  # noqa: E402 - after the sys.path lines above

# Reported from one H100 outside this project's machines (no GPU was lent to measure it
# here). Tokens/s of codesearch's encode() on short chunks with today's sdpa backend, and with
# torch's varlen flash attention plugged in (hidden_states end to end).
H100_ASSUMED = {"sdpa backend (reported)": 195_000, "varlen flash (reported experiment)": 471_000}


def code_texts(n: int, lines_per_text: int) -> list[str]:
    import torch

    files = sorted(Path(torch.__file__).parent.joinpath("nn").rglob("*.py"))
    texts: list[str] = []
    for f in files:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        for i in range(0, len(lines), lines_per_text):
            piece = "".join(lines[i : i + lines_per_text]).strip()
            if len(piece) > 100:
                texts.append(piece)
            if len(texts) >= n:
                return texts
    return texts


def batches_of(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def peak_rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def writer_ceiling(payload_mb: int = 384, grouped: bool = True) -> list[tuple[str, float, float]]:
    """(kind, vectors/s, MB/s of float16 payload) of the vector writer alone, batches of 64
    arriving as fast as it takes them: committed as the pipeline commits them (``grouped``:
    batches in quick succession share a commit of up to ``commit.COMMIT_GROUP_S``) or one
    commit per batch (every batch before grouping).

    Steady state: each kind writes ``payload_mb`` (several of SQLite's WAL checkpoints, which
    copy every page a second time; ColBERT arrays go to the store's segment files, once, and
    are flushed before each commit) and the timing includes the last checkpoint, on close.
    Vectors come as float32, as encoders return them, in a process that has torch (as one that
    made them has)."""
    import torch  # noqa: F401  (the store's float16 cast uses it when loaded)

    from codesearch.indexing.commit import Commits as _Commits
    from codesearch.store import Store

    rng = np.random.default_rng(0)
    out = []
    for kind, shape in (("dense", (768,)), ("colbert", (300, 48)), ("colbert", (300, 128))):
        arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(64)]
        n_batches = max(4, payload_mb * 2**20 // (64 * int(np.prod(shape)) * 2))
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            with Store(Path(d) / "store.sqlite3") as store:
                commits = _Commits(store)
                for _ in range(n_batches):
                    # keys are random hex like the real xxh3 text hashes: sequential keys
                    # hid how a b-tree ordered by hash (the schema-1 cache) behaves
                    batch = [(rng.bytes(16).hex(), a) for a in arrays]
                    with commits.batch() if grouped else store.transaction():
                        store.put_vectors("bench@0", kind, batch)
                commits.commit()
            s = time.perf_counter() - t
        n = n_batches * 64
        out.append((f"{kind} {'x'.join(map(str, shape))}", n / s, n * int(np.prod(shape)) * 2 / s / 2**20))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--lines", type=int, default=10, help="source lines per text")
    parser.add_argument("--batch", type=int, default=8, help="texts per batch (the pipeline sends 64)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one-actor", action="store_true", help="also 1 actor x all cores")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()

    import torch
    from fixtures import models

    from codesearch.encoder import load
    from codesearch.encoder.ray import RayEncoder, WorkerPool, connect

    print(f"load at start: {open('/proc/loadavg').read().split()[:3]}  cores: {args.cores}")
    tmp = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    ckpt = models.make_single_vector(tmp / "model", hidden_size=256, num_layers=8, heads=4, intermediate_size=384)
    torch.set_num_threads(args.cores)
    local = load(str(ckpt), device="cpu", dtype=args.dtype)
    texts = code_texts(args.texts, args.lines)
    batches = batches_of(texts, args.batch)
    counts = local.count_tokens(texts)
    tokens = sum(min(n, local.max_length) for n in counts)
    per_batch = [sum(min(n, local.max_length) for n in local.count_tokens(b)) for b in batches]
    print(f"{len(texts)} texts, {tokens:,} tokens, {len(batches)} batches (largest {max(per_batch):,} tokens, "
          f"{max(len(b) for b in batches)} texts)")

    t = time.perf_counter()
    connect("auto", num_cpus=args.cores, object_store_memory=256 * 2**20)  # a local cluster, as --ray makes
    t_init = time.perf_counter() - t
    pools = {
        f"ray {args.cores} actors x 1 thread": WorkerPool(workers=args.cores, cpus_per_worker=1),
    }
    starts = {}
    for name, pool in pools.items():
        t = time.perf_counter()
        RayEncoder(local, pool).start()
        starts[name] = time.perf_counter() - t
    print(f"local cluster start {t_init:.1f} s; actors start + load the model: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in starts.items()))

    reference = [local.encode(b) for b in batches[:2]]  # warm-up, and the outputs to compare
    times: dict[str, list[float]] = {"local": []}
    for r in range(args.rounds):
        t = time.perf_counter()
        for b in batches:
            local.encode(b)
        times["local"].append(time.perf_counter() - t)
        for name, pool in pools.items():
            enc = RayEncoder(local, pool)
            t = time.perf_counter()
            outs = list(enc.encode_batches(batches))
            times.setdefault(name, []).append(time.perf_counter() - t)
            for a, b in zip(outs[:2], reference):
                assert np.allclose(a, b, atol=2e-2), "ray and local outputs differ"  # bf16, other threads
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items())
              + f"  (load {open('/proc/loadavg').read().split()[0]})")

    # 1 actor x N threads: the same cores in one process (a pool made after the first is gone)
    for pool in pools.values():
        memory = pool.memory()
        stats = pool.progress()
        pool.close()
    if args.one_actor:
        one = WorkerPool(workers=1, cpus_per_worker=args.cores)
        RayEncoder(local, one).start()
        name1 = f"ray 1 actor x {args.cores} threads"
        for _ in range(args.rounds):
            t = time.perf_counter()
            list(RayEncoder(local, one).encode_batches(batches))
            times.setdefault(name1, []).append(time.perf_counter() - t)
        one.close()

    best_local = min(times["local"])
    print("\n| path | best of rounds, s | tokens/s | vs local |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.2f} | {tokens / min(ts):,.0f} | {min(ts) / best_local:.2f}x |")
    print(f"\nlocal process peak RSS {peak_rss_mb():.0f} MB (model, texts and the driver)")
    for w, m in zip(stats.workers, memory):
        print(f"actor {w.worker}: {w.batches} batches, {w.tokens_per_s:,.0f} tok/s busy, "
              f"RSS {m['rss_mb']:.0f} MB, peak {m['peak_rss_mb']:.0f} MB")
    per_worker = np.mean([w.tokens_per_s for w in stats.workers])

    print("\nwriter ceiling (Store.put_vectors, batches of 64 committed as the pipeline does, float16 on disk):")
    ceiling = writer_ceiling()
    for kind, vps, mbps in ceiling:
        print(f"  {kind}: {vps:,.0f} vectors/s ({mbps:,.0f} MB/s)")

    print("\n100M tokens, embedding stage only (workers x tokens/s each; 300 tokens per text):")
    print("| per-worker rate | 1 worker | 4 workers | 16 workers | texts/s at 16 |")
    print("|---|---:|---:|---:|---:|")
    rates = {f"CPU actor here, 1 core (measured) {per_worker:,.0f} tok/s": per_worker}
    rates.update({f"H100, {k}: {v:,} tok/s (assumed)": v for k, v in H100_ASSUMED.items()})
    for label, rate in rates.items():
        cells = [_hours(100e6 / (n * rate)) for n in (1, 4, 16)]
        print(f"| {label} | {' | '.join(cells)} | {16 * rate / 300:,.0f} |")
    dense_ceiling = ceiling[0][1]
    colbert_ceiling = ceiling[1][1]
    print(f"\nwriter: dense {dense_ceiling:,.0f} texts/s, ColBERT {colbert_ceiling:,.0f} texts/s (300 tokens each)")
    for label, rate in rates.items():
        print(f"  {label.split(':')[0]}: the writer binds past {dense_ceiling * 300 / rate:,.1f} dense workers, "
              f"{colbert_ceiling * 300 / rate:,.1f} ColBERT (48-dim) workers")


class InstantEncoder(BatchEncoder):
    """A real encoder's identity and shapes, with vectors made without running the model:
    what the driver of an index run (store writes, commits, publications to the vector
    indexes, progress) costs per text when the workers are arbitrarily fast. As on a Ray
    run, the driver does not tokenize: counts are estimated at 4 characters a token."""

    offloaded = True  # as a pool of workers: publications run beside the batches
    batch_tokens = 0

    def __init__(self, inner, seed: int = 0, rate: float | None = None):
        self.inner = inner
        self.rate = rate  # tokens/s of the stand-in cluster (None: instant)
        rng = np.random.default_rng(seed)
        pool = rng.standard_normal((64, inner.max_length, inner.dim)).astype(np.float32)
        self.pool = pool / np.linalg.norm(pool, axis=-1, keepdims=True)
        self._codes = {}
        self.idle_s = 0.0  # the stand-in workers' time waiting for the driver to take batches

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def count_tokens(self, texts):
        return [max(1, min(len(t) // 4, self.inner.max_length)) for t in texts]

    # PLAID codes on the workers, as RayEncoder makes them. The stand-in's
    # vectors are prefixes of its 64 pool arrays, so the workers' codes are prefixes of the
    # pool's codes, computed once per codec (that time is the workers', not the driver's).
    # CODESEARCH_BENCH_NO_CODES=1: the stand-in makes no codes (the driver assigns, as before).
    codec = None
    _pool_codes = None
    last_batch = 0.0  # time.monotonic() when the stand-in cluster handed over its last batch

    def set_codec(self, codec):
        if os.environ.get("CODESEARCH_BENCH_NO_CODES"):
            return
        t0 = time.perf_counter()
        docs = codec.compress_documents(list(self.pool))
        errs = [np.cumsum(codec.error(p.astype(np.float16).astype(np.float32), d.codes, d.packed), dtype=np.float64)
                for p, d in zip(self.pool, docs)]
        self._pool_codes = (codec.fingerprint, docs, errs)
        self.codec, self.codec_at = codec, time.monotonic()
        print(f"  codec of {len(codec.centroids):,} centroids at the workers; the pool's codes took "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

    def codes_for(self, texts):
        return self._codes.pop(tuple(texts), None)

    def _make_codes(self, texts, out):
        from codesearch.indexes.plaid.codec import DocCodes

        fp, docs, errs = self._pool_codes
        self._codes[tuple(texts)] = (fp, [
            DocCodes(docs[i % 64].codes[: len(v)], docs[i % 64].packed[: len(v)], float(errs[i % 64][len(v) - 1]))
            for i, v in enumerate(out)])

    def encode(self, texts, kind="document", batch_tokens=None):
        # ColBERT skips punctuation tokens; ~ 0.8 of the tokens keep a vector
        return [self.pool[i % 64][: max(1, n * 4 // 5)] for i, n in enumerate(self.count_tokens(texts))]

    def encode_batches(self, batches, kind="document", idle=None, rate: float | None = None):
        """As a pool of workers streams them (the driver takes this path for RayEncoder):
        at ``rate`` tokens/s across the cluster, or as fast as the driver takes them. While
        it waits the driver's thread sleeps, as it does in ``ray.wait``."""
        rate = rate or self.rate
        due = time.monotonic()
        for texts in batches:
            # Workers run at most ~1 s ahead of a driver that stopped taking batches (a pool's
            # window): after a longer stall they start again from now, not from their schedule.
            if time.monotonic() - 1.0 > due:
                self.idle_s += time.monotonic() - 1.0 - due
                due = time.monotonic() - 1.0
            due += sum(self.count_tokens(texts)) / rate if rate else 0.0
            while (left := due - time.monotonic()) > 0:
                if idle is not None:
                    idle()
                time.sleep(min(left, 0.05))
            out = self.encode(texts, kind=kind)
            if self._pool_codes is not None:
                self._make_codes(texts, out)
            self.last_batch = time.monotonic()
            yield out


def driver_ceiling(root: Path, model: Path, rate: float | None = None) -> None:
    """Index ``root`` with ``InstantEncoder`` over the ColBERT checkpoint at ``model``, and
    print the encode stage's rate: the ceiling the driver puts on any number of workers.
    With ``rate`` (--rate TOK_S), the stand-in cluster makes vectors at that many tokens/s,
    and the encode stage is compared with the time the workers alone would take."""
    import logging

    from codesearch.encoder import load
    from codesearch.encoder.base import Encoders
    from codesearch.indexing.run import build_index

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("codesearch.indexing.codes").setLevel(logging.INFO)  # the codec's training
    # Every text encoded: the user's vector cache would hand a second run the first one's
    # stand-in vectors (and keep them, under the stand-in checkpoint's identity).
    os.environ.setdefault("CODESEARCH_CACHE_SIZE", "0")
    enc = InstantEncoder(load(str(model), device="cpu"), rate=rate)
    from codesearch.indexing import publish

    sync = publish.sync_derived

    def timed_sync(idir, store, prev, delta, *args, **kw):  # each publication's own cost
        t = time.monotonic()
        try:
            return sync(idir, store, prev, delta, *args, **kw)
        finally:
            print(f"  publication of {sum(len(h) for h in delta.newly_encoded.values()):,} texts: "
                  f"{t - t0:.1f} s to {time.monotonic() - t0:.1f} s ({time.monotonic() - t:.1f} s)", flush=True)

    publish.sync_derived = timed_sync
    with tempfile.TemporaryDirectory() as d:
        events = {"published": 0}
        t0 = time.monotonic()
        stream: list[float] = []  # when the first and the last batch were committed

        def progress(ev):
            if ev.stage == "encode":
                stream[1:] = [time.monotonic() - t0]
                stream[:1] = stream[:1] or stream[1:]
            if ev.stage == "published":
                events["published"] += 1
                print(f"  published at {time.monotonic() - t0:6.1f} s: {ev.message}", flush=True)

        summary = build_index(root, index_dir=Path(d) / "ix", encoders=Encoders(None, enc), progress=progress)
        after = time.monotonic() - enc.last_batch
        if enc.codec is not None:
            print(f"the codec reached the workers at {enc.codec_at - t0:.1f} s; the stand-in's last batch at "
                  f"{enc.last_batch - t0:.1f} s")
        print(f"the stand-in workers waited {enc.idle_s:.1f} s for the driver to take batches")
        st = summary.stage_seconds
        print(f"{summary.files_indexed:,} files, {summary.chunks_total:,} chunks, {summary.chunks_encoded:,} texts "
              f"encoded, {summary.tokens_encoded:,} tokens (estimated), {events['published']} publications")
        print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in st.items()))
        print(f"encode stage (writes, commits, publications): {summary.chunks_encoded / st['encode']:,.0f} texts/s, "
              f"{summary.tokens_encoded / st['encode']:,.0f} tok/s")
        if rate:
            alone = summary.tokens_encoded / rate
            took = stream[-1] - stream[0]
            print(f"the workers alone: {alone:.1f} s at {rate:,.0f} tok/s; the vectors were all committed in "
                  f"{took:.1f} s ({took / alone:.2f}x that), at {stream[-1]:.1f} s from the start; the encode "
                  f"stage, with the publications, took {st['encode'] / alone:.2f}x that")
            print(f"the driver's work after the last worker batch: {after:.1f} s = {after / alone:.1%} of the "
                  f"workers' {alone:.1f} s (the run's end {time.monotonic() - t0 - after:.1f} s from the start "
                  f"plus that; codes from the workers: {'yes' if enc.codec is not None else 'no'})")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:  # the whole driver side of a run: --driver ROOT MODEL [--rate TOK_S]
        rate = float(sys.argv[sys.argv.index("--rate") + 1]) if "--rate" in sys.argv else None
        driver_ceiling(Path(sys.argv[2]), Path(sys.argv[3]), rate)
    elif sys.argv[1:] == ["--writer"]:  # the writer's ceiling alone, as committed before and now
        for grouped in (False, True):
            print("grouped commits (the pipeline)" if grouped else "one commit per batch of 64")
            for kind, vps, mbps in writer_ceiling(grouped=grouped):
                print(f"  {kind}: {vps:,.0f} vectors/s ({mbps:,.0f} MB/s)")
    else:
        main()
