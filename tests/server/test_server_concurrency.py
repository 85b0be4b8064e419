"""Concurrency and shutdown: searches never fail while the index is rewritten, the search
pool is bounded and timed out, SIGTERM leaves an index that opens and searches."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from fixtures.sample_repo import EXPECTED, write_sample_repo
from serverkit import LEXICAL, start_server

from codesearch.api import CodeSearch
from codesearch.server.repos import RepoOptions, RepoSet
from codesearch.server.service import (
    Limits,
    SearchTimeoutError,
    ServerBusyError,
    Service,
)
from codesearch.types import result_document


def _hammer(url: str, stop: threading.Event, outcomes: list, query: str, expected_path: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            try:
                response = http.post("/search", json={"query": query, "mode": "lexical", "k": 3})
                ok = response.status_code == 200 and response.json()["results"][0]["path"] == expected_path
                outcomes.append(ok or (response.status_code, response.text[:200]))
            except httpx.HTTPError as exc:
                outcomes.append(repr(exc))


def test_searches_never_fail_while_the_index_is_rewritten(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    for i in range(150):  # enough work that each run takes a while
        (root / "pkg" / f"m{i}").mkdir(parents=True)
        (root / "pkg" / f"m{i}" / "mod.py").write_text(f"def function_{i}(x):\n    return x + {i}\n" * 5)
    server = start_server([str(root), *LEXICAL, "--debounce-ms", "100"], tmp_path / "logs")
    try:
        server.wait_idle(min_runs=1)
        stop = threading.Event()
        outcomes: list = []
        threads = [
            threading.Thread(target=_hammer, args=(server.url, stop, outcomes, query, path))
            for query, path in sorted(EXPECTED.items())
        ]
        for t in threads:
            t.start()
        with httpx.Client(base_url=server.url, timeout=30) as http:
            runs = http.get("/status").json()["roots"][0]["indexing"]["runs"]
            # An incremental run (edits through the watcher), a rebuild, and another edit.
            for i in range(0, 150, 3):
                (root / "pkg" / f"m{i}" / "mod.py").write_text(f"def renamed_{i}(y):\n    return y * {i}\n")
            server.wait_idle(timeout=120, min_runs=runs + 1)
            assert http.post("/index", json={"rebuild": True}).status_code == 202
            server.wait_idle(timeout=120, min_runs=runs + 2)
            (root / "pkg" / "m1" / "mod.py").write_text("def late_edit_marker():\n    pass\n")
            status = server.wait_idle(timeout=120, min_runs=runs + 3)
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        failures = [o for o in outcomes if o is not True]
        assert len(outcomes) > 50
        assert failures == []
        assert status["roots"][0]["indexing"]["generation"] >= 4
        assert status["roots"][0]["indexing"]["last_error"] is None
    finally:
        server.stop()


def test_sigterm_leaves_an_index_that_opens_and_searches(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    server = start_server([str(root), *LEXICAL], tmp_path / "logs")
    server.wait_idle(min_runs=1)
    discovery = root / ".codesearch" / "server.json"
    assert json.loads(discovery.read_text())["pid"] == server.proc.pid
    with server.client() as http:
        served = {q: http.post("/search", json={"query": q, "mode": "lexical"}).json() for q in EXPECTED}
    # Start a big run and stop the server in the middle of it.
    for i in range(300):
        (root / "bulk" / f"f{i}").mkdir(parents=True)
        (root / "bulk" / f"f{i}" / "code.py").write_text(f"def bulk_{i}():\n    return {i}\n")
    time.sleep(0.4)
    assert server.stop() == 0
    assert not discovery.exists()
    with CodeSearch(root, model=None, multi_model=None) as cs:
        for query, doc in served.items():
            after = result_document(cs.query(query, 10, mode="lexical"))
            assert after["results"][0]["path"] == EXPECTED[query]
            assert after["results"][0] == doc["results"][0]
        cs.index()  # the interrupted run's work is picked up again
        assert cs.status().files >= 305


@pytest.fixture()
def service(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    repos = RepoSet([root], RepoOptions(model=None, multi_model=None))
    repos.start(index_now=True, watch=False)
    assert repos.repos[0].wait_idle(60)
    svc = Service(repos, Limits(workers=1, max_pending=2, timeout_s=0.3))
    yield svc
    svc.close()


def test_search_pool_is_bounded_and_timed_out(service, monkeypatch):
    repo = service.repos.repos[0]
    real_query = repo.query

    def slow_query(*args, **kwargs):
        time.sleep(0.6)  # a search slower than the 0.3 s limit
        return real_query(*args, **kwargs)

    monkeypatch.setattr(repo, "query", slow_query)

    async def main() -> list:
        calls = [service.search(query="parseConfigFile", mode="lexical") for _ in range(3)]
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(main())
    kinds = sorted(type(o).__name__ for o in outcomes)
    # Two are admitted (one runs, one waits) and time out; the third is turned away at once.
    assert kinds == ["SearchTimeoutError", "SearchTimeoutError", "ServerBusyError"]
    assert all("\n" not in str(o) for o in outcomes)
    # The slots free when the threads finish, and a normal search works again.
    monkeypatch.setattr(repo, "query", real_query)
    deadline = time.monotonic() + 5
    while service.status()["search"]["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    doc = asyncio.run(service.search(query="parseConfigFile", mode="lexical"))
    assert doc["results"][0]["path"] == "src/config.js"


def test_error_classes_map_to_http_statuses():
    from codesearch.errors import (
        IndexCorruptError,
        NotIndexedError,
        PathError,
        QueryError,
    )
    from codesearch.server.app import status_for

    assert status_for(PathError("p")) == 403
    assert status_for(QueryError("q")) == 400
    assert status_for(NotIndexedError("n")) == 409
    assert status_for(ServerBusyError("b")) == 503
    assert status_for(SearchTimeoutError("t")) == 504
    assert status_for(IndexCorruptError("c")) == 500


def test_a_reader_stays_on_its_generation_until_the_swap(tmp_path, monkeypatch):
    # Another process commits a new generation (a `codesearch index` in a terminal): the
    # served reader keeps answering from its own snapshot, records included, instead of
    # ranking with one generation and reading records of the next.
    root = write_sample_repo(tmp_path / "repo")
    repos = RepoSet([root], RepoOptions(model=None, multi_model=None))
    try:
        repos.start(index_now=True, watch=False)
        (repo,) = repos.repos
        assert repo.wait_idle(60)
        before = repo.query("parseConfigFile", 3, mode="lexical").hits
        path = root / "src" / "config.js"
        path.write_text("// moved down\n\n\n\n" + path.read_text())
        with CodeSearch(root, model=None, multi_model=None) as cs:
            cs.index()
            moved = cs.query("parseConfigFile", 3, mode="lexical").hits[0]
        assert (moved.end_line, moved.text) != (before[0].end_line, before[0].text)  # a new generation
        assert repo.query("parseConfigFile", 3, mode="lexical").hits == before
        repo.request_index()  # the server's own run swaps to the new generation
        assert repo.wait_idle(60)
        now = repo.query("parseConfigFile", 3, mode="lexical").hits[0]
        assert (now.end_line, now.text) == (moved.end_line, moved.text)
    finally:
        repos.close()


def test_a_run_blocked_by_another_indexer_is_retried(tmp_path):
    from codesearch.store import IndexLock

    root = write_sample_repo(tmp_path / "repo")
    repos = RepoSet([root], RepoOptions(model=None, multi_model=None))
    try:
        repos.start(index_now=True, watch=False)
        (repo,) = repos.repos
        assert repo.wait_idle(60)
        runs = repo.run_state.runs
        lock = IndexLock(repo.index_dir).acquire()  # as a `codesearch index` in a terminal would
        try:
            (root / "src" / "late.py").write_text("def arrived_while_locked():\n    pass\n")
            repo.request_index()
            deadline = time.monotonic() + 30
            while repo.run_state.runs == runs and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "being written by another codesearch process" in repo.run_state.last_error
        finally:
            lock.release()
        deadline = time.monotonic() + 30
        while not repo.query("arrived_while_locked", 1, mode="lexical").hits and time.monotonic() < deadline:
            time.sleep(0.1)
        assert repo.query("arrived_while_locked", 1, mode="lexical").hits[0].path == "src/late.py"
        assert repo.wait_idle(30) and repo.run_state.last_error is None
    finally:
        repos.close()
