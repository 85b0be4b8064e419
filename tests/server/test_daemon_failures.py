"""The daemon's failure modes beyond those of test_daemon, with real processes: a stuck daemon
(alive, accepting, never answering), the daemon's own working folder and environment, and
two codesearch versions side by side.

Each test has a runtime folder of its own and stops every daemon it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from daemonkit import daemon_env, daemon_pids, run_cli, same_hits

from codesearch.server import daemon_client
from codesearch.server.runtime_dir import daemon_dir, read_info


def _query(repo: Path, env: dict[str, str], *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_cli(["query", "greet the user", "-p", str(repo), "-k", "3", "--json", *extra], env, cwd=cwd)


def test_a_stuck_daemon_costs_a_short_probe_then_one_line_and_the_answer_here(repo, runtime):
    env = daemon_env(runtime)
    run_cli(["daemon", "start"], env)
    info = read_info(daemon_dir(runtime))
    assert daemon_client.responsive(info)
    os.kill(info.pid, signal.SIGSTOP)  # alive, its socket accepts (the kernel's backlog), no answer
    assert daemon_client.find(runtime) == info and not daemon_client.responsive(info, timeout=0.5)

    done = _query(repo, env)
    assert json.loads(done.stdout)["results"]  # answered in this process
    notices = [line for line in done.stderr.splitlines() if line.startswith("Notice:")]
    assert notices == [f"Notice: the codesearch daemon (pid {info.pid}) accepts connections but did not answer "
                       f"within {daemon_client.PROBE_S:g}s ('codesearch daemon stop' ends it); searching in this "
                       "process"], done.stderr

    # An index with work goes the same way, and `daemon stop` ends the stopped daemon.
    (repo / "stuck_probe.py").write_text("def stuck_probe():\n    return 2\n")
    try:
        indexed = run_cli(["index", str(repo)], env)
    finally:
        (repo / "stuck_probe.py").unlink()
    assert f"(pid {info.pid}) accepts connections but did not answer" in indexed.stderr
    assert "indexing in this process" in indexed.stderr
    stopped = run_cli(["daemon", "stop"], env)
    assert f"stopped the codesearch daemon (pid {info.pid})" in stopped.stderr
    assert daemon_pids(runtime) == []


def test_the_daemon_runs_in_its_own_folder_with_only_the_environment_it_needs(repo, runtime, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    env = daemon_env(runtime, SOME_EDITOR_SECRET="s3cret", CODESEARCH_TOKEN="serve-token")
    _query(repo, env, cwd=a)  # starts the daemon from folder a
    info = read_info(daemon_dir(runtime))
    assert Path(os.readlink(f"/proc/{info.pid}/cwd")) == daemon_dir(runtime).resolve()
    environ = dict(item.split("=", 1) for item in
                   Path(f"/proc/{info.pid}/environ").read_text().split("\0") if "=" in item)
    assert "SOME_EDITOR_SECRET" not in environ and "CODESEARCH_TOKEN" not in environ
    assert environ.get("PWD") != str(a) and environ["HF_HUB_OFFLINE"] == "1"
    assert environ["MALLOC_ARENA_MAX"] == "2"  # the arenas of its thread pools stay few

    # From folder b, the root given as a relative path is b's, not the daemon's folder's.
    rel = os.path.relpath(repo, b)
    through = _query(Path(rel), env, cwd=b)
    alone = _query(Path(rel), env, "--no-daemon", cwd=b)
    assert same_hits(json.loads(through.stdout)["results"], json.loads(alone.stdout)["results"])
    assert read_info(daemon_dir(runtime)).pid == info.pid and "Notice" not in through.stderr
    # A client that sends a relative path anyway is told so, not answered about another folder.
    status, doc = daemon_client.call(info, "POST", "/daemon/search",
                                     {"root": rel, "request": {"query": "greet the user"}})
    assert status >= 400 and "is relative" in doc["detail"], doc


def _as_version(tmp_path: Path, runtime: Path, version: str) -> dict[str, str]:
    """The environment of a codesearch that calls itself ``version``, in every process it
    starts (its daemon too): a ``sitecustomize`` sets ``codesearch.__version__`` first."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('CODESEARCH_TEST_VERSION'):\n    import codesearch\n"
        "    codesearch.__version__ = os.environ['CODESEARCH_TEST_VERSION']\n")
    env = daemon_env(runtime, CODESEARCH_TEST_VERSION=version)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return env


def test_two_versions_each_run_their_own_daemon_and_leave_the_other_alone(repo, runtime, tmp_path):
    old, new = _as_version(tmp_path, runtime, "9.0.0a1"), _as_version(tmp_path, runtime, "9.0.0b2")
    run_cli(["daemon", "start"], old)
    first = _query(repo, new)  # starts the new version's daemon beside the old one's
    assert "started the codesearch daemon" in first.stderr and json.loads(first.stdout)["results"]
    a = read_info(daemon_dir(runtime, version="9.0.0a1"))
    b = read_info(daemon_dir(runtime, version="9.0.0b2"))
    assert (a.version, b.version) == ("9.0.0a1", "9.0.0b2")
    assert sorted(daemon_pids(runtime)) == sorted([a.pid, b.pid])
    # Each version's commands use its own daemon, and neither restarts the other's.
    for env in (old, new, old):
        done = _query(repo, env)
        assert "started" not in done.stderr and json.loads(done.stdout)["results"]
    assert sorted(daemon_pids(runtime)) == sorted([a.pid, b.pid])

    status = json.loads(run_cli(["daemon", "status", "--json"], old).stdout)
    assert status["running"] and status["version"] == "9.0.0a1" and status["pid"] == a.pid
    assert [(o["version"], o["pid"]) for o in status["others"]] == [("9.0.0b2", b.pid)]
    stopped = run_cli(["daemon", "stop"], old)
    assert f"stopped the codesearch daemon (pid {a.pid})" in stopped.stderr
    assert f"also running: the daemon of codesearch 9.0.0b2 (pid {b.pid}" in stopped.stderr
    assert daemon_pids(runtime) == [b.pid]
    run_cli(["daemon", "stop"], new)
    assert daemon_pids(runtime) == []


def test_the_daemon_trims_its_heap_once_per_quiet_spell(monkeypatch):
    """After a burst of work the daemon hands freed heap back once it has been quiet for
    TRIM_AFTER_S, and not again until new work came (trimming is not free)."""
    import threading
    import time

    from codesearch.server import daemon

    trims = []
    monkeypatch.setattr(daemon, "_trim_heap", lambda: trims.append(time.monotonic()))
    monkeypatch.setattr(daemon, "TRIM_AFTER_S", 0.3)

    class Server:
        should_exit = False

    class Registry:
        last_activity = time.monotonic()

        def busy(self):
            return False

    server, registry = Server(), Registry()
    watcher = threading.Thread(target=daemon._watch_idle, args=(server, registry, 0.8 * 4 * 60))
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while not trims and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(trims) == 1 and trims[0] - registry.last_activity >= 0.3
        time.sleep(1.5)
        assert len(trims) == 1  # quiet still: no second trim
        registry.last_activity = time.monotonic()  # new work
        deadline = time.monotonic() + 10
        while len(trims) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(trims) == 2
    finally:
        server.should_exit = True
        watcher.join(5)


def test_trimming_the_heap_is_harmless_here():
    from codesearch.server import daemon

    daemon._trim_heap()  # glibc: returns pages; elsewhere: nothing, and no error
