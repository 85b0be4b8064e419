"""Lexical search at scale: a cold query (a fresh ``codesearch query`` process), warm queries
(one `CodeSearch` object), and where a cold query's time goes, on an indexed repository.

What people feel: the command from a shell, and an application or server that keeps the
index open. Prints CPU seconds, wall seconds and peak RSS of each cold process, the warm
p50, the per-stage CPU of a cold query, and the load average (the machine is shared).

Usage::

    codesearch index PATH --model none --multi-model none --no-daemon
    python benchmarks/lexical_scale.py PATH                    # the code of this checkout
    PYTHONPATH=/old/checkout python benchmarks/lexical_scale.py PATH   # another version

``--no-refresh`` runs measure the search alone; the default runs include the staleness
check ``codesearch query`` makes first (a walk of the repository's files).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

QUERIES = [
    "parse the configuration file", "BeanFactory", "transaction rollback on exception",
    "how are http message converters registered", "getBean", "cache eviction policy",
    "reactive web client retry", "jdbc template batch update", "StringUtils", "convert string to date",
]

_STAGES = """
import sys, time
c0 = time.process_time()
from codesearch import CodeSearch
from codesearch.api import CodeSearch as _api  # noqa: F401  (the lazy import, timed here)
c1 = time.process_time()
from codesearch.search import searcher as searcher_mod
from codesearch.search import ranking
marks = {}
def timed(owner, name):
    real = getattr(owner, name)
    def wrapper(*a, **k):
        t = time.process_time()
        try:
            return real(*a, **k)
        finally:
            marks[name] = marks.get(name, 0.0) + time.process_time() - t
    setattr(owner, name, wrapper)
timed(searcher_mod, "load_derived")
timed(ranking.Ranker, "score")
timed(ranking.Ranker, "select")
timed(searcher_mod.Searcher, "_hits")
cs = CodeSearch(sys.argv[1])
result = cs.query(sys.argv[2], k=5, mode="lexical", refresh=False)
c2 = time.process_time()
print("STAGES", {"import": round(c1 - c0, 3), "open+query": round(c2 - c1, 3),
                 **{k: round(v, 3) for k, v in marks.items()}})
"""


def _cold(root: str, query: str, refresh: bool) -> dict:
    argv = [sys.executable, "-m", "codesearch.cli", "query", query, "-p", root, "-k", "5", "--json", "--no-daemon",
            "--mode", "lexical", *([] if refresh else ["--no-refresh"])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.stdout.read(), proc.stderr.read()  # (small: five hits)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time and peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"query failed: {err.strip()}")
    hits = json.loads(out)["results"]
    return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "top": [h["path"] for h in hits[:1]]}


def _warm(root: str, rounds: int) -> dict:
    from codesearch import CodeSearch

    cs = CodeSearch(root)
    for q in QUERIES:
        cs.query(q, k=5, mode="lexical", refresh=False)
    cpu, wall = [], []
    for _ in range(rounds):
        for q in QUERIES:
            c, w = time.process_time(), time.perf_counter()
            cs.query(q, k=5, mode="lexical", refresh=False)
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
    cs.close()
    return {"p50_cpu_ms": round(1000 * statistics.median(cpu), 1),
            "p50_wall_ms": round(1000 * statistics.median(wall), 1),
            "max_cpu_ms": round(1000 * max(cpu), 1), "queries": len(cpu)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="an indexed repository")
    ap.add_argument("--cold", type=int, default=3, help="cold processes per setting")
    ap.add_argument("--rounds", type=int, default=3, help="warm rounds over the queries")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    print(f"load before: {os.getloadavg()}", flush=True)
    for refresh in (False, True):
        for i in range(args.cold):
            q = QUERIES[i % len(QUERIES)]
            print(f"cold{' (with refresh)' if refresh else ''} {q!r}: {_cold(root, q, refresh)}", flush=True)
    stages = subprocess.run([sys.executable, "-c", _STAGES, root, QUERIES[0]], capture_output=True, text=True,
                            check=True)
    print([ln for ln in stages.stdout.splitlines() if ln.startswith("STAGES")][-1], flush=True)
    print(f"warm: {_warm(root, args.rounds)}", flush=True)
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
