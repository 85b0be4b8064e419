"""The codesearch server: HTTP JSON API and MCP tools over served repositories, with a file
watcher that keeps their indexes fresh.

Start it with ``codesearch serve [PATH...]`` or ``python -m codesearch.server [PATH...]``.
Modules: `app` (FastAPI routes, auth), `mcp_tools` (MCP server), `service` (bounded search
pool), `repos` (an index writer and a pinned live searcher per root), `batching`
(concurrent queries share encoder passes), `watch` (debounced watcher), `discovery` and
`client` (the ``codesearch query`` fast path), `runner` (bind, announce, shutdown),
`network` (loopback and address checks), `command` (the ``serve`` command, for the CLI and
``__main__``). Nothing is imported here, so ``codesearch.server.client`` stays light.
"""
