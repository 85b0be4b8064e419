"""``codesearch serve ROOT --mcp stdio`` as a thin client of the daemon.

An agent (Claude Code, Cursor, Codex, ...) starts this once per session, as ``codesearch
agents --write`` set it up: the configs keep working unchanged. This process loads no model
and imports neither torch nor the server: it registers the session's roots with the
per-user daemon (starting it when none runs) and relays each JSON-RPC message from stdin to
the session's MCP endpoint there (Streamable HTTP, stateless, JSON answers) and each answer
to stdout, one line each, as MCP's stdio transport frames them. Many sessions then share
one model load, one watcher and one index writer per repository.

A daemon that goes away (killed, or replaced by another version) is found again or started
again, the session registered again and the message sent again, when sending it again is
safe: a message never delivered (no connection), or a read (`idempotent`). A call that may
have been acted on (``repair_index`` queues a run) and then lost its answer (a timeout, a
daemon killed mid-call) is not sent twice: the agent gets an error that says so.

Standard library only, and not even `http.client` (`codesearch.server.wire`): each session
is a small Python process (~14 MiB resident, most of it the interpreter's own).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from codesearch.server import daemon_client
from codesearch.server.runtime_dir import DaemonInfo
from codesearch.server.wire import NotConnected, exchange

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

MAX_IN_FLIGHT = 16  # requests relayed at once; an agent rarely has more than one or two
REQUEST_TIMEOUT_S = 600.0  # the daemon bounds searches (10 s); index tools may take longer
#: MCP methods that change nothing on the daemon: sent again after a lost answer.
IDEMPOTENT_METHODS = frozenset({"initialize", "ping", "tools/list", "resources/list", "resources/templates/list",
                                "resources/read", "prompts/list", "prompts/get", "completion/complete"})
#: Tools that only read (`codesearch.server.mcp_tools`); ``repair_index`` queues a run.
READ_ONLY_TOOLS = frozenset({"search_code", "index_status"})


def idempotent(message: object) -> bool:
    """Whether ``message`` (a JSON-RPC request) may be sent again after its answer was lost:
    a read. Notifications and anything unknown: no."""
    if not isinstance(message, dict) or message.get("id") is None:
        return False
    method = message.get("method")
    if method == "tools/call":
        params = message.get("params")
        return isinstance(params, dict) and params.get("name") in READ_ONLY_TOOLS
    return method in IDEMPOTENT_METHODS


class _Link:
    """The daemon and the session registered with it, re-made when the daemon goes away."""

    def __init__(self, register: Callable[[DaemonInfo], str], start: bool):
        self._register = register
        self._start = start
        self._lock = threading.Lock()
        self.info: DaemonInfo | None = None
        self.path = ""
        self.protocol_version: str | None = None

    def current(self) -> tuple[DaemonInfo, str]:
        with self._lock:
            if self.info is None:
                self._connect()
            assert self.info is not None
            return self.info, self.path

    def reconnect(self, seen: DaemonInfo) -> tuple[DaemonInfo, str]:
        """After a failed exchange with ``seen``: the live daemon (started again if need be)."""
        with self._lock:
            if self.info is seen:
                self.info = None
                self._connect()
            assert self.info is not None
            return self.info, self.path

    def _connect(self) -> None:
        info = daemon_client.ensure(start=self._start, say=_say)
        if info is None:
            raise daemon_client.DaemonError("the codesearch daemon is not running (and this session may not start it)")
        self.path = self._register(info)
        self.info = info


def _say(line: str) -> None:
    sys.stderr.write(f"codesearch: {line}\n")
    sys.stderr.flush()


def _post(info: DaemonInfo, path: str, body: bytes, protocol_version: str | None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {info.token}"}
    if protocol_version:
        headers["MCP-Protocol-Version"] = protocol_version
    return exchange(info.host, info.port, "POST", path, body=body, headers=headers, timeout=REQUEST_TIMEOUT_S)


def _error(msg_id: object, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


class Relay:
    """Stdin to the daemon and back, for one session."""

    def __init__(self, link: _Link, out: object = None):
        self.link = link
        self.out = out if out is not None else sys.stdout.buffer
        self._write_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self._threads: list[threading.Thread] = []

    def write(self, doc: dict) -> None:
        line = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
        with self._write_lock:
            self.out.write(line)
            self.out.flush()

    def handle(self, raw: bytes) -> None:
        try:
            message = json.loads(raw)
        except ValueError:
            self.write(_error(None, -32700, "parse error: a line on stdin is not JSON"))
            return
        msg_id = message.get("id") if isinstance(message, dict) else None
        answer = self._exchange(raw, msg_id, resend=idempotent(message))
        if answer is None:
            return
        if isinstance(message, dict) and message.get("method") == "initialize":
            result = answer.get("result") if isinstance(answer, dict) else None
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                self.link.protocol_version = result["protocolVersion"]
        self.write(answer)

    def _exchange(self, raw: bytes, msg_id: object, *, resend: bool = False) -> dict | None:
        """The daemon's answer to ``raw``; sent a second time (to the daemon found or started
        again) only when the first was not delivered, or ``resend`` (a read)."""
        seen: DaemonInfo | None = None
        for attempt in range(2):
            try:
                info, path = self.link.current() if seen is None else self.link.reconnect(seen)
            except Exception as exc:  # noqa: BLE001 - said to the agent, which can go on
                return None if msg_id is None else _error(msg_id, -32603, f"codesearch daemon unavailable: {exc}")
            seen = info
            try:
                status, body = _post(info, path, raw, self.link.protocol_version)
            except NotConnected:
                continue  # the daemon went away: find or start it, register again, resend
            except OSError as exc:
                if resend:
                    continue  # a read: asking again is harmless
                # Delivered, perhaps acted on (a queued run), answer lost: not sent twice.
                return None if msg_id is None else _error(
                    msg_id, -32603, f"the codesearch daemon did not answer ({exc or type(exc).__name__}); the call may "
                    "have run: check with index_status before calling it again")
            if status == 404 and attempt == 0:
                continue  # a daemon that restarted does not know this session
            if status == 202 or not body:
                return None
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and doc.get("jsonrpc") == "2.0":
                return doc
            detail = doc.get("detail") if isinstance(doc, dict) else body[:200].decode("utf-8", "replace")
            return None if msg_id is None else _error(msg_id, -32603, f"codesearch daemon answered {status}: {detail}")
        return None if msg_id is None else _error(msg_id, -32603, "the codesearch daemon could not be reached")

    def run(self, stdin: object = None) -> None:
        source = stdin if stdin is not None else sys.stdin.buffer
        for raw in iter(source.readline, b""):
            if not raw.strip():
                continue
            self._slots.acquire()
            thread = threading.Thread(target=self._one, args=(raw,), daemon=True)
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S)

    def _one(self, raw: bytes) -> None:
        try:
            self.handle(raw)
        finally:
            self._slots.release()


def proxy_stdio(roots: list[Path], options: dict | None, *, start: bool, index_on_start: bool = True) -> bool:
    """Serve MCP on stdin/stdout through the daemon until stdin closes.

    Returns False, having read nothing from stdin, when no daemon can be had (``start``
    False and none runs, or it could not start: said on stderr); the caller then serves in
    its own process.
    """
    resolved = [str(Path(r).expanduser().resolve()) for r in roots]
    sessions: list[tuple[DaemonInfo, str]] = []

    def register(info: DaemonInfo) -> str:
        body: dict = {"roots": resolved, "pid": os.getpid(), "index_on_start": index_on_start}
        if options:
            body["options"] = options
        status, doc = daemon_client.call(info, "POST", "/daemon/sessions", body, timeout=REQUEST_TIMEOUT_S)
        if status != 200:
            raise daemon_client.DaemonError(doc.get("detail") or f"the daemon answered {status}")
        sessions.append((info, doc["id"]))
        return doc["mcp"]

    link = _Link(register, start)
    try:
        info, _ = link.current()
    except Exception as exc:  # noqa: BLE001 - any failure: serve in-process instead
        if start or daemon_client.find() is not None:
            _say(f"{exc}; serving in this process instead")
        return False
    sys.stderr.write(json.dumps({"event": "listening", "transport": "stdio", "pid": os.getpid(), "roots": resolved,
                                 "daemon": info.pid}) + "\n")
    sys.stderr.flush()
    try:
        Relay(link).run()
    except KeyboardInterrupt:
        pass
    finally:
        for seen, sid in sessions:
            try:
                daemon_client.call(seen, "DELETE", f"/daemon/sessions/{sid}", timeout=2.0)
            except (OSError, ValueError):
                pass
    return True
