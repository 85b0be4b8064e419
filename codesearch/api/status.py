"""``codesearch status``: what an index holds and how it compares with the files on disk."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from codesearch.api.health import index_health
from codesearch.api.refresh import Recorded, stale_files
from codesearch.indexing.status import index_info
from codesearch.store import VECTOR_KINDS
from codesearch.types import SCHEMA_VERSION, STORE_FILE, JSONDict

__all__ = ["IndexStatus", "index_status"]


@dataclass(frozen=True, slots=True)
class IndexStatus:
    """What an index holds and how it compares with the files on disk.

    Attributes
    ----------
    root, index_dir : str
        The indexed folder and where its index lives (absolute paths).
    indexed : bool
        False when there is no index yet (every count is then 0).
    files, chunks : int
        Files and chunks in the store.
    languages : dict[str, int]
        Files per language, most common first.
    models : dict[str, str | None]
        ``{"dense": name, "multi": name}`` of the models the vectors came from (hub id or
        local folder); None where that index is absent (lexical-only).
    stale : dict[str, int]
        Files ``added``, ``changed`` and ``removed`` since the last index run.
    disk_bytes : dict[str, int]
        Size on disk of each index file or folder, and ``total``.
    vectors : dict[str, float]
        Share of chunks (``dense``, ``colbert``) and files (``file``) that have a vector of
        each recorded model, 0..1: below 1 while a first index run is still embedding (the
        lexical index is complete from its first seconds) or after an offline run.
    embedded : dict[str, str]
        Per model (``dense``, ``multi``), how its vectors were last embedded:
        ``local cpu (bfloat16)`` or ``ray <address>: 4 cuda workers (bfloat16)``.
    health : dict
        ``state`` (``complete``, ``stale``, ``incomplete``, ``building``, ``damaged`` or
        ``not_indexed``), ``problems`` (what is wrong, in words) and ``next_action`` (the
        command that fixes it, or ``none``): :mod:`codesearch.api.health`.
    """

    root: str
    index_dir: str
    indexed: bool
    files: int = 0
    chunks: int = 0
    languages: dict[str, int] = field(default_factory=dict)
    models: dict[str, str | None] = field(default_factory=dict)
    stale: dict[str, int] = field(default_factory=dict)
    disk_bytes: dict[str, int] = field(default_factory=dict)
    vectors: dict[str, float] = field(default_factory=dict)
    embedded: dict[str, str] = field(default_factory=dict)
    health: dict = field(default_factory=dict)

    @property
    def is_stale(self) -> bool:
        """True when some file was added, changed or removed since the last index run."""
        return any(self.stale.values())

    def to_dict(self) -> JSONDict:
        """A JSON-ready dict (``codesearch status --json``)."""
        return {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(self), "is_stale": self.is_stale}


def index_status(root: Path, index_dir: Path, default_max_file_bytes: int) -> IndexStatus:
    """The `IndexStatus` of the index of ``root`` at ``index_dir`` (not indexed: counts 0)."""
    if not (index_dir / STORE_FILE).is_file():
        return IndexStatus(root=str(root), index_dir=str(index_dir), indexed=False,
                           health=index_health(root, index_dir, indexed=False, vectors={}, is_stale=False))
    info = index_info(index_dir)
    stale = stale_files(root, index_dir, Recorded.read(index_dir, default_max_file_bytes))
    status = IndexStatus(
        root=str(root),
        index_dir=str(index_dir),
        indexed=True,
        files=info.files,
        chunks=info.chunks,
        languages=dict(info.languages),
        models={"dense": info.dense_model, "multi": info.multi_model},
        stale={"added": len(stale.added), "changed": len(stale.changed), "removed": len(stale.removed)},
        disk_bytes=_disk_usage(index_dir),
        vectors={
            kind: round(n / max(1, info.files if VECTOR_KINDS[kind].per_file else info.chunks), 4)
            for kind, n in info.vectors.items()
        },
        embedded={"multi" if role == "colbert" else role: how for role, how in info.embedded.items()},
    )
    health = index_health(root, index_dir, indexed=True, vectors=status.vectors, is_stale=status.is_stale)
    return dataclasses.replace(status, health=health)


def _disk_usage(index_dir: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for entry in sorted(index_dir.iterdir()):
        if entry.name in {".gitignore", "lock", "server.json"} or entry.name.startswith("."):
            continue
        # SQLite's -wal/-shm side files and the vectors' segment folder are the store's.
        name = STORE_FILE if entry.name.startswith(STORE_FILE) else entry.name
        try:
            if entry.is_dir():
                size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
            else:
                size = entry.stat().st_size
        except FileNotFoundError:  # a temporary file renamed into place meanwhile
            continue
        sizes[name] = sizes.get(name, 0) + size
    sizes["total"] = sum(sizes.values())
    return sizes
