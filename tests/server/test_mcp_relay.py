"""The MCP stdio relay (`codesearch.server.mcp_proxy`) when an answer is lost: a read is
asked again, a call that may have been acted on (``repair_index``) is not sent twice.

The "daemon" here is a real HTTP server on loopback in this process, named by a real
``daemon.json`` in a private runtime folder (the relay finds it as it finds the daemon); its
first answer to each message comes after the relay's timeout, as a daemon stuck or killed
mid-call would leave it."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import threading
import time
from collections import Counter

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from codesearch import __version__
from codesearch.server import mcp_proxy
from codesearch.server.runtime_dir import PROTOCOL, DaemonInfo, daemon_dir, ensure_runtime_dir, write_info

TOKEN = "t" * 32


class FakeDaemon:
    """Answers ``/daemon/sessions`` and ``/daemon/mcp/S1``; counts each message it got,
    and answers the first of each only after ``slow_s``."""

    def __init__(self, slow_s: float):
        self.slow_s = slow_s
        self.got: Counter[str] = Counter()
        self.app = Starlette(routes=[Route("/daemon/sessions", self.session, methods=["POST"]),
                                     Route("/daemon/mcp/S1", self.mcp, methods=["POST"])])

    async def session(self, request: Request) -> JSONResponse:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        return JSONResponse({"id": "S1", "mcp": "/daemon/mcp/S1", "roots": []})

    async def mcp(self, request: Request) -> JSONResponse:
        message = json.loads(await request.body())
        key = message["method"] + (":" + message["params"]["name"] if message["method"] == "tools/call" else "")
        self.got[key] += 1
        if self.got[key] == 1:
            await asyncio.sleep(self.slow_s)
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": {"content": [], "n": self.got[key]}})


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    fake = FakeDaemon(slow_s=3.0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    runtime = ensure_runtime_dir(tmp_path / "run")
    info = DaemonInfo(host="127.0.0.1", port=sock.getsockname()[1], pid=os.getpid(), token=TOKEN,
                      version=__version__, protocol=PROTOCOL, started_at=time.time(), idle_timeout_s=600.0)
    write_info(ensure_runtime_dir(daemon_dir(runtime)), info)
    monkeypatch.setenv("CODESEARCH_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(mcp_proxy, "REQUEST_TIMEOUT_S", 0.5)
    yield fake
    server.should_exit = True
    thread.join(10)
    sock.close()


def _relay_one(message: dict) -> dict:
    link = mcp_proxy._Link(lambda info: _register(info), start=False)
    out = io.BytesIO()
    mcp_proxy.Relay(link, out=out).handle(json.dumps(message).encode())  # what run() does per line, here
    return json.loads(out.getvalue())


def _register(info: DaemonInfo) -> str:
    from codesearch.server import daemon_client

    status, doc = daemon_client.call(info, "POST", "/daemon/sessions", {"roots": ["/"], "pid": os.getpid()})
    assert status == 200
    return doc["mcp"]


def _call(tool: str) -> dict:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def test_a_call_that_may_have_run_is_not_sent_again_after_a_lost_answer(daemon):
    answer = _relay_one(_call("repair_index"))
    assert daemon.got["tools/call:repair_index"] == 1
    assert answer["id"] == 7 and answer["error"]["code"] == -32603
    assert "may have run" in answer["error"]["message"]


def test_a_read_is_asked_once_more_after_a_lost_answer(daemon):
    answer = _relay_one(_call("search_code"))
    assert daemon.got["tools/call:search_code"] == 2
    assert answer == {"jsonrpc": "2.0", "id": 7, "result": {"content": [], "n": 2}}


@pytest.mark.parametrize(("message", "safe"), [
    ({"id": 1, "method": "tools/call", "params": {"name": "search_code"}}, True),
    ({"id": 1, "method": "tools/call", "params": {"name": "index_status"}}, True),
    ({"id": 1, "method": "tools/list"}, True),
    ({"id": 1, "method": "initialize"}, True),
    ({"id": 1, "method": "tools/call", "params": {"name": "repair_index"}}, False),
    ({"id": 1, "method": "tools/call", "params": {"name": "a_tool_of_tomorrow"}}, False),
    ({"method": "notifications/initialized"}, False),
    ([{"id": 1, "method": "ping"}], False),
])
def test_which_messages_are_reads(message, safe):
    assert mcp_proxy.idempotent(message) is safe
