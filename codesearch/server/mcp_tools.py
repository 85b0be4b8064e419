"""The MCP server: tools ``search_code``, ``index_status`` and ``repair_index`` for coding agents.

Built on the official SDK (``mcp`` 2.x, where v1's ``FastMCP`` is ``MCPServer``). The same
`Service` answers HTTP and MCP, so a tool call returns exactly the ``POST /search``
document and goes through the same bounded pool and timeout. Served over stdio
(``codesearch serve --mcp stdio``) or Streamable HTTP at ``/mcp`` on the HTTP app.
(Module name: not ``mcp.py``, which would shadow the SDK for code run from this folder.)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

# Module level, not in build_mcp: the SDK reads the tools' annotations from this module.
from mcp.types import CallToolResult, TextContent

from codesearch import __version__
from codesearch.errors import CodeSearchError
from codesearch.server.service import Service
from codesearch.types import JSONDict, Mode

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server.mcpserver import MCPServer

INSTRUCTIONS = (
    "Semantic and lexical code search over the repositories this server indexes. "
    "Call search_code with a description of the code you need (or an identifier); "
    "results carry path, line range, score and the code itself. With several repositories "
    "served, a search covers all of them (each hit names its repo) unless repo or path picks "
    "one. index_status says what is indexed and whether an index run is going; its health says "
    "whether the index is complete, stale, incomplete, being built or damaged, and the next action, "
    "which repair_index does."
)


def _compact(doc: JSONDict) -> CallToolResult:
    """The tool result: the document as structured content, and as compact JSON text.

    Why not return the dict: the SDK would write the text with ``indent=2``, and an agent
    pays for every space of it out of its context window.
    """
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=doc)


def build_mcp(service: Service) -> MCPServer:
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
        lang: str | list[str] | None = None,
        glob: str | list[str] | None = None,
        files_only: bool = False,
        regex: str | None = None,
        path: str | None = None,
        repo: str | None = None,
        max_lines: int | None = None,
        no_snippet: bool = False,
        min_score: float | None = None,
        budget: int | None = None,
        context: int = 0,
        language: str | list[str] | None = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """Search the served code for `query` (natural language, an identifier, or code).

        Args:
            query: What to look for.
            k: How many results (chunks, or files with files_only).
            mode: hybrid (every index), lexical (BM25 only), dense, or colbert.
            lang: Only results in this language, or any of a list, e.g. "python".
            glob: ripgrep-style glob(s) on the path, e.g. "src/**/*.py", "*.{rs,md}",
                "!tests/**" (excludes); with several, the last matching one wins.
            files_only: One result per file, best chunk first, file names without code.
            regex: Only chunks whose text matches this RE2 pattern, e.g. "Retry-After|backoff"
                (^ and $ per line, (?i) for any case), ranked as usual.
            path: Only this folder or file: relative to the repository (with several served,
                starting with the repository's name, e.g. "fd/src"), or absolute.
            repo: Only this served repository (its folder name or path); default all.
            max_lines: Cut each snippet to this many lines (end_line shrinks to match;
                more_lines says how many lines were cut).
            no_snippet: Locations and scores only, no code.
            min_score: Leave out results scoring below this.
            budget: Approximate token budget for all snippets together; results best
                first, the last one cut to fit; left_out says how many did not fit.
            context: Extra lines of the file above and below each snippet.
            language: Same as lang (older name).

        Returns the same JSON document as `codesearch query --json`: schema_version, query,
        mode, indexes_used, notices and results (path, start_line, end_line, score,
        language, symbol, kind, text, and repo when several repositories are served).
        """
        if lang and language and lang != language:
            raise ToolError(f"lang={lang!r} and language={language!r} disagree (pass only lang)")
        try:
            # Checked in the search pool (as the HTTP route does): never on the event loop.
            return _compact(await service.search(
                query=query, k=k, mode=mode, lang=lang or language, glob=glob, files_only=files_only,
                regex=regex, max_lines=max_lines, no_snippet=no_snippet, min_score=min_score, budget=budget,
                context=context, path=path, repo=repo,
            ))
        except CodeSearchError as exc:
            # ToolError's message reaches the agent; any other exception is hidden by the SDK.
            raise ToolError(str(exc)) from None

    @server.tool()
    async def index_status(path: str | None = None) -> Annotated[CallToolResult, dict[str, Any]]:
        """What each served repository's index holds and whether it is being updated.

        Args:
            path: Only this repository (its name or path); default all of them.

        Returns files, chunks, languages, models, staleness and the background indexer's
        state (idle / queued / running, last run summary or error) per repository.
        """
        try:
            return _compact(await anyio.to_thread.run_sync(service.status, path))
        except CodeSearchError as exc:
            raise ToolError(str(exc)) from None

    _add_repair_tool(server, service)
    return server


def _add_repair_tool(server: MCPServer, service: Service) -> None:
    """``repair_index``: what ``index_status``'s health.next_action asks for, done by the server."""
    import anyio.to_thread
    from mcp.server.mcpserver.exceptions import ToolError

    @server.tool()
    async def repair_index(path: str | None = None, rebuild: bool = False) -> Annotated[CallToolResult, dict[str, Any]]:
        """Repair a served repository's index: queue an index run that rebuilds missing or
        outdated derived index files, resumes the vectors a stopped run left out and takes in
        changed files. Returns at once; index_status's health.state says when it is complete.

        Args:
            path: Only this repository (its name or path); default all of them.
            rebuild: Build the index anew (for a damaged store: health.next_action says so).

        Returns the queued run per repository (root, indexing state) and the health before it.
        """
        def repair() -> JSONDict:
            before = {root["root"]: (root.get("index") or {}).get("health") for root in service.status(path)["roots"]}
            return {**service.index(path, rebuild=rebuild), "health_before": before}

        try:
            return _compact(await anyio.to_thread.run_sync(repair))
        except CodeSearchError as exc:
            raise ToolError(str(exc)) from None
