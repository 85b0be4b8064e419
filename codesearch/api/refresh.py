"""What the last index run recorded, and how a search brings a stale index up to date first
(``search(..., refresh=True)``; ``codesearch query`` does it by default).

Why the recorded walk options: a refresh (or a status) must compare the files with the
index as it was built; with the searching object's own (possibly default) options, files
left out on purpose by ``index --include/--exclude/--max-file-size`` would look new.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from codesearch.errors import IndexLockedError, IndexWriteError
from codesearch.indexing.commit import WALK_EXCLUDE_KEY, WALK_INCLUDE_KEY
from codesearch.indexing.encoders import DISABLED_KEY, VECTORS_PENDING_KEY
from codesearch.indexing.status import Staleness, staleness
from codesearch.indexing.walk import quiet_skips
from codesearch.store import Store
from codesearch.types import STORE_FILE, IndexSummary

__all__ = ["Recorded", "Walk", "refresh", "stale_files"]

#: (include, exclude, max file bytes): the options of a walk.
Walk = tuple[tuple[str, ...], tuple[str, ...], int]


@dataclass(frozen=True, slots=True)
class Recorded:
    """The options and state of the last index run that a refresh reuses."""

    include: tuple[str, ...]
    exclude: tuple[str, ...]
    max_file_bytes: int
    disabled: tuple[str, ...]  # model roles the user switched off
    vectors_pending: bool  # a run without models left changed code without vectors

    @property
    def walk(self) -> Walk:
        return self.include, self.exclude, self.max_file_bytes

    @classmethod
    def read(cls, index_dir: Path, default_max_file_bytes: int) -> Recorded:
        """What the index at ``index_dir`` records, in one read."""
        with Store(index_dir / STORE_FILE, readonly=True) as store:
            return cls(
                include=tuple(json.loads(store.get_meta(WALK_INCLUDE_KEY) or "[]")),
                exclude=tuple(json.loads(store.get_meta(WALK_EXCLUDE_KEY) or "[]")),
                max_file_bytes=int(store.get_meta("max_file_bytes") or default_max_file_bytes),
                disabled=tuple(json.loads(store.get_meta(DISABLED_KEY) or "[]")),
                vectors_pending=bool(store.get_meta(VECTORS_PENDING_KEY)),
            )


def stale_files(root: Path, index_dir: Path, recorded: Recorded) -> Staleness:
    """The files added, changed and removed since the run that ``recorded`` describes."""
    include, exclude, max_bytes = recorded.walk
    return staleness(root, index_dir=index_dir, include=include, exclude=exclude, max_file_bytes=max_bytes)


#: ``run(models, walk=, disabled=, defer_vectors=)``: one index run (`CodeSearch._index`).
IndexRun = Callable[..., IndexSummary]


def refresh(root: Path, index_dir: Path, recorded: Recorded, *, run: IndexRun,
            search_models: Callable[[], tuple[str | None, str | None]], lexical: bool) -> list[str]:
    """Index what changed since the last run before a search; the notices to show.

    A lexical search needs no vectors: its refresh loads no model (0.8 s, not 8 s after a
    one-line edit), and the changed code gets its vectors from the next run that encodes.
    An earlier lexical search's refresh may have left such code: a search that uses the
    vectors adds them. Another process indexing, or a full disk, is said, not raised: the
    current index answers.
    """
    stale = stale_files(root, index_dir, recorded)
    add_vectors = not lexical and recorded.vectors_pending
    if not stale.stale and not add_vectors:
        return []
    n = len(stale.added) + len(stale.changed) + len(stale.removed)
    models = (None, None) if lexical else search_models()
    try:
        # A refresh keeps the index's record of what the user switched off. It is part
        # of a query: the index run reported unreadable files already.
        with quiet_skips():
            summary = run(models, walk=recorded.walk, disabled=recorded.disabled, defer_vectors=lexical)
    except IndexLockedError:
        # Another process is indexing right now: search what is there rather than fail.
        return [f"{n} file(s) changed since the last run, but another process is updating the index; "
                "searched the current index"]
    except IndexWriteError as exc:
        # A full disk: the last complete index still answers (the run kept it whole).
        return [f"{n} file(s) changed since the last run, but the index could not be updated ({exc}); "
                "searched the current index"]
    what = f"{n} file(s) added, changed or removed since the last run" if n else "vectors of changed code added"
    return [f"index refreshed: {what} ({summary.seconds:.1f}s)", *summary.notices]
