"""Is an index run needed at all? A stat-only comparison of the files with the store, made
before any model is resolved (which imports torch) or the index is locked.

``codesearch index`` on a repository where nothing changed used to cost a model load (7 s
on a CPU) for 0.03 s of work. `unchanged_run` answers the common case, nothing to do, with
git's listing and a ``stat`` per file (`walk.unchanged_since`, against the stamp the last
run recorded, git's stat cache standing for the files it vouches for, `gitstat`; a walk
where there is none) and a few reads of the store, and returns the
summary such a run would have printed. It says None (run the index) at any doubt: a file added, changed,
removed or only touched (its stat is the run's to record), other walk options or models
than the index records, vectors missing or pending, a derived index behind the store, a
chunker of another release, another run going on, a default model that has appeared in the
cache, or a notice about the defaults that this index has not said yet.

No torch, no model, no network, no write.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from codesearch.errors import CodeSearchError
from codesearch.types import DEFAULT, STORE_FILE, IndexSummary, default_index_dir

#: Meta key (JSON list): notices about the default models this index has said already; a
#: notice said once per index, not on every run (`codesearch.api.run`). Kept in sync with
#: `codesearch.api.run.SAID_KEY` (a test checks).
SAID_KEY = "notices.said"
#: The notices said once per index, by their opening words (`resolve_encoders` words them).
ONCE_PER_INDEX = ("No dense model by default", "Default model")
_OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline(environ: dict[str, str] | None = None) -> bool:
    """Whether the hub is switched off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    env = os.environ if environ is None else environ
    return any((env.get(name) or "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE_ENV)


def unchanged_run(
    root: str | os.PathLike[str],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    model: str | None = DEFAULT,
    multi_model: str | None = DEFAULT,
    device: str = "auto",
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    max_file_bytes: int = 1_000_000,
    vouched_since: float | None = None,
) -> IndexSummary | None:
    """The summary of an index run that would change nothing, or None when a run is needed.

    Same arguments as `CodeSearch` (``model``/``multi_model``: `DEFAULT`, a name, None).
    ``vouched_since``: a file watcher (the daemon's) vouches that no file of the work tree
    changed since then (``time.time()``), when a full check found the index current: only
    what a watcher does not see is looked at (`walk.vouched_unchanged`: git's index and
    excludes, the watched files), not every file; everything else (options, models, vectors,
    derived indexes) is checked as ever.

    Example
    -------
    >>> unchanged_run("path/to/repo") is None     # doctest: +SKIP
    False
    """
    from codesearch.indexes.registry import index_path, wanted
    from codesearch.indexing.chunking.source import CHUNKER_VERSION
    from codesearch.indexing.walk import (
        WALK_SKIPPED_KEY,
        WALK_STAMP_KEY,
        WalkStamp,
        start_listings,
        unchanged_since,
        vouched_unchanged,
        walk,
    )
    from codesearch.store import KIND_ROLE, VECTOR_KINDS, IndexLock, Store

    t0 = time.perf_counter()
    root_path = Path(root).expanduser()
    if not root_path.is_dir():
        return None
    root_path = root_path.resolve()
    idir = Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(root_path)
    if not (idir / STORE_FILE).is_file() or IndexLock.writer_active(idir):
        return None
    try:
        with Store(idir / STORE_FILE, readonly=True) as store:
            meta = store.meta()
            recorded = store.models()
            gen = str(store.generation)
            if not _same_options(meta, root_path, include, exclude, max_file_bytes, CHUNKER_VERSION):
                return None
            used = _models_in_use(meta, recorded, (model, multi_model), device)
            if used is None:
                return None
            if not used and (meta.get("chunk_tokens") != "512" or meta.get("chunk_counter") != "approx"):
                return None  # a lexical run chunks by the estimate at 512 tokens (`chunk_budget`)
            chunks, n_files = store.count("chunks"), store.count("files")
            for kind, role in KIND_ROLE.items():
                if role in used and store.count_with_vectors(kind) != (n_files if VECTOR_KINDS[kind].per_file
                                                                      else chunks):
                    return None
            for name in wanted(store):
                if meta.get(f"gen.{name}") != gen or not index_path(idir, name).exists():
                    return None
            stamp = WalkStamp.from_json(meta.get(WALK_STAMP_KEY))
            vouched = stamp is not None and vouched_since is not None and vouched_unchanged(
                root_path, stamp, vouched_since)
            if stamp is not None and not vouched:
                start_listings(root_path, stamp)
            # What the last run kept, with the stats it recorded: enough with its stamp (read
            # later, only if git's stat cache does not vouch for them: `gitstat`).
            kept = (store.file_stats() if stamp.git is None else file_stats_of(idir / STORE_FILE)) \
                if stamp is not None and not vouched else None
            old = store.files() if stamp is None else {}
    except (CodeSearchError, OSError, sqlite3.Error, ValueError):
        return None
    t_walk = time.perf_counter()
    if stamp is not None and vouched:
        skipped = {reason: int(n) for reason, n in json.loads(meta.get(WALK_SKIPPED_KEY) or "{}").items()}
        n_old = n_files
    elif stamp is not None and kept is not None:
        if not unchanged_since(root_path, stamp, kept):
            return None
        skipped = {reason: int(n) for reason, n in json.loads(meta.get(WALK_SKIPPED_KEY) or "{}").items()}
        n_old = n_files
    else:  # an index from before stamps, or listed without git: a walk that reads no kept file
        result = walk(root_path, include=include, exclude=exclude, max_file_bytes=max_file_bytes, index_dir=idir,
                      known=old)
        if len(result.files) != len(old):
            return None
        for sf in result.files:
            rec = old.get(sf.path)
            if rec is None or rec.size != sf.size or rec.mtime_ns != sf.mtime_ns:
                return None
        skipped = {reason: len(paths) for reason, paths in result.skipped.items() if paths}
        n_old = len(old)
    now = time.perf_counter()
    return IndexSummary(
        root=str(root_path), index_dir=str(idir), files_indexed=0, files_unchanged=n_old, files_removed=0,
        files_renamed=0, skipped=skipped,
        chunks_total=chunks, chunks_encoded=0, tokens_encoded=0, seconds=round(now - t0, 3),
        models={role: rec.name for role, rec in recorded.items()}, notices=[], files_read=0,
        stage_seconds={"walk": round(now - t_walk, 3)},
    )


def file_stats_of(store_path: Path) -> Callable[[], list[tuple[str, int, int]] | None]:
    """A function reading the store's ``(path, size, mtime_ns)`` of every file, when called
    (a no-op check that git's stat cache may spare the read)."""
    from codesearch.store import Store

    def read() -> list[tuple[str, int, int]] | None:
        try:
            with Store(store_path, readonly=True) as store:
                return store.file_stats()
        except (CodeSearchError, OSError, sqlite3.Error):
            return None  # (a store gone or damaged since the check began: a run)

    return read


def _same_options(meta: dict[str, str], root: Path, include: tuple[str, ...], exclude: tuple[str, ...],
                  max_file_bytes: int, chunker_version: int) -> bool:
    """The run would record what the index records: root, walk options, chunker, no vectors pending."""
    return (
        same_walk(meta, root, include, exclude, max_file_bytes)
        and meta.get("chunker_version") == str(chunker_version)
        and not meta.get("vectors.pending")
    )


def same_walk(meta: dict[str, str], root: Path, include: Sequence[str], exclude: Sequence[str],
              max_file_bytes: int | None) -> bool:
    """Whether the index's last run walked ``root`` with these options (``max_file_bytes``
    None: whatever it was): what its walk stamp holds for."""
    return (
        meta.get("root") == str(root)
        and json.loads(meta.get("walk.include") or "[]") == list(include)
        and json.loads(meta.get("walk.exclude") or "[]") == list(exclude)
        and (max_file_bytes is None or meta.get("max_file_bytes") == str(max_file_bytes))
    )


def _models_in_use(meta: dict[str, str], recorded: dict, asked: tuple[str | None, str | None],
                   device: str) -> set[str] | None:
    """The roles whose recorded model the run would use; None when the run would do anything
    else with models (add one, switch one off, load a default now in the cache, say a
    notice this index has not said)."""
    disabled = set(json.loads(meta.get("models.disabled") or "[]"))
    said = json.loads(meta.get(SAID_KEY) or "[]")
    used: set[str] = set()
    for role, arg in zip(("dense", "colbert"), asked):
        rec = recorded.get(role)
        if arg is None:
            if rec is not None or role not in disabled:
                return None  # the run switches it off (and says so)
            continue
        if arg != DEFAULT:
            if rec is None or not _same_model(arg, rec.name):
                return None
            used.add(role)
            continue
        if rec is not None:
            used.add(role)
        elif role in disabled:
            continue
        elif role == "dense":
            if device == "cuda" or (device == "auto" and _nvidia_driver()):
                return None  # the dense default is on where CUDA is
            if not recorded and not any(s.startswith(ONCE_PER_INDEX[0]) for s in said):
                return None  # the run says why there is no dense model, once
        else:
            from codesearch.encoder import DEFAULT_MULTI_MODEL
            from codesearch.encoder.loading import colbert_window

            if colbert_window(DEFAULT_MULTI_MODEL) is not None or not offline():
                return None  # in the cache now, or the hub may have it: the run tries
            if not any(s.startswith(ONCE_PER_INDEX[1]) for s in said):
                return None
    return used


def _same_model(asked: str, recorded: str) -> bool:
    if asked == recorded:
        return True
    a, r = Path(asked).expanduser(), Path(recorded).expanduser()
    return a.exists() and r.exists() and a.resolve() == r.resolve()


def _nvidia_driver() -> bool:
    import shutil

    marks = ("/proc/driver/nvidia", "/dev/nvidia0", "/usr/lib/wsl/lib/libcuda.so")
    return any(Path(m).exists() for m in marks) or shutil.which("nvidia-smi") is not None
