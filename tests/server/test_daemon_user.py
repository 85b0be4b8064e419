"""The daemon as a user meets it, with real processes, files and models: what it says when a
model cannot load (the one line this process would say), a model folder moved away or
spelled two ways, roots whose folder is gone or whose first run failed, ``daemon status``
and ``daemon logs`` for people, and a lexical query of a big index.

The tests share one daemon (a runtime folder of this module's, stopped after it); each
works on repositories and model folders of its own.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from daemonkit import daemon_env, daemon_pids, run_cli, stop_all
from fixtures.sample_repo import write_sample_repo

from codesearch.server import daemon_client


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(runtime folder, environment) of this module's daemon; stopped after the module."""
    runtime = tmp_path_factory.mktemp("daemon") / "run"
    try:
        yield runtime, daemon_env(runtime)
    finally:
        stop_all(runtime)
        assert daemon_pids(runtime) == []


def _status(env: dict[str, str]) -> dict:
    return json.loads(run_cli(["daemon", "status", "--json"], env).stdout)


def _served(env: dict[str, str]) -> list[str]:
    return [r["root"] for r in _status(env).get("roots", [])]


def _indexed(tmp_path: Path, name: str, model: Path, env: dict[str, str]) -> Path:
    root = write_sample_repo(tmp_path / name)
    run_cli(["index", str(root), "--model", str(model), "--multi-model", "none", "--quiet"], env)
    return root


