"""Ctrl-C (and SIGTERM) at random moments, or at each stage, of a real `codesearch index`.

Each trial starts ``codesearch index`` on a copy of a generated repository with the tiny
random checkpoints of the tests (tests/fixtures/models.py: a dense and a ColBERT model, so
the run walks, chunks in a process pool, commits, encodes and publishes PLAID), waits a
random time, and sends the signal to the process group, as a terminal does. Half the
trials run with stderr on a pseudo-terminal, so the rich progress bar (a thread) is live
and the chunking pool starts from a forkserver, as on a user's terminal; the others with
stderr on a pipe (fork). Between trials the index is kept and a few files are edited, so
later trials resume the encoding and re-chunk; some trials start again from nothing.

A trial passes when the process (and its whole process group: pool workers, forkserver)
is gone within ``--limit`` seconds (default 2) of the signal, its exit status is 130 (SIGINT)
or 143 (SIGTERM), its stderr holds no traceback and exactly one "Interrupted"/"Terminated"
line, and the index left behind is consistent (`check_consistent`, as the kill -9 tests
check it). A signal that lands after the run ended is not a trial (counted apart). At the
end one more run (no signal) must finish the index.

With ``--stages`` the signal comes at each stage boundary instead: the run is held at a
progress event by the test hook (`codesearch._stagehook`, the events of
tests/cli/test_interrupts.py) and signalled there, ``-n`` times per stage, each trial from
a fresh copy of the repository (no index yet, no cached vectors), and the tuning of the tests
(each batch its own commit, batches of 8 texts, a publication whenever one is due).

Run::

    PYTHONPATH=$PWD python benchmarks/interrupts.py                 # 100 SIGINTs
    PYTHONPATH=$PWD python benchmarks/interrupts.py --signal TERM -n 20
    PYTHONPATH=$PWD python benchmarks/interrupts.py --max-delay 6 --seed 2
    PYTHONPATH=$PWD python benchmarks/interrupts.py --stages -n 3 --files 6 --signal TERM

The output is one JSON document (and a line per trial on stderr). Timings depend on the
machine's load, which is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

# The child is the console script's own entry point; the forkserver threshold is lowered so
# that a small repository (fast trials) still chunks in a pool on a "terminal", as a large
# repository does on a real one. It writes one byte first: the random delay starts once the
# interpreter runs the child's code (a signal during Python's own start-up is not ours to
# handle); the guard is armed before the patch's import, as `main` arms it before its own.
# A script run with `&` starts its children with SIGINT ignored (which the guard keeps, as
# Python does): the child takes SIGINT back first, as a command typed at a terminal has it.
CHILD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, even if we run in the background
os.write(1, b'S')
from codesearch.cli import interrupts
interrupts.install()
try:
    import codesearch.indexing.chunking.parallel as p
    p.PARALLEL_MIN_FILES_FORKSERVER = 200
except KeyboardInterrupt:  # what main does with one during its imports
    os._exit(interrupts.say_and_exit())
from codesearch.cli import main
sys.argv[0] = 'codesearch'
main()
"""


def make_inputs(work: Path, n_files: int) -> tuple[Path, Path, Path]:
    from fixtures import models
    from fixtures.pipeline_helpers import make_repo

    dense, colbert = models.make_single_vector(work / "dense"), models.make_colbert(work / "colbert")
    template = make_repo(work / "template", n_files=n_files, n_functions=2, lines=5)
    return template, dense, colbert


def edit_some(repo: Path, rng: random.Random, n: int = 3) -> None:
    """A few edited files, so the next run re-reads, re-chunks and commits again."""
    files = sorted((repo / "pkg").glob("*.py"))
    for f in rng.sample(files, min(n, len(files))):
        f.write_text(f.read_text() + f"\n\ndef edited_{rng.randrange(10**9)}(x):\n    return x + 1\n")


#: Where ``--stages`` holds a run: (stage, n), the stage's n-th progress event (as the tests).
STAGES = [("walk", 1), ("walk", 2), ("chunk", 1), ("write", 1), ("write", 2), ("sync", 1), ("searchable", 1),
          ("encode", 1), ("sync", 5), ("published", 1), ("encode", 2)]
KNOBS = """
from codesearch.indexing import commit, encode, publish
commit.COMMIT_GROUP_S, encode.ENCODE_BATCH, publish.PUBLISH_EVERY_S = 0.0, 8, 0.0
"""


