"""The HTTP JSON API (FastAPI): ``POST /search``, ``GET /status``, ``POST /index``,
``GET /health``, and the MCP Streamable HTTP endpoint at ``/mcp``.

Errors are JSON ``{"error": <class>, "detail": <one line>}`` with a status that says whose
fault it is: 400 bad request, 401 no or wrong token, 403 path outside the served roots,
404 a path or repo that is not served, 409 not indexed yet, 413 a body over 1 MiB, 503 too
busy or shutting down (a search in flight at SIGTERM), 504 search timed out. On a loopback
bind every route also refuses a foreign ``Host`` (421) or ``Origin`` (403) header:
DNS-rebinding protection, see `HostGuard`.
"""

from __future__ import annotations

import contextlib
import hmac
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from codesearch import __version__
from codesearch.errors import (
    CodeSearchError,
    IndexLockedError,
    NotIndexedError,
    PathError,
    QueryError,
)
from codesearch.server.discovery import CHALLENGE_HEADER, PROOF_HEADER, token_proof
from codesearch.server.network import is_loopback
from codesearch.server.repos import AmbiguousPathError, InvalidPathError, UnknownPathError
from codesearch.server.service import MAX_K, SearchTimeoutError, ServerBusyError, ServerStoppingError, Service
from codesearch.types import Mode

# -- request and response models (they make the OpenAPI schema) ---------------------------


class SearchRequest(BaseModel):
    """``POST /search`` body: the options of ``codesearch query``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=20_000, description="Natural language, an identifier, or code.")
    k: int = Field(10, ge=1, le=MAX_K, description="How many results.")
    mode: Mode = Field(Mode.hybrid, description="Which indexes rank.")
    lang: str | list[str] | None = Field(None, description="Only this language, or any of these (python, go, ...).")
    glob: str | list[str] | None = Field(
        None, description="ripgrep-style glob(s) on the path: '*.{rs,md}', '!tests/**'; the last match wins."
    )
    files_only: bool = Field(False, description="One result per file, best chunk first, without text.")
    regex: str | None = Field(
        None, description="Only chunks whose text matches this RE2 pattern (linear time; ^ $ per line; "
        "at most 1000 characters), ranked as usual.",
    )
    context: int = Field(0, ge=0, description="Extra lines of the file above and below each snippet.")
    max_lines: int | None = Field(
        None, ge=1, description="Cut each snippet to this many lines (end_line shrinks; more_lines counts the rest)."
    )
    no_snippet: bool = Field(False, description="Locations and scores only (empty text).")
    min_score: float | None = Field(None, description="Leave out hits scoring below this.")
    budget: int | None = Field(
        None, ge=1, description="Approximate token budget of the answer; 'left_out' says how many hits did not fit."
    )
    path: str | None = Field(
        None,
        description="A folder or file to search in: absolute, or relative (to `repo`; else starting with a "
        "served repository's name; with one repository served, inside it). Default: every served repository.",
    )
    repo: str | None = Field(None, description="Only this served repository: its name (folder name) or path.")


class Hit(BaseModel):
    path: str = Field(description="Relative to the served root, posix.")
    start_line: int = Field(description="1-based, inclusive.")
    end_line: int = Field(description="1-based, inclusive.")
    score: float
    language: str
    symbol: str | None
    kind: str
    text: str = Field(description="The exact source of start_line..end_line (empty with no_snippet or files_only).")
    more_lines: int | None = Field(
        None, description="Lines of the chunk past end_line that max_lines or budget cut off; only when cut."
    )
    repo: str | None = Field(None, description="The served repository's name; only when several are served.")


class SearchResponse(BaseModel):
    """The same document as ``codesearch query --json``."""

    schema_version: int
    query: str
    mode: str
    indexes_used: list[str]
    notices: list[str]
    results: list[Hit]
    left_out: int | None = Field(None, description="Hits left out by min_score or budget (only when one was set).")


class IndexRequest(BaseModel):
    """``POST /index`` body."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, description="A served repository (name or path); default every one.")
    rebuild: bool = Field(False, description="Drop the index and build it again.")


class IndexAccepted(BaseModel):
    root: str
    roots: list[str]
    accepted: bool
    rebuild: bool
    indexing: dict[str, Any]


class Health(BaseModel):
    status: str
    version: str
    pid: int
    roots: list[str]
    repos: list[str] = Field(description="Each root's name, as `repo` and hits use it.")


class ErrorBody(BaseModel):
    error: str = Field(description="Error class, e.g. PathError.")
    detail: str = Field(description="One line: the bad value and the fix.")


_STATUS: list[tuple[type[CodeSearchError], int]] = [
    (UnknownPathError, 404),
    (AmbiguousPathError, 400),
    (InvalidPathError, 400),
    (PathError, 403),
    (QueryError, 400),
    (NotIndexedError, 409),
    (IndexLockedError, 409),
    (ServerBusyError, 503),
    (ServerStoppingError, 503),
    (SearchTimeoutError, 504),
]


