"""Ctrl-C and SIGTERM end a real `codesearch index` with one line that says what the run kept,
exit 130/143, no traceback, and a consistent, resumable index; codesearch.cli.interrupts.

The signal comes at each stage boundary of a run (the walk, the chunking, the files' commit,
the derived indexes' sync, each encode batch, a publication), in the CLI's own process and
in the daemon whose run the CLI relays: the run is held at that progress event by the test
hook (`codesearch._stagehook`) and signalled there, so every stage is hit on any machine,
fast or slow. Runs signalled at random wall-clock moments cover what lies between the events
(imports, model loading, C code); their failures name the last event the run reported.

Signals go to the process group, as a terminal sends them. How long the end takes is
measured by benchmarks/interrupts.py (no timed assertions here: the waits are long).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.pipeline_helpers import check_consistent, make_repo, module_source

from codesearch.server import daemon_client
from codesearch.server.repos import CANCELLED

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120.0
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}

#: The console script's entry point in a fresh process, after a byte on stdout that says the
#: child's code runs and a test's own set-up (``prelude``; the signal is sent long after it).
CHILD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as typed at a terminal (pytest may run in the background)
os.write(1, b"S")
{prelude}
from codesearch.cli import main
sys.argv[0] = "codesearch"
main()
"""

#: Where a run is held and signalled: (stage, n), the stage's n-th progress event.
STAGES = [
    ("walk", 1),  # the walk begins (nothing written yet)
    ("walk", 2),  # walked; the changed files are read next
    ("chunk", 1),  # chunked
    ("write", 1),  # the files' one transaction begins
    ("write", 2),  # ... and has committed
    ("sync", 1),  # the lexical index is written, the other derived indexes not yet
    ("searchable", 1),
    ("encode", 1),  # the first batch of vectors committed
    ("sync", 5),  # a publication has written its first vector index (sync 1-4 follow the commit)
    ("published", 1),  # a publication recorded, more batches to come
    ("encode", 2),  # a later batch committed
]
STAGE_IDS = [f"{stage}{n}" for stage, n in STAGES]

#: The run's tuning, the same on every machine: each batch its own commit (so its own encode
#: event), batches of 8 texts (a small repository makes several), a publication whenever
#: one is due (between batches too).
KNOBS = """
from codesearch.indexing import commit, encode, publish
commit.COMMIT_GROUP_S, encode.ENCODE_BATCH, publish.PUBLISH_EVERY_S = 0.0, 8, 0.0
"""


def _repo(root: Path, tag: str = "") -> Path:
    """Six modules and a README (33 texts for the two tiny models); ``tag`` makes every text
    its own (a daemon's vector cache then holds none of them)."""
    (root / "pkg").mkdir(parents=True)
    for i in range(6):
        (root / "pkg" / f"mod{i}.py").write_text(module_source(f"{tag}mod{i}", 2, 5))
    (root / "README.md").write_text("# Fixture\n\nA fixture repository for the interrupt tests.\n")
    return root


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """40 modules: a run with the tiny models takes seconds (the random moments fall inside it)."""
    return make_repo(tmp_path_factory.mktemp("interrupts") / "template", n_files=40, n_functions=2, lines=5)


def _index_args(repo: Path, single_vector_dir, colbert_dir) -> list[str]:
    return ["index", str(repo), "--model", str(single_vector_dir), "--multi-model", str(colbert_dir)]


def _check_one_line(rc: int, err: str, sig: int, where: str = "") -> str:
    """The exit status of ``sig`` and one last line that says it, nothing else; returns the line."""
    want, word = (130, "Interrupted") if sig == signal.SIGINT else (143, "Terminated")
    context = f"{where}\n--- stderr ---\n{err[-2000:]}"
    assert rc == want, f"exit status {rc}, not {want}: {context}"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Exception ignored" not in err, context
    lines = err.splitlines()
    said = [ln for ln in lines if ln.startswith(("Interrupted", "Terminated"))]
    assert lines and said == [lines[-1]] and said[0].startswith(word), f"not one last {word!r} line: {context}"
    return said[0]


# -- the test hook's files ----------------------------------------------------------------------