def run_trial(repo: Path, dense: Path, colbert: Path, delay: float, sig: signal.Signals, tty: bool,
              limit: float, wait_s: float = 120.0, hold: tuple[str, int] | None = None) -> dict:
    """One run of ``codesearch index`` signalled ``delay`` s after its start, or once it is
    held at progress event ``hold``."""
    child = CHILD
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               COLUMNS="100")
    if hold is not None:
        hook = repo.parent / "hook"
        shutil.rmtree(hook, ignore_errors=True)
        hook.mkdir()
        (hook / "at").write_text(f"{hold[0]} {hold[1]}\n")
        env.update(CODESEARCH_STAGE_HOOK=str(hook), CODESEARCH_CACHE_DIR=str(repo.parent / "cache"))
        child = CHILD.replace("from codesearch.cli import main", KNOBS + "from codesearch.cli import main")
    cmd = [sys.executable, "-c", child, "index", str(repo), "--model", str(dense), "--multi-model", str(colbert)]
    chunks: list[bytes] = []
    if tty:
        master, slave = pty.openpty()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env,
                                start_new_session=True)
        os.close(slave)

        def drain() -> None:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain, daemon=True)
    else:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True)
        reader = threading.Thread(target=lambda: chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    proc.stdout.read(1)  # the child's code runs
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    started = time.monotonic()
    if hold is None:
        time.sleep(delay)
    else:
        while not (hook / "held").exists() and proc.poll() is None and time.monotonic() - started < wait_s:
            time.sleep(0.01)
    if proc.poll() is not None:
        proc.wait()
        reader.join(5)
        return {"trial": False, "rc": proc.returncode, "delay": delay}
    sent = time.monotonic()
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ended = time.monotonic()
    group_gone = None
    while time.monotonic() - ended < wait_s:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            group_gone = time.monotonic()
            break
        time.sleep(0.01)
    if group_gone is None:
        os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    if tty:
        os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace")
    want = 130 if sig == signal.SIGINT else 143
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.strip().startswith(("Interrupted", "Terminated"))]
    gone_s = (group_gone or time.monotonic()) - sent
    out = {
        "trial": True, "delay": round(delay, 3), "tty": tty, "rc": proc.returncode,
        "exit_s": round(ended - sent, 3), "group_gone_s": round(gone_s, 3),
        "traceback": "Traceback" in err or "Exception ignored" in err or "KeyboardInterrupt" in err,
        "lines_said": len(said), "last_line": lines[-1][:200] if lines else "",
        "stage_s": round(sent - started, 3),
    }
    if hold is not None:
        out["stage"] = f"{hold[0]}{hold[1]}"
        shutil.rmtree(repo.parent / "cache", ignore_errors=True)
    out["ok"] = (proc.returncode == want and gone_s <= limit and not out["traceback"] and len(said) == 1
                 and (tty or lines[-1] == said[0]))
    if not out["ok"]:
        out["stderr_head"], out["stderr_tail"] = err[:1500], err[-1500:]
    return out


def consistent(repo: Path) -> str | None:
    """None when the index left behind is consistent (or absent: a run stopped before its
    first commit leaves nothing), else what is wrong."""
    from fixtures.pipeline_helpers import check_consistent

    idir = repo / ".codesearch"
    if not (idir / "store.sqlite").exists():
        return None
    try:
        check_consistent(idir, complete=False)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100, help="trials (signals that land while the run is going)")
    ap.add_argument("--signal", choices=["INT", "TERM"], default="INT")
    ap.add_argument("--max-delay", type=float, default=8.0, help="signal at a uniform random time in [0, this] s")
    ap.add_argument("--files", type=int, default=220, help="files in the generated repository")
    ap.add_argument("--limit", type=float, default=2.0, help="seconds the run may take to end after the signal")
    ap.add_argument("--fresh", type=float, default=0.3, help="share of trials that start from no index")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-final", action="store_true", help="skip the final run that must finish the index")
    ap.add_argument("--stages", action="store_true", help="signal at each stage boundary, -n times each")
    args = ap.parse_args()
    sig = signal.SIGINT if args.signal == "INT" else signal.SIGTERM
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="codesearch-interrupts-"))
    try:
        template, dense, colbert = make_inputs(work, args.files)
        repo = work / "repo"
        results, late = [], 0

        def trial(delay: float, hold: tuple[str, int] | None = None) -> None:
            nonlocal late
            r = run_trial(repo, dense, colbert, delay, sig, tty=rng.random() < 0.5, limit=args.limit, hold=hold)
            if not r["trial"]:
                late += 1
                return
            problem = consistent(repo)
            r["index"] = problem or "consistent"
            r["ok"] = r["ok"] and problem is None
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)

        for stage in STAGES if args.stages else ():
            for _ in range(args.n):
                shutil.rmtree(repo, ignore_errors=True)
                shutil.copytree(template, repo)
                trial(0.0, stage)  # (a run that ends before its stage counts as landed after the run)
        while not args.stages and len(results) < args.n:
            if not repo.exists() or rng.random() < args.fresh:
                shutil.rmtree(repo, ignore_errors=True)
                shutil.copytree(template, repo)
            else:
                edit_some(repo, rng)
            trial(rng.uniform(0, args.max_delay))
        final = None
        if not args.no_final:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, "index", str(repo), "--model", str(dense), "--multi-model", str(colbert),
                 "-q"], capture_output=True, text=True,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])),
            )
            from fixtures.pipeline_helpers import check_consistent

            check_consistent(repo / ".codesearch")
            final = {"rc": done.returncode, "stderr": done.stderr[-500:]}
        ok = [r for r in results if r["ok"]]
        times = sorted(r["group_gone_s"] for r in results)
        print(json.dumps({
            "signal": args.signal, "trials": len(results), "ok": len(ok), "landed_after_the_run": late,
            "limit_s": args.limit,
            "exit_status": {str(k): sum(r["rc"] == k for r in results) for k in sorted({r["rc"] for r in results})},
            "tracebacks": sum(r["traceback"] for r in results),
            "over_limit": sum(r["group_gone_s"] > args.limit for r in results),
            "gone_s": {"p50": times[len(times) // 2], "p90": times[int(len(times) * 0.9)], "max": times[-1]},
            "inconsistent": sum(r["index"] != "consistent" for r in results),
            "final_run": final,
            "failures": [r for r in results if not r["ok"]][:10],
            "load_average": os.getloadavg(),
            **({"by_stage": {
                f"{st}{n}": {"trials": len(rs), "ok": sum(r["ok"] for r in rs),
                             "gone_s_max": max(r["group_gone_s"] for r in rs)}
                for st, n in STAGES if (rs := [r for r in results if r.get("stage") == f"{st}{n}"])
            }} if args.stages else {}),
        }, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
