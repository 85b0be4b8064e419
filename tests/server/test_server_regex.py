"""The regex filter against a real server: a catastrophic-backtracking
pattern is answered (RE2 does not backtrack) while /health keeps answering, and a bad or
oversized pattern is a one-line 400 over HTTP and a tool error over MCP."""

from __future__ import annotations

import threading

import anyio
import pytest
from mcp import Client
from serverkit import LEXICAL, start_server

from codesearch.api import CodeSearch

#: Each takes Python's backtracking `re` exponential time on a long run of "a" or "x" that
#: does not end the way the pattern needs.
CATASTROPHIC = [r"(a+)+$", r"(a|aa)+b", r"(x+x+)+y", r"^(\w+\s?)*$"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("rx_server")
    lines = "".join(f"RUN_{i} = '{'a' * 90}!'\n# {'x' * 90}\n" for i in range(40))
    (root / "runs.py").write_text(lines + "def backoff(n):\n    return 2 ** n\n")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    srv = start_server([str(root), *LEXICAL, "--no-watch", "--search-timeout", "30"],
                       tmp_path_factory.mktemp("logs"))
    try:
        srv.wait_idle()
        yield srv
    finally:
        srv.stop()


def test_catastrophic_patterns_are_answered_while_health_answers(server):
    answers: dict[str, int] = {}

    def search(pattern: str) -> None:
        with server.client() as http:
            answers[pattern] = http.post("/search", json={"query": "run", "k": 5, "mode": "lexical",
                                                          "regex": pattern}).status_code

    threads = [threading.Thread(target=search, args=(p,)) for p in CATASTROPHIC for _ in range(3)]
    for t in threads:
        t.start()
    health = []
    with server.client() as http:
        while any(t.is_alive() for t in threads) or len(health) < 3:
            health.append(http.get("/health").status_code)
    for t in threads:
        t.join(60)
    assert set(health) == {200}
    assert answers == {p: 200 for p in CATASTROPHIC}
    with server.client() as http:
        hit = http.post("/search", json={"query": "backoff", "mode": "lexical", "regex": r"\*\* n$"}).json()
    assert hit["results"] and all("** n" in r["text"] for r in hit["results"])


@pytest.mark.parametrize(
    "pattern,needle",
    [("(a", "invalid regex"), ("(?=a)b", "lookaround"), ("a" * 1001, "over the limit of 1,000"),
     (r"(\w+\s*){300}", "instructions, over the limit")],
)
def test_a_bad_pattern_is_a_one_line_400_and_a_tool_error(server, pattern, needle):
    with server.client() as http:
        response = http.post("/search", json={"query": "run", "regex": pattern})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "QueryError" and needle in body["detail"] and "\n" not in body["detail"]

    async def main():
        with anyio.fail_after(60):
            async with Client(server.url + "/mcp") as client:
                return await client.call_tool("search_code", {"query": "run", "regex": pattern})

    result = anyio.run(main)
    assert result.is_error and needle in result.content[0].text
