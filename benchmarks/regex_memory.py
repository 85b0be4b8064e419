"""What the ``--regex`` filter holds in memory and how long it takes, on a large index.

    python benchmarks/regex_memory.py [FOLDER] [N_FILES]

Writes ``N_FILES`` (default 5,000) synthetic Python files of 6 functions each into FOLDER
(default ``/tmp/regex-memory``) once and indexes them lexical-only, then, in a fresh
process per pattern and scope: a warm searcher (one query without a regex first), the peak
RSS growth of the first regex query, the peak of Python's allocations during a second one
(tracemalloc), and the median seconds of 3 more (tracemalloc off).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    ("rare", r"\bquokka_\d+\b", None),  # few matches: every text read, almost none kept
    ("common", r"return \w+ \+", None),  # most chunks match
    ("rare, glob half", r"\bquokka_\d+\b", "pkg[0-4]*/**"),
]


def _function(i: int, j: int) -> str:
    body = "\n".join(f"    v{k} = compute_{(i * 7 + j + k) % 97}(x, {k})  # step {k} of function {j}"
                     for k in range(30))
    rare = f"    quokka_{i} = 1\n" if (i + j) % 50 == 0 else ""
    return f"def func_{i}_{j}(x):\n    '''Function {j} of module {i}.'''\n{rare}{body}\n    return v0 + x\n"


def build(folder: Path, n_files: int) -> None:
    from codesearch.api import CodeSearch

    if (folder / ".codesearch").is_dir():
        return
    for i in range(n_files):
        path = folder / f"pkg{i % 10}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(_function(i, j) for j in range(6)))
    t = time.perf_counter()
    with CodeSearch(folder, model=None, multi_model=None) as cs:
        summary = cs.index()
    print(f"indexed {summary.files_indexed:,} files in {time.perf_counter() - t:.0f} s", file=sys.stderr)


def measure(folder: str, pattern: str, glob: str | None) -> dict:
    import tracemalloc

    from codesearch.api import CodeSearch

    with CodeSearch(folder, model=None, multi_model=None) as cs:
        kwargs = {"mode": "lexical", "regex": pattern, "glob": glob}
        cs.query("compute the value", 10, mode="lexical")  # warm: searcher open, corpus loaded
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kept = len(cs.query("compute the value", 10, **kwargs).hits)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        cs.query("compute the value", 10, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            cs.query("compute the value", 10, **kwargs)
            times.append(time.perf_counter() - t)
        chunks = cs.status().chunks
    return {"chunks": chunks, "kept": kept, "rss_growth_mb": (rss1 - rss0) / 1024, "traced_peak_mb": peak / 2**20,
            "seconds": statistics.median(times)}


def main(folder: str = "/tmp/regex-memory", n_files: str = "5000") -> None:
    build(Path(folder), int(n_files))
    for name, pattern, glob in CASES:
        out = subprocess.run([sys.executable, __file__, "--measure", folder, pattern, glob or ""],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        print(f"{name:16} {r['chunks']:,} chunks, {r['kept']} hits: peak RSS +{r['rss_growth_mb']:.0f} MB, "
              f"Python allocations peak {r['traced_peak_mb']:.1f} MB, {r['seconds'] * 1000:.0f} ms")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2], sys.argv[3], sys.argv[4] or None)))
    else:
        main(*sys.argv[1:])
