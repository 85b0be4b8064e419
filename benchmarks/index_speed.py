"""How fast codesearch turns a tree into chunks, and how much memory that takes.

One function per measurement, so later stages (encoding, storing) can add theirs:

- `measure_walk_chunk`: walk + read + chunk, files/s and chunks/s (wall and CPU time);
- `measure_chunk_memory`: peak RSS of chunking N files in a fresh process (kept in memory).

Run::

    /work/venv/bin/python benchmarks/index_speed.py                # site-packages subtrees
    /work/venv/bin/python benchmarks/index_speed.py path/to/repo   # any folder(s)
    /work/venv/bin/python benchmarks/index_speed.py --memory-files 10000 --json

CPU rates (files per CPU second of this process) are the ones to compare between runs on a
shared machine; wall rates depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from codesearch.indexing.chunking import chunk_many, chunk_source
from codesearch.indexing.walk import SourceFile, read_source, walk

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
# Python, C and C++ of several shapes; about 10,000 indexable files in all.
DEFAULT_SUBTREES = ("transformers", "torch", "sympy", "numpy", "llama_index", "pip", "rich")


def default_roots() -> list[Path]:
    return [SITE / name for name in DEFAULT_SUBTREES if (SITE / name).is_dir()]


def measure_walk(roots: list[Path]) -> tuple[list[SourceFile], dict]:
    """Walk each root; returns the files (root order, then path order) and timings."""
    wall, cpu = time.perf_counter(), time.process_time()
    files: list[SourceFile] = []
    skipped: Counter = Counter()
    for root in roots:
        result = walk(root)
        files.extend(result.files)
        skipped.update({k: len(v) for k, v in result.skipped.items()})
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return files, {
        "files": len(files),
        "skipped": dict(skipped),
        "walk_wall_s": round(wall, 3),
        "walk_cpu_s": round(cpu, 3),
        "walk_files_per_s": round(len(files) / wall, 1),
    }


def measure_chunk(files: list[SourceFile], max_tokens: int = 512, workers: int = 1) -> dict:
    """Read and chunk every file once; what the pipeline does before encoding.

    ``workers`` 1: one file after another in this process. Otherwise `chunk_many` as the
    pipeline calls it (a process pool of ``workers`` processes, 0 = one per CPU, when there
    are at least `PARALLEL_MIN_FILES` files); ``chunk_cpu_s`` then counts this process only and
    ``chunk_workers_cpu_s`` the workers (when they were forked from it).
    """
    wall, cpu = time.perf_counter(), time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    n_chunks = n_bytes = 0
    if workers == 1:
        for f in files:
            text = read_source(f.abs_path)
            n_bytes += f.size
            n_chunks += len(chunk_source(f.path, text, f.language, max_tokens=max_tokens))
    else:
        items = [(f.path, read_source(f.abs_path), f.language) for f in files]
        n_bytes = sum(f.size for f in files)
        for chunks in chunk_many(items, max_tokens=max_tokens, workers=workers or None):
            n_chunks += len(chunks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "chunks": n_chunks,
        # CPU of pool workers that were this process's children (fork start), once they exited
        "chunk_workers_cpu_s": round(after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 3),
        "mbytes": round(n_bytes / 1e6, 1),
        "chunk_workers": workers or os.cpu_count(),
        "chunk_wall_s": round(wall, 3),
        "chunk_cpu_s": round(cpu, 3),
    }


def measure_parse_only(files: list[SourceFile]) -> dict:
    """Read and tree-sitter-parse each file, nothing else: the floor under chunking."""
    from codesearch.indexing.chunking.grammars import SPECS, parser_for

    wall, cpu = time.perf_counter(), time.process_time()
    parsed = 0
    for f in files:
        spec = SPECS.get(f.language)
        parser = parser_for(spec.grammar) if spec is not None else None
        if parser is not None:
            parser.parse(read_source(f.abs_path).encode("utf-8", errors="surrogatepass"))
            parsed += 1
    return {
        "parsed_files": parsed,
        "parse_only_wall_s": round(time.perf_counter() - wall, 3),
        "parse_only_cpu_s": round(time.process_time() - cpu, 3),
    }


def measure_walk_chunk(roots: list[Path], max_files: int | None = None,
                       max_tokens: int = 512, workers: int = 1, parse_only: bool = True) -> dict:
    """Walking + chunking alone: files/s and chunks/s, by wall clock and by CPU time."""
    files, walked = measure_walk(roots)
    if max_files is not None:
        files = files[:max_files]
    chunked = measure_chunk(files, max_tokens, workers)
    parse = measure_parse_only(files) if parse_only else {}
    wall = walked["walk_wall_s"] + chunked["chunk_wall_s"]
    cpu = walked["walk_cpu_s"] + chunked["chunk_cpu_s"]
    n = len(files)
    return {
        **walked,
        **chunked,
        **parse,
        "files_chunked": n,
        "files_per_s_wall": round(n / wall, 1),
        "chunks_per_s_wall": round(chunked["chunks"] / wall, 1),
        "files_per_s_cpu": round(n / cpu, 1),
        "chunks_per_s_cpu": round(chunked["chunks"] / cpu, 1),
        "languages": dict(Counter(f.language for f in files).most_common(8)),
    }


def _memory_child(roots: list[str], n_files: int, max_tokens: int) -> None:
    files, _ = measure_walk([Path(r) for r in roots])
    files = files[:n_files]
    chunks = []  # kept: the worst case, a pipeline that holds every chunk at once
    for f in files:
        chunks.extend(chunk_source(f.path, read_source(f.abs_path), f.language,
                                   max_tokens=max_tokens))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: kilobytes
    print(json.dumps({"files": len(files), "chunks": len(chunks), "peak_rss_mb": peak_kb / 1024}))


def measure_chunk_memory(roots: list[Path], n_files: int = 10_000, max_tokens: int = 512) -> dict:
    """Peak RSS (getrusage maxrss) of a fresh process that walks and chunks `n_files`."""
    proc = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(n_files), "--max-tokens",
         str(max_tokens), *map(str, roots)],
        capture_output=True, text=True, check=True,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The interpreter and imports alone, for scale.
    base = subprocess.run(
        [sys.executable, "-c", "import resource, codesearch.indexing.chunking.grammars as c;"
         "c.parser_for('python');print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)"],
        capture_output=True, text=True, check=True,
    )
    return {
        "memory_files": out["files"],
        "memory_chunks": out["chunks"],
        "peak_rss_mb": round(out["peak_rss_mb"], 1),
        "baseline_rss_mb": round(float(base.stdout.strip()), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", type=Path, help="folders to walk (default: site-packages subtrees)")
    ap.add_argument("--max-files", type=int, default=None, help="chunk at most this many files")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--workers", type=int, default=1,
                    help="1: chunk in this process; N: chunk_many with N processes; 0: one per CPU")
    ap.add_argument("--no-parse-only", action="store_true", help="skip the parse-only measurement")
    ap.add_argument("--memory-files", type=int, default=10_000,
                    help="files for the peak-memory run (0 to skip)")
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    roots = args.roots or default_roots()
    if args.memory_child is not None:
        _memory_child([str(r) for r in roots], args.memory_child, args.max_tokens)
        return 0
    report = {
        "roots": [str(r) for r in roots],
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        **measure_walk_chunk(roots, args.max_files, args.max_tokens, args.workers, not args.no_parse_only),
    }
    if args.memory_files:
        report.update(measure_chunk_memory(roots, args.memory_files, args.max_tokens))
    report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
