"""The MCP tools through the official client SDK: stdio (spawning the real process) and
Streamable HTTP (the /mcp endpoint of the HTTP server)."""

from __future__ import annotations

import json
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from serverkit import LEXICAL, server_env

from codesearch.api import CodeSearch
from codesearch.types import result_document


def library(root, query, k, **kwargs):
    with CodeSearch(root, model=None, multi_model=None) as cs:
        return result_document(cs.query(query, k, **kwargs))


async def _exercise(client: Client, root) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert {"search_code", "index_status"} <= set(tools)
    # The HTTP API's names (lang, not language; language stays accepted as an alias).
    assert {"query", "k", "mode", "lang", "language", "glob", "files_only", "path", "repo", "max_lines", "no_snippet",
            "min_score", "budget", "context"} <= set(tools["search_code"].input_schema["properties"])

    result = await client.call_tool("search_code", {"query": "openDatabaseConnection", "k": 3, "mode": "lexical"})
    assert not result.is_error, result.content
    assert result.structured_content == library(root, "openDatabaseConnection", 3, mode="lexical")
    assert result.structured_content["results"][0]["path"] == "server/main.go"
    # The text an agent reads is the same document as compact JSON: no indentation.
    (text,) = result.content
    assert text.text == json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)

    for name in ("lang", "language"):
        filtered = await client.call_tool(
            "search_code", {"query": "config database", "k": 5, "mode": "lexical", name: "javascript"}
        )
        assert {r["language"] for r in filtered.structured_content["results"]} == {"javascript"}
    missing = await client.call_tool("search_code", {"query": "x", "path": "no_such_folder"})
    assert missing.is_error and str(root) in missing.content[0].text

    args = {"query": "config database server", "k": 5, "mode": "lexical", "language": ["javascript", "go"],
            "glob": ["*.{js,go}", "!server/**"], "budget": 60}
    shaped = await client.call_tool("search_code", args)
    assert not shaped.is_error, shaped.content
    assert shaped.structured_content == library(
        root, "config database server", 5, mode="lexical", language=["javascript", "go"],
        glob=["*.{js,go}", "!server/**"], budget=60,
    )
    # Regression: file names only means no code
    names = await client.call_tool("search_code", {"query": "config database server", "k": 5, "mode": "lexical",
                                                   "files_only": True})
    found = names.structured_content["results"]
    assert len(found) > 1 and {r["text"] for r in found} == {""}
    assert len({r["path"] for r in found}) == len(found)
    bad = await client.call_tool("search_code", {"query": "x", "glob": "*.{rs,md"})
    assert bad.is_error and "invalid glob" in bad.content[0].text

    outside = await client.call_tool("search_code", {"query": "x", "path": "/etc"})
    assert outside.is_error
    assert "outside the served roots" in outside.content[0].text

    status = await client.call_tool("index_status", {})
    assert not status.is_error
    (served,) = status.structured_content["roots"]
    assert served["root"] == str(root) and served["index"]["files"] == 5


def test_stdio_transport_spawning_the_real_server(sample_repo):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "codesearch.server", str(sample_repo), "--mcp", "stdio", "--no-watch", "--no-index-on-start",
              *LEXICAL],
        env=server_env(),
    )

    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(params) as client:
                await _exercise(client, sample_repo)

    anyio.run(main)


def test_streamable_http_at_slash_mcp(lexical_server, sample_repo):
    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(lexical_server.url + "/mcp") as client:
                await _exercise(client, sample_repo)

    anyio.run(main)


@pytest.mark.parametrize("transport", ["http"])
def test_mcp_http_refuses_a_foreign_host_header(lexical_server, transport):
    # DNS-rebinding protection on a loopback bind: a page on evil.example that resolves to
    # 127.0.0.1 must not reach the tools.
    with lexical_server.client() as http:
        response = http.post("/mcp", headers={"Host": "evil.example", "Accept": "application/json, text/event-stream"},
                             json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert response.status_code in (403, 421), response.text
