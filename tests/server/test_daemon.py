"""The per-user daemon, with real processes: the CLI starts one and reuses it, racing
starts end with one, a daemon killed with -9 or of another version is replaced, the
environment switches it off, and nobody without the token (or of another user) reaches it.

Each test has a runtime folder of its own (``CODESEARCH_RUNTIME_DIR``) and stops every
daemon it started. The index is the sample repository with a tiny random dense model, so
a hybrid query needs a model (which is what makes the CLI go to the daemon).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemonkit import cli_argv, daemon_env, daemon_pids, run_cli, stop_all
from fixtures.sample_repo import write_sample_repo

from codesearch.server import daemon_client
from codesearch.server.runtime_dir import DaemonInfo, daemon_dir, read_info, write_info

STARTED = "started the codesearch daemon (pid "


def _query(repo: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return run_cli(["query", "greet the user", "-p", str(repo), "-k", "3", "--json", *extra], env)


def _hits(done: subprocess.CompletedProcess) -> list[tuple[str, int, int]]:
    return [(h["path"], h["start_line"], h["end_line"]) for h in json.loads(done.stdout)["results"]]


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/status").read_text()
            if "zombie" in state:
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_query_starts_one_daemon_says_so_once_and_reuses_it(repo, runtime):
    env = daemon_env(runtime)
    first = _query(repo, env)
    assert first.stderr.count(STARTED) == 1, first.stderr
    info = read_info(daemon_dir(runtime))
    assert info is not None and f"(pid {info.pid})" in first.stderr
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert stat.S_IMODE((daemon_dir(runtime) / "daemon.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((daemon_dir(runtime) / "daemon.log").stat().st_mode) == 0o600

    second = _query(repo, env)
    assert STARTED not in second.stderr
    assert read_info(daemon_dir(runtime)).pid == info.pid and daemon_pids(runtime) == [info.pid]
    assert _hits(second) == _hits(first)
    # The same answer as this process gives without the daemon.
    assert _hits(_query(repo, env, "--no-daemon")) == _hits(first)

    status = json.loads(run_cli(["daemon", "status", "--json"], env).stdout)
    assert status["running"] and status["pid"] == info.pid
    assert [r["root"] for r in status["roots"]] == [str(repo.resolve())]
    assert len(status["model_loads"]) == 1 and status["rss_bytes"] > 0
    assert "listening on" in run_cli(["daemon", "logs", "-n", "50"], env).stdout

    stopped = run_cli(["daemon", "stop"], env)
    assert f"pid {info.pid}" in stopped.stderr
    assert _wait_gone(info.pid) and not (daemon_dir(runtime) / "daemon.json").exists()
    assert "no codesearch daemon runs" in run_cli(["daemon", "status"], env).stdout


def test_racing_starts_end_with_exactly_one_daemon(runtime):
    env = daemon_env(runtime)
    procs = [subprocess.Popen([*cli_argv(), "daemon", "start"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    said = [err for _, err in outs if STARTED in err]
    assert len(said) == 1, outs
    pids = daemon_pids(runtime)
    assert len(pids) == 1 and read_info(daemon_dir(runtime)).pid == pids[0]
    # One started by hand while one runs holds no lock: it says so and exits 3.
    extra = subprocess.run([sys.executable, "-m", "codesearch.server.daemon", "--runtime-dir", str(runtime)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert extra.returncode == 3 and "another daemon" in extra.stderr
    assert daemon_pids(runtime) == pids


def test_kill_9_leaves_a_stale_file_and_the_next_query_starts_a_fresh_daemon(repo, runtime):
    env = daemon_env(runtime)
    before = _hits(_query(repo, env))
    old = read_info(daemon_dir(runtime))
    os.kill(old.pid, signal.SIGKILL)
    assert _wait_gone(old.pid)
    assert (daemon_dir(runtime) / "daemon.json").exists()  # nobody removed it: stale
    assert daemon_client.find(runtime) is None

    again = _query(repo, env)
    new = read_info(daemon_dir(runtime))
    assert new.pid != old.pid and f"(pid {new.pid})" in again.stderr
    assert _hits(again) == before  # nothing lost
    assert daemon_pids(runtime) == [new.pid]


def test_a_daemon_of_another_version_is_restarted_not_spoken_to(repo, runtime):
    env = daemon_env(runtime)
    run_cli(["daemon", "start"], env)
    old = read_info(daemon_dir(runtime))
    log_size = (daemon_dir(runtime) / "daemon.log").stat().st_size
    # What an older codesearch's daemon would have written (the same process stands in for it).
    fields = {**old.to_dict(), "version": "0.0.1-older", "protocol": 0}
    write_info(daemon_dir(runtime), DaemonInfo(**fields))
    assert daemon_client.find(runtime) is None and daemon_client.find_any(runtime) is not None

    done = _query(repo, env)
    new = read_info(daemon_dir(runtime))
    assert new.pid != old.pid and new.version != "0.0.1-older"
    assert _wait_gone(old.pid)
    assert STARTED in done.stderr and _hits(done)
    # The old one got SIGTERM, not a request: it logged no model load or root.
    old_log = (daemon_dir(runtime) / "daemon.log").read_text()[log_size:]
    assert f"serving {repo.resolve()}" in old_log  # the new daemon's line...
    assert old_log.count("serving ") == 1  # ...and only the new one's


def test_no_daemon_and_ci_keep_the_query_in_this_process(repo, runtime):
    for extra in ({"CODESEARCH_NO_DAEMON": "1"}, {"CI": "true"}):
        done = _query(repo, daemon_env(runtime, **extra))
        assert STARTED not in done.stderr and _hits(done)
        assert daemon_pids(runtime) == [] and not (daemon_dir(runtime) / "daemon.json").exists()


@pytest.mark.parametrize(("env", "flag", "want"), [
    ({}, False, daemon_client.START),
    ({"CODESEARCH_NO_DAEMON": "1"}, False, daemon_client.OFF),
    ({}, True, daemon_client.OFF),
    ({"CI": "true"}, False, daemon_client.USE),
    ({"CI": "1", "CODESEARCH_DAEMON": "1"}, False, daemon_client.START),
    ({"CODESEARCH_DAEMON": "0"}, False, daemon_client.OFF),
    ({"CODESEARCH_NO_DAEMON": "0"}, False, daemon_client.START),
])
def test_policy(env, flag, want):
    assert daemon_client.policy(flag, env) == want


def test_the_token_is_required_and_lax_files_are_not_believed(runtime):
    env = daemon_env(runtime)
    run_cli(["daemon", "start"], env)
    info = read_info(daemon_dir(runtime))
    for token in (None, "wrong", info.token[:-1]):
        conn = http.client.HTTPConnection(info.host, info.port, timeout=10)
        conn.request("GET", "/daemon/info", headers={"Authorization": f"Bearer {token}"} if token else {})
        assert conn.getresponse().status == 401
        conn.close()
    assert daemon_client.call(info, "GET", "/daemon/info")[0] == 200
    # A discovery file others could read (or write) is not believed.
    os.chmod(daemon_dir(runtime) / "daemon.json", 0o644)
    assert read_info(daemon_dir(runtime)) is None
    os.chmod(daemon_dir(runtime) / "daemon.json", 0o600)
    os.chmod(daemon_dir(runtime), 0o755)
    assert read_info(daemon_dir(runtime)) is None
    os.chmod(daemon_dir(runtime), 0o700)
    os.chmod(runtime, 0o755)  # the runtime folder above it, too
    assert daemon_client.find(runtime) is None
    os.chmod(runtime, 0o700)
    assert read_info(daemon_dir(runtime)).pid == info.pid == daemon_client.find(runtime).pid


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser")
def test_another_user_cannot_read_the_discovery_file_or_reach_the_daemon(tmp_path):
    runtime = tmp_path / "run"
    os.chmod(tmp_path, 0o755)  # the other user may walk to the folder, not into it
    env = daemon_env(runtime)
    runuser = shutil.which("runuser")
    try:
        run_cli(["daemon", "start"], env)
        info = read_info(daemon_dir(runtime))
        read = subprocess.run([runuser, "-u", "nobody", "--", "cat", str(daemon_dir(runtime) / "daemon.json")],
                              capture_output=True, text=True, timeout=30)
        assert read.returncode != 0 and info.token not in read.stdout
        probe = ("import http.client,sys; c=http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=10); "
                 "c.request('GET', '/daemon/info'); print(c.getresponse().status)")
        reach = subprocess.run([runuser, "-u", "nobody", "--", "/usr/bin/env", "python3", "-c", probe,
                                str(info.port)], capture_output=True, text=True, timeout=60,
                               env={"PATH": "/usr/bin:/bin"})
        if reach.returncode == 0:
            assert reach.stdout.strip() == "401"
        else:  # no python3 for that user: curl
            reach = subprocess.run([runuser, "-u", "nobody", "--", "curl", "-s", "-o", "/dev/null", "-w",
                                    "%{http_code}", f"http://127.0.0.1:{info.port}/daemon/info"],
                                   capture_output=True, text=True, timeout=60)
            assert reach.stdout.strip() == "401", reach
    finally:
        stop_all(runtime)
    assert daemon_pids(runtime) == []


def test_an_idle_daemon_exits_by_itself_and_removes_its_file(runtime):
    env = daemon_env(runtime)
    run_cli(["daemon", "start", "--idle-timeout", "2s"], env)
    info = read_info(daemon_dir(runtime))
    assert _wait_gone(info.pid, timeout=60.0)
    assert not (daemon_dir(runtime) / "daemon.json").exists()
    assert "idle for" in (daemon_dir(runtime) / "daemon.log").read_text()


def test_an_index_run_with_work_goes_to_the_running_daemon(tmp_path, single_vector_dir, runtime):
    from codesearch.api import CodeSearch

    root = write_sample_repo(tmp_path / "own")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    env = daemon_env(runtime, CODESEARCH_DAEMON_IDLE="600")
    _query(root, env)  # starts the daemon, which now serves the root
    (root / "later.py").write_text("def brand_new_helper(x):\n    return x + 1\n")
    done = run_cli(["index", str(root)], {**env, "PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported  # the daemon's model did the work
    assert "files unchanged" in done.stderr
    status = json.loads(run_cli(["daemon", "status", "--json"], env).stdout)
    (served,) = status["roots"]
    assert served["runs"] >= 1 and served["last_error"] is None
    found = run_cli(["query", "brand_new_helper", "-p", str(root), "--json", "--no-refresh"], env)
    assert _hits(found)[0][0] == "later.py"


def test_piped_output_through_the_daemon_is_the_same_as_without_it(repo, runtime):
    # The lean path prints plain text itself: the cut of a snippet says "... (N more lines)"
    # there as the Typer path does.
    env = daemon_env(runtime)
    args = ["query", "greet the user", "-p", str(repo), "-k", "3", "--max-lines", "2"]
    through = run_cli(args, env)
    assert read_info(daemon_dir(runtime)) is not None, through.stderr  # the daemon answered
    alone = run_cli([*args, "--no-daemon"], env)
    assert "more lines)" in alone.stdout
    assert through.stdout == alone.stdout