def _wait(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_model_that_cannot_load_is_the_one_line_error_from_the_daemon(shared, tmp_path, single_vector_dir):
    runtime, env = shared
    root = _indexed(tmp_path, "repo", single_vector_dir, env)
    assert daemon_client.find(runtime) is not None  # the run was the daemon's: it serves the root
    for model, said in (("/nonexistent", "Model path '/nonexistent' does not exist"),
                        ("nobody/not-cached", "Model 'nobody/not-cached' is not in the local cache")):
        started = time.monotonic()
        done = run_cli(["index", str(root), "--model", model, "--quiet"], env, check=False)
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(f"Error: {said}") and done.stderr.count("\n") == 1, done.stderr
        assert "answered" not in done.stderr and "in this process" not in done.stderr
        assert time.monotonic() - started < 60
        logs = run_cli(["daemon", "logs", "-n", "20"], env).stdout
        assert said in logs


def test_a_moved_model_folder_is_blamed_as_a_fresh_process_blames_it(shared, tmp_path, single_vector_dir):
    _, env = shared
    model = tmp_path / "models" / "mine"
    shutil.copytree(single_vector_dir, model)
    root = _indexed(tmp_path, "repo", model, env)
    run_cli(["query", "retry with backoff", "-p", str(root), "--json"], env)  # the daemon holds the model now
    model.rename(tmp_path / "models" / "moved")
    with open(root / "src" / "http_client.py", "a") as fh:
        fh.write("\n\ndef added_after_the_move():\n    return 1\n")
    daemon = run_cli(["query", "retry with backoff", "-p", str(root), "--json"], env)
    here = run_cli(["query", "retry with backoff", "-p", str(root), "--json", "--no-daemon"], env)
    gone = f"Model path '{model}' does not exist"
    for done in (daemon, here):
        assert gone in done.stderr, done.stderr
        assert "another tokenizer" not in done.stderr and "tokenizer.json" not in done.stderr
        assert json.loads(done.stdout)["results"]
    # The root was served for `index --model PATH`, so the daemon's run asks for that model by
    # name (an error: said), and its searches answer from the copy it holds in memory.


def test_one_model_folder_spelled_two_ways_is_one_load(shared, tmp_path, single_vector_dir):
    _, env = shared
    folder = tmp_path / "venv" / "lib" / "model"
    shutil.copytree(single_vector_dir, folder)
    (tmp_path / "venv" / "bin").mkdir()
    loads_before = len(_status(env)["model_loads"])
    _indexed(tmp_path, "one", folder, env)
    _indexed(tmp_path, "two", tmp_path / "venv" / "bin" / ".." / "lib" / "model", env)
    status = _status(env)
    names = [m["name"] for m in status["models"] if "venv" in m["name"]]
    assert names == [str(folder)]
    assert len(status["model_loads"]) == loads_before + 1


def test_a_root_whose_folder_is_gone_is_not_served_on(shared, tmp_path, single_vector_dir):
    _, env = shared
    root = _indexed(tmp_path, "repo", single_vector_dir, env)
    assert str(root) in _served(env)
    shutil.rmtree(root)
    assert _wait(lambda: str(root) not in _served(env)), _served(env)


def test_a_folder_whose_first_run_failed_is_not_served(shared, tmp_path, single_vector_dir):
    _, env = shared
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_cli(["index", str(empty), "--model", str(single_vector_dir), "--multi-model", "none", "--quiet"], env,
                   check=False)
    said = [line for line in done.stderr.splitlines() if not line.startswith("Notice: started the codesearch daemon")]
    assert done.returncode == 1 and len(said) == 1 and said[0].startswith("Error: nothing to index"), done.stderr
    assert str(empty) not in _served(env)
    assert "is not served by the daemon" not in done.stderr  # the run's own error, not the follow-up's


def test_daemon_status_speaks_to_people(shared, tmp_path, single_vector_dir):
    _, env = shared
    root = _indexed(tmp_path, "repo", single_vector_dir, env)
    text = run_cli(["daemon", "status"], env).stdout
    line = next(line for line in text.splitlines() if line.strip().startswith(f"{root}:"))
    assert "{" not in text and "'" not in line, text
    assert "memory " in line and "MiB" in line
    doc = _status(env)
    served = next(r for r in doc["roots"] if r["root"] == str(root))
    assert served["memory"]["heap_bytes"] > 0 and served["memory"]["mapped_bytes"] is not None
    assert all(m["heap_bytes"] > 0 for m in doc["models"])


def test_progress_of_a_running_root_reads_as_the_index_progress():
    import dataclasses

    from codesearch.cli.daemon import root_line
    from codesearch.types import ProgressEvent

    event = ProgressEvent("encode", 77, 200, files=1234, chunks=5678, tokens=99, tokens_per_s=2551.602174017563)
    line = root_line({"state": "running", "progress": dataclasses.asdict(event), "runs": 1, "watching": True,
                      "memory": {"heap_bytes": 3 * 2**20, "mapped_bytes": 2**20}, "last_error": None})
    assert line == ("running (encode 77/200 texts, 1,234 files, 5,678 chunks, 2,552 tok/s), 1 run, watching, "
                    "memory 4 MiB (heap 3 MiB, mapped index files 1 MiB)")


def test_daemon_logs_hold_what_a_user_needs(shared, tmp_path, single_vector_dir):
    _, env = shared
    _indexed(tmp_path, "repo", single_vector_dir, env)  # loads a model and faiss in the daemon
    logs = run_cli(["daemon", "logs", "-n", "200"], env).stdout
    assert "loaded model" in logs and "serving " in logs
    for noise in ("faiss.loader", "ModuleNotFoundError", "Traceback", "session manager started"):
        assert noise not in logs, logs


def test_a_lexical_query_of_a_big_index_is_the_daemons(tmp_path):
    """Past `LEXICAL_DAEMON_CHUNKS` a lexical query starts the daemon, which keeps the index
    open; below it the query is searched in the process and starts none. (The threshold is
    lowered through its environment variable: the sample repository is small.)"""
    runtime = tmp_path / "run"
    root = write_sample_repo(tmp_path / "repo")
    try:
        env = daemon_env(runtime)
        run_cli(["index", str(root), "--model", "none", "--multi-model", "none", "--quiet"], env)
        small = run_cli(["query", "retry with backoff", "-p", str(root), "--mode", "lexical", "--json"], env)
        assert json.loads(small.stdout)["results"] and daemon_client.find(runtime) is None
        big = run_cli(["query", "retry with backoff", "-p", str(root), "--mode", "lexical", "--json"],
                      {**env, "CODESEARCH_LEXICAL_DAEMON_CHUNKS": "1"})
        assert json.loads(big.stdout)["results"] == json.loads(small.stdout)["results"]
        assert "started the codesearch daemon" in big.stderr
        assert [r["root"] for r in _status(env)["roots"]] == [str(root)]
    finally:
        stop_all(runtime)


# -- a query right after a change --------------------------------------------------------------

_ADDED = "\n\ndef vanishing_helper_xyz():\n    return 42\n"


def _finds(result) -> bool:
    return any("vanishing_helper_xyz" in (hit.text or "") for hit in result.hits)


def test_a_search_never_answers_from_the_generation_before_a_commit(tmp_path, monkeypatch):
    """A run commits the files as they are, then opens that generation for searches, which
    takes a moment (here held for a second, on the run's thread, so that the moment is
    certain); a search in between must answer from the committed generation, not the one
    before (which still holds a function the revert removed)."""
    import threading

    from codesearch.api import CodeSearch
    from codesearch.server.daemon_app import Registry
    from codesearch.store import Store

    root = write_sample_repo(tmp_path / "repo")
    target = root / "src" / "http_client.py"
    original = target.read_text()
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    registry = Registry(watch=True, debounce_s=0.05)
    gate = threading.Event()
    try:
        served = registry.repo(root)
        target.write_text(original + _ADDED)

        def edited_is_found() -> bool:
            registry.refresh(served)
            return _finds(served.query("vanishing_helper_xyz", 3, mode="lexical"))

        assert _wait(edited_is_found)
        # The watcher saw that edit too: let its run (a no-op now) end before the gate goes in,
        # or the gate holds that run, and the revert's run waits behind it on a loaded machine.
        from codesearch.store import IndexLock

        time.sleep(0.3)
        assert _wait(lambda: served.watcher.debouncer._first is None and not IndexLock.writer_active(
            root / ".codesearch"))
        swap = served._live.swap

        def slow_swap(**kwargs):  # the run's open of its new generation takes a second
            if threading.current_thread().name.startswith("codesearch-index"):
                gate.wait(10)
            return swap(**kwargs)

        monkeypatch.setattr(served._live, "swap", slow_swap)

        def committed() -> int:
            with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
                return store.generation

        before = committed()
        target.write_text(original)  # what `git checkout` of the file does
        assert _wait(lambda: committed() > before, 60.0)  # the run committed; its swap waits on the gate
        threading.Timer(1.0, gate.set).start()
        notices = registry.refresh(served)
        result = served.query("vanishing_helper_xyz", 3, mode="lexical")
        assert not _finds(result) or notices, (notices, [h.path for h in result.hits])
    finally:
        gate.set()
        registry.close(10.0)


def test_queries_right_after_git_checkout_reflect_the_files_or_say_so(shared, tmp_path):
    """Through a real daemon: a function added, searched, then removed by ``git checkout``
    and searched at once, several times over; each answer has it only with a notice that
    the index is being brought up to date."""
    import subprocess

    _, env = shared
    root = write_sample_repo(tmp_path / "repo")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "sample"], check=True)
    run_cli(["index", str(root), "--model", "none", "--multi-model", "none", "--quiet"], env)
    query = ["query", "vanishing_helper_xyz", "-p", str(root), "-k", "3", "--json",
             "--mode", "lexical"]
    daemon_env_ = {**env, "CODESEARCH_LEXICAL_DAEMON_CHUNKS": "1"}  # lexical queries go to the daemon
    run_cli(["query", "warm up", "-p", str(root), "--json"], daemon_env_)
    target = root / "src" / "http_client.py"
    for _ in range(5):
        with open(target, "a") as fh:
            fh.write(_ADDED)
        added = json.loads(run_cli(query, daemon_env_).stdout)
        assert any("vanishing_helper_xyz" in h["text"] for h in added["results"]), added
        subprocess.run([*git, "checkout", "-q", "--", "src/http_client.py"], check=True)
        after = json.loads(run_cli(query, daemon_env_).stdout)
        stale = any("vanishing_helper_xyz" in h["text"] for h in after["results"])
        assert not stale or after["notices"], after
    # Nothing changed since: the daemon answers without looking at the files (the watcher
    # caught up), and from the files as they are.
    again = json.loads(run_cli(query, daemon_env_).stdout)
    assert not any("vanishing_helper_xyz" in h["text"] for h in again["results"]) and not again["notices"]


