"""The discovery file a running server leaves in each served index folder, and how a
client decides whether to believe one.

``codesearch query`` looks for ``<index_dir>/server.json`` to use a warm server instead of
loading the models itself. The file says where the server listens and whether a token is
needed, never the token itself: the index folder is readable by anything that can read the
repository.

Which is also why the file proves nothing: a cloned repository can carry one, pointing at
any host and port. A client therefore talks only to a loopback address (`is_loopback`),
where the listening socket belongs to the pid the file names, and that process to this
user (`listener_belongs_to`, where ``/proc`` can tell); and it sends a token only to a
server that has shown it holds the same token, by answering a fresh challenge with
`token_proof` (the proof binds the port, so another server cannot relay it). Nothing here
depends on the file living in the index folder: the same checks apply to a per-user
runtime directory.
"""

from __future__ import annotations

import json
import os
import time
from collections import namedtuple
from pathlib import Path

DISCOVERY_NAME = "server.json"
SCHEMA_VERSION = 1
#: A client's nonce, sent without a token; a server that has one answers with
#: `PROOF_HEADER` (on its 401), and the client sends the token only if the proof is right.
CHALLENGE_HEADER = "X-Codesearch-Challenge"
PROOF_HEADER = "X-Codesearch-Proof"


class ServerInfo(namedtuple("ServerInfo", "host port pid token_required root started_at")):
    """Where a running server listens, as written to ``server.json``.

    A named tuple, not a frozen dataclass: the thin clients read it (see `DaemonInfo`).

    Attributes
    ----------
    host, port:
        The bound address (the real port, also when ``--port 0`` asked for an ephemeral one).
    pid:
        Process id of the server; a file whose pid is dead is stale and ignored.
    token_required:
        True when every request must carry ``Authorization: Bearer <token>``.
    root:
        The served repository root this file belongs to (absolute, resolved).
    started_at:
        Unix time the server started listening.
    """

    __slots__ = ()
    host: str
    port: int
    pid: int
    token_required: bool
    root: str
    started_at: float

    @property
    def url(self) -> str:
        """Base URL of the server (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def to_dict(self) -> dict:
        """JSON-ready form, with ``schema_version`` and ``url``."""
        return {"schema_version": SCHEMA_VERSION, **self._asdict(), "url": self.url}


def discovery_path(index_dir: str | os.PathLike[str]) -> Path:
    """The discovery file's path inside an index folder."""
    return Path(index_dir) / DISCOVERY_NAME


def write_discovery(index_dir: str | os.PathLike[str], info: ServerInfo) -> Path:
    """Write ``server.json`` atomically (temp name + ``os.replace``), readable only by the owner.

    A reader never sees half a file: it either finds the previous one or the new one.
    """
    path = discovery_path(index_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{DISCOVERY_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(info.to_dict(), fh)
    os.replace(tmp, path)
    return path


def remove_discovery(index_dir: str | os.PathLike[str], pid: int | None = None) -> None:
    """Remove ``server.json`` if it still belongs to ``pid`` (default: this process).

    Why the pid check: a second server may have started on the same repo and rewritten the
    file; the first one shutting down must not delete the second one's entry.
    """
    pid = os.getpid() if pid is None else pid
    path = discovery_path(index_dir)
    info = read_discovery(index_dir, check_alive=False)
    if info is not None and info.pid != pid:
        return
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def pid_alive(pid: int) -> bool:
    """True when a process with this id exists (signal 0 probes without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def read_discovery(index_dir: str | os.PathLike[str], *, check_alive: bool = True) -> ServerInfo | None:
    """Read ``server.json``; None when absent, unreadable, malformed or (by default) stale.

    Never raises: a broken discovery file must only cost the fast path, not the query.
    """
    try:
        raw = json.loads(discovery_path(index_dir).read_text(encoding="utf-8"))
        info = ServerInfo(
            host=str(raw["host"]),
            port=int(raw["port"]),
            pid=int(raw["pid"]),
            token_required=bool(raw["token_required"]),
            root=str(raw["root"]),
            started_at=float(raw.get("started_at", time.time())),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if check_alive and not pid_alive(info.pid):
        return None
    return info


def token_proof(token: str, port: int, nonce: str) -> str:
    """HMAC-SHA256 of the nonce and the server's port, keyed with the token (hex).

    The port is in it so that a server that does not hold the token cannot pass a client's
    challenge on to one that does and return its answer: that one proves its own port.
    """
    import hashlib  # here: the CLI's warm query reads this module and never proves a token
    import hmac

    message = f"codesearch-proof-v1 {int(port)} {nonce}".encode()
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).hexdigest()


def listener_belongs_to(port: int, pid: int) -> bool | None:
    """Whether the TCP socket listening on ``port`` is open in process ``pid`` and owned by
    this user; None where the system does not say (no ``/proc``).

    Read from ``/proc/net/tcp{,6}`` (the listening socket's owner and inode) and
    ``/proc/<pid>/fd`` (readable only for this user's own processes).
    """
    inodes: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port and int(fields[7]) == os.getuid():
                inodes.add(fields[9])
    if not readable:
        return None
    if not inodes or pid <= 0:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # not ours (pid 1, another user's), or gone
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            continue
    return False
