"""How soon a first `index` run makes a repository searchable, and how long it takes whole.

Lexical first: a run commits files, chunks and the lexical index before it encodes any
vector. This measures, on any folder, the seconds from the start of the run to the
``searchable`` progress event, then (unless ``--searchable-only``) to the end of the run,
with the model you name (a hub id or a local checkpoint; none for lexical only).

Example
-------
    python benchmarks/first_index.py /path/to/repo --model none
    python benchmarks/first_index.py /path/to/repo --model /path/to/minilm --searchable-only
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path


class _Stop(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", type=Path)
    ap.add_argument("--model", default="none", help="dense model (hub id or folder), or 'none'")
    ap.add_argument("--multi-model", default="none", help="ColBERT model (hub id or folder), or 'none'")
    ap.add_argument("--searchable-only", action="store_true", help="stop the run once it is searchable")
    args = ap.parse_args()

    from codesearch.indexing.encoders import resolve_encoders
    from codesearch.indexing.run import build_index
    from codesearch.search.searcher import Searcher

    dense = None if args.model == "none" else args.model
    multi = None if args.multi_model == "none" else args.multi_model
    encoders, _ = resolve_encoders(dense, multi, device="cpu")
    index_dir = Path(tempfile.mkdtemp(prefix="first_index_"))
    marks: dict[str, float] = {}
    t0 = time.perf_counter()

    def cpu_s() -> float:
        # This process and its chunking workers: the figure that does not move with the load.
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    cpu0 = cpu_s()

    def progress(event) -> None:
        if event.stage == "searchable" and "searchable" not in marks:
            marks["searchable"] = time.perf_counter() - t0
            marks["searchable_cpu"] = cpu_s() - cpu0
            with Searcher(index_dir) as s:  # a query at that moment, as a user would send it
                q0 = time.perf_counter()
                s.search("read the configuration file", 10, mode="lexical")
                marks["first_query"] = time.perf_counter() - q0
            if args.searchable_only:
                raise _Stop

    try:
        summary = build_index(args.repo, index_dir=index_dir, encoders=encoders, progress=progress)
        marks["total"] = time.perf_counter() - t0
        files, chunks = summary.files_indexed, summary.chunks_total
    except _Stop:
        files = chunks = -1
    finally:
        shutil.rmtree(index_dir, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"repo {args.repo}  model {args.model}  multi {args.multi_model}  load {load:.1f} on {os.cpu_count()} cores")
    print(
        f"searchable after {marks['searchable']:.2f} s wall, {marks['searchable_cpu']:.2f} CPU-s "
        f"(first lexical query {1000 * marks['first_query']:.0f} ms)"
    )
    if "total" in marks:
        print(f"whole run {marks['total']:.1f} s: {files} files, {chunks} chunks")


if __name__ == "__main__":
    main()