MAX_BODY_BYTES = 1 << 20  # a search is a query and a few options; MCP calls are as small

_HTTP_NAMES = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 413: "TooLarge"}
_HTTP_DETAIL = {
    # FastAPI's answer to a body json.loads cannot read: invalid UTF-8, nesting past the
    # recursion limit.
    "There was an error parsing the body": "the request body is not valid UTF-8 JSON, or nests too deep "
    "(send a flat JSON object, see GET /openapi.json)",
}


def _error(status: int, name: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": name, "detail": detail}, status_code=status)


def status_for(exc: CodeSearchError) -> int:
    """HTTP status of a `CodeSearchError` (500 for the ones that are the server's problem)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


# -- auth ----------------------------------------------------------------------------------

_CHALLENGE = CHALLENGE_HEADER.lower().encode("latin-1")


class BearerAuth:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <token>``.

    Pure ASGI rather than a FastAPI dependency so that it also guards the mounted MCP
    endpoint and the docs. The comparison is constant-time (``hmac.compare_digest``), so
    response timing does not leak how much of a guessed token was right.
    """

    def __init__(self, app: ASGIApp, token: str):
        self.app = app
        self._token = token.strip()  # the client strips what it sends; so must the server
        self._expected = self._token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        supplied = challenge = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                supplied = value
            elif name == _CHALLENGE:
                challenge = value
        scheme, _, token = supplied.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected):
            await self.app(scope, receive, send)
            return
        detail = (
            "missing or wrong bearer token (send 'Authorization: Bearer <token>' with the token "
            "the server was started with: --token or CODESEARCH_TOKEN)"
        )
        headers = {"WWW-Authenticate": "Bearer"}
        if challenge and len(challenge) <= 128:
            # A client about to send its token asks first whether this server holds the same
            # one (see discovery.token_proof); the answer tells nothing about the token.
            port = (scope.get("server") or ("", 0))[1] or 0
            headers[PROOF_HEADER] = token_proof(self._token, port, challenge.decode("latin-1"))
        response = JSONResponse({"error": "AuthError", "detail": detail}, status_code=401, headers=headers)
        await response(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request body past `MAX_BODY_BYTES` is answered 413 before anything
    parses it.

    Why: uvicorn reads any body it is sent, and FastAPI parses and validates the JSON on the
    event loop; a 16 MB body held up ``/health`` for 0.2 s, and the size is the sender's
    choice. The body is read here (up to the limit) and handed on whole.
    """

    def __init__(self, app: ASGIApp, limit: int | None = None):
        self.app = app
        self.limit = MAX_BODY_BYTES if limit is None else limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length", b"0")
        chunks: list[bytes] = []
        size = int(declared) if declared.isdigit() else 0
        while size <= self.limit:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            size = max(size, sum(map(len, chunks)))
            if not message.get("more_body", False):
                break
        if size > self.limit:
            detail = (f"the request body is larger than {self.limit // 1024} KiB (send a smaller request: "
                      "a search needs a query and a few options)")
            await _error(413, "TooLarge", detail)(scope, receive, send)
            return
        await self.app(scope, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}],
                                      receive), send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A `receive` that returns ``messages`` first, then defers to ``then``."""
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


class HostGuard:
    """ASGI middleware: refuse requests whose ``Host`` or ``Origin`` is not this machine.

    Why: a web page on ``evil.example`` can make its name resolve to 127.0.0.1 (DNS
    rebinding) and then read a loopback server as its own origin; only the ``Host`` and
    ``Origin`` headers give it away. Same rule and statuses as the MCP SDK's protection of
    ``/mcp`` (421 for the host, 403 for the origin), applied to every route. Only installed
    on a loopback bind: a server exposed beyond it requires a bearer token, which a page
    from another origin cannot know.
    """

    def __init__(self, app: ASGIApp, host: str):
        self.app = app
        self._hosts = {"127.0.0.1", "localhost", "[::1]", _bracket(host).lower()}

    def _local(self, authority: str) -> bool:
        """``host`` or ``host:port`` (a port of digits only) names this machine.

        Whole, not by its head: ``127.0.0.1:8000.evil.com`` (a name a page can make resolve
        to 127.0.0.1) passed when the part before the last ``:`` was compared alone.
        """
        found = _AUTHORITY.fullmatch(authority.strip().lower())
        return found is not None and found.group(1) in self._hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope.get("headers", ())
                   if name in (b"host", b"origin")}
        host, origin = headers.get(b"host", ""), headers.get(b"origin")
        if not self._local(host):
            response = _error(421, "HostError", f"Host header {host!r} is not this machine (DNS-rebinding protection; "
                                                "serve with --host and --token to be reached by another name)")
        elif origin is not None and not (
            origin.startswith(("http://", "https://")) and self._local(origin.split("://", 1)[1].split("/", 1)[0])
        ):
            response = _error(403, "OriginError", f"Origin {origin!r} may not call this server (requests from web "
                                                  "pages of other origins are refused)")
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


