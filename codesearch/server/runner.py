"""Start, announce and stop the server: bind, write discovery files, run uvicorn or stdio.

The bound address is printed as one JSON line, so a test or an IDE extension that starts
``codesearch serve --port 0`` can read the real port::

    {"event": "listening", "url": "http://127.0.0.1:53122", "host": "127.0.0.1", "port": 53122, ...}

It goes to stdout for HTTP, and to stderr under ``--mcp stdio`` (stdout is the protocol).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TextIO

from codesearch.errors import ServerError
from codesearch.server.discovery import ServerInfo, remove_discovery, write_discovery
from codesearch.server.network import bind_socket, check_bind, client_host, normalize_token
from codesearch.server.repos import RepoOptions, RepoSet
from codesearch.server.service import Limits, Service
from codesearch.types import JSONDict

log = logging.getLogger("codesearch.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7420
GRACEFUL_S = 1.0  # requests in flight at SIGTERM get this long (uvicorn's graceful shutdown)
SHUTDOWN_WAIT_S = 0.5  # then searches and the indexer this long, before the process exits without them


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything about how to serve, apart from the repositories.

    Attributes
    ----------
    host, port:
        Where to listen; port 0 picks a free one.
    token:
        Bearer token every request must carry; required off loopback.
    mcp:
        ``"http"`` (MCP at ``/mcp`` next to the JSON API), ``"stdio"`` (MCP only, on
        stdin/stdout) or ``"off"``.
    watch:
        Re-index served roots when their files change.
    index_on_start:
        One incremental run per root at start (catch up with edits made meanwhile).
    limits:
        Search pool size, queue bound, per-search timeout.
    max_connections:
        uvicorn's ``limit_concurrency``: connections beyond it get 503 at once.
    debounce_s:
        Quiet period of the watcher.
    query_batching:
        Encode concurrent searches' queries in shared forward passes.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    mcp: str = "http"
    watch: bool = True
    index_on_start: bool = True
    limits: Limits = field(default_factory=Limits)
    max_connections: int = 256
    debounce_s: float = 0.25
    query_batching: bool = True


def _announce(payload: JSONDict, *, stream: TextIO) -> None:
    stream.write(json.dumps(payload) + "\n")
    stream.flush()


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    # uvicorn restores this handler after its graceful shutdown and re-raises the signal;
    # SystemExit then runs our `finally` blocks (discovery files, index threads) and exits 0.
    raise SystemExit(0)


def serve(roots: Sequence[str | os.PathLike[str]], repo_options: RepoOptions, options: ServeOptions) -> None:
    """Serve ``roots`` until SIGTERM/SIGINT (HTTP) or until stdin closes (MCP stdio).

    Raises
    ------
    ServerError
        Non-loopback bind without a token, a blank token, or the port cannot be bound.
    PathError
        A root that does not exist.
    """
    if options.mcp not in ("http", "stdio", "off"):
        raise ServerError(f"unknown --mcp {options.mcp!r} (use http, stdio or off)")
    token = normalize_token(options.token)
    if options.mcp != "stdio":
        check_bind(options.host, token)
    repos = RepoSet(roots, repo_options, query_batching=options.query_batching)
    service = Service(repos, options.limits)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        repos.start(index_now=options.index_on_start, watch=options.watch, quiet_s=options.debounce_s)
        if options.mcp == "stdio":
            _serve_stdio(service)
        else:
            _serve_http(service, options, token)
    except KeyboardInterrupt:
        pass
    finally:
        service.close(SHUTDOWN_WAIT_S)
        signal.signal(signal.SIGTERM, previous)


def _serve_stdio(service: Service) -> None:
    import anyio

    from codesearch.server.mcp_tools import build_mcp

    server = build_mcp(service)
    _announce({"event": "listening", "transport": "stdio", "pid": os.getpid(), "roots": service.repos.roots},
              stream=sys.stderr)
    anyio.run(server.run_stdio_async)


def _stopping_server(config: object, service: Service) -> object:
    """A uvicorn server that, on SIGTERM or SIGINT, first answers the searches in flight
    (`Service.stop`: the documented JSON 503, at once) and then shuts down as uvicorn does.
    Without it the graceful shutdown waited its second for them, then cancelled each:
    a plain-text 500 and a traceback per request, and the process gone after ~4 s."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            service.stop()
            super().handle_exit(sig, frame)

    return StoppingServer(config)


def _serve_http(service: Service, options: ServeOptions, token: str | None) -> None:
    import uvicorn

    from codesearch.server.app import create_app

    sock = bind_socket(options.host, options.port)
    bound_host, bound_port = sock.getsockname()[:2]
    host = client_host(bound_host)
    app = create_app(service, token=token, mcp=options.mcp == "http", host=options.host)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        limit_concurrency=options.max_connections,
        timeout_keep_alive=5,
        # SIGTERM stops the server within ~2 s: requests in flight get this long to finish
        # (a search takes milliseconds), then they are cancelled; the pool's threads and the
        # indexer are not waited for longer than SHUTDOWN_WAIT_S (see Service.close).
        timeout_graceful_shutdown=GRACEFUL_S,
        lifespan="on",
    )
    server = _stopping_server(config, service)
    started = time.time()
    written = []
    try:
        for repo in service.repos.repos:
            info = ServerInfo(host=host, port=bound_port, pid=os.getpid(), token_required=bool(token),
                              root=str(repo.root), started_at=started)
            try:
                write_discovery(repo.index_dir, info)
            except OSError as exc:  # a read-only checkout: serve anyway, without the fast path
                log.warning("cannot write the discovery file in %s (%s); 'codesearch query' will not "
                            "find this server", repo.index_dir, exc)
                continue
            written.append(repo.index_dir)
        url = ServerInfo(host, bound_port, os.getpid(), bool(token), "", started).url
        _announce(
            {
                "event": "listening",
                "url": url,
                "host": host,
                "port": bound_port,
                "pid": os.getpid(),
                "roots": service.repos.roots,
                "mcp": f"{url}/mcp" if options.mcp == "http" else None,
                "token_required": bool(token),
            },
            stream=sys.stdout,
        )
        print(f"codesearch: serving {', '.join(service.repos.roots)} at {url}", file=sys.stderr, flush=True)
        server.run(sockets=[sock])
    finally:
        for index_dir in written:
            remove_discovery(index_dir)
        sock.close()
