"""One index run of a `CodeSearch`: its encoders (loaded before the run, or once the
repository is searchable), the Ray wrapping, and the errors a user can do something about."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch.api.models import ModelArgs, Models
from codesearch.api.refresh import Walk
from codesearch.encoder.base import Encoders
from codesearch.errors import CodeSearchError, IndexWriteError
from codesearch.indexing.run import build_index
from codesearch.indexing.unchanged import ONCE_PER_INDEX, SAID_KEY
from codesearch.types import DEFAULT, STORE_FILE, IndexSummary, ProgressEvent

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder.ray import RayEncoders

__all__ = ["run_index"]


def run_index(
    root: Path,
    index_dir: Path,
    models: Models,
    args: ModelArgs,
    *,
    walk: Walk,
    ray: RayEncoders | None = None,
    rebuild: bool = False,
    progress: Callable[[ProgressEvent], None] | None = None,
    disabled: tuple[str, ...] | None = None,
    defer_vectors: bool = False,
) -> IndexSummary:
    """`build_index` of ``root`` with the encoders of ``args``; the caller holds the index.

    Parameters
    ----------
    models, args
        Where encoders resolve, and the (dense, multi) arguments to resolve.
    walk
        (include, exclude, max file bytes).
    ray
        Embed on this Ray pool.
    disabled
        When given, the switched-off model roles the run records instead of the resolved ones.
    defer_vectors
        A run without models that leaves the recorded ones as they are (their vectors of
        changed code come with the next run that encodes).

    Raises
    ------
    IndexWriteError
        The index folder cannot be written (not creatable, read-only, a full disk).
    """
    include, exclude, max_bytes = walk
    notices: list[str] = []

    def load() -> Encoders:
        # Without Ray, a model whose texts are all in the user's cache is never loaded.
        encoders, said = models.encoders(args) if ray is not None else models.for_index(args)
        notices.extend(said)
        if ray is not None:
            encoders = ray.wrap(encoders)
        return encoders if disabled is None else dataclasses.replace(encoders, disabled=tuple(disabled))

    # Loading takes seconds on a CPU (torch, weights): the pipeline calls `load` once the
    # repository is searchable, so a first index answers queries sooner.
    lazy = models.index_lexically_first(args, indexed=(index_dir / STORE_FILE).is_file())
    if lazy:  # a named model that cannot be found fails before the run writes anything
        from codesearch.encoder.loading import locate

        for name in args:
            if name not in (None, DEFAULT):
                locate(name)
    encoders = None if lazy else load()
    try:
        summary = build_index(
            root,
            index_dir=index_dir,
            encoders=encoders,
            load_encoders=load if lazy else None,
            include=include,
            exclude=exclude,
            max_file_bytes=max_bytes,
            rebuild=rebuild,
            progress=progress if ray is None else ray.with_rates(progress),
            defer_vectors=defer_vectors,
        )
    except OSError as exc:
        # Unreadable source files are skipped by the pipeline; what reaches here is the index
        # folder itself (not creatable, read-only, disk full).
        where = exc.filename or index_dir
        raise IndexWriteError(
            f"cannot write the index at {str(where)!r}: {exc.strerror or exc} "
            "(check permissions and free disk space, or pass --index-dir FOLDER)"
        ) from exc
    if notices:
        summary = dataclasses.replace(summary, notices=[*notices, *summary.notices])
    return dataclasses.replace(summary, notices=said_once(index_dir, summary.notices))


def said_once(index_dir: Path, notices: list[str]) -> list[str]:
    """``notices`` less those about the default models this index has said already (each is
    said once per index, not on every run: an offline machine hears it at its first index);
    the new ones are recorded. A store that cannot record them says them again next time."""
    once = [n for n in notices if n.startswith(ONCE_PER_INDEX)]
    if not once:
        return notices
    import json

    from codesearch.store import Store

    try:
        with Store(index_dir / STORE_FILE) as store:
            said = set(json.loads(store.get_meta(SAID_KEY) or "[]"))
            fresh = [n for n in once if n not in said]
            if fresh:
                with store.transaction():
                    store.set_meta(SAID_KEY, json.dumps(sorted(said | set(fresh))))
    except (CodeSearchError, OSError, ValueError, sqlite3.Error):
        return notices
    return [n for n in notices if n not in once or n in fresh]
