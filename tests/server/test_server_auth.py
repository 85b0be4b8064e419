"""Auth: a non-loopback bind needs a token; with a token every request (MCP included) must
carry it; the discovery file says a token is needed but never holds it."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from serverkit import LEXICAL, server_env, start_server

from codesearch.errors import ServerError
from codesearch.server.client import try_server_search
from codesearch.server.network import check_bind, is_loopback

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def token_server(sample_repo, tmp_path_factory):
    """Bound to every interface (0.0.0.0), which is only allowed because a token is set;
    the token comes from CODESEARCH_TOKEN, as it would in a service unit."""
    server = start_server(
        [str(sample_repo), *LEXICAL, "--no-watch", "--host", "0.0.0.0"],
        tmp_path_factory.mktemp("logs"),
        env=server_env(CODESEARCH_TOKEN=TOKEN),
        token=TOKEN,
    )
    try:
        server.wait_idle()
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "example.com"])
def test_non_loopback_bind_without_token_is_refused(sample_repo, host):
    proc = subprocess.run(
        [sys.executable, "-m", "codesearch.server", str(sample_repo), "--host", host, "--port", "0", *LEXICAL],
        capture_output=True, text=True, env=server_env(), timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("Error: refusing to listen on non-loopback host") and "--token" in line


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
                                           ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                           ("10.0.0.1", False), ("myhost", False)])
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback
    if loopback:
        check_bind(host, None)
    else:
        with pytest.raises(ServerError):
            check_bind(host, None)
        check_bind(host, "t")


@pytest.mark.parametrize("method,path,body", [("GET", "/health", None), ("GET", "/status", None),
                                              ("POST", "/search", {"query": "x"}), ("POST", "/index", {}),
                                              ("GET", "/openapi.json", None), ("POST", "/mcp", {})])
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer", TOKEN])
def test_every_route_needs_the_right_token(token_server, method, path, body, header):
    headers = {"Authorization": header} if header else {}
    response = httpx.request(method, token_server.url + path, json=body, headers=headers, timeout=30)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"] == "AuthError"


def test_the_right_token_is_accepted(token_server, sample_repo):
    with token_server.client() as http:
        assert http.get("/health").status_code == 200
        doc = http.post("/search", json={"query": "parseConfigFile", "mode": "lexical"}).json()
    assert doc["results"][0]["path"] == "src/config.js"
    # A wildcard bind is announced and discovered through loopback.
    assert token_server.info["host"] == "127.0.0.1" and token_server.info["token_required"] is True


def test_discovery_file_says_a_token_is_needed_and_never_holds_it(token_server, sample_repo):
    path = sample_repo / ".codesearch" / "server.json"
    text = path.read_text()
    assert TOKEN not in text
    assert json.loads(text)["token_required"] is True
    assert path.stat().st_mode & 0o077 == 0  # owner-only


def test_fast_path_needs_the_token(token_server, sample_repo, monkeypatch):
    monkeypatch.delenv("CODESEARCH_TOKEN", raising=False)
    request = {"query": "parseConfigFile", "mode": "lexical", "k": 2}
    assert try_server_search(sample_repo, request) is None
    assert try_server_search(sample_repo, request, token="wrong") is None
    monkeypatch.setenv("CODESEARCH_TOKEN", TOKEN)
    doc = try_server_search(sample_repo, request)
    assert doc is not None and doc["results"][0]["path"] == "src/config.js"


def test_mcp_over_http_with_the_token(token_server, sample_repo):
    async def main() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            from mcp.client.streamable_http import streamable_http_client

            with anyio.fail_after(120):
                async with Client(streamable_http_client(token_server.url + "/mcp", http_client=http)) as client:
                    result = await client.call_tool("search_code", {"query": "parseConfigFile", "mode": "lexical"})
        assert not result.is_error
        assert result.structured_content["results"][0]["path"] == "src/config.js"

    anyio.run(main)
