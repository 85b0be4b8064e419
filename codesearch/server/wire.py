"""One HTTP/1.1 exchange with the per-user daemon over a plain socket.

Why not `http.client`: importing it (with the ``email`` package it parses headers with)
costs about 20 ms, a tenth of a warm ``codesearch query``, and a few MiB in each agent
session's relay process. The daemon is ours, on loopback, and answers one request per
connection with a ``Content-Length`` or a chunked body; this reads either, or a body
ended by the close, and nothing more of HTTP. Standard library only (`socket`).
"""

from __future__ import annotations

import socket

#: Longest status or header line read before the exchange is called broken.
MAX_LINE = 65536


class WireError(ConnectionError):
    """The peer did not answer HTTP/1.x as the daemon does (a broken exchange, as a reset is)."""


class NotConnected(ConnectionError):
    """No connection was made: the request was certainly not delivered (safe to send again,
    whatever it asks; a failure after this point may have been acted on)."""


def exchange(host: str, port: int, method: str, path: str, *, body: bytes | None = None,
             headers: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int, bytes]:
    """Send one request and read the whole answer; returns (status, body).

    Raises
    ------
    OSError
        No connection (`NotConnected`: nothing was delivered), a timeout (`TimeoutError`),
        a reset, or an answer that is not HTTP/1.x (`WireError`).
    ValueError
        A header value with a line break (it would forge another header).
    """
    where = f"[{host}]" if ":" in host else host
    lines = [f"{method} {path} HTTP/1.1", f"Host: {where}:{port}", "Connection: close",
             "Accept-Encoding: identity"]
    for name, value in (headers or {}).items():
        if any(c in f"{name}{value}" for c in "\r\n\0"):
            raise ValueError(f"header {name!r} has a line break (not sent)")
        lines.append(f"{name}: {value}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise NotConnected(f"no connection to {where}:{port} ({exc})") from exc
    with sock:
        sock.sendall(request)
        with sock.makefile("rb") as reader:
            return _response(reader, method)


def _response(reader, method: str) -> tuple[int, bytes]:
    while True:
        status_line = _line(reader)
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise WireError(f"not an HTTP answer: {status_line[:80]!r}")
        status = int(parts[1])
        fields = _fields(reader)
        if status >= 200:
            break  # (a 1xx interim answer is followed by the real one)
    if method == "HEAD" or status in (204, 304):
        return status, b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return status, _chunked(reader)
    if "content-length" in fields:
        try:
            size = int(fields["content-length"])
        except ValueError:
            raise WireError(f"bad Content-Length {fields['content-length']!r}") from None
        data = reader.read(size)
        if len(data) != size:
            raise WireError(f"the answer ended after {len(data)} of {size} bytes")
        return status, data
    return status, reader.read()


def _line(reader) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if not line:
        raise WireError("the connection closed before an answer")
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise WireError("an answer line too long, or cut")
    return line.rstrip(b"\r\n")


def _fields(reader) -> dict[str, str]:
    fields: dict[str, str] = {}
    while True:
        line = _line(reader)
        if not line:
            return fields
        name, sep, value = line.partition(b":")
        if not sep:
            raise WireError(f"not a header line: {line[:80]!r}")
        fields[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")


def _chunked(reader) -> bytes:
    out = bytearray()
    while True:
        size_text = _line(reader).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise WireError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            _fields(reader)  # trailers, up to the blank line
            return bytes(out)
        chunk = reader.read(size)
        if len(chunk) != size or reader.read(2) != b"\r\n":
            raise WireError("a chunk was cut")
        out += chunk