@dataclass
class Hook:
    """A `codesearch._stagehook` folder: the events a run reported, the event it is held at."""

    folder: Path

    @classmethod
    def make(cls, folder: Path, stage: tuple[str, int] | None = None) -> Hook:
        folder.mkdir(parents=True, exist_ok=True)
        hook = cls(folder)
        hook.hold_at(stage)
        return hook

    def hold_at(self, stage: tuple[str, int] | None) -> None:
        # A new word each time: a process counts the events again from a new target (the daemon's next run).
        word = os.urandom(4).hex()
        (self.folder / "at").write_text(f"{stage[0]} {stage[1]} {word}\n" if stage else f"- 0 {word}\n")

    def held(self) -> bool:
        return (self.folder / "held").exists()

    def release(self) -> None:
        (self.folder / "held").unlink(missing_ok=True)

    def events(self) -> list[tuple[str, int, int, int]]:
        """(stage, n, done, total) of each event, in order."""
        try:
            lines = (self.folder / "events").read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            _, stage, n, fraction = line.split()
            done, total = fraction.split("/")
            out.append((stage, int(n), int(done), int(total)))
        return out

    def where(self) -> str:
        """Where the run was: after its last reported event (its stage is going on)."""
        events = self.events()
        if not events:
            return "before the run's first progress event (start-up, imports, models, the index lock)"
        stage, n, done, total = events[-1]
        return f"after progress event {stage} #{n} ({done}/{total}); events: " + " ".join(
            f"{s}{k}" for s, k, _, _ in events)


def _kept(events: list[tuple[str, int, int, int]]) -> str:
    """What the line says a run kept, given the events its CLI had seen: the oracle of
    `interrupts.noting`, from the stages' order (the files' commit, then batches of vectors)."""
    committed, vectors = None, None
    for stage, _, done, total in events:
        if stage in ("searchable", "encode", "published") or (stage == "write" and total and done >= total):
            committed = "done"
        elif stage == "write":
            committed = committed or "begun"
        if stage == "encode":
            vectors = (done, total)
    if committed is None:
        return "nothing of this run was kept"
    if committed == "begun":
        return "kept: this run's files if their commit had ended"
    if vectors is None:
        return "kept: the files and their lexical index"
    return f"kept: the files and vectors for at least {vectors[0]:,} of {vectors[1]:,} texts"


def _wait_for(condition, alive, what) -> None:
    """Until ``condition()``, while ``alive()``; ``what()`` says what did not happen."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert alive(), what()
        assert time.monotonic() < deadline, f"{WAIT_S} s and still not: {what()}"
        time.sleep(0.01)


# -- runs forked from one process that has imported everything --------------------------------

#: Imports torch, faiss and codesearch once, then forks each run: a run costs what it does,
#: not the ~1.5 CPU-s of its imports (22 runs here). Each child is the console script's entry
#: point in a session of its own (signalled as a terminal's group), stderr to a file. Lines
#: in: a run to start (JSON), or {"wait": pid}; lines out: its pid, or its exit status.
ZYGOTE = """
import importlib, json, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as typed at a terminal
for name in ("faiss", "torch", "tokenizers", "safetensors.torch", "tree_sitter_language_pack", "typer._adapters",
             "codesearch.api", "codesearch.cli.app", "codesearch.cli.lean", "codesearch.cli.render",
             "codesearch.server.daemon_client", "codesearch.encoder.loading", "codesearch.encoder.runtime",
             "codesearch.encoder.modernbert", "codesearch.encoder.heads", "codesearch.indexes.plaid.index",
             "codesearch.indexing.run", "codesearch.indexing.encode"):
    try:
        importlib.import_module(name)
    except ImportError:  # (a module renamed since: its run imports it)
        pass
out = sys.stdout
out.write("ready\\n")
out.flush()
for line in sys.stdin:
    job = json.loads(line)
    if "wait" in job:
        _, status = os.waitpid(job["wait"], 0)
        out.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\\n")
        out.flush()
        continue
    pid = os.fork()
    if pid:
        out.write(json.dumps(pid) + "\\n")
        out.flush()
        continue
    code = 99  # a bug of the child's set-up: its traceback is in its stderr
    try:
        os.setsid()
        null, err = os.open(os.devnull, os.O_RDWR), os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(null, 0), os.dup2(null, 1), os.dup2(err, 2)
        for name in job["unset"]:
            os.environ.pop(name, None)
        os.environ.update(job["env"])
        sys.argv = ["codesearch", *job["args"]]
        exec(job["prelude"], {})
        from codesearch.cli import main
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        import traceback
        traceback.print_exc()
    os._exit(code)
