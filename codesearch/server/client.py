"""Client side of the fast path: ``codesearch query`` asks a running server first.

A warm server answers in milliseconds; loading the models in a fresh process takes seconds.
Everything here is best effort: any doubt (no discovery file, dead pid, wrong repo, a host
that is not loopback, a socket or pid that does not match the file, a server that cannot
prove it holds the token, no answer within the short timeout, an error status) returns None
and the CLI searches on its own, so a broken, stale or planted discovery file can never make
a query fail, or take the query and the token elsewhere.

Only the standard library is used (``http.client``): importing httpx would cost more than
the round trip it makes.
"""

from __future__ import annotations

import dataclasses
import hmac
import http.client
import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch.server.discovery import (
    CHALLENGE_HEADER,
    PROOF_HEADER,
    ServerInfo,
    listener_belongs_to,
    read_discovery,
    token_proof,
)
from codesearch.server.network import is_loopback
from codesearch.types import (
    JSON,
    SCHEMA_VERSION,  # of the documents this client understands
    JSONDict,
)

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.types import SearchRequest, SearchResult

HEALTH_TIMEOUT_S = 0.3
SEARCH_TIMEOUT_S = 30.0
TOKEN_ENV = "CODESEARCH_TOKEN"
ANSWERED_BY = "answered by the running 'codesearch serve' for this repository"


