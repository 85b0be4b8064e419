"""``codesearch serve`` stopped by SIGTERM under load, and what a within-limit glob costs.

A 2,000-file repository (long names, as in a real tree) is indexed lexically and served;
eight clients send searches with a glob of 64 rules and 12 wildcards each (within the
limits); once each has had an answer, the server gets SIGTERM. Printed, as one JSON line:
the seconds from SIGTERM to the process's exit, the answers by status and content type, the
tracebacks on the server's stderr; then the glob filter alone in this process, on those
2,000 paths and on 100,000: seconds a search spends matching them.

Usage::

    python benchmarks/serve_sigterm.py [--work DIR] [--runs 3]
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
from collections import Counter
from pathlib import Path

GLOB = "{*a*,*b*}{*c*,*d*}{*e*,*f*}{*g*,*h*}{*i*,*j*}{*k*,*l*}"


def path_of(i: int) -> str:
    return f"src/components/feature_{i % 50}/deeply/nested/folder_{i % 13}/{'a' * 60}_{i}_handler.py"


def make_repo(root: Path, n: int) -> Path:
    from codesearch.api import CodeSearch

    for i in range(n):
        file = root / path_of(i)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"def handler_{i}(request):\n    return json_decoder({i})\n")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def sigterm_run(root: Path, logs: Path) -> dict:
    import httpx

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    err = open(logs / f"serve-{time.monotonic_ns()}.err", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "codesearch.server", str(root), "--model", "none", "--multi-model",
                             "none", "--no-watch", "--no-index-on-start", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    url = json.loads(proc.stdout.readline())["url"]
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                try:
                    r = http.post("/search", json={"query": "json decoder handler", "mode": "lexical", "k": 50,
                                                   "glob": GLOB})
                except httpx.HTTPError:
                    return
                answers.append((r.status_code, r.headers.get("content-type", "").split(";")[0]))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    while len(answers) < 8:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    proc.wait(120)
    exit_s = time.monotonic() - t0
    stop.set()
    for thread in threads:
        thread.join(60)
    err.seek(0)
    tracebacks = err.read().count("Traceback")
    err.close()
    after = answers[8:]
    return {"exit_s": round(exit_s, 2), "answers_after_the_first_8": dict(Counter(f"{s} {t}" for s, t in after)),
            "tracebacks": tracebacks}


def glob_cost(n: int) -> float:
    from codesearch.globs import GlobFilter

    spec = GlobFilter.of([GLOB])
    paths = [path_of(i) for i in range(n)]
    t0 = time.perf_counter()
    sum(spec.matches(paths))
    return round(time.perf_counter() - t0, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="serve-sigterm-"))
    work.mkdir(parents=True, exist_ok=True)
    root = work / "repo"
    if not (root / ".codesearch").exists():
        make_repo(root, 2000)
    runs = [sigterm_run(root, work) for _ in range(args.runs)]
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    print(json.dumps({
        "exit_s": {"p50": statistics.median(r["exit_s"] for r in runs), "all": [r["exit_s"] for r in runs]},
        "answers": [r["answers_after_the_first_8"] for r in runs], "tracebacks": [r["tracebacks"] for r in runs],
        "glob_s": {"2000_paths": glob_cost(2000), "100000_paths": glob_cost(100_000)},
        "cpu": cpu, "load": os.getloadavg()[0],
    }))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