def test_a_root_a_search_adds_is_watched_once_that_search_is_answered(tmp_path, monkeypatch):
    """The first search of a root does not wait for its watch (an inotify watch per folder,
    added in Python: 1.6-1.9 s for a 114k-file monorepo's 28k folders). The watch starts once
    that search is answered and then checks the files as the next search would: an edit made
    before the watch began is indexed, and, nothing else changing, the watcher's word stands
    (the next search and no-op index look at no file)."""
    from codesearch.api import CodeSearch
    from codesearch.server import repos
    from codesearch.server.daemon_app import Registry

    monkeypatch.setattr(repos, "WATCH_DEFER_S", 60.0)  # (only the search starts it here)
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    registry = Registry(watch=True, debounce_s=0.05)
    try:
        served = registry.repo(root, defer_watch=True)
        time.sleep(0.3)
        assert served.watcher is None and served.events_seen() is None and not registry.known_current(served)
        (root / "late.py").write_text("def added_before_the_watch():\n    return 1\n")  # no watcher sees it
        def found() -> bool:  # (asked with no refresh)
            hits = served.query("added_before_the_watch", 3, mode="lexical").hits
            return any("added_before_the_watch" in (hit.text or "") for hit in hits)

        assert not found()
        assert _wait(lambda: served.watcher is not None)
        assert _wait(found)  # the check's run
        assert _wait(lambda: registry.known_current(served))
    finally:
        registry.close(10.0)
