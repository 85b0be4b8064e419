"""The discovery file a running server leaves in each served index folder.

``codesearch query`` looks for ``<index_dir>/server.json`` to use a warm server instead of
loading the models itself. The file says where the server listens and whether a token is
needed, never the token itself: the index folder is readable by anything that can read the
repository.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DISCOVERY_NAME = "server.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Where a running server listens, as written to ``server.json``.

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
        return {"schema_version": SCHEMA_VERSION, **asdict(self), "url": self.url}


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
