"""Watch mode: saves become searchable within seconds, a git checkout of a thousand files is
one batch, the index folder's and .git's own events trigger nothing."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fixtures.sample_repo import write_sample_repo
from serverkit import LEXICAL, start_server

from codesearch.server.watch import Debouncer, RepoWatcher

FIND_TIMEOUT_S = 8.0  # generous: 2 cores shared with other test suites


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A git repo served with the watcher on (not pre-indexed: the server builds it)."""
    if shutil.which("git") is None:  # pragma: no cover - git is part of the dev setup
        pytest.fail("git is needed for the checkout test")
    root = write_sample_repo(tmp_path_factory.mktemp("watched") / "repo")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")
    server = start_server([str(root), *LEXICAL, "--debounce-ms", "200"], tmp_path_factory.mktemp("logs"))
    try:
        server.wait_idle(min_runs=1)
        yield root, server
    finally:
        server.stop()


def _find(server, query: str, path: str | None = None) -> list[dict]:
    """Hits whose text holds ``query`` verbatim (a ranked hit may match sub-tokens only)."""
    with server.client() as http:
        response = http.post("/search", json={"query": query, "mode": "lexical", "k": 5})
    assert response.status_code == 200, response.text
    return [r for r in response.json()["results"] if (path is None or r["path"] == path) and query in r["text"]]


def _poll(predicate, timeout: float = FIND_TIMEOUT_S) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - start


def _runs(server) -> int:
    with server.client() as http:
        return http.get("/status").json()["roots"][0]["indexing"]["runs"]


def test_a_saved_file_becomes_searchable(watched):
    root, server = watched
    (root / "src" / "widgets.py").write_text("def frobnicate_widget_inventory(n):\n    return n * 2\n")
    took = _poll(lambda: _find(server, "frobnicate_widget_inventory", "src/widgets.py"))
    assert took < FIND_TIMEOUT_S


def test_an_edit_replaces_the_old_code(watched):
    root, server = watched
    path = root / "src" / "config.js"
    path.write_text(path.read_text().replace("parseConfigFile", "loadSettingsDocument"))
    _poll(lambda: _find(server, "loadSettingsDocument", "src/config.js"))
    assert not _find(server, "parseConfigFile")


def test_a_deleted_file_leaves_the_results(watched):
    root, server = watched
    assert _find(server, "customer_email", "db/schema.sql")
    (root / "db" / "schema.sql").unlink()
    _poll(lambda: not _find(server, "customer_email", "db/schema.sql"))


def test_events_in_the_index_folder_and_git_trigger_nothing(watched):
    root, server = watched
    server.wait_idle()
    before = _runs(server)
    for i in range(20):
        (root / ".codesearch" / f"scratch-{i}.tmp").write_text("x")
        (root / ".git" / f"scratch-{i}").write_text("x")
    time.sleep(1.0)  # four quiet periods
    assert _runs(server) == before
    for i in range(20):
        (root / ".codesearch" / f"scratch-{i}.tmp").unlink()
        (root / ".git" / f"scratch-{i}").unlink()


def test_a_checkout_of_a_thousand_files_is_one_batch(watched):
    root, server = watched
    server.wait_idle()
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "edits")
    _git(root, "checkout", "-q", "-b", "feature")
    gen = root / "generated"
    gen.mkdir()
    for i in range(1000):
        (gen / f"mod_{i:04d}.py").write_text(f"def handler_number_{i:04d}(request):\n    return {i}\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "many files")
    _git(root, "checkout", "-q", "main")  # deletes the 1000 files
    server.wait_idle(timeout=120)
    _poll(lambda: not _find(server, "handler_number_0500"), timeout=60)
    before = _runs(server)

    _git(root, "checkout", "-q", "feature")  # creates them again, in one burst
    _poll(lambda: _find(server, "handler_number_0999", "generated/mod_0999.py"), timeout=120)
    status = server.wait_idle(timeout=120)
    run = status["roots"][0]["indexing"]
    assert run["runs"] - before <= 2  # one run, or one more if the first began mid-burst
    assert status["roots"][0]["index"]["files"] >= 1000
    assert _find(server, "handler_number_0001", "generated/mod_0001.py")


def test_debouncer_fires_once_after_a_burst():
    fired: list[float] = []
    debouncer = Debouncer(lambda: fired.append(time.monotonic()), quiet_s=0.15, max_delay_s=5.0)
    try:
        for _ in range(10):
            debouncer.poke()
            last_poke = time.monotonic()
            time.sleep(0.02)
        _poll(lambda: fired, timeout=3)
        time.sleep(0.3)
        assert len(fired) == 1
        assert fired[0] - last_poke >= 0.14
    finally:
        debouncer.stop()


def test_debouncer_max_delay_bounds_a_never_ending_burst():
    fired: list[float] = []
    debouncer = Debouncer(lambda: fired.append(time.monotonic()), quiet_s=0.2, max_delay_s=0.3)
    stop = threading.Event()

    def poke_forever() -> None:
        while not stop.is_set():
            debouncer.poke()
            time.sleep(0.02)

    poker = threading.Thread(target=poke_forever)
    poker.start()
    try:
        _poll(lambda: fired, timeout=3)
    finally:
        stop.set()
        poker.join()
        debouncer.stop()


@pytest.mark.parametrize(
    "rel,relevant",
    [
        ("src/a.py", True),
        ("README.md", True),
        (".git/index", False),
        ("sub/.git/HEAD", False),
        (".codesearch/store.sqlite", False),
        (".codesearch", False),
        ("src/__pycache__/a.cpython-311.pyc", False),
        ("src/.a.py.swp", False),
        ("src/a.py~", False),
    ],
)
def test_watcher_relevance(tmp_path, rel, relevant):
    watcher = RepoWatcher(tmp_path, tmp_path / ".codesearch", lambda: None)
    try:
        assert watcher.relevant(str(tmp_path / rel)) is relevant
        assert watcher.relevant("/elsewhere/a.py") is False
    finally:
        watcher.stop()


@pytest.mark.parametrize("rel", [".codesearch.import-4242/store.sqlite", ".codesearch.import-4242",
                                 ".codesearch.replaced-17/plaid/codes.npy"])
def test_an_imports_temp_folder_beside_the_index_is_not_the_repository(tmp_path, rel):
    watcher = RepoWatcher(tmp_path, tmp_path / ".codesearch", lambda: None)
    try:
        assert watcher.relevant(str(tmp_path / rel)) is False
        assert watcher.relevant(str(tmp_path / "src" / rel)) is True  # only beside the index folder
        assert watcher.relevant(str(tmp_path / ".codesearch.imports/a.py")) is True
    finally:
        watcher.stop()


def test_reads_of_the_roots_files_never_reach_the_handler(tmp_path):
    # An index run opens and reads every file of the root: the observer is asked for the
    # kinds of event that change files only, so those opens are not even delivered.
    (tmp_path / "src").mkdir()
    files = [tmp_path / "src" / f"m{i}.py" for i in range(20)]
    for f in files:
        f.write_text("x = 1\n")
    changed = threading.Event()
    watcher = RepoWatcher(tmp_path, tmp_path / ".codesearch", changed.set, quiet_s=0.05)
    watcher.start()
    try:
        for _ in range(5):
            for f in files:
                f.read_bytes()
        time.sleep(0.5)  # inotify's events come within milliseconds
        assert watcher.events_delivered == 0 and not changed.is_set()
        files[0].write_text("x = 2\n")  # a write still arrives
        _poll(changed.is_set, timeout=5)
        assert watcher.events_seen >= 1
    finally:
        watcher.stop()
