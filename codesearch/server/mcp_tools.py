"""The MCP server: tools ``search_code`` and ``index_status`` for coding agents.

Built on the official SDK (``mcp`` 2.x, where v1's ``FastMCP`` is ``MCPServer``). The same
`Service` answers HTTP and MCP, so a tool call returns exactly the ``POST /search``
document and goes through the same bounded pool and timeout. Served over stdio
(``codesearch serve --mcp stdio``) or Streamable HTTP at ``/mcp`` on the HTTP app.
(Module name: not ``mcp.py``, which would shadow the SDK for code run from this folder.)
"""

from __future__ import annotations

from typing import Any

from codesearch import __version__
from codesearch.errors import CodeSearchError
from codesearch.request import Mode, SearchRequest
from codesearch.server.service import Service

INSTRUCTIONS = (
    "Semantic and lexical code search over the repositories this server indexes. "
    "Call search_code with a description of the code you need (or an identifier); "
    "results carry path, line range, score and the code itself. index_status says what "
    "is indexed and whether an index run is going."
)


def build_mcp(service: Service) -> Any:
    """An `MCPServer` whose tools call ``service``.

    Returns
    -------
    mcp.server.mcpserver.MCPServer
        Run it with ``run_stdio_async()``, or mount ``streamable_http_app()``.
    """
    import anyio.to_thread
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("codesearch", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool()
    async def search_code(
        query: str,
        k: int = 10,
        mode: Mode = Mode.hybrid,
        language: str | list[str] | None = None,
        glob: str | list[str] | None = None,
        files_only: bool = False,
        path: str | None = None,
        max_lines: int | None = None,
        no_snippet: bool = False,
        min_score: float | None = None,
        budget: int | None = None,
        context: int = 0,
    ) -> dict[str, Any]:
        """Search the served code for `query` (natural language, an identifier, or code).

        Args:
            query: What to look for.
            k: How many results (chunks, or files with files_only).
            mode: hybrid (every index), lexical (BM25 only), dense, or colbert.
            language: Only results in this language, or any of a list, e.g. "python".
            glob: ripgrep-style glob(s) on the path, e.g. "src/**/*.py", "*.{rs,md}",
                "!tests/**" (excludes); with several, the last matching one wins.
            files_only: One result per file, best chunk first.
            path: Which served repository (or a folder inside it); default the first one.
            max_lines: Cut each snippet to this many lines.
            no_snippet: Locations and scores only, no code.
            min_score: Leave out results scoring below this.
            budget: Approximate token budget for all snippets together; results best
                first, the last one cut to fit; left_out says how many did not fit.
            context: Extra lines of the file above and below each snippet.

        Returns the same JSON document as `codesearch query --json`: schema_version, query,
        mode, indexes_used, notices and results (path, start_line, end_line, score,
        language, symbol, kind, text).
        """
        try:
            request = SearchRequest.of(
                query, k, mode=mode, language=language, glob=glob, files_only=files_only, max_lines=max_lines,
                no_snippet=no_snippet, min_score=min_score, budget=budget, context=context,
            )
            return await service.search(query=request, path=path)
        except CodeSearchError as exc:
            # ToolError's message reaches the agent; any other exception is hidden by the SDK.
            raise ToolError(str(exc)) from None

    @server.tool()
    async def index_status(path: str | None = None) -> dict[str, Any]:
        """What each served repository's index holds and whether it is being updated.

        Args:
            path: Only the repository containing this path; default all of them.

        Returns files, chunks, languages, models, staleness and the background indexer's
        state (idle / queued / running, last run summary or error) per repository.
        """
        try:
            return await anyio.to_thread.run_sync(service.status, path)
        except CodeSearchError as exc:
            raise ToolError(str(exc)) from None

    return server
