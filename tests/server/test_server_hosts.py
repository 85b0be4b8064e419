"""DNS-rebinding protection on every route: a loopback server refuses a foreign ``Host``
(421) or ``Origin`` (403) header before doing anything, as ``/mcp`` always did; the JSON API
once answered them with source code. A server exposed with a token takes any host name
(the token is what protects it)."""

from __future__ import annotations

import httpx
import pytest
from serverkit import LEXICAL, server_env, start_server

TOKEN = "t0ken-for-host-tests"
ROUTES = [("GET", "/health", None), ("GET", "/status", None), ("POST", "/search", {"query": "parseConfigFile"}),
          ("POST", "/index", {}), ("GET", "/openapi.json", None), ("GET", "/docs", None),
          ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})]
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}


def call(url: str, method: str, path: str, body, **headers) -> httpx.Response:
    return httpx.request(method, url + path, json=body, headers={**MCP_ACCEPT, **headers}, timeout=30)


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[r[1] for r in ROUTES])
@pytest.mark.parametrize("host", ["evil.example:{port}", "evil.example", "127.0.0.1.evil.example:{port}",
                                  "localhost.evil.example", "",
                                  # A port that is a name: passed when the head before ':' was compared alone.
                                  "127.0.0.1:{port}.evil.example", "localhost:{port}.evil.example",
                                  "127.0.0.1:evil", "[::1]:{port}.evil.example", "evil@127.0.0.1:{port}"])
def test_a_foreign_host_is_421_on_every_route(lexical_server, method, path, body, host):
    port = lexical_server.info["port"]
    response = call(lexical_server.url, method, path, body, Host=host.format(port=port))
    assert response.status_code == 421, response.text
    assert "source" not in response.text and "parseConfigFile" not in response.text
    if response.headers["content-type"].startswith("application/json"):
        assert response.json()["error"] == "HostError"


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[r[1] for r in ROUTES])
@pytest.mark.parametrize("origin", ["http://evil.example:{port}", "https://evil.example", "null",
                                    "http://127.0.0.1.evil.example:{port}", "file://",
                                    "http://127.0.0.1:{port}.evil.example", "http://localhost:1.evil.example/x"])
def test_a_foreign_origin_is_403_on_every_route(lexical_server, method, path, body, origin):
    port = lexical_server.info["port"]
    response = call(lexical_server.url, method, path, body, Origin=origin.format(port=port))
    assert response.status_code == 403, response.text
    assert response.json()["error"] == "OriginError"


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}", "127.0.0.1"])
@pytest.mark.parametrize("origin", [None, "http://localhost:{port}", "http://127.0.0.1:{port}"])
def test_this_machine_by_any_of_its_names_is_served(lexical_server, host, origin):
    port = lexical_server.info["port"]
    headers = {"Host": host.format(port=port)}
    if origin:
        headers["Origin"] = origin.format(port=port)
    response = call(lexical_server.url, "POST", "/search", {"query": "parseConfigFile", "mode": "lexical"}, **headers)
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["path"] == "src/config.js"


@pytest.fixture(scope="module")
def exposed_server(sample_repo, tmp_path_factory):
    server = start_server([str(sample_repo), *LEXICAL, "--no-watch", "--host", "0.0.0.0"],
                          tmp_path_factory.mktemp("logs"), env=server_env(CODESEARCH_TOKEN=TOKEN), token=TOKEN)
    try:
        server.wait_idle()
        yield server
    finally:
        server.stop()


def test_an_exposed_server_takes_any_host_name_but_only_with_the_token(exposed_server):
    body = {"query": "parseConfigFile", "mode": "lexical"}
    headers = {"Host": "codesearch.internal:7420", "Origin": "https://ide.internal"}
    with_token = call(exposed_server.url, "POST", "/search", body, Authorization=f"Bearer {TOKEN}", **headers)
    assert with_token.status_code == 200 and with_token.json()["results"][0]["path"] == "src/config.js"
    assert call(exposed_server.url, "POST", "/search", body, **headers).status_code == 401
