"""The vector indexes at a monorepo's scale: build, cold load and search of the index alone.

Random unit vectors (rounded to float16, as the store keeps them) at a model's shapes, made
from a seed in blocks, so no step holds more than the index does:

  dense      MiniLM's shape: 600,000 chunk vectors of 384 dims (a 114k-file monorepo)
  centroids  the per-file means a short-context model keeps: 114,000 files x 384
  plaid      LateOn-Code-edge's shape: 48-dim token vectors, ~350 tokens a chunk, 4-bit
             residuals; the codes are drawn at random under a codec trained on a sample
             (what the index run's workers hand the index), so no hour of k-means
             assignment stands between the run and the figures

Each step is a fresh process (`python -c`), so the figures are those a process feels:

  build     wall, CPU-s and peak RSS of making and saving the index
  load      wall and RSS of a cold process opening it (RSS after the imports is the base)
  search    p50/p99 of one query per call (k=100, as the searcher asks), RSS after them;
            for dense, recall@100 against exact search over the same vectors

``--baseline SRC`` runs the same steps with the code at SRC (a checkout of the code before
a change, e.g. ``git archive main | tar -x -C /tmp/main``) for the ratio. ``--clustered``
draws the dense vectors around 2,000 centres (real embeddings are clustered; uniform random
vectors are the worst case for IVF recall, not the usual one).

    python benchmarks/vectors_at_scale.py dense --n 600000
    python benchmarks/vectors_at_scale.py dense --n 600000 --clustered --baseline /tmp/main
    python benchmarks/vectors_at_scale.py dense --n 600000 --batch 16384 --baseline /tmp/main
    python benchmarks/vectors_at_scale.py dense --n 600000 --batch 16384 --fill    # as a sync makes it
    python benchmarks/vectors_at_scale.py dense --n 600000 --batch 16384 --writer --baseline /tmp/main
    python benchmarks/vectors_at_scale.py centroids --n 114000
    python benchmarks/vectors_at_scale.py plaid --docs 60000 --tokens 350

Hybrid queries end to end (the searcher's set-up, the model, every index) on a repository:

    python benchmarks/vectors_at_scale.py hybrid PATH --index     # random MiniLM vectors first
    python benchmarks/vectors_at_scale.py hybrid PATH --queries 50 --baseline /tmp/main
    python benchmarks/vectors_at_scale.py hybrid PATH --index --default-shapes --index-dir DIR
        # the default CPU set-up: lexical + a random LateOn-Code-edge-shaped ColBERT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Shared by every child: vectors made from a seed, block by block.
_COMMON = textwrap.dedent('''
    import json, os, resource, sys, time
    import numpy as np

    def rss_mb():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        kb = lambda k: int(fields[k].split()[0]) if k in fields else 0
        return {"rss": kb("VmRSS") / 1024, "anon": kb("RssAnon") / 1024, "file": kb("RssFile") / 1024}

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def cpu_s():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    BLOCK = 50_000

    def centres(dim, n):
        return np.random.default_rng(1234).standard_normal((n, dim)).astype(np.float32)

    def block(i, dim, clustered, seed=0):
        """Vectors [i*BLOCK, (i+1)*BLOCK) of the collection, unit norm, float16-exact."""
        rng = np.random.default_rng([seed, i])
        x = rng.standard_normal((BLOCK, dim)).astype(np.float32)
        if clustered:
            c = centres(dim, 2000)
            x = c[rng.integers(0, len(c), BLOCK)] + 1.0 * x
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x.astype(np.float16).astype(np.float32)

    def vectors(n, dim, clustered, seed=0):
        for i in range(-(-n // BLOCK)):
            yield i * BLOCK, block(i, dim, clustered, seed)[: min(BLOCK, n - i * BLOCK)]

    def queries(n, dim, clustered):
        return block(10**6, dim, clustered, seed=1)[:n]

    def say(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
''')

_DENSE_BUILD = '''
from codesearch.indexes.dense import DenseIndex
cls = {cls}
t0, c0 = time.perf_counter(), cpu_s()
index = cls({dim})
if {writer} and hasattr(index, "lists_dir"):  # as an index run's sync has it (the code before: in memory)
    index.lists_dir = __import__("pathlib").Path({path!r})
ids, parts = [], []
def reads():  # what a sync that makes the index afresh reads from the store, a batch at a time
    for start, x in vectors({n}, {dim}, {clustered}):
        for at in range(0, len(x), {batch} or len(x)):
            yield np.arange(start + at, start + at + len(x[at : at + ({batch} or len(x))]), dtype=np.int64) * 7 + 3, \
                x[at : at + ({batch} or len(x))].astype(np.float16)
use_fill = {fill} and hasattr(index, "fill")  # (the code before it adds the batches)
if use_fill and not index.fill(reads, {n}):
    raise SystemExit("fill: the reads disagreed")
for start, x in vectors({n}, {dim}, {clustered}) if not use_fill else ():
    x_ids = np.arange(start, start + len(x), dtype=np.int64) * 7 + 3  # store-like ids
    if {batch}:  # added a batch at a time, as an index run's sync adds them
        for at in range(0, len(x), {batch}):
            index.add(x_ids[at : at + {batch}], x[at : at + {batch}])
    else:
        ids.append(x_ids)
        parts.append(x)
if ids:
    index.add(np.concatenate(ids), np.concatenate(parts))
del ids, parts
built = time.perf_counter() - t0
import ctypes
ctypes.CDLL(None).malloc_trim(0)  # what the index holds, not what the allocator kept
held = rss_mb()["rss"]
index.save({path!r})
say(build_s=built, save_s=time.perf_counter() - t0 - built, cpu_s=cpu_s() - c0, peak_mb=peak_mb(),
    built_rss_mb=held, kind=getattr(index, "kind", "?"))
'''

_DENSE_SEARCH = '''
import faiss
faiss.omp_set_num_threads(1)
from codesearch.indexes.dense import DenseIndex
cls = {cls}
qs = queries({queries}, {dim}, {clustered})
before = rss_mb()
t0 = time.perf_counter()
index = cls.load({path!r})
load_s = time.perf_counter() - t0
loaded = rss_mb()
if {scores}:
    search = lambda q: index.scores(q[None])
else:
    search = lambda q: index.search(q[None], 100)[0]

def run_queries():
    times, results = [], []
    for q in qs:
        t = time.perf_counter()
        got = search(q)
        times.append(time.perf_counter() - t)
        results.append(None if {scores} else got)  # (every file's score: not kept, 1.4 MB each)
    return times, results

c0 = cpu_s()
times, results = run_queries()
cpu_ms = 1e3 * (cpu_s() - c0) / len(qs)
after = rss_mb()
out = dict(load_s=load_s, rss_imports=before, rss_loaded=loaded, rss_after=after, cpu_ms_per_query=cpu_ms,
           p50_ms=1e3 * float(np.percentile(times, 50)), p99_ms=1e3 * float(np.percentile(times, 99)))
default_nprobe = getattr(index, "_nprobe", lambda: None)() if getattr(index, "kind", "") == "ivf" else None
sweep = {{}}
for nprobe in {nprobe}:  # other probe counts, after the default's run (pages are warm by now)
    index.nprobe = nprobe
    t, r = run_queries()
    sweep[nprobe] = (1e3 * float(np.percentile(t, 50)), 1e3 * float(np.percentile(t, 99)), r)
if not {scores}:
    # recall@100 against exact search over the same vectors (made again from the seed)
    n_check = min(len(qs), 50)
    best = np.full((n_check, 100), -np.inf, np.float32)
    best_ids = np.zeros((n_check, 100), np.int64)
    for start, x in vectors({n}, {dim}, {clustered}):
        s = qs[:n_check] @ x.T
        ids = (np.arange(start, start + len(x), dtype=np.int64) * 7 + 3)
        allscores = np.concatenate([best, s], axis=1)
        allids = np.concatenate([best_ids, np.broadcast_to(ids, s.shape)], axis=1)
        top = np.argpartition(-allscores, 99, axis=1)[:, :100]
        best = np.take_along_axis(allscores, top, 1)
        best_ids = np.take_along_axis(allids, top, 1)
    recall = lambda res: float(np.mean([len(set(r[0].tolist()) & set(t.tolist())) / 100
                                        for r, t in zip(res, best_ids)]))
    out["recall_at_100"] = recall(results)
    out["nprobe"] = default_nprobe
    for nprobe, (p50, p99, res) in sweep.items():
        out[f"nprobe={{nprobe}}"] = f"p50 {{p50:.1f}} ms, p99 {{p99:.1f}} ms, recall@100 {{recall(res):.3f}}"
say(**out)
'''

_PLAID_BUILD = '''
from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexes.plaid.coded import Coded, DocCodes, fit_on_sample
t0, c0 = time.perf_counter(), cpu_s()
rng = np.random.default_rng(0)
n_docs, dim = {docs}, {dim}
lens = rng.integers({tokens} // 2, {tokens} * 3 // 2 + 1, n_docs)
index = PlaidIndex(dim)
n_centroids = index._centroid_count(int(lens.sum()))
# The codec: trained on a sample of documents (~40 tokens per centroid), as the index run
# trains it for its workers.
flat = np.concatenate([x for _, x in vectors(40 * n_centroids, dim, False, seed=3)])
sample = np.array_split(flat, max(1, len(flat) // {tokens}))
codec, _ = fit_on_sample(sample, nbits=4, n_centroids=n_centroids)
del flat, sample
trained = time.perf_counter() - t0
codes = rng.integers(0, n_centroids, int(lens.sum())).astype(codec.code_dtype)
packed = rng.integers(0, 256, (int(lens.sum()), codec.packed_dim), dtype=np.uint8)
ends = np.cumsum(lens)
docs = [DocCodes(codes[e - n:e], packed[e - n:e], 0.1 * n) for e, n in zip(ends.tolist(), lens.tolist())]
stand_in = np.zeros((1, dim), np.float32)
index.add(np.arange(n_docs, dtype=np.int64) * 5 + 1, [np.broadcast_to(stand_in, (n, dim)) for n in lens.tolist()],
          coded=Coded(codec, 0.1, docs))
del docs, codes, packed
built = time.perf_counter() - t0
index.save({path!r})
say(train_s=trained, build_s=built, save_s=time.perf_counter() - t0 - built, cpu_s=cpu_s() - c0, peak_mb=peak_mb(),
    kind=index.kind, tokens=int(lens.sum()), centroids=n_centroids)
'''

_PLAID_SEARCH = '''
from codesearch.indexes.plaid import PlaidIndex
rng = np.random.default_rng(5)
qs = [x for x in block(2 * 10**6, {dim}, False, seed=4)[: 32 * {queries}].reshape({queries}, 32, {dim})]
before = rss_mb()
t0 = time.perf_counter()
index = PlaidIndex.load({path!r})
load_s = time.perf_counter() - t0
loaded = rss_mb()
times = []
c0 = cpu_s()
for q in qs:
    t = time.perf_counter()
    index.search([q], 100)
    times.append(time.perf_counter() - t)
say(load_s=load_s, rss_imports=before, rss_loaded=loaded, rss_after=rss_mb(),
    cpu_ms_per_query=1e3 * (cpu_s() - c0) / len(qs), first_ms=1e3 * times[0],
    p50_ms=1e3 * float(np.percentile(times[1:], 50)), p99_ms=1e3 * float(np.percentile(times[1:], 99)))
'''


# -- hybrid queries on an indexed root -------------------------------------------------------

QUERIES = [
    "roll back the transaction when an exception is thrown", "parse the JSON body of a request",
    "register a bean definition", "evict entries from a cache", "send a message over a websocket",
    "resolve placeholders in a property value", "convert a string to a date", "schedule a task at a fixed rate",
    "close the database connection after use", "validate a form field", "read a resource from the classpath",
    "retry a failed http call", "map a row of a result set to an object", "load the application context",
    "handle a multipart file upload", "encode a url path segment",
]

_INDEX = """
# The package under test first: second_worktree puts this checkout's root on sys.path.
import codesearch.encoder, codesearch.indexing.run, codesearch.indexing.deferred  # noqa: F401
sys.path.insert(0, {bench!r})
from second_worktree import random_first
t0, c0 = time.perf_counter(), cpu_s()
Path = __import__("pathlib").Path
out = random_first(Path({root!r}), {model!r}, {multi!r}, Path({cache!r}), {index_dir!r} and Path({index_dir!r}))
say(**out, process_wall_s=time.perf_counter() - t0, cpu_s=cpu_s() - c0, peak_mb=peak_mb())
"""

_CLI = """
import atexit
atexit.register(lambda: print("RESULT " + json.dumps(dict(peak_mb=peak_mb(), cpu_s=cpu_s())), flush=True))
sys.argv = ["codesearch", *{argv!r}]
from codesearch.cli import main
main()
"""


def hybrid(args: argparse.Namespace) -> None:
    """Hybrid queries on ``args.root`` (indexed with random vectors first when ``--index``:
    MiniLM's shapes, or with ``--default-shapes`` lexical + LateOn-Code-edge's): from a cold
    process (``--no-daemon``: the process opens the index, loads the model, answers) and
    through the warm per-user daemon (round trips timed in this process, as an editor's or
    agent's client makes them), with the RSS of each."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from quality import _minilm_dir


    root, work = args.root.resolve(), args.work / "hybrid"
    env = {**os.environ, "CODESEARCH_RUNTIME_DIR": str(work / "run"), "CODESEARCH_CACHE_DIR": str(work / "cache"),
           "XDG_CACHE_HOME": str(work / "xdg")}
    for key in ("CODESEARCH_RUNTIME_DIR", "CODESEARCH_CACHE_DIR", "XDG_CACHE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
        os.environ[key] = env[key]
    src = (args.baseline or ROOT).resolve()
    print(f"hybrid on {root}; code at {src}; CPU: {cpu_name()} x {os.cpu_count()}; load {os.getloadavg()[0]:.1f}")
    index_dir = str(args.index_dir.resolve()) if args.index_dir else None
    where = ("--index-dir", index_dir) if index_dir else ()
    if args.index:
        if args.default_shapes:
            # (Built in a child: a child's peak RSS starts at its parent's, which torch would raise.)
            made = _child(f"sys.path.insert(0, {str(ROOT)!r})\n"
                          "from benchmarks.default_cost import DEFAULT_CACHE, build_models\n"
                          "say(multi=str(build_models(DEFAULT_CACHE)['multi']))", src, env)
            model, multi, shapes = "none", made["multi"], "LateOn-Code-edge"
        else:
            model, multi, shapes = _minilm_dir(), "none", "MiniLM"
        done = _child(_INDEX.format(bench=str(ROOT / "benchmarks"), root=str(root), model=model, multi=multi,
                                    cache=env["CODESEARCH_CACHE_DIR"], index_dir=index_dir), src, env)
        print(f"index with random {shapes} vectors: {json.dumps(done)}", flush=True)

    def cli(*argv: str) -> tuple[float, dict]:
        t0 = time.perf_counter()
        out = _child(_CLI.format(argv=list(argv)), src, env)
        return time.perf_counter() - t0, out

    def stop() -> None:
        subprocess.run([sys.executable, "-m", "codesearch.cli", "daemon", "stop"], env={**env, "PYTHONPATH": str(src)},
                       capture_output=True, cwd=src)

    cold = [cli("query", q, "-p", str(root), *where, "-k", "10", "--json", "--no-daemon") for q in QUERIES[: args.cold]]
    print(f"cold process (--no-daemon), {len(cold)} queries: wall s {[round(w, 2) for w, _ in cold]}, "
          f"peak RSS MB {[round(o['peak_mb']) for _, o in cold]}, CPU-s {[round(o['cpu_s'], 1) for _, o in cold]}")
    stop()
    first, _ = cli("query", QUERIES[0], "-p", str(root), *where, "-k", "10", "--json")  # starts the daemon
    # The round trips from a child with the code under test: a daemon talks to its own version.
    warm = _child(_WARM.format(root=str(root), index_dir=index_dir, queries=QUERIES, n_q=len(QUERIES),
                               n=args.queries), src, env)
    walls = [cli("query", q, "-p", str(root), *where, "-k", "10", "--json")[0] for q in QUERIES[:5]]
    rss_warm = _proc_rss(warm["pid"])
    print(f"warm daemon: first query {first:.2f} s (CLI; the daemon's first of this root then "
          f"{warm['first_s']:.2f} s), daemon RSS {warm['rss_open']:.0f} MB; {args.queries} round trips "
          f"p50 {warm['p50_ms']:.0f} ms, p99 {warm['p99_ms']:.0f} ms; daemon RSS after them {rss_warm:.0f} MB "
          f"(daemon CPU-s {warm['daemon_cpu_s']:.1f}); CLI query wall (client process + round trip) "
          f"{[round(w, 2) for w in walls]} s; load {os.getloadavg()[0]:.1f}")
    stop()


_WARM = """
from codesearch.cli import lean
from codesearch.server import daemon_client
deadline = time.monotonic() + 300
while (info := daemon_client.find()) is None and time.monotonic() < deadline:
    time.sleep(1)  # (the first query may answer in its own process while the daemon starts)
if info is None:
    raise SystemExit("no daemon started")

def ask(q, timeout=60):
    body = {{"root": {root!r}, "index_dir": {index_dir!r}, "refresh": False,
            "request": lean._search_request(q, {{"k": "10"}})}}
    t0 = time.perf_counter()
    assert daemon_client.call(info, "POST", "/daemon/search", body, timeout=timeout)[0] == 200
    return time.perf_counter() - t0

def daemon_cpu():
    fields = open(f"/proc/{{info.pid}}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

first = ask({queries!r}[1], timeout=600)
rss_open = int(dict(ln.split(":", 1) for ln in open(f"/proc/{{info.pid}}/status"))["VmRSS"].split()[0]) / 1024
c0 = daemon_cpu()
times = [ask({queries!r}[i % {n_q}] + f" {{i}}") for i in range({n})]
say(pid=info.pid, first_s=first, rss_open=rss_open, p50_ms=1e3 * float(np.percentile(times, 50)),
    p99_ms=1e3 * float(np.percentile(times, 99)), daemon_cpu_s=daemon_cpu() - c0)
"""


def _proc_rss(pid: int) -> float:
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return int(fields["VmRSS"].split()[0]) / 1024


def _child(code: str, src: Path, env: dict) -> dict:
    """Run ``code`` in a fresh Python whose ``codesearch`` is the one at ``src`` (checked)."""
    code = f"import codesearch\nassert codesearch.__file__.startswith({str(src)!r}), codesearch.__file__\n" + code
    done = subprocess.run([sys.executable, "-c", _COMMON + textwrap.dedent(code)], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(src)}, cwd=src)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"step failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run(code: str, src: Path) -> dict:
    """Run ``code`` in a fresh Python with the package at ``src``; its RESULT line."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    done = subprocess.run([sys.executable, "-c", _COMMON + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=src)
    if done.returncode:
        raise SystemExit(f"step failed:\n{done.stderr[-3000:]}")
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def folder_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")


def measure(args: argparse.Namespace, src: Path, label: str) -> dict:
    path = args.work / f"{args.what}-{label}"
    if not args.reuse:
        shutil.rmtree(path, ignore_errors=True)
        if path.is_file():
            path.unlink()
    fmt = dict(path=str(path), dim=args.dim, n=args.n, clustered=args.clustered, queries=args.queries,
               batch=args.batch, fill=args.fill, writer=args.writer,
               docs=args.docs, tokens=args.tokens, nprobe=args.nprobe)
    if args.what == "plaid":
        build = {} if args.reuse else run(_PLAID_BUILD.format(**fmt), src)
        search = run(_PLAID_SEARCH.format(**fmt), src)
    else:
        centroids = args.what == "centroids"
        fmt["cls"] = "__import__('codesearch.indexes.dense', fromlist=['_']).CentroidIndex" if centroids else (
            "DenseIndex")
        fmt["scores"] = centroids
        build = {} if args.reuse else run(_DENSE_BUILD.format(**fmt), src)
        search = run(_DENSE_SEARCH.format(**fmt), src)
    return {"label": label, "disk_mb": folder_mb(path), **{f"build.{k}": v for k, v in build.items()},
            **{f"search.{k}": v for k, v in search.items()}}


def show(rows: list[dict]) -> None:
    keys = sorted({k for r in rows for k in r if k != "label"})
    print("| | " + " | ".join(r["label"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        cells = []
        for r in rows:
            v = r.get(k, "")
            if isinstance(v, dict):
                v = ", ".join(f"{n} {x:.0f}" for n, x in v.items())
            elif isinstance(v, float):
                v = f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
            cells.append(str(v))
        print(f"| {k} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["dense", "centroids", "plaid", "hybrid"])
    ap.add_argument("root", type=Path, nargs="?", help="hybrid: the repository")
    ap.add_argument("--index", action="store_true", help="hybrid: index the root with random MiniLM vectors first")
    ap.add_argument("--default-shapes", action="store_true",
                    help="hybrid --index: lexical + a random LateOn-Code-edge-shaped ColBERT (the default CPU set-up)")
    ap.add_argument("--index-dir", type=Path, help="hybrid: the index's folder (default: ROOT/.codesearch)")
    ap.add_argument("--cold", type=int, default=3, help="hybrid: cold-process queries")
    ap.add_argument("--n", type=int, default=600_000, help="vectors (dense) or files (centroids)")
    ap.add_argument("--dim", type=int, default=None, help="384 (dense, centroids) or 48 (plaid)")
    ap.add_argument("--clustered", action="store_true", help="vectors around 2,000 centres (dense)")
    ap.add_argument("--batch", type=int, default=0,
                    help="dense, centroids: add this many vectors at a time, as an index run's sync does (16384)")
    ap.add_argument("--fill", action="store_true",
                    help="dense: build with DenseIndex.fill from reads of --batch vectors (a sync that makes the"
                    " index afresh); the baseline, without fill, adds the batches")
    ap.add_argument("--writer", action="store_true",
                    help="dense: the index builds its IVF lists in the folder it is saved to, as an index run's"
                    " sync has it (DenseIndex.lists_dir), not in memory")
    ap.add_argument("--docs", type=int, default=60_000, help="plaid: chunks")
    ap.add_argument("--tokens", type=int, default=350, help="plaid: mean tokens per chunk")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--nprobe", type=int, nargs="*", default=[], help="dense: IVF probe counts to try as well")
    ap.add_argument("--reuse", action="store_true", help="search the index the last run built (no build)")
    ap.add_argument("--baseline", type=Path, help="a checkout of the code before, for the ratio")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "vectors_at_scale")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.dim = args.dim or (48 if args.what == "plaid" else 384)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.what == "hybrid":
        if args.root is None:
            ap.error("hybrid needs the repository's path")
        hybrid(args)
        return
    shape = (f"{args.docs:,} chunks x ~{args.tokens} tokens x {args.dim} dims" if args.what == "plaid"
             else f"{args.n:,} x {args.dim}{' clustered' if args.clustered else ' uniform'}")
    print(f"{args.what}: {shape}; CPU: {cpu_name()} x {os.cpu_count()}; load {os.getloadavg()[0]:.1f}")
    rows = []
    if args.baseline:
        rows.append(measure(args, args.baseline.resolve(), "before"))
        print(f"  (before done; load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    rows.append(measure(args, ROOT, "this code"))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    show(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