#: A Host header (or an origin's host): a name or a bracketed IPv6 address, then an
#: optional port of digits.
_AUTHORITY = re.compile(r"(\[[0-9a-f:.]+\]|[^:\[\]/@]+)(?::\d{1,5})?")


def _bracket(host: str) -> str:
    """IPv6 addresses as a Host header writes them: ``[::1]``."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- the app -------------------------------------------------------------------------------


def create_app(service: Service, *, token: str | None = None, mcp: bool = True, host: str = "127.0.0.1") -> ASGIApp:
    """The ASGI app: FastAPI routes, MCP at ``/mcp``, bearer auth when ``token`` is set.

    Parameters
    ----------
    service:
        The served repositories and search pool.
    token:
        When set, every request (MCP included) must carry it.
    mcp:
        Mount the MCP Streamable HTTP endpoint at ``/mcp``.
    host:
        The bound host; on loopback every route checks the Host/Origin headers
        (`HostGuard`; the MCP SDK also checks them on ``/mcp``).

    Returns
    -------
    ASGI app
        The FastAPI app, wrapped in `BodyLimit`, in `BearerAuth` when a token is set and
        in `HostGuard` on a loopback bind.
    """
    mcp_server = None
    mcp_routes: list[BaseRoute] = []
    if mcp:
        from codesearch.server.mcp_tools import build_mcp

        mcp_server = build_mcp(service)
        # Stateless + JSON responses: each MCP POST is answered on its own, so MCP calls
        # share the HTTP server's limits and need no session bookkeeping.
        mcp_app = mcp_server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host
        )
        mcp_routes = list(mcp_app.routes)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_server is not None:
                await stack.enter_async_context(mcp_server.session_manager.run())
            yield

    app = FastAPI(
        title="codesearch",
        version=__version__,
        description="Semantic code search over the served repositories. MCP (Streamable HTTP) at /mcp.",
        lifespan=lifespan,
    )
    app.state.service = service
    errors = {400: {"model": ErrorBody}, 403: {"model": ErrorBody}, 409: {"model": ErrorBody}}

    @app.exception_handler(CodeSearchError)
    async def _codesearch_error(_request: Request, exc: CodeSearchError) -> JSONResponse:
        return _error(status_for(exc), type(exc).__name__, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own errors (an unknown route, a body that is not UTF-8 JSON or nests
        # past the parser's depth) in the documented {"error", "detail"} form too.
        detail = _HTTP_DETAIL.get(str(exc.detail), str(exc.detail))
        return JSONResponse({"error": _HTTP_NAMES.get(exc.status_code, "HTTPError"), "detail": detail},
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # One line, like every other error, instead of FastAPI's nested 422 document.
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return _error(400, "ValidationError", "; ".join(parts) + " (see GET /openapi.json for the schema)")

    busy = {503: {"model": ErrorBody}, 504: {"model": ErrorBody}}

    @app.post("/search", response_model=SearchResponse, responses={**errors, **busy})
    async def search(body: SearchRequest) -> JSONResponse:
        """Search one served repository; the result schema is ``codesearch query --json``'s."""
        # A Response is sent as is: the document is already the schema's (it is the CLI's),
        # and re-validating every hit through the response model cost more than the search.
        # The request is checked (QueryError -> 400) in the search pool, not here: how long
        # its globs take to check is the sender's choice, and this loop answers /health.
        fields = body.model_dump(exclude={"path", "repo", "lang", "glob"})
        return JSONResponse(
            await service.search(lang=body.lang, glob=body.glob, path=body.path, repo=body.repo, **fields)
        )

    @app.post("/index", status_code=202, response_model=IndexAccepted, responses=errors)
    def index(body: IndexRequest | None = None) -> dict[str, Any]:
        """Queue an incremental index run (or a rebuild); returns at once. Progress: GET /status."""
        # A plain `def`: resolving the path touches the file system, off the event loop.
        body = body or IndexRequest()
        return service.index(body.path, rebuild=body.rebuild)

    @app.get("/status", responses=errors)
    def status(path: str | None = Query(None, description="Only the root containing this path.")) -> dict[str, Any]:
        """Index contents, staleness and indexer progress of each served root."""
        # A plain `def`: FastAPI runs it on its thread pool, as it walks the files.
        return service.status(path)

    @app.get("/health", response_model=Health)
    async def health() -> dict[str, Any]:
        """Liveness and the served roots (what `codesearch query` checks before using the server)."""
        return service.health()

    app.router.routes.extend(mcp_routes)
    guarded: ASGIApp = BodyLimit(app)
    if token:
        guarded = BearerAuth(guarded, token)
    # Host first: a rebinding page must learn nothing, not even that a token is needed.
    return HostGuard(guarded, host) if is_loopback(host) else guarded
