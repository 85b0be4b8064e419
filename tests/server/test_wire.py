"""The daemon's client HTTP over a plain socket (`codesearch.server.wire`), against a real
uvicorn server on loopback: every way an answer's body can end, and what is not HTTP."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from codesearch.server.wire import WireError, exchange


async def _echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"method": request.method, "path": request.url.path, "query": request.url.query,
                         "host": request.headers.get("host"), "auth": request.headers.get("authorization"),
                         "body": body.decode("utf-8")}, status_code=201)


async def _chunks(_request: Request) -> StreamingResponse:
    async def parts():
        for i in range(50):
            yield f'{{"part":{i}}}\n'.encode()

    return StreamingResponse(parts(), media_type="application/x-ndjson")  # no length: chunked


async def _empty(_request: Request) -> Response:
    return Response(status_code=204)


async def _big(_request: Request) -> Response:
    return Response(b"x" * 3_000_000, media_type="application/octet-stream")


@pytest.fixture(scope="module")
def server():
    app = Starlette(routes=[Route("/echo", _echo, methods=["GET", "POST", "DELETE"]), Route("/chunks", _chunks),
                            Route("/empty", _empty, methods=["POST"]), Route("/big", _big)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    srv.should_exit = True
    thread.join(10)
    sock.close()


def test_a_post_with_a_body_and_headers_gets_the_whole_answer(server):
    status, body = exchange("127.0.0.1", server, "POST", "/echo?x=1", body='{"é": 1}'.encode(),
                            headers={"Authorization": "Bearer abc", "Content-Type": "application/json"})
    assert status == 201
    import json

    doc = json.loads(body)
    assert doc == {"method": "POST", "path": "/echo", "query": "x=1", "host": f"127.0.0.1:{server}",
                   "auth": "Bearer abc", "body": '{"é": 1}'}


def test_chunked_empty_and_large_answers(server):
    status, body = exchange("127.0.0.1", server, "GET", "/chunks")
    assert status == 200 and body.splitlines() == [f'{{"part":{i}}}'.encode() for i in range(50)]
    assert exchange("127.0.0.1", server, "POST", "/empty") == (204, b"")
    status, body = exchange("127.0.0.1", server, "GET", "/big")
    assert status == 200 and body == b"x" * 3_000_000
    assert exchange("127.0.0.1", server, "DELETE", "/nowhere")[0] == 404


def test_a_header_with_a_line_break_is_not_sent(server):
    with pytest.raises(ValueError, match="line break"):
        exchange("127.0.0.1", server, "GET", "/echo", headers={"Authorization": "Bearer a\r\nX-Evil: 1"})


def _one_shot(answer: bytes) -> int:
    """A listener that answers one connection with ``answer`` and closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


@pytest.mark.parametrize("answer", [b"", b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_what_is_not_a_whole_http_answer_is_a_broken_exchange(answer):
    with pytest.raises(WireError):
        exchange("127.0.0.1", _one_shot(answer), "GET", "/", timeout=10)


def test_no_listener_is_an_os_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(OSError):
        exchange("127.0.0.1", port, "GET", "/", timeout=5)
