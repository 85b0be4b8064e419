"""SIGTERM under load: searches in flight get the documented JSON error, the server exits
with no traceback, and a search's filters stop with it.

Before the fix: eight clients sending within-limit globs to a 2,000-file ``serve``, then
SIGTERM: the server took 3.9-4.3 s to exit, every client got a plain-text 500, and stderr a
traceback per request (458-914 lines).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import httpx
import pytest
from serverkit import LEXICAL, start_server

from codesearch.server.repos import RepoOptions, RepoSet
from codesearch.server.service import Limits, ServerStoppingError, Service

#: Within the limits (64 rules, 32 wildcards a rule): ~1 s a search on these paths matched
#: one rule at a time (eight at once, each took seconds).
GLOB = "{*a*,*b*}{*c*,*d*}{*e*,*f*}{*g*,*h*}{*i*,*j*}{*k*,*l*}"


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory):
    from codesearch.api import CodeSearch

    root = tmp_path_factory.mktemp("shutdown") / "repo"
    for i in range(2000):
        folder = root / "src" / "components" / f"feature_{i % 50}" / "deeply" / "nested" / f"folder_{i % 13}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{'a' * 60}_{i}_handler.py").write_text(f"def handler_{i}(request):\n    return json_decoder({i})\n")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def test_sigterm_under_load_answers_json_and_leaves_no_traceback(big_repo, tmp_path):
    proc = start_server([str(big_repo), *LEXICAL, "--no-watch", "--no-index-on-start"], tmp_path)
    answers: list[tuple[int, str, str]] = []  # (status, content type, body) of each answer
    stop = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            while not stop.is_set():
                try:
                    r = http.post("/search", json={"query": "json decoder handler", "mode": "lexical", "k": 50,
                                                   "glob": GLOB})
                except httpx.HTTPError:
                    return  # the server closed the connection or stopped listening
                answers.append((r.status_code, r.headers.get("content-type", ""), r.text))

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(8)]
    try:
        proc.wait_idle()
        for thread in threads:
            thread.start()
        while len(answers) < 8:  # every client has had an answer: each has a search in flight now
            time.sleep(0.02)
        proc.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert proc.proc.wait(timeout=30) == 0
        exit_s = time.monotonic() - t0
        stop.set()
        for thread in threads:
            thread.join(30)
    finally:
        stop.set()
        proc.stop(sig=signal.SIGKILL)
    print(f"exit {exit_s:.2f} s after SIGTERM, {len(answers)} answers")
    for status, kind, body in answers:
        assert kind.startswith("application/json"), (status, body[:200])
        assert status in (200, 503), (status, body[:200])
        if status == 503:
            assert '"error":"ServerStoppingError"' in body.replace(" ", ""), body
    assert "Traceback" not in proc.stderr()


@pytest.fixture()
def service(big_repo):
    repos = RepoSet([big_repo], RepoOptions(model=None, multi_model=None))
    repos.start(index_now=False, watch=False)
    svc = Service(repos, Limits(workers=2, max_pending=8, timeout_s=30))
    yield svc
    svc.close(5)


def test_stop_answers_searches_in_flight_at_once_and_refuses_new_ones(service, monkeypatch):
    """A search slower than the shutdown (one that waits 20 s here) is answered at once when
    the server stops: it does not wait for the search's thread."""
    repo = service.repos.repos[0]
    real_query = repo.query
    started = threading.Event()

    def slow_query(*args, **kwargs):
        started.set()
        time.sleep(20)
        return real_query(*args, **kwargs)

    monkeypatch.setattr(repo, "query", slow_query)

    async def main() -> tuple[BaseException | None, float]:
        loop = asyncio.get_running_loop()
        search = asyncio.ensure_future(service.search(query="handler", mode="lexical"))
        await loop.run_in_executor(None, started.wait, 30)
        t0 = time.monotonic()
        service.stop()
        try:
            await search
        except ServerStoppingError as exc:
            return exc, time.monotonic() - t0
        return None, 0.0

    error, took = asyncio.run(main())
    assert isinstance(error, ServerStoppingError) and "shutting down" in str(error)
    assert took < 10  # (the search's thread sleeps 20 s)
    with pytest.raises(ServerStoppingError):
        asyncio.run(service.search(query="handler", mode="lexical"))


def test_stop_stops_the_glob_filter_of_a_search_in_flight(service):
    """The glob filter looks at its search's clock every 1,024 paths: stopped, it raises at
    once, and the search's thread is free."""
    from codesearch.errors import QueryError
    from codesearch.globs import GlobFilter, glob_deadline
    from codesearch.globs.limits import Deadline

    deadline = Deadline(time.monotonic() + 60)
    spec = GlobFilter.of(["*?" * 15 + "Z"])
    paths = iter(f"pkg/sub/module_{i}.py" for i in range(10**9))
    with glob_deadline(deadline):
        matches = spec.matches(paths)
        for _ in range(5000):
            next(matches)
        deadline.stop()
        with pytest.raises(QueryError, match="time limit"):
            for _ in range(2048):
                next(matches)
