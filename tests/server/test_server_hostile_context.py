"""Context lines over HTTP and MCP from a file swapped for a symlink out of the repository,
with the watcher off and on: no response carries a byte of the outside file, including
those answered while the watcher's refresh runs, and a FIFO in place of a file never
stops the watcher's run.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from serverkit import LEXICAL, start_server

SECRET = "TOP_SECRET_OUTSIDE_LINE"


def function(name: str) -> str:
    return f"def {name}(x):\n" + "".join(f"    y_{i} = x * {i}\n" for i in range(80)) + "    return x\n\n\n"


def make_repo(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text(function("above_it") + function("needle_function") + function("below_it"))
    (root / "pkg" / "b.py").write_text(function("other_module_function"))
    return root


def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_text("".join(f"{SECRET} {i}\n" for i in range(600)))
    return target


def swap_for_link(path: Path, target: Path) -> None:
    link = path.with_name(path.name + ".swap")
    link.symlink_to(target)
    link.replace(path)  # atomic: the path is the file, then the link


def search(http, context: int = 20) -> dict:
    response = http.post("/search", json={"query": "needle_function", "mode": "lexical", "k": 3, "context": context})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture()
def server_no_watch(tmp_path):
    root = make_repo(tmp_path / "repo")
    server = start_server([str(root), *LEXICAL, "--no-watch"], tmp_path / "logs")
    try:
        server.wait_idle(min_runs=1)
        yield root, server
    finally:
        server.stop()


def test_http_and_mcp_serve_no_context_from_a_symlinked_file(server_no_watch, tmp_path):
    root, server = server_no_watch
    with server.client() as http:
        wide = search(http)["results"][0]
        assert wide["path"] == "pkg/a.py" and "above_it" not in wide["text"] and "y_79 = x * 79" in wide["text"]
        swap_for_link(root / "pkg" / "a.py", outside(tmp_path))
        after = search(http)
    assert SECRET not in str(after) and after["results"][0]["path"] == "pkg/a.py"

    async def call() -> dict:
        async with Client(server.url + "/mcp") as client:
            result = await client.call_tool(
                "search_code", {"query": "needle_function", "k": 3, "mode": "lexical", "context": 20})
            assert not result.is_error, result.content
            return {"structured": result.structured_content, "text": result.content[0].text}

    got = anyio.run(call)
    assert SECRET not in got["text"] and SECRET not in str(got["structured"])


def _runs(http) -> int:
    return http.get("/status").json()["roots"][0]["indexing"]["runs"]


def test_no_response_during_a_watcher_refresh_carries_the_outside_file(tmp_path):
    root = make_repo(tmp_path / "repo")
    target = outside(tmp_path)
    server = start_server([str(root), *LEXICAL, "--debounce-ms", "50"], tmp_path / "logs")
    leaked, answered = [], []
    stop = threading.Event()

    def hammer() -> None:
        with server.client() as http:
            while not stop.is_set():
                doc = search(http)
                answered.append(1)
                if SECRET in str(doc):
                    leaked.append(doc)

    try:
        server.wait_idle(min_runs=1)
        workers = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
        for w in workers:
            w.start()
        with server.client() as http:

            def after_a_run(change) -> None:
                before = _runs(http)
                change()
                deadline = time.monotonic() + 60
                while _runs(http) == before and time.monotonic() < deadline:  # the watcher's run
                    time.sleep(0.02)
                assert _runs(http) > before, "the watcher did not run"

            path = root / "pkg" / "a.py"
            original = path.read_text()
            for round_ in range(3):
                if round_:  # the file back, indexed again
                    after_a_run(lambda: (path.unlink(), path.write_text(original)))
                after_a_run(lambda: swap_for_link(path, target))
                time.sleep(0.3)  # and answers after it
        stop.set()
        for w in workers:
            w.join(30)
        assert len(answered) > 20 and leaked == []
        # The refresh left the link out of the index: nothing of it is searchable.
        with server.client() as http:
            found = http.post("/search", json={"query": SECRET, "mode": "lexical", "k": 3}).json()["results"]
        assert SECRET not in str(found)
    finally:
        stop.set()
        server.stop()


def test_a_fifo_in_place_of_a_file_does_not_stop_the_watcher(tmp_path):
    root = make_repo(tmp_path / "repo")
    server = start_server([str(root), *LEXICAL, "--debounce-ms", "50"], tmp_path / "logs")
    try:
        server.wait_idle(min_runs=1)
        (root / "pkg" / "b.py").unlink()
        os.mkfifo(root / "pkg" / "b.py")
        (root / "pkg" / "c.py").write_text(function("added_after_the_fifo"))
        with server.client() as http:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                hits = http.post("/search", json={"query": "added_after_the_fifo", "mode": "lexical", "k": 1}).json()
                if hits["results"] and hits["results"][0]["path"] == "pkg/c.py":
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the watcher's run did not finish with a FIFO in the repository")
        assert server.wait_idle(timeout=60)["roots"][0]["ready"]
    finally:
        server.stop()
