"""The server's network checks: what counts as this machine, the token a request must
carry, and the listening socket. Apart from the app and the runner (which both use them) so
that neither imports the other, and light enough for the client of ``codesearch query``."""

from __future__ import annotations

import ipaddress
import socket

from codesearch.errors import ServerError

__all__ = ["TOKEN_ENV", "bind_socket", "check_bind", "client_host", "is_loopback", "normalize_token"]

TOKEN_ENV = "CODESEARCH_TOKEN"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything, so not loopback


def normalize_token(token: str | None) -> str | None:
    """The token every request must carry: stripped of surrounding whitespace (a client
    strips what it sends, so a padded token would refuse everyone); None when not given.

    Raises
    ------
    ServerError
        A token of only whitespace, or with a character an HTTP header cannot carry as is
        (a control or non-ASCII character). The message never shows the token.
    """
    if not token:
        return None  # --token '' is no token (refused off loopback by check_bind)
    stripped = token.strip()
    if not stripped:
        raise ServerError(f"the token is blank (only whitespace); pass --token SECRET or set {TOKEN_ENV} "
                          "to visible characters, or unset it")
    bad = next((i for i, ch in enumerate(stripped) if not " " <= ch <= "~"), None)
    if bad is not None:
        raise ServerError(f"the token has a control or non-ASCII character at position {bad + 1}, which an "
                          f"Authorization header cannot carry; use printable ASCII in --token or {TOKEN_ENV}")
    return stripped


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without a token.

    Raises
    ------
    ServerError
        A non-loopback ``host`` and no token.
    """
    if not is_loopback(host) and not token:
        raise ServerError(
            f"refusing to listen on non-loopback host {host!r} without a token "
            f"(pass --token SECRET or set {TOKEN_ENV}, or bind 127.0.0.1)"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free port.

    Why bind here rather than let uvicorn do it: the real port of ``--port 0`` is known
    before the server runs, so the discovery files and the announce line can carry it.

    Raises
    ------
    ServerError
        The address is in use or cannot be bound.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        raise ServerError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port, or --port 0 for a free one"
        ) from None
    sock.set_inheritable(True)
    return sock


def client_host(bound_host: str) -> str:
    # A wildcard bind is reached through loopback by clients on this machine.
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bound_host, bound_host)