"""


@dataclass
class Run:
    """A forked ``codesearch`` run: its pid (and process group) and its stderr file."""

    zygote: Zygote
    pid: int
    stderr: Path
    status: int | None = None

    def alive(self) -> bool:
        """Running: not yet a zombie (the zygote reaps it when asked)."""
        try:
            return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def signal(self, sig: int) -> None:
        os.killpg(self.pid, sig)

    def wait(self) -> tuple[int, str]:
        if self.status is None:
            deadline = time.monotonic() + WAIT_S
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.alive():
                self.kill()
                self.status = self.zygote.reap(self.pid)
                pytest.fail(f"still running {WAIT_S} s after the signal: {self.stderr.read_text()[-800:]}")
            self.status = self.zygote.reap(self.pid)
        return self.status, self.stderr.read_text(errors="replace")

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Zygote:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)
        assert self.proc.stdout.readline() == "ready\n", "the zygote did not start"
        self.runs: list[Run] = []

    def _ask(self, job: dict) -> int:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def start(self, args: list[str], stderr: Path, *, env: dict[str, str] | None = None, unset: tuple[str, ...] = (),
              prelude: str = "") -> Run:
        job = {"args": args, "stderr": str(stderr), "env": env or {}, "unset": list(unset),
               "prelude": textwrap.dedent(prelude)}
        run = Run(self, self._ask(job), stderr)
        self.runs.append(run)
        return run

    def reap(self, pid: int) -> int:
        return self._ask({"wait": pid})

    def close(self) -> None:
        for run in self.runs:
            if run.status is None:
                run.kill()
                run.status = self.reap(run.pid)
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


# -- a signal at each stage of a run in the CLI's process ---------------------------------------


@dataclass
class Held:
    run: Run
    hook: Hook
    repo: Path


@pytest.fixture(scope="module")
def held_runs(zygote, tmp_path_factory, single_vector_dir, colbert_dir):
    """For a signal: a run at each of `STAGES`, started together and each held at its stage
    (so that the runs cost about one run's time); each test signals one."""
    started: dict[int, dict[tuple[str, int], Held]] = {}

    def runs(sig: int) -> dict[tuple[str, int], Held]:
        if sig not in started:
            started[sig] = {}
            for stage in STAGES:
                work = tmp_path_factory.mktemp(f"{signal.Signals(sig).name}-{stage[0]}{stage[1]}")
                repo, hook = _repo(work / "repo"), Hook.make(work / "hook", stage)
                run = zygote.start(_index_args(repo, single_vector_dir, colbert_dir), work / "stderr",
                                   env={"CODESEARCH_STAGE_HOOK": str(hook.folder),
                                        "CODESEARCH_CACHE_DIR": str(work / "cache")},  # its own: nothing cached
                                   prelude=KNOBS)
                started[sig][stage] = Held(run, hook, repo)
        return started[sig]

    return runs


@pytest.mark.parametrize(("sig", "stage"), [(s, st) for s in SIGNALS.values() for st in STAGES],
                         ids=[f"{name}-{i}" for name in SIGNALS for i in STAGE_IDS])
def test_a_signal_at_each_stage_of_a_run_ends_it_in_one_line_that_says_what_was_kept(sig, stage, held_runs):
    held = held_runs(sig)[stage]
    _wait_for(held.hook.held, held.run.alive, lambda: f"the run to reach {stage}: it ended first, "
              f"{held.hook.where()}\n{held.run.stderr.read_text()[-800:]}")
    held.run.signal(sig)
    rc, err = held.run.wait()
    events = held.hook.events()
    line = _check_one_line(rc, err, sig, where=f"signalled at {stage}: {held.hook.where()}")
    # The hook holds a run before its CLI sees the event: the line tells what the events before it say.
    assert _kept(events[:-1]) in line, (stage, line)
    if (held.repo / ".codesearch" / "store.sqlite").exists():
        check_consistent(held.repo / ".codesearch", complete=False)


def test_a_run_signalled_between_two_batches_resumes_to_a_complete_index(zygote, tmp_path, single_vector_dir,
                                                                         colbert_dir):
    repo, hook = _repo(tmp_path / "repo"), Hook.make(tmp_path / "hook", ("encode", 2))
    env = {"CODESEARCH_STAGE_HOOK": str(hook.folder), "CODESEARCH_CACHE_DIR": str(tmp_path / "cache")}
    run = zygote.start(_index_args(repo, single_vector_dir, colbert_dir), tmp_path / "first", env=env, prelude=KNOBS)
    _wait_for(hook.held, run.alive, lambda: f"the run to reach its second batch: {hook.where()}")
    run.signal(signal.SIGINT)
    _check_one_line(*run.wait(), signal.SIGINT)
    hook.hold_at(None)
    again = zygote.start([*_index_args(repo, single_vector_dir, colbert_dir), "-q"], tmp_path / "again", env=env,
                         prelude=KNOBS)
    rc, err = again.wait()
    assert rc == 0, err
    resumed = [e for e in hook.events() if e[0] == "encode"]
    assert resumed[-1][2] < resumed[0][3], resumed  # only what the first run had not committed was encoded
    check_consistent(repo / ".codesearch")


# -- the daemon's run, relayed by the CLI ---------------------------------------------------------


@dataclass
class Daemon:
    runtime: Path
    hook: Hook
    proc: subprocess.Popen
    log: Path

    def wait_idle(self, root: Path) -> dict:
        """The run state of ``root`` once served, with a run done and none going or queued."""
        deadline = time.monotonic() + WAIT_S
        while True:
            info = daemon_client.find(self.runtime)
            assert info is not None, "the daemon is gone"
            status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={root.resolve()}")
            state = doc.get("indexing") or {}
            if status == 200 and state["state"] == "idle" and state["runs"] >= 1:
                return state
            assert time.monotonic() < deadline, doc  # (403: not served yet, its options being replaced)
            time.sleep(0.02)


#: The CLI's environment that uses the daemon (the suite's default keeps it off).
NO_DAEMON = ("CODESEARCH_NO_DAEMON", "CODESEARCH_DAEMON", "CODESEARCH_TOKEN", "CI")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A daemon with the tuning of `KNOBS` and the test hook, as ``codesearch daemon start``
    would start it (its own session; no watcher, so only the CLI starts runs)."""
    work = tmp_path_factory.mktemp("daemon")
    runtime, hook = work / "runtime", Hook.make(work / "hook")
    runtime.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in NO_DAEMON}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               CODESEARCH_STAGE_HOOK=str(hook.folder), CODESEARCH_CACHE_DIR=str(work / "cache"))
    code = KNOBS + "from codesearch.server.daemon import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"
    with open(work / "log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code, "--runtime-dir", str(runtime), "--idle-timeout", "0",
                                 "--no-watch"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True)
    _wait_for(lambda: daemon_client.find(runtime) is not None, lambda: proc.poll() is None,
              lambda: f"the daemon to start: {(work / 'log').read_text()[-800:]}")
    try:
        yield Daemon(runtime, hook, proc, work / "log")
    finally:
        hook.release()
        daemon_client.stop(runtime)
        if proc.poll() is None:
            proc.kill()
        proc.wait()


#: The daemon sees a cancel, whichever signal its client got: SIGTERM at three stages.
RELAYED = [(signal.SIGINT, stage) for stage in STAGES] + [
    (signal.SIGTERM, stage) for stage in (("walk", 1), ("encode", 1), ("published", 1))]


@pytest.mark.parametrize(("sig", "stage"), RELAYED,
                         ids=[f"{signal.Signals(sig).name[3:]}-{st}{n}" for sig, (st, n) in RELAYED])
def test_a_signal_to_the_cli_at_each_stage_of_the_daemons_run_cancels_it_in_one_line(
        sig, stage, daemon, zygote, tmp_path, single_vector_dir, colbert_dir):
    repo = _repo(tmp_path / "repo", tag=f"t{os.getpid()}{tmp_path.name}_".replace("-", "_"))
    daemon.hook.hold_at(stage)
    run = zygote.start(_index_args(repo, single_vector_dir, colbert_dir), tmp_path / "stderr", unset=NO_DAEMON,
                       env={"CODESEARCH_RUNTIME_DIR": str(daemon.runtime)})
    try:
        _wait_for(daemon.hook.held, run.alive, lambda: f"the daemon's run to reach {stage}: the CLI ended first, "
                  f"{daemon.hook.where()}\n{run.stderr.read_text()[-800:]}")
        run.signal(sig)  # the CLI's group: the daemon is in a session of its own
        rc, err = run.wait()
    finally:
        daemon.hook.release()  # the run goes on to its next report, where it finds the cancel
    word = "Interrupted" if sig == signal.SIGINT else "Terminated"
    line = _check_one_line(rc, err, sig, where=f"signalled at the daemon's {stage}: {daemon.hook.where()}")
    assert line == (f"{word}: the daemon stopped the index run (the index is intact; run the command again to "
                    "resume)")
    state = daemon.wait_idle(repo)
    assert state["last_error"] == CANCELLED, state
    if (repo / ".codesearch" / "store.sqlite").exists():
        check_consistent(repo / ".codesearch", complete=False)


@pytest.mark.parametrize("sig", SIGNALS.values(), ids=SIGNALS.keys())
def test_a_signal_while_the_daemon_takes_the_run_says_the_run_may_go_on(sig, daemon, zygote, tmp_path,
                                                                       single_vector_dir, colbert_dir):
    """The CLI signalled before the daemon has answered that it took the run: the run may
    start after the CLI is gone, and the line says so (it said "the index is intact" and
    nothing more). The daemon takes a run for new options of a served root only once the
    root's run going now has ended: that run, held here, holds the request."""
    repo = _repo(tmp_path / "repo", tag=f"p{os.getpid()}{tmp_path.name}_".replace("-", "_"))
    daemon.hook.hold_at(("walk", 1))
    env, log = {"CODESEARCH_RUNTIME_DIR": str(daemon.runtime)}, daemon.log.read_text()
    first = zygote.start(_index_args(repo, single_vector_dir, colbert_dir), tmp_path / "first", unset=NO_DAEMON,
                         env=env)
    try:
        _wait_for(daemon.hook.held, first.alive, lambda: f"the first run to begin: {first.stderr.read_text()}")
        daemon.hook.hold_at(None)  # (the next run goes through)
        run = zygote.start([*_index_args(repo, single_vector_dir, colbert_dir), "--exclude", "*.txt"],
                           tmp_path / "stderr", unset=NO_DAEMON, env=env)
        _wait_for(lambda: "options of" in daemon.log.read_text()[len(log):], run.alive,
                  lambda: f"the daemon to take the new options: {run.stderr.read_text()}")
        run.signal(sig)
        rc, err = run.wait()
    finally:
        daemon.hook.release()
    word = "Interrupted" if sig == signal.SIGINT else "Terminated"
    line = _check_one_line(rc, err, sig)
    assert line.startswith(f"{word}; the daemon's index run may go on"), line
    state = daemon.wait_idle(repo)
    assert state["last_error"] is None, state  # it went on, as the line said
    check_consistent(repo / ".codesearch")
    first.wait()


# -- the line against the watchdog ------------------------------------------------------------------

#: ``_isatty`` is where `_say` gave up the GIL between claiming the line and writing it: here
#: the named thread loses the CPU there, for 2 s (standing for a busy machine).
SLOW_SAY = """
import threading, time
from codesearch.cli import interrupts
interrupts.SAY_WAIT_S = 60.0  # the writer is slow, not stuck: the other thread waits for it
isatty = interrupts._isatty
def slow_isatty(fd):
    if threading.current_thread().name == {thread!r}:
        open({marker!r}, "w").close()
        time.sleep(2.0)
    return isatty(fd)
interrupts._isatty = slow_isatty
"""


def test_a_second_signal_while_the_command_writes_its_line_waits_for_the_line(zygote, tmp_path, template):
    """The command's clean-up claims the line, then loses the CPU before writing it; a second
    Ctrl-C (or the watchdog's deadline) ended the process then: exit 130, empty stderr."""
    repo, hook = tmp_path / "repo", Hook.make(tmp_path / "hook", ("walk", 1))
    shutil.copytree(template, repo)
    marker = tmp_path / "claimed"
    run = zygote.start(["index", str(repo), "--model", "none", "--multi-model", "none"], tmp_path / "stderr",
                       env={"CODESEARCH_STAGE_HOOK": str(hook.folder)},
                       prelude=SLOW_SAY.format(thread="MainThread", marker=str(marker)))
    _wait_for(hook.held, run.alive, lambda: f"the run to begin its walk: {run.stderr.read_text()[-800:]}")
    run.signal(signal.SIGINT)
    _wait_for(marker.exists, run.alive, lambda: f"the command to claim its line: {run.stderr.read_text()[-800:]}")
    run.signal(signal.SIGINT)  # the watchdog ends the process now
    line = _check_one_line(*run.wait(), signal.SIGINT)
    assert "nothing of this run was kept" in line


def test_the_command_ending_while_the_watchdog_writes_the_line_waits_for_it(zygote, tmp_path, template):
    """The watchdog claims the line at its deadline, then loses the CPU before writing it; the
    command, its clean-up done meanwhile, ended the process: exit 130, empty stderr (seen on a
    quiet Zen 4 when an interrupt deferred until torch's import ended landed at the deadline).
    Here the clean-up takes until the watchdog has claimed the line."""
    repo, hook = tmp_path / "repo", Hook.make(tmp_path / "hook", ("walk", 1))
    shutil.copytree(template, repo)
    marker = tmp_path / "claimed"
    prelude = SLOW_SAY.format(thread="codesearch-interrupt-watchdog", marker=str(marker)) + textwrap.dedent("""
        interrupts.GRACE_S = 0.3
        from codesearch.store import IndexLock
        release = IndexLock.release
        def release_late(self):  # the run's last clean-up step, once the watchdog claimed the line
            while not interrupts._state["said"]:
                time.sleep(0.01)
            return release(self)
        IndexLock.release = release_late
    """)
    run = zygote.start(["index", str(repo), "--model", "none", "--multi-model", "none"], tmp_path / "stderr",
                       env={"CODESEARCH_STAGE_HOOK": str(hook.folder)}, prelude=prelude)
    _wait_for(hook.held, run.alive, lambda: f"the run to begin its walk: {run.stderr.read_text()[-800:]}")
    run.signal(signal.SIGTERM)
    _check_one_line(*run.wait(), signal.SIGTERM)
    assert marker.exists()  # the watchdog claimed it


@pytest.mark.parametrize("sig", SIGNALS.values(), ids=SIGNALS.keys())
def test_a_signal_while_the_run_is_in_c_code_ends_it_with_the_signals_own_status(sig, zygote, tmp_path, template):
    """The main thread in a long SQLite statement never runs the handler: the watchdog ends the
    run at its deadline, and SIGTERM still reads as SIGTERM (it was 130, "Interrupted")."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo)
    marker = tmp_path / "in-c"
    run = zygote.start(["index", str(repo), "--model", "none", "--multi-model", "none"], tmp_path / "stderr",
                       prelude=f"""
        import sqlite3
        import codesearch.indexing.run as run
        def in_c(r):
            open({str(marker)!r}, "w").close()
            sqlite3.connect(":memory:").execute(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c").fetchone()
        run._walk_and_read = in_c
    """)
    _wait_for(marker.exists, run.alive, lambda: f"the run to enter its statement: {run.stderr.read_text()[-800:]}")
    time.sleep(0.2)  # inside it (the statement runs until the process ends)
    run.signal(sig)
    line = _check_one_line(*run.wait(), sig)
    assert "nothing of this run was kept" in line


# -- at random wall-clock moments, in fresh processes ----------------------------------------------


def _start(args: list[str], prelude: str = "", env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(prelude=textwrap.dedent(prelude)), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
    )
    assert proc.stdout.read(1) == b"S"
    return proc


def _signal_and_wait(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    os.killpg(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"still running {WAIT_S} s after the signal: {err.decode()[-800:]}")
    return proc.returncode, err.decode("utf-8", "replace")


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS.values(), ids=SIGNALS.keys())
def test_a_signal_at_random_moments_ends_the_run_in_one_line(sig, tmp_path, template, single_vector_dir, colbert_dir):
    rng = random.Random(26 + sig)
    repo = tmp_path / "repo"
    shutil.copytree(template, repo)
    trials = 0
    for i in range(4):
        hook = Hook.make(tmp_path / f"hook{i}")  # no target: it records where the run is
        proc = _start(_index_args(repo, single_vector_dir, colbert_dir),
                      env={"CODESEARCH_STAGE_HOOK": str(hook.folder)})
        delay = rng.uniform(0.0, 4.0)
        time.sleep(delay)
        if proc.poll() is not None:
            proc.communicate()
            continue  # the run ended before the signal: not a trial
        where = hook.where()
        rc, err = _signal_and_wait(proc, sig)
        if rc == 0:
            continue
        trials += 1
        _check_one_line(rc, err, sig, where=f"trial {i}, signalled {delay:.2f} s after the start, {where}")
        if (repo / ".codesearch" / "store.sqlite").exists():
            check_consistent(repo / ".codesearch", complete=False)
    assert trials, "every run ended before its signal"
    # (that a run resumes to a complete index: the test after the stage tests; a resumed run
    # after random trials: benchmarks/interrupts.py, whose last run must finish the index)


# -- where a plain KeyboardInterrupt fails -----------------------------------------------------------


def test_an_interrupt_raised_inside_a_finalizer_is_not_lost(tmp_path, template):
    """Python ignores an exception raised in a finalizer (it prints "Exception ignored"):
    a Ctrl-C that lands there was lost, and the run went on. A gc callback that takes a while
    stands for any ``__del__``: the walk below makes garbage, so collections keep running."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo)
    proc = _start(["index", str(repo), "--model", "none", "--multi-model", "none"], prelude="""
        import gc, time, pathlib
        import codesearch.indexing.run as run
        walk_and_read = run._walk_and_read
        def slow(r):
            # (from here: a callback during the imports before would slow them down by seconds)
            gc.callbacks.append(lambda phase, info: time.sleep(0.2) if phase == "start" else None)
            pathlib.Path(sys.argv[2], "walking").write_text("")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                gc.collect()  # the signal lands in the callback nearly always
            walk_and_read(r)
        run._walk_and_read = slow
    """)
    marker = repo / "walking"
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.3)
    _check_one_line(*_signal_and_wait(proc, signal.SIGINT), signal.SIGINT)


def test_an_interrupt_a_library_swallows_still_ends_the_run(tmp_path, template):
    """A bare ``except:`` in a library keeps the KeyboardInterrupt from the command: the
    watchdog, woken by the signal itself, ends the run with the one line."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo)
    proc = _start(["index", str(repo), "--model", "none", "--multi-model", "none"], prelude="""
        import time, pathlib
        import codesearch.indexing.run as run
        walk_and_read = run._walk_and_read
        def swallowing(r):
            pathlib.Path(sys.argv[2], "walking").write_text("")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    time.sleep(0.01)
                except BaseException:
                    pass
            walk_and_read(r)
        run._walk_and_read = swallowing
    """)
    while not (repo / "walking").exists() and proc.poll() is None:
        time.sleep(0.02)
    _check_one_line(*_signal_and_wait(proc, signal.SIGINT), signal.SIGINT)


def test_chunking_workers_leave_the_interrupt_to_the_run(tmp_path, template):
    """The pool's workers are in the terminal's process group: each printed a KeyboardInterrupt
    traceback (from multiprocessing/connection.py) before the run's own line."""
    repo = tmp_path / "repo"
    shutil.copytree(template, repo)
    proc = _start(["index", str(repo), "--model", "none", "--multi-model", "none"], prelude="""
        import time, pathlib
        import codesearch.indexing.chunking.parallel as parallel
        parallel.PARALLEL_MIN_FILES = 2
        chunk_item = parallel._chunk_item
        def slow(item):
            if item[0].endswith("mod0.py"):  # one busy worker; the other waits for work
                pathlib.Path(sys.argv[2], "chunking").touch()
                time.sleep(30)
            return chunk_item(item)
        parallel._chunk_item = slow
    """)
    while not (repo / "chunking").exists() and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(1.0)  # the other files are chunked
    _check_one_line(*_signal_and_wait(proc, signal.SIGINT), signal.SIGINT)


def test_servers_keep_their_own_signal_handling():
    """`serve` drains its searches and waits for its indexer on SIGTERM/SIGINT
    (codesearch.server.runner): the guard, with its 0.8 s deadline, stays out of it."""
    from codesearch.cli import interrupts

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    interrupts.install(["serve", ".", "--mcp", "stdio"])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert not interrupts.signalled()


def test_a_signal_after_the_summary_does_not_kill_the_process(tmp_path, template):
    # The run is done and has said so; a signal during the interpreter's teardown found the
    # default action back in place and killed the process (status -2, no line). CI hit it.
    repo = tmp_path / "repo"
    shutil.copytree(template, repo)
    for delay in (0.0, 0.01, 0.02, 0.03, 0.05):
        proc = _start(["index", str(repo), "--model", "none", "--multi-model", "none", "--rebuild"])
        said = b""
        while (line := proc.stderr.readline()) and b"models:" not in line:
            said += line
        assert line, said.decode()
        time.sleep(delay)
        try:
            rc, err = _signal_and_wait(proc, signal.SIGINT)
        except ProcessLookupError:  # it had ended: nothing to stop
            proc.communicate()
            continue
        assert rc in (0, 130), (delay, rc, err)
        if rc == 130:
            _check_one_line(rc, err, signal.SIGINT)
