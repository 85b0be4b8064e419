"""``codesearch index`` through the per-user daemon, with real processes: a first index and a
``--rebuild`` with a model are the daemon's runs (started when none runs; the CLI imports no
torch), Ctrl-C of the CLI cancels the daemon's run in one line, a run refused by the index
lock says so in one line, and a lexical-only index stays in the CLI's process.

Each test has a runtime folder of its own and stops every daemon it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from daemonkit import cli_argv, daemon_env, run_cli
from fixtures.sample_repo import write_sample_repo
from fixtures.trees import git

from codesearch.server import daemon_client
from codesearch.server.repos import CANCELLED
from codesearch.server.runtime_dir import daemon_dir, read_info

STARTED = "started the codesearch daemon (pid "


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _run_state(runtime: Path, root: Path) -> dict:
    info = daemon_client.find(runtime)
    assert info is not None
    status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={root}")
    assert status == 200, doc
    return doc["indexing"]


def test_a_first_index_with_a_model_starts_the_daemon_which_runs_it(tmp_path, single_vector_dir, runtime):
    root = write_sample_repo(tmp_path / "repo")
    env = {**daemon_env(runtime), "PYTHONPROFILEIMPORTTIME": "1"}
    done = run_cli(["index", str(root), "--model", str(single_vector_dir), "--multi-model", "none"], env)
    assert STARTED in done.stderr and done.stderr.count(STARTED) == 1
    assert "torch" not in _imported(done.stderr)  # the daemon loaded the model, not the CLI
    assert "files indexed" in done.stderr or "indexed" in done.stderr
    status = json.loads(run_cli(["daemon", "status", "--json"], env).stdout)
    (served,) = status["roots"]
    assert served["root"] == str(root.resolve()) and served["last_error"] is None
    # One run, whose summary is the CLI's: not a second run that found every file unchanged.
    assert served["runs"] == 1 and served["last_summary"]["files_indexed"] > 0
    assert "files indexed: 0" not in done.stderr
    assert [m["name"] for m in status["models"]] == [str(single_vector_dir)]
    # The index is the model's: a dense query answers from it.
    hits = json.loads(run_cli(["query", "greet the user", "-p", str(root), "--mode", "dense", "--json"], env).stdout)
    assert hits["results"]

    # --rebuild goes to the same daemon: no second start, no torch here, one model load.
    again = run_cli(["index", str(root), "--rebuild"], env)
    assert STARTED not in again.stderr and "torch" not in _imported(again.stderr)
    status = json.loads(run_cli(["daemon", "status", "--json"], env).stdout)
    (served,) = status["roots"]
    assert len(status["model_loads"]) == 1 and served["last_error"] is None
    assert served["last_summary"]["files_indexed"] > 0  # all of them again: a rebuild, not a no-op run


def test_a_lexical_only_first_index_stays_in_this_process(tmp_path, runtime):
    root = write_sample_repo(tmp_path / "repo")
    done = run_cli(["index", str(root), "--model", "none", "--multi-model", "none"], daemon_env(runtime))
    assert STARTED not in done.stderr and read_info(daemon_dir(runtime)) is None
    assert (root / ".codesearch" / "store.sqlite").is_file()


def test_no_daemon_and_ci_index_in_this_process(tmp_path, single_vector_dir, runtime):
    root = write_sample_repo(tmp_path / "repo")
    for extra, args in (({"CI": "1"}, []), ({}, ["--no-daemon"])):
        run_cli(["index", str(root), "--model", str(single_vector_dir), "--multi-model", "none", "--rebuild", *args],
                daemon_env(runtime, **extra))
        assert read_info(daemon_dir(runtime)) is None


def _many_files(root: Path, n: int) -> Path:
    """A repository large enough that an index run lasts seconds (to be interrupted)."""
    for i in range(n):
        folder = root / f"pkg{i % 40}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_text(
            "".join(f"def handler_{i}_{j}(request, retries={j}):\n    '''Handle request {j} of module {i}.'''\n"
                    f"    return [request.get(k) for k in range({j})]\n\n" for j in range(6)))
    return root


def test_ctrl_c_of_the_cli_cancels_the_daemons_run_in_one_line(tmp_path, single_vector_dir, runtime):
    root = _many_files(tmp_path / "big", 3000)
    env = daemon_env(runtime)
    run_cli(["daemon", "start"], env)
    proc = subprocess.Popen([*cli_argv(), "index", str(root), "--model", str(single_vector_dir), "--multi-model",
                             "none"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # the daemon's run has begun (it reports progress)
            info = daemon_client.find(runtime)
            status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={root.resolve()}")
            running = status == 200 and doc["indexing"]["state"] == "running"
            progress = doc["indexing"]["progress"] if running else None
            # Early in a stage, so the run is still going when the cancel arrives (seen: a run
            # at its last report finished before it, exit 0).
            if progress and 2 * progress["done"] < progress["total"]:
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, doc
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode == 0 and "files indexed" in err:  # as tests/test_user_errors.py does
        pytest.skip("the daemon's run finished before the cancel arrived")
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == ("Interrupted: the daemon stopped the index run (the index is intact; run the command "
                         "again to resume)"), err
    assert "Traceback" not in err
    deadline = time.monotonic() + 60
    while (state := _run_state(runtime, root.resolve()))["state"] != "idle":
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert state["last_error"] == CANCELLED and state["runs"] == 1
    # The daemon lives on and the next index resumes and finishes the run.
    done = run_cli(["index", str(root), "--model", str(single_vector_dir), "--multi-model", "none"], env)
    assert "Error" not in done.stderr
    assert _run_state(runtime, root.resolve())["last_error"] is None, done.stderr


def test_a_run_refused_by_the_index_lock_is_one_line_naming_the_writer(tmp_path, single_vector_dir, runtime):
    from codesearch.api import CodeSearch
    from codesearch.store import IndexLock

    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    (root / "later.py").write_text("def later():\n    return 1\n")
    env = daemon_env(runtime)
    with IndexLock(root / ".codesearch").acquire():  # another writer (a --no-daemon run) holds the index
        done = run_cli(["index", str(root)], env, check=False)
    assert done.returncode == 1, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert f"being written by another codesearch process (pid {os.getpid()})" in line
    assert "Traceback" not in done.stderr


def test_a_search_before_the_first_index_commits_answers_at_once_with_where_the_run_is(tmp_path):
    # In this process: the daemon's app and registry, with the daemon's one run slot held (as
    # another root's run holds it), so the first index of this root is running and has
    # committed nothing yet, for as long as the test needs.
    from starlette.testclient import TestClient

    from codesearch.server.daemon_app import Registry, build_app
    from codesearch.server.repos import RepoOptions

    root = write_sample_repo(tmp_path / "repo")
    registry = Registry(watch=False)
    app = build_app(registry, token="t0k", idle_timeout_s=0, on_stop=lambda: None)
    ask = {"root": str(root), "request": {"query": "retry with backoff", "k": 3}}
    auth = {"Authorization": "Bearer t0k"}
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            with registry.run_lock:
                registry.repo(root, RepoOptions(model=None, multi_model=None))
                response = client.post("/daemon/search", headers=auth, json=ask)
                assert response.status_code == 200, response.text
                doc = response.json()
                assert doc["schema_version"] == 1 and doc["results"] == []
                (notice,) = doc["notices"]
                assert notice.startswith(f"the first index of {root.resolve()} is running"), notice
            assert registry.repo(root).wait_idle(60)
            response = client.post("/daemon/search", headers=auth, json=ask)
            assert response.status_code == 200 and response.json()["results"], response.json()
    finally:
        registry.close(10.0)


def test_a_query_of_a_folder_whose_first_index_the_daemon_makes_asks_the_daemon(tmp_path):
    # The daemon here is this process (its app on a real loopback socket, its discovery file
    # in a runtime folder of the test's), so that its one run slot can be held: the first
    # index of the root is running and has not even created the store yet.
    import secrets
    import threading
    import time as clock

    import uvicorn

    from codesearch import __version__
    from codesearch.server.daemon_app import Registry, build_app
    from codesearch.server.network import bind_socket
    from codesearch.server.repos import RepoOptions
    from codesearch.server.runtime_dir import PROTOCOL, DaemonInfo, daemon_dir, ensure_runtime_dir, write_info

    root = write_sample_repo(tmp_path / "repo")
    runtime = tmp_path / "run"
    registry = Registry(watch=False)
    token = secrets.token_urlsafe(16)
    app = build_app(registry, token=token, idle_timeout_s=0, on_stop=lambda: None)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            clock.sleep(0.02)
        folder = ensure_runtime_dir(daemon_dir(ensure_runtime_dir(runtime)))
        write_info(folder, DaemonInfo(host="127.0.0.1", port=sock.getsockname()[1], pid=os.getpid(), token=token,
                                      version=__version__, protocol=PROTOCOL, started_at=clock.time(),
                                      idle_timeout_s=0))
        with registry.run_lock:
            registry.repo(root, RepoOptions(model=None, multi_model=None))
            assert not (root / ".codesearch" / "store.sqlite").exists()
            done = run_cli(["query", "retry with backoff", "-p", str(root), "--json"], daemon_env(runtime))
        doc = json.loads(done.stdout)
        assert doc["results"] == [] and doc["notices"][0].startswith(f"the first index of {root.resolve()} is"), doc
        assert "no index yet" not in done.stderr  # it did not index the folder itself
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        registry.close(10.0)


def test_the_registry_says_which_call_added_a_root_and_finds_one_without_adding(tmp_path):
    # The index handler's "this request started the root" (so the start's run covers it)
    # and `served_at` read this public answer, not the registry's private list.
    from codesearch.server.daemon_app import Registry
    from codesearch.server.repos import RepoOptions

    root = write_sample_repo(tmp_path / "repo")
    registry = Registry(watch=False)
    try:
        lexical = RepoOptions(model=None, multi_model=None)
        assert registry.served(root) is None and registry.repos == []  # looking adds nothing
        with registry.run_lock:  # (no run starts meanwhile)
            first, added = registry.repo_added(root, lexical)
            assert added
            again, added = registry.repo_added(f"{root}/.", lexical)
            assert again is first and not added
            assert registry.served(str(root)) is first and registry.repo(root) is first
            other, added = registry.repo_added(root, RepoOptions(model=None, multi_model=None, exclude=("*.md",)))
            assert added and other is not first  # new options replace the root: a new start
            assert registry.served(root) is other and registry.repos == [other]
        assert registry.served(tmp_path) is None
    finally:
        registry.close(10.0)


def test_a_no_op_index_of_a_watched_root_takes_the_daemons_word(tmp_path, single_vector_dir, runtime, monkeypatch):
    """Once the daemon's refresh before a search found the index current, its watcher vouches
    for the files: a no-op ``codesearch index`` stats none of them (at 114k files that is most
    of its second). A change the watcher saw withdraws that word until the watcher's run of it
    ends; another index folder, a daemon switched off, never had it."""
    from codesearch.cli import lean

    root = write_sample_repo(tmp_path / "repo")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "sample")
    time.sleep(1.1)  # (git's own files must be older than the watcher's word by a margin: file times are coarse)
    args = ["index", str(root), "--model", str(single_vector_dir), "--multi-model", "none"]
    env = daemon_env(runtime)
    run_cli(args, env)  # the first index: the daemon's run; it serves and watches the root now
    run_cli(["query", "greet the user", "-p", str(root), "--json"], env)  # its refresh: the index is current
    monkeypatch.setenv("CODESEARCH_RUNTIME_DIR", str(runtime))
    for name in ("CODESEARCH_NO_DAEMON", "CI"):
        monkeypatch.delenv(name, raising=False)
    since = lean._watched_since(root, {})
    assert since is not None and since <= time.time()
    assert lean._watched_since(root, {"index_dir": str(tmp_path / "elsewhere")}) is None
    assert lean._watched_since(root, {"no_daemon": True}) is None
    # git on the no-op's PATH notes each call: with the watcher's word, no listing is made.
    shim, calls = tmp_path / "bin", tmp_path / "git-calls"
    shim.mkdir()
    (shim / "git").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {shutil.which("git")} "$@"\n')
    (shim / "git").chmod(0o755)
    noop = run_cli(args, {**env, "PATH": f"{shim}{os.pathsep}{env['PATH']}"})
    assert "files indexed: 0" in noop.stderr, noop.stderr
    assert not calls.exists(), calls.read_text()
    alone = run_cli([*args, "--no-daemon"], {**env, "PATH": f"{shim}{os.pathsep}{env['PATH']}"})
    assert "files indexed: 0" in alone.stderr and "ls-files" in calls.read_text()  # (the check of every file)

    # An edit: the watcher sees it, which withdraws the word; its run of the edit, which saw no
    # other event, gives a new word (from before that run), with no search in between.
    (root / "brand_new.py").write_text("def brand_new_function():\n    return 1\n")
    deadline = time.monotonic() + 60
    while ((again := lean._watched_since(root, {})) is None or again <= since) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert again is not None and again > since
    noop = run_cli(args, {**env, "PATH": f"{shim}{os.pathsep}{env['PATH']}"})
    assert "files indexed: 0" in noop.stderr, noop.stderr
    assert calls.read_text().count("ls-files") == 1  # (the --no-daemon run's alone)
    hits = json.loads(run_cli(["query", "brand_new_function", "-p", str(root), "--mode", "lexical", "--json",
                               "--no-refresh"], env).stdout)["results"]
    assert hits and hits[0]["path"] == "brand_new.py"
