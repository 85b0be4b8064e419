"""The ``serve`` command: its options, parsed by Typer, turned into the server's settings.

It lives with the server so that both entry points use it without an arrow back up: the
CLI adds it to ``codesearch`` (`register`), and ``python -m codesearch.server`` runs it
alone. Only typer and the standard library are imported at module level, so
``codesearch --help`` stays fast.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from codesearch.types import Device, model_option


class McpTransport(str, Enum):
    http = "http"
    stdio = "stdio"
    off = "off"


def serve(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Repositories to serve (default: the indexed folder at or above the current one, "
            "else the current one).",
            metavar="PATH",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; anything but loopback needs --token.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port; 0 picks a free one (printed as a JSON line on stdout).")
    ] = 7420,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="CODESEARCH_TOKEN", show_envvar=True, help="Require 'Authorization: Bearer TOKEN' on every request."
        ),
    ] = None,
    mcp: Annotated[
        McpTransport, typer.Option(help="MCP transport: http (at /mcp), stdio (MCP only, on stdin/stdout), off.")
    ] = McpTransport.http,
    watch: Annotated[bool, typer.Option("--watch/--no-watch", help="Re-index changed files as they are saved.")] = True,
    index_on_start: Annotated[
        bool,
        typer.Option("--index-on-start/--no-index-on-start", help="Run one incremental index per repository at start."),
    ] = True,
    model: Annotated[
        str | None, typer.Option(help="Dense model (default: the one the index records; 'none' disables).")
    ] = None,
    multi_model: Annotated[
        str | None,
        typer.Option("--multi-model", help="ColBERT model (default: the one the index records; 'none' disables)."),
    ] = None,
    device: Annotated[Device, typer.Option(help="Where the encoders run.")] = Device.auto,
    index_dir: Annotated[
        Path | None, typer.Option("--index-dir", help="Index folder (one PATH only; default PATH/.codesearch).")
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option("--include", metavar="GLOB", help="Only index files matching GLOB (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", metavar="GLOB", help="Skip files matching GLOB (repeatable).")
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Threads that run searches (concurrent queries share encoder passes).")
    ] = 8,
    max_pending: Annotated[int, typer.Option(min=1, help="Searches running or queued before 503.")] = 64,
    search_timeout: Annotated[float, typer.Option(min=0.01, help="Seconds per search before 504.")] = 10.0,
    max_connections: Annotated[int, typer.Option(min=1, help="Open connections before 503.")] = 256,
    debounce_ms: Annotated[int, typer.Option(min=0, help="Quiet period after file changes before re-indexing.")] = 250,
    query_batching: Annotated[
        bool,
        typer.Option(
            "--query-batching/--no-query-batching", help="Encode concurrent queries in shared forward passes."
        ),
    ] = True,
    no_daemon: Annotated[
        bool,
        typer.Option(
            "--no-daemon",
            help="With --mcp stdio: serve in this process instead of relaying to the per-user daemon "
            "(also: CODESEARCH_NO_DAEMON=1).",
        ),
    ] = False,
) -> None:
    """Serve indexed repositories over HTTP (JSON API + MCP at /mcp) or MCP over stdio."""
    from codesearch.server.daemon_client import missing_server_module

    missing = missing_server_module()
    if missing is not None:
        from codesearch.errors import MissingDependencyError, install_line

        raise MissingDependencyError(f"codesearch serve needs {missing!r}, which is not installed "
                                     f"({install_line('server')})")
    from codesearch.server.repos import RepoOptions
    from codesearch.server.runner import ServeOptions
    from codesearch.server.runner import serve as run_server
    from codesearch.server.service import Limits

    repo_options = RepoOptions(
        model=model_option(model),
        multi_model=model_option(multi_model),
        device=device.value,
        include=tuple(include or ()),
        exclude=tuple(exclude or ()),
        index_dir=index_dir,
    )
    options = ServeOptions(
        host=host,
        port=port,
        token=token,
        mcp=mcp.value,
        watch=watch,
        index_on_start=index_on_start,
        limits=Limits(workers=workers, max_pending=max_pending, timeout_s=search_timeout),
        max_connections=max_connections,
        debounce_s=debounce_ms / 1000,
        query_batching=query_batching,
    )
    run_server(paths or [_default_root()], repo_options, options)


def _default_root() -> Path:
    """The nearest indexed folder at or above the current one (as `codesearch query` finds
    it), else the current folder (which the server then indexes)."""
    from codesearch.api import find_index_root
    from codesearch.errors import NotIndexedError

    try:
        return find_index_root(Path.cwd())
    except NotIndexedError:
        return Path(".")


SERVE_EPILOG = "Example: codesearch serve ./repo --port 0   (MCP for an agent: codesearch serve ./repo --mcp stdio)"


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to ``app`` (idempotent)."""
    names = {info.name or getattr(info.callback, "__name__", "") for info in app.registered_commands}
    if "serve" not in names:
        app.command("serve", epilog=SERVE_EPILOG)(serve)


def main() -> None:
    """Run the serve command as its own program (``python -m codesearch.server``)."""
    import functools
    import sys

    from codesearch.errors import CodeSearchError

    @functools.wraps(serve)
    def one_line_errors(*args: object, **kwargs: object) -> None:
        try:
            serve(*args, **kwargs)
        except CodeSearchError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None

    app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False, rich_markup_mode=None)
    app.command("serve", epilog=SERVE_EPILOG)(one_line_errors)
    app(prog_name="python -m codesearch.server")