def _request(
    info: ServerInfo,
    method: str,
    path: str,
    *,
    body: JSONDict | None,
    token: str | None,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> tuple[int, JSON, http.client.HTTPMessage]:
    conn = http.client.HTTPConnection(info.host, info.port, timeout=timeout)
    try:
        sent = {"Accept": "application/json", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            sent["Content-Type"] = "application/json"
        if token:
            sent["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=data, headers=sent)
        resp = conn.getresponse()
        payload = resp.read()
        return resp.status, json.loads(payload) if payload else None, resp.headers
    finally:
        conn.close()


def configured_token(token: str | None = None) -> str | None:
    """``token``, else ``$CODESEARCH_TOKEN``, stripped; None when blank (as the server
    strips the one it is started with)."""
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    return (token or "").strip() or None


def find_server(root: str | os.PathLike[str], *, index_dir: str | os.PathLike[str] | None = None) -> ServerInfo | None:
    """The live server that serves ``root``, from its discovery file; None when there is none
    or the file cannot be believed: a host that is not loopback, or (where ``/proc`` says)
    a listening socket that is not the named process's, or not this user's."""
    root_path = Path(root).resolve()
    folder = Path(index_dir) if index_dir is not None else root_path / ".codesearch"
    info = read_discovery(folder)
    if info is None or Path(info.root) != root_path or not is_loopback(info.host):
        return None
    if listener_belongs_to(info.port, info.pid) is False:
        return None
    return info


def _proves_token(info: ServerInfo, token: str, timeout: float) -> bool:
    """Ask the server, without the token, to show it holds it (see `token_proof`)."""
    nonce = secrets.token_hex(16)
    status, _, headers = _request(info, "GET", "/health", body=None, token=None, timeout=timeout,
                                  headers={CHALLENGE_HEADER: nonce})
    proof = headers.get(PROOF_HEADER) or ""
    return status == 401 and hmac.compare_digest(proof, token_proof(token, info.port, nonce))


def try_server_search(
    root: str | os.PathLike[str],
    request: JSONDict,
    *,
    index_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    health_timeout: float = HEALTH_TIMEOUT_S,
    timeout: float = SEARCH_TIMEOUT_S,
) -> JSONDict | None:
    """Run a search on a running server for ``root``; None when no usable server is up.

    Parameters
    ----------
    root:
        The repository the query is for.
    request:
        The ``POST /search`` body: ``query`` and optionally ``k``, ``mode``, ``lang``,
        ``glob``, ``files_only`` (same names as the CLI options). ``path`` is set to
        ``root``.
    index_dir:
        Where the index lives when not ``<root>/.codesearch``.
    token:
        Bearer token for a server started with one; default ``$CODESEARCH_TOKEN``. A server
        that needs a token when none is known is skipped without a request; the token is
        sent only to a server whose discovery file says it needs one and that first proves
        it holds the same token, and never where none is needed. Any server is used only
        when it reports the pid its discovery file names.
    health_timeout, timeout:
        Seconds for the quick ``/health`` probe and for the search itself.

    Returns
    -------
    dict | None
        The server's JSON document, the same schema as ``codesearch query --json``
        (``schema_version``, ``query``, ``mode``, ``indexes_used``, ``notices``,
        ``results``); None on any failure, so the caller searches locally.

    Example
    -------
    >>> doc = try_server_search("path/to/repo", {"query": "retry http", "k": 5})  # doctest: +SKIP
    >>> doc is None or doc["schema_version"] == 1                                  # doctest: +SKIP
    True
    """
    info = find_server(root, index_dir=index_dir)
    if info is None:
        return None
    token = configured_token(token) if info.token_required else None  # never sent where not asked for
    if info.token_required and not token:
        return None
    root_path = str(Path(root).resolve())
    try:
        if token and not _proves_token(info, token, health_timeout):
            return None
        status, health, _ = _request(info, "GET", "/health", body=None, token=token, timeout=health_timeout)
        if (status != 200 or not isinstance(health, dict) or health.get("pid") != info.pid
                or root_path not in health.get("roots", [])):
            return None
        body = {key: value for key, value in request.items() if value is not None}
        body["path"] = root_path
        status, doc, _ = _request(info, "POST", "/search", body=body, token=token, timeout=timeout)
    except (OSError, http.client.HTTPException, ValueError):
        # OSError covers refused connections and timeouts; ValueError a non-JSON answer.
        return None
    if status != 200 or not isinstance(doc, dict):
        # Why not surface the server's 4xx: the local path raises the same error with the
        # CLI's own formatting and exit code.
        return None
    return doc


def result_from_document(doc: JSONDict) -> SearchResult:
    """Turn a ``POST /search`` document back into a `SearchResult` for the CLI's renderers.

    The document carries what ``--json`` prints; fields it lacks (scope, chunk id, sources)
    are left empty.
    """
    from codesearch.types import SearchHit, SearchResult

    hits = [
        SearchHit(
            path=h["path"], start_line=int(h["start_line"]), end_line=int(h["end_line"]), score=float(h["score"]),
            language=h["language"], symbol=h.get("symbol"), kind=h["kind"], scope=None, text=h["text"],
            chunk_id=-1, more_lines=int(h.get("more_lines") or 0),
            match_lines=tuple(int(n) for n in h.get("match_lines") or ()),
        )
        for h in doc["results"]
    ]
    left_out = doc.get("left_out")
    return SearchResult(
        query=doc["query"], mode=doc["mode"], hits=hits, indexes_used=tuple(doc.get("indexes_used", ())),
        notices=list(doc.get("notices", ())), left_out=None if left_out is None else int(left_out),
    )


def request_body(request: SearchRequest) -> JSONDict:
    """``POST /search`` body of a `SearchRequest`. One language or glob goes as a string and
    output controls only when set, so that a server of an earlier release still understands
    a plain request (one that does not answers 400, and the query runs locally)."""
    from codesearch.types import SearchRequest

    def one_or_list(values: tuple[str, ...]) -> str | list[str] | None:
        return None if not values else values[0] if len(values) == 1 else list(values)

    body: JSONDict = {
        "query": request.query, "k": request.k, "mode": request.mode.value,
        "lang": one_or_list(request.languages), "glob": one_or_list(request.globs), "files_only": request.files_only,
    }
    defaults = SearchRequest("x")
    for name in ("context", "max_lines", "no_snippet", "min_score", "budget", "regex"):
        value = getattr(request, name)
        if value != getattr(defaults, name):
            body[name] = value
    return body


def try_server_result(
    root: str | os.PathLike[str],
    request: JSONDict,
    *,
    index_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
) -> SearchResult | None:
    """`try_server_search`, returned as a `SearchResult` (None when no usable server is up).

    This is the one call ``codesearch query`` makes before opening the index itself. The
    result's first notice says that the server answered.

    Example
    -------
    >>> result = try_server_result("repo", {"query": "open the db", "k": 5, "mode": "hybrid"})  # doctest: +SKIP
    >>> if result is None:                                                                   # doctest: +SKIP
    ...     result = CodeSearch("repo").query("open the db", 5)
    """
    if not str(request.get("query") or "").strip():
        return None  # the local path raises the proper QueryError
    doc = try_server_search(root, request, index_dir=index_dir, token=token)
    if doc is None or doc.get("schema_version") != SCHEMA_VERSION:
        return None
    try:
        result = result_from_document(doc)
    except (KeyError, TypeError, ValueError):  # a server of another version: search locally
        return None
    return dataclasses.replace(result, notices=[ANSWERED_BY, *result.notices])  # say who answered
