"""How an index compares with the files (staleness) and what it holds (info), read without
loading a model or writing anything."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch.indexing.encoders import EMBEDDED_KEY
from codesearch.indexing.run import check_root
from codesearch.store import KIND_ROLE, FileRecord, Store
from codesearch.store.files import hash_bytes, read_inside
from codesearch.types import STORE_FILE, JSONDict, default_index_dir

if TYPE_CHECKING:  # pragma: no cover
    pass



@dataclass(frozen=True, slots=True)
class Staleness:
    """How the files differ from the index (paths, relative, posix)."""

    indexed: bool
    added: list[str]
    changed: list[str]
    removed: list[str]
    touched: list[str]  # stat changed, content did not (no re-index needed beyond a stat update)

    @property
    def stale(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def to_dict(self) -> JSONDict:
        return {
            "indexed": self.indexed,
            "new": len(self.added),
            "changed": len(self.changed),
            "deleted": len(self.removed),
            "touched": len(self.touched),
        }


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """What an index holds (for ``codesearch status``)."""

    index_dir: str
    root: str | None
    files: int
    chunks: int
    languages: dict[str, int]
    dense_model: str | None
    multi_model: str | None
    generation: int
    chunk_tokens: int | None
    #: Vector kind (``dense``, ``file``, ``colbert``) -> how many chunks (files, for ``file``)
    #: have a vector; with `chunks`/`files` it says how complete each vector index is.
    vectors: dict[str, int] = field(default_factory=dict)
    embedded: dict[str, str] = field(default_factory=dict)  # role -> how the last run embedded

    def to_dict(self) -> JSONDict:
        return asdict(self)


def staleness(
    root: str | os.PathLike[str],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_file_bytes: int | None = None,
) -> Staleness:
    """Which files were added, changed or removed since the last index run.

    Cheap: git's listing and a ``stat`` per file when the last run recorded a walk stamp
    with these options and nothing changed since (`walk.unchanged_since`); else a walk and
    a ``stat`` per file, where a file is read (sniffed, then hashed) only when it is new or
    its size or mtime differ from the store. ``max_file_bytes`` defaults to the last run's.
    """
    from codesearch.indexing.walk import quiet_skips, walk

    root_path = check_root(root)
    idir = Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(root_path)
    store_path = idir / STORE_FILE
    if _unchanged(root_path, store_path, include, exclude, max_file_bytes):
        return Staleness(indexed=True, added=[], changed=[], removed=[], touched=[])
    old: dict[str, FileRecord] = {}
    if store_path.is_file():
        with Store(store_path, readonly=True) as store:
            old = store.files()
            if max_file_bytes is None:
                max_file_bytes = int(store.get_meta("max_file_bytes", "1000000") or 1_000_000)
    with quiet_skips():  # the index run reported them; a check before each query stays quiet
        result = walk(
            root_path, include=include, exclude=exclude,
            max_file_bytes=max_file_bytes if max_file_bytes is not None else 1_000_000, index_dir=idir,
            known=old,
        )
    added, changed, touched = [], [], []
    seen = set()
    for sf in result.files:
        seen.add(sf.path)
        rec = old.get(sf.path)
        if rec is None:
            added.append(sf.path)
        elif rec.size != sf.size or rec.mtime_ns != sf.mtime_ns:
            try:
                digest = hash_bytes(read_inside(root_path, sf.path)[0])
            except OSError:
                continue
            (touched if digest == rec.hash else changed).append(sf.path)
    removed = sorted(p for p in old if p not in seen)
    return Staleness(indexed=store_path.is_file(), added=added, changed=changed, removed=removed, touched=touched)


def _unchanged(root: Path, store_path: Path, include: Sequence[str], exclude: Sequence[str],
               max_file_bytes: int | None) -> bool:
    """Whether the last run's walk stamp, made with these walk options, still holds."""
    from codesearch.indexing.unchanged import file_stats_of, same_walk
    from codesearch.indexing.walk import WALK_STAMP_KEY, WalkStamp, start_listings, unchanged_since

    if not store_path.is_file():
        return False
    with Store(store_path, readonly=True) as store:
        meta = store.meta()
        stamp = WalkStamp.from_json(meta.get(WALK_STAMP_KEY))
        if stamp is None or not same_walk(meta, root, include, exclude, max_file_bytes):
            return False
        start_listings(root, stamp)
        kept = store.file_stats() if stamp.git is None else None
    return unchanged_since(root, stamp, kept if kept is not None else file_stats_of(store_path))


def index_info(index_dir: str | os.PathLike[str]) -> IndexInfo:
    """Counts, languages and models of the index in ``index_dir``.

    Raises
    ------
    NotIndexedError
        When there is no store in ``index_dir``.
    """
    from codesearch.errors import NotIndexedError

    idir = Path(index_dir)
    path = idir / STORE_FILE
    if not path.is_file():
        raise NotIndexedError(f"no index in {idir} (run 'codesearch index' first)")
    with Store(path, readonly=True) as store:
        models = store.models()
        budget = store.get_meta("chunk_tokens")
        return IndexInfo(
            index_dir=str(idir),
            root=store.get_meta("root"),
            files=store.count("files"),
            chunks=store.count("chunks"),
            languages=store.language_counts(),
            dense_model=models["dense"].name if "dense" in models else None,
            multi_model=models["colbert"].name if "colbert" in models else None,
            generation=store.generation,
            chunk_tokens=int(budget) if budget else None,
            vectors={kind: store.count_with_vectors(kind) for kind in KIND_ROLE if KIND_ROLE[kind] in models},
            embedded=json.loads(store.get_meta(EMBEDDED_KEY) or "{}"),
        )
