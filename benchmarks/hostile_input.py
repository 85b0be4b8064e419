"""Hostile globs against `codesearch serve`: how long each is answered in, how
long ``/health`` takes meanwhile, and how long SIGTERM takes to end the server.

A copy of a repository (default: the sample repository of the tests, plus a file with a
45-character name, as in the reported case) is indexed lexical-only and served on loopback. Then:

* ``globs``: each glob family at growing sizes, one request each, sequentially; the answer
  time and status (400 = refused by a limit), and the largest time per family;
* ``flood``: N threads send the worst globs in a loop while ``/health`` is polled; p50/p99/max
  of ``/health`` latency;
* ``sigterm``: SIGTERM in the middle of the flood, seconds until the process is gone.

Targets: every glob answered within 100 ms or refused, ``/health`` within
100 ms, SIGTERM within 2 s. Nothing here asserts; it prints one JSON document.

Run::

    PYTHONPATH=$PWD python benchmarks/hostile_input.py
    PYTHONPATH=$PWD python benchmarks/hostile_input.py --repo PATH --clients 8 --seconds 5

Timings depend on what else runs on the machine; the output records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

FAMILIES = {
    "star-any": lambda n: "*?" * n + "Z",
    "stars": lambda n: "*a" * n + "b",
    "globstar": lambda n: "**/" * n + "*.py",
    "segments": lambda n: "a*/" * n + "c",
    "classes": lambda n: "[a-z]*" * n,
    "braces": lambda n: "{a,b}" * n,
    "brace-stars": lambda n: "{a*,b?}" * n,
    "nested": lambda n: "{a," * n + "*" + "}" * n,
    "mixed": lambda n: "**/" + "*a?[a-z]" * n + "/**/b*",
}
SIZES = (1, 2, 4, 8, 12, 16, 22, 32, 64)
WORST = ["*?" * 15 + "Z", "{a*,b?}" * 6, "**/" * 30 + "*a" * 15 + "/**", "*?" * 22 + "Z", "{a,b}" * 16]


def _start(root: Path, log: Path) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "CODESEARCH_TOKEN"}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "codesearch.server", str(root), "--model", "none", "--multi-model", "none",
             "--no-watch", "--no-index-on-start", "--port", "0"],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env,
        )
    return proc, json.loads(proc.stdout.readline())["url"]


def _pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000, 2) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, help="folder to copy and serve (default: the tests' sample repo)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    from codesearch.api import CodeSearch

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        if args.repo:
            shutil.copytree(args.repo, root, ignore=shutil.ignore_patterns(".codesearch", ".git"))
        else:
            from fixtures.sample_repo import write_sample_repo

            write_sample_repo(root)
        (root / ("a" * 41 + ".txt")).write_text("json decoder\n")
        with CodeSearch(root, model=None, multi_model=None) as cs:
            files = cs.index().files_indexed
        proc, url = _start(root, Path(tmp) / "server.err")
        report: dict = {"files": files, "loadavg": os.getloadavg(), "globs": {}}
        try:
            with httpx.Client(base_url=url, timeout=120) as http:
                http.post("/search", json={"query": "warm", "mode": "lexical"})
                for name, make in FAMILIES.items():
                    rows = []
                    for n in SIZES:
                        start = time.perf_counter()
                        status = http.post("/search", json={"query": "json decoder", "mode": "lexical", "k": 50,
                                                            "glob": make(n)}).status_code
                        rows.append((n, status, round((time.perf_counter() - start) * 1000, 2)))
                    report["globs"][name] = {"max_ms": max(r[2] for r in rows), "sizes": rows}

            stop = threading.Event()

            def flood() -> None:
                with httpx.Client(base_url=url, timeout=120) as http:
                    while not stop.is_set():
                        for glob in WORST:
                            try:
                                http.post("/search", json={"query": "json decoder", "glob": glob, "k": 50})
                            except httpx.HTTPError:
                                return

            threads = [threading.Thread(target=flood, daemon=True) for _ in range(args.clients)]
            for t in threads:
                t.start()
            health: list[float] = []
            with httpx.Client(base_url=url, timeout=120) as http:
                deadline = time.monotonic() + args.seconds
                while time.monotonic() < deadline:
                    start = time.perf_counter()
                    http.get("/health")
                    health.append(time.perf_counter() - start)
                    time.sleep(0.02)
            report["health_during_flood_ms"] = {"n": len(health), "p50": _pct(health, 0.5), "p99": _pct(health, 0.99),
                                                "max": round(max(health) * 1000, 2),
                                                "mean": round(statistics.mean(health) * 1000, 2)}
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                report["sigterm_exit"] = {"code": proc.wait(60), "seconds": round(time.perf_counter() - start, 3)}
            except subprocess.TimeoutExpired:
                report["sigterm_exit"] = {"code": None, "seconds": "> 60 (killed)"}
            stop.set()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
