"""The incremental index build: walk -> chunk -> encode what is missing -> store -> sync.

The store (``store.sqlite``) is the truth; lexical, dense and PLAID indexes are derived
from it. A run does its work in an order that survives a crash or Ctrl-C at any moment:

1. walk the files; a file whose size and mtime_ns match the store costs one ``stat``;
   a file whose stat changed is read and hashed (xxh3_128); same hash -> only its stat is
   recorded, no re-chunk; a new hash -> re-chunked;
2. encode the texts that have no vector in the cache yet (keyed by model identity, kind
   and text hash), committing each batch: a killed run leaves those vectors behind and
   the next run skips them;
3. ONE transaction writes files, chunks, models and meta (``generation + 1``);
4. every derived index is brought to the new generation - incrementally when its saved
   generation is the previous one, else rebuilt from the store's vectors (no encoding) -
   written atomically, and its generation recorded in meta. A crash between 3 and 4 shows
   up as a generation mismatch, which :func:`load_derived` and the next run heal.

Example
-------
>>> from codesearch.indexer.pipeline import build_index, resolve_encoders
>>> encoders, notices = resolve_encoders()                       # doctest: +SKIP
>>> summary = build_index("path/to/repo", encoders=encoders)     # doctest: +SKIP
>>> summary.files_indexed, summary.chunks_encoded                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from codesearch.errors import (
    CodeSearchError,
    IndexCorruptError,
    IndexLockedError,
    ModelError,
    ModelMismatchError,
    ModelUnavailableError,
    NothingToIndexError,
    PathError,
)
from codesearch.indexer.store import CENTRALITY_FILE, LOCK_FILE, STORE_FILE, IndexLock, Store

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder import Encoder

__all__ = [
    "DEFAULT",
    "Encoders",
    "IndexInfo",
    "IndexSummary",
    "ProgressEvent",
    "Staleness",
    "build_index",
    "default_index_dir",
    "index_info",
    "load_derived",
    "resolve_encoders",
    "staleness",
]

#: Sentinel for "the default model": used when it can be had, else a lexical-only index.
DEFAULT = "default"

INDEX_DIR_NAME = ".codesearch"
#: Meta key: the model roles a run switched off with 'none' (JSON list).
DISABLED_KEY = "models.disabled"
#: Chunks are never longer than this many tokens, whatever the model accepts: retrieval
#: wants units of about a function or two. Measured on the semble dev split (lexical mode):
#: 128 tokens 0.815, 256 0.845, 512 0.861, 1024 0.837 NDCG@10 (BENCHMARKS.md).
MAX_CHUNK_TOKENS = 512
#: Texts per encode call (and per committed batch of cached vectors).
ENCODE_BATCH = 64
ENCODE_BATCH_CHARS = 64_000

# Derived indexes: name -> (file or folder in the index dir, vector kind or None).
DERIVED: dict[str, tuple[str, str | None]] = {
    "lexical": ("lexical.npz", None),
    "dense_chunks": ("dense_chunks.faiss", "dense"),
    "dense_files": ("dense_files.faiss", "file"),
    "plaid": ("plaid", "colbert"),
}


# -- public records ------------------------------------------------------------------------


@dataclass
class Encoders:
    """The encoders of one run: a single-vector (``dense``) and a ColBERT (``multi``) one.

    Either may be None; with both None the index is lexical-only.
    """

    dense: Encoder | None = None
    multi: Encoder | None = None
    #: Store roles the user switched off ('none'), recorded so that a later run with the
    #: default models leaves them off instead of reporting them as unavailable.
    disabled: tuple[str, ...] = ()

    def by_role(self) -> dict[str, Encoder]:
        """Store role (``dense`` | ``colbert``) -> encoder, for the encoders present."""
        out: dict[str, Any] = {}
        if self.dense is not None:
            out["dense"] = self.dense
        if self.multi is not None:
            out["colbert"] = self.multi
        return out


@dataclass(frozen=True)
class ProgressEvent:
    """One progress report; the CLI renders these with rich.

    ``done``/``total`` count the unit of the stage: files for ``walk``/``chunk``, texts
    for ``encode``, derived indexes for ``sync``.
    """

    stage: str  # 'walk' | 'chunk' | 'encode' | 'write' | 'sync'
    done: int
    total: int
    files: int = 0
    chunks: int = 0
    tokens: int = 0
    tokens_per_s: float = 0.0
    message: str = ""


@dataclass(frozen=True, slots=True)
class IndexSummary:
    """What an index run did."""

    root: str
    index_dir: str
    files_indexed: int  # new or changed (re-chunked)
    files_unchanged: int
    files_removed: int
    files_renamed: int
    skipped: dict[str, int]
    chunks_total: int
    chunks_encoded: int  # texts actually sent to an encoder (chunks and whole files)
    tokens_encoded: int
    seconds: float
    models: dict[str, str]
    notices: list[str]
    files_read: int = 0  # files whose bytes were read (stat changed, new, or re-chunk)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    def to_dict(self) -> dict[str, Any]:
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- small helpers ---------------------------------------------------------------------------


def default_index_dir(root: str | os.PathLike[str]) -> Path:
    """``<root>/.codesearch``, where an index lives unless told otherwise."""
    return Path(root).expanduser().resolve() / INDEX_DIR_NAME


def _hash_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _hash_text(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


def _n_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _check_root(root: str | os.PathLike[str]) -> Path:
    path = Path(root).expanduser()
    if not path.exists():
        raise PathError(f"path {str(root)!r} does not exist (pass the folder of a repository)")
    if not path.is_dir():
        raise PathError(f"path {str(root)!r} is not a folder (pass the folder of a repository)")
    return path.resolve()


def _prepare_index_dir(index_dir: Path) -> None:
    index_dir.mkdir(parents=True, exist_ok=True)
    gitignore = index_dir / ".gitignore"
    if not gitignore.exists():
        # The folder ignores itself, so an index inside a repo never shows up in git status.
        gitignore.write_text("*\n")


def _file_text_for_encoder(path: str, text: str, max_length: int) -> str:
    # The encoder truncates at its max length anyway; cutting the string first keeps a
    # 1 MB file from being tokenized whole (code runs well under 16 chars per token).
    return f"{path}\n{text[: max(1, max_length) * 16]}"


def _remove_index_files(index_dir: Path) -> None:
    for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm", CENTRALITY_FILE):
        (index_dir / name).unlink(missing_ok=True)
    for filename, _ in DERIVED.values():
        p = index_dir / filename
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# -- encoders ---------------------------------------------------------------------------------


def resolve_encoders(
    dense_model: str | None = DEFAULT,
    multi_model: str | None = DEFAULT,
    *,
    device: str = "auto",
    store: Store | None = None,
    index_dir: str | os.PathLike[str] | None = None,
    loaded: Mapping[str, Any] | None = None,
) -> tuple[Encoders, list[str]]:
    """Load the encoders a run asks for; returns them and the notices to show.

    Parameters
    ----------
    dense_model, multi_model
        A hub id or a local checkpoint folder; ``None`` for none; :data:`DEFAULT` for the
        model the index already records (when ``store``/``index_dir`` has one), else the
        package default. A default that is not cached while the hub is unreachable is
        left out with a notice (the index is then built without its vectors); a model
        named explicitly that cannot be loaded raises.
    device
        Passed to :func:`codesearch.encoder.load`.
    store, index_dir
        Where to read the recorded models (either; ``store`` wins).
    loaded
        Encoders already loaded for a role (``"dense"`` | ``"multi"``), used as they are
        for that role's argument. Why: a server composes a run's encoders from ones it
        holds; resolving only the missing roles (passing None for the others) would record
        those roles as switched off and word the notices as if they had no vectors.

    Raises
    ------
    ModelError
        An explicitly named model that cannot be loaded, or a model of the wrong kind
        (a ColBERT checkpoint as the dense model, or the reverse).
    """
    from codesearch import encoder as enc_mod

    recorded: dict[str, Any] = {}
    was_disabled: list[str] = []
    if store is not None:
        recorded, was_disabled = store.models(), json.loads(store.get_meta(DISABLED_KEY) or "[]")
    elif index_dir is not None and (Path(index_dir) / STORE_FILE).is_file():
        with contextlib.suppress(IndexCorruptError), Store(Path(index_dir) / STORE_FILE) as s:
            recorded, was_disabled = s.models(), json.loads(s.get_meta(DISABLED_KEY) or "[]")

    notices: list[str] = []
    missing_defaults: list[str] = []
    disabled: list[str] = []

    def one(arg: str | None, role: str, package_default: str, want_multi: bool) -> Any:
        held = (loaded or {}).get("multi" if role == "colbert" else role)
        if held is not None and arg is not None:
            return held
        if arg is None or (arg == DEFAULT and role in was_disabled and role not in recorded):
            disabled.append(role)
            return None
        is_default = arg == DEFAULT
        name = arg
        if is_default:
            name = recorded[role].name if role in recorded else package_default
        try:
            enc = enc_mod.load(name, device=device)
        except ModelUnavailableError:
            if not is_default:
                raise
            missing_defaults.append(name)
            return None
        except ModelError as exc:
            if not (is_default and role in recorded):
                raise
            # The model this index was built with is gone (a deleted local folder, say):
            # search and indexing go on without its vectors rather than refusing to run.
            flag = "--model" if role == "dense" else "--multi-model"
            notices.append(
                f"Model {name} recorded in the index cannot be loaded ({exc}); its vectors are left out "
                f"of this run (restore the model, or re-embed with 'codesearch index --rebuild {flag} PATH_OR_ID')"
            )
            return None
        if bool(enc.multivector) != want_multi:
            what = "a ColBERT (multi-vector)" if want_multi else "a single-vector"
            raise ModelError(
                f"Model {name!r} is not {what} model (pass --model for single-vector checkpoints "
                "and --multi-model for ColBERT ones)"
            )
        return enc

    dense = one(dense_model, "dense", enc_mod.DEFAULT_DENSE_MODEL, False)
    multi = one(multi_model, "colbert", enc_mod.DEFAULT_MULTI_MODEL, True)
    if missing_defaults:
        names = " and ".join(missing_defaults)
        plural = "s" if len(missing_defaults) > 1 else ""
        cached = "are" if plural else "is"
        how = "indexed lexical-only" if dense is None and multi is None else "indexed without its vectors"
        notices.append(
            f"Default model{plural} {names} {cached} not cached and the hub is unreachable; {how}. "
            "Run 'codesearch index' again online (or pass --model PATH) to add vectors."
        )
    return Encoders(dense=dense, multi=multi, disabled=tuple(disabled)), notices


def _check_models(store: Store, encoders: Encoders, index_dir: Path) -> None:
    recorded = store.models()
    for role, enc in encoders.by_role().items():
        rec = recorded.get(role)
        if rec is not None and rec.identity != enc.identity:
            flag = "--model" if role == "dense" else "--multi-model"
            raise ModelMismatchError(
                f"Index at {index_dir} was built with {role} model {rec.name} ({rec.identity}); this run "
                f"asks for {enc.name} ({enc.identity}); run 'codesearch index --rebuild' to re-index with "
                f"the new model, or pass {flag} {rec.name}"
            )


def _chunk_budget(encoders: Encoders, chunk_tokens: int | None) -> tuple[int, Callable[[str], int] | None, str]:
    """(max tokens per chunk, token counter or None, the counter's identity)."""
    encs = [e for e in (encoders.dense, encoders.multi) if e is not None]
    if chunk_tokens is not None:
        if chunk_tokens < 16:
            raise CodeSearchError(f"chunk size {chunk_tokens} tokens is too small (use 64 or more)")
        budget = int(chunk_tokens)
    else:
        # A multi-vector model truncates, and a token it drops cannot match: its window caps
        # the chunk. A single-vector model's window does not (MiniLM reads 256 tokens of a
        # 512-token chunk): on the benchmark, hybrid NDCG was the same with 256- and
        # 512-token chunks, lexical better with 512, and 512 halves the texts to encode.
        # (Reading a long chunk as the mean of its windows' vectors was measured too: hybrid
        # 0.875 -> 0.868 for 1.5x the encoding, BENCHMARKS.md.)
        budget = min([MAX_CHUNK_TOKENS, *(int(e.max_length) for e in encs if getattr(e, "multivector", False))])
    if not encs:
        return budget, None, "approx"
    # Count with the model whose window must hold the chunk whole (the multi-vector one).
    counter = next((e for e in encs if getattr(e, "multivector", False)), encs[0])
    if hasattr(counter, "token_counter"):
        # picklable (tokenizer path + extra tokens), so chunking can run in worker processes
        return budget, counter.token_counter(), counter.identity
    return budget, (lambda s: counter.count_tokens([s])[0]), counter.identity


# -- the build ---------------------------------------------------------------------------------


@dataclass
class _Work:
    """A file that is (re-)chunked this run."""

    path: str
    abs_path: Path
    language: str
    size: int
    mtime_ns: int
    hash: str
    text: str
    chunks: list[Any] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    old_id: int | None = None


class _Progress:
    def __init__(self, callback: Callable[[ProgressEvent], None] | None):
        self.callback = callback

    def __call__(self, stage: str, done: int, total: int, **kw: Any) -> None:
        if self.callback is not None:
            self.callback(ProgressEvent(stage, done, total, **kw))


def build_index(
    root: str | os.PathLike[str],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    encoders: Encoders | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_file_bytes: int = 1_000_000,
    rebuild: bool = False,
    chunk_tokens: int | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
) -> IndexSummary:
    """Bring the index of ``root`` up to date with its files, encoding only what changed.

    Parameters
    ----------
    root
        The repository folder.
    index_dir
        Where the index lives; default ``<root>/.codesearch``.
    encoders
        From :func:`resolve_encoders`; None (or both fields None) builds a lexical-only
        index. Chunks that lack vectors of a model the index records get them on the next
        run that has the model.
    include, exclude, max_file_bytes
        Passed to :func:`codesearch.indexer.walk.walk`.
    rebuild
        Build the index anew: every file re-read and re-chunked, new chunk ids, models
        recorded from ``encoders`` (another model than before is allowed), every derived
        index rebuilt. It happens inside the existing store, in one transaction, so readers
        keep the old index until the new one is committed and a killed rebuild leaves the
        old index; vectors of the same model and text still come from the cache. An
        unreadable store is deleted first.
    chunk_tokens
        Chunk budget; default 512 tokens, or less when a multi-vector model's window is
        shorter (a single-vector model with a shorter window reads each chunk's start). A different
        budget than the last run re-chunks every file (vectors still come from the cache
        when chunk texts match).
    progress
        Called with :class:`ProgressEvent` s.

    Raises
    ------
    PathError
        ``root`` does not exist or is not a folder.
    NothingToIndexError
        No indexable file (the message says what was skipped).
    ModelMismatchError
        The index records another model than ``encoders`` hold (use ``rebuild``).
    IndexLockedError
        Another indexer is writing this index.
    IndexCorruptError
        The store cannot be read (use ``rebuild``).
    """
    from codesearch.indexer.walk import walk

    t0 = time.perf_counter()
    root_path = _check_root(root)
    idir = Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(root_path)
    encoders = encoders or Encoders()
    report = _Progress(progress)
    dir_existed = idir.is_dir()
    gitignore_existed = (idir / ".gitignore").exists()
    lock_existed = (idir / LOCK_FILE).exists()
    _prepare_index_dir(idir)
    # A searcher may hold the lock for a moment to save an index it rebuilt; wait for that,
    # never for another writer.
    lock = IndexLock(idir).acquire(wait_for_readers=30.0)
    store_existed = (idir / STORE_FILE).is_file()  # under the lock: no writer is between
    try:
        try:
            store = Store(idir / STORE_FILE)
        except IndexCorruptError:
            if not rebuild:
                raise
            # Unreadable: nothing to keep. (A readable store is rebuilt in place instead, so
            # readers see the old index until the new one commits.)
            _remove_index_files(idir)
            store = Store(idir / STORE_FILE)
        try:
            return _build(
                store, root_path, idir, encoders, include, exclude, max_file_bytes, chunk_tokens, report, t0,
                walk, rebuild,
            )
        except NothingToIndexError:
            store.close()
            if not store_existed:
                # The store was opened before the walk; leaving it empty would make a query
                # answer "no results" instead of "not indexed yet". Only what this run
                # wrote goes (nothing else is written before the walk).
                for name in (STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm"):
                    (idir / name).unlink(missing_ok=True)
                if not gitignore_existed:
                    (idir / ".gitignore").unlink(missing_ok=True)
                # Still under the lock: the lock file goes (an unlinked file stays lockable
                # through our descriptor), then the folder if this run made it.
                with contextlib.suppress(OSError):
                    if not lock_existed:
                        lock.path.unlink()
                    if not dir_existed:
                        idir.rmdir()
            raise
        finally:
            store.close()
    finally:
        lock.release()


def _build(
    store: Store,
    root: Path,
    idir: Path,
    encoders: Encoders,
    include: Sequence[str],
    exclude: Sequence[str],
    max_file_bytes: int,
    chunk_tokens: int | None,
    report: _Progress,
    t0: float,
    walk: Callable[..., Any],
    rebuild: bool,
) -> IndexSummary:
    from codesearch.indexer.chunking import chunk_many

    # A rebuild starts from nothing - no recorded models, no files - but inside the same
    # store: the old index stays readable until the final transaction replaces it, and
    # vectors of the same model and text still come from the cache.
    if not rebuild:
        _check_models(store, encoders, idir)
    notices: list[str] = []
    prev_gen = store.generation
    recorded = {} if rebuild else store.models()
    roles = encoders.by_role()

    # 1. walk -----------------------------------------------------------------------------
    report("walk", 0, 0, message="walking files")
    result = walk(root, include=include, exclude=exclude, max_file_bytes=max_file_bytes, index_dir=idir)
    skipped = {reason: len(paths) for reason, paths in result.skipped.items() if paths}
    all_old = store.files()
    old_files = {} if rebuild else all_old
    if not result.files and not old_files:
        what = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())) or "no files at all"
        raise NothingToIndexError(
            f"nothing to index under {root} (skipped: {what}); check the path and --include/--exclude"
        )
    report("walk", len(result.files), len(result.files), files=len(result.files))

    budget, counter, counter_id = _chunk_budget(encoders, chunk_tokens)
    old_budget, old_counter = (None, None) if rebuild else (store.get_meta("chunk_tokens"), store.get_meta("chunk_counter"))
    degraded = counter_id == "approx" and old_counter not in (None, "approx")
    if degraded:
        # A run without the recorded model (offline) keeps the old chunks and budget, and
        # chunks changed files with the approximate count; the record stays the model's.
        counter_id = old_counter
        if chunk_tokens is None and old_budget:
            budget = int(old_budget)
    # Re-chunk everything when the budget changes, or when a real tokenizer replaces the
    # approximate count (a model added to a lexical-only index).
    rechunk_all = bool(old_files) and (
        old_budget != str(budget) or (not degraded and counter_id != "approx" and old_counter != counter_id)
    )

    # 2. classify and chunk ---------------------------------------------------------------
    work: list[_Work] = []
    touched: list[tuple[int, int, int]] = []  # (file id, size, mtime_ns)
    unchanged = files_read = 0
    seen: set[str] = set()
    n_files = len(result.files)
    chunks_made = 0
    to_chunk: list[tuple[int, _Work]] = []  # (walk position, file) of new and changed files
    for i, sf in enumerate(result.files):
        seen.add(sf.path)
        old = old_files.get(sf.path)
        if old is not None and not rechunk_all and old.size == sf.size and old.mtime_ns == sf.mtime_ns:
            unchanged += 1
            continue
        try:
            with open(sf.abs_path, "rb") as fh:
                st = os.fstat(fh.fileno())
                data = fh.read()
        except OSError:
            skipped["unreadable"] = skipped.get("unreadable", 0) + 1
            seen.discard(sf.path)  # a file that vanished mid-run leaves the index
            continue
        files_read += 1
        digest = _hash_bytes(data)
        if old is not None and old.hash == digest and not rechunk_all:
            touched.append((old.id, st.st_size, st.st_mtime_ns))
            unchanged += 1
            continue
        text = data.decode("utf-8", errors="replace")
        to_chunk.append((i, _Work(sf.path, sf.abs_path, sf.language, st.st_size, st.st_mtime_ns, digest, text,
                                  old_id=old.id if old else None)))
    # Chunking is per file and shares nothing: many files go to a process pool (chunk_many).
    pieces = chunk_many(
        ((w.path, w.text, w.language) for _, w in to_chunk), max_tokens=budget, count_tokens=counter
    )
    for (i, w), chunks in zip(to_chunk, pieces):
        w.chunks = list(chunks)
        w.hashes = [_hash_text(c.text) for c in w.chunks]
        work.append(w)
        chunks_made += len(w.chunks)
        if (i + 1) % 50 == 0 or i + 1 == n_files:
            report("chunk", i + 1, n_files, files=len(work), chunks=chunks_made)
    report("chunk", n_files, n_files, files=len(work), chunks=chunks_made)
    removed = [f for p, f in old_files.items() if p not in seen]
    removed_hashes = {f.hash for f in removed}
    renamed = sum(1 for w in work if w.old_id is None and w.hash in removed_hashes)

    # 3. encode what the cache lacks, one committed batch at a time ----------------------
    changing_ids = {w.old_id for w in work if w.old_id is not None} | {f.id for f in removed}
    newly_encoded: dict[str, set[str]] = defaultdict(set)
    texts_encoded = tokens_encoded = 0
    jobs: list[tuple[str, Any, dict[str, str]]] = []  # (kind, encoder, text hash -> text)
    for role, enc in roles.items():
        for kind in ("dense", "file") if role == "dense" else ("colbert",):
            cached = store.cached_hashes(enc.identity, kind)
            todo: dict[str, str] = {}
            if kind == "file":
                for w in work:
                    if w.hash not in cached:
                        todo.setdefault(w.hash, _file_text_for_encoder(w.path, w.text, enc.max_length))
                for fid, path, h in [] if rebuild else store.files_missing_vectors(enc.identity):
                    if fid not in changing_ids and h not in todo:
                        text = _read_text(root / path)
                        if text is not None:
                            todo[h] = _file_text_for_encoder(path, text, enc.max_length)
            else:
                for w in work:
                    for c, h in zip(w.chunks, w.hashes):
                        if h not in cached and h not in todo:
                            todo[h] = c.encoder_text
                for _cid, fid, h, text in [] if rebuild else store.chunks_missing_vectors(enc.identity, kind):
                    if fid not in changing_ids and h not in todo:
                        todo[h] = text
            if todo:
                jobs.append((kind, enc, todo))
    for role in recorded:
        if role not in roles:
            # Offline run of an index that has vectors: they are added by a later run.
            notices.append(
                f"No {role} encoder in this run; new or changed chunks have no {role} vectors yet "
                f"(run 'codesearch index' again with {recorded[role].name} available to add them)"
            )
    total_texts = sum(len(t) for _, _, t in jobs)
    # One stream of texts per encoder (a dense model's chunks and whole files together), so
    # a small edit costs one encode call, not one per kind.
    streams: dict[int, tuple[Any, list[tuple[str, str, str]]]] = {}
    for kind, enc, todo in jobs:
        streams.setdefault(id(enc), (enc, []))[1].extend((kind, h, t) for h, t in todo.items())
    enc_t0 = time.perf_counter()
    for enc, items in streams.values():
        for batch in _batches(items):
            texts = [t for _, _, t in batch]
            out = enc.encode(texts, kind="document")
            vectors = list(out) if enc.multivector else [np.asarray(out)[i] for i in range(len(texts))]
            by_kind: dict[str, list[tuple[str, np.ndarray]]] = defaultdict(list)
            for (kind, h, _), v in zip(batch, vectors):
                by_kind[kind].append((h, v))
            with store.transaction():  # the batch is cached whole or not at all
                for kind, pairs in by_kind.items():
                    store.put_vectors(enc.identity, kind, pairs)
            for kind, pairs in by_kind.items():
                newly_encoded[kind].update(h for h, _ in pairs)
            texts_encoded += len(texts)
            tokens_encoded += sum(min(n, int(enc.max_length)) for n in enc.count_tokens(texts))
            elapsed = max(time.perf_counter() - enc_t0, 1e-9)
            report(
                "encode", texts_encoded, total_texts, files=len(work), chunks=chunks_made,
                tokens=tokens_encoded, tokens_per_s=tokens_encoded / elapsed, message="/".join(by_kind),
            )

    # 4. one transaction: files, chunks, models, meta -------------------------------------
    report("write", 0, 1, files=len(work), chunks=chunks_made)
    removed_chunks: list[tuple[int, str]] = []  # (chunk id, text hash) leaving the index
    added_chunks: list[int] = []
    changed_files: list[int] = []  # files whose content (hence file vector) changed
    models_changed = any(role not in recorded for role in roles)
    changed = bool(work or removed or models_changed or rechunk_all or any(newly_encoded.values()))
    new_gen = prev_gen + 1 if changed else prev_gen
    with store.transaction():
        if rebuild:
            store.clear()  # files, chunks, models, meta (and so every derived generation)
        for fid, size, mtime_ns in touched:
            store.touch_file(fid, size=size, mtime_ns=mtime_ns)
        for f in removed:
            removed_chunks += [(r.id, r.text_hash) for r in store.chunk_rows(f.id)]
        store.delete_files([f.id for f in removed])
        for w in work:
            fid = store.upsert_file(
                w.path, hash=w.hash, size=w.size, mtime_ns=w.mtime_ns, language=w.language,
                n_lines=_n_lines(w.text),
            )
            changed_files.append(fid)
            # Keep the id of a chunk whose header and text are unchanged (it only moved):
            # every derived index holds exactly the same thing for it.
            pool: dict[tuple[str, str], list[int]] = defaultdict(list)
            old_hash: dict[int, str] = {}
            if w.old_id is not None:
                for r in store.chunk_rows(fid):
                    pool[(r.header, r.text_hash)].append(r.id)
                    old_hash[r.id] = r.text_hash
            for c, h in zip(w.chunks, w.hashes):
                ids = pool.get((c.header, h))
                if ids:
                    store.update_chunk_position(ids.pop(0), c)
                else:
                    added_chunks.append(store.insert_chunk(fid, c, h))
            gone = [cid for ids in pool.values() for cid in ids]
            store.delete_chunks(gone)
            removed_chunks += [(cid, old_hash[cid]) for cid in gone]
        for role, enc in roles.items():
            if role not in recorded:
                store.set_model(role, enc.name, enc.identity, int(enc.dim))
        store.set_meta(DISABLED_KEY, json.dumps(sorted(getattr(encoders, "disabled", ()))))
        store.set_meta("root", str(root))
        store.set_meta("chunk_tokens", budget)
        store.set_meta("chunk_counter", counter_id)
        store.set_meta("max_file_bytes", max_file_bytes)
        # The walk options, so a later staleness check compares with the index as built.
        store.set_meta("walk.include", json.dumps(list(include)))
        store.set_meta("walk.exclude", json.dumps(list(exclude)))
        store.set_meta("generation", new_gen)
    report("write", 1, 1, files=len(work), chunks=chunks_made)

    # 5. derived indexes ------------------------------------------------------------------
    delta = _Delta(
        removed_chunks=removed_chunks,
        added_chunks=added_chunks,
        removed_files=[f.id for f in removed],
        changed_files=changed_files,
        newly_encoded=newly_encoded,
    )
    _sync_derived(idir, store, prev_gen, delta, report)
    # Old versions of edited code stay cached (cheap branch switches) up to about the size
    # of the live index; past that they go.
    store.prune_vectors(keep_unreferenced=max(10_000, store.count("chunks")))

    models = {role: rec.name for role, rec in store.models().items()}
    return IndexSummary(
        root=str(root),
        index_dir=str(idir),
        files_indexed=len(work),
        files_unchanged=unchanged,
        files_removed=len(removed) if not rebuild else sum(1 for p in all_old if p not in seen),
        files_renamed=renamed,
        skipped=skipped,
        chunks_total=store.count("chunks"),
        chunks_encoded=texts_encoded,
        tokens_encoded=tokens_encoded,
        seconds=time.perf_counter() - t0,
        models=models,
        notices=notices,
        files_read=files_read,
    )


def _batches(items: list[tuple[str, str, str]]) -> Iterable[list[tuple[str, str, str]]]:
    """Consecutive runs of (kind, hash, text) of at most ENCODE_BATCH texts / ..._CHARS chars."""
    batch: list[tuple[str, str, str]] = []
    chars = 0
    for item in items:
        if batch and (len(batch) >= ENCODE_BATCH or chars + len(item[2]) > ENCODE_BATCH_CHARS):
            yield batch
            batch, chars = [], 0
        batch.append(item)
        chars += len(item[2])
    if batch:
        yield batch


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


# -- derived indexes ---------------------------------------------------------------------------


@dataclass
class _Delta:
    removed_chunks: list[tuple[int, str]]
    added_chunks: list[int]
    removed_files: list[int]
    changed_files: list[int]
    newly_encoded: dict[str, set[str]]


def _wanted(store: Store) -> list[str]:
    """The derived indexes this store should have: lexical, plus those of recorded models."""
    roles = store.models()
    out = ["lexical"]
    if "dense" in roles:
        out += ["dense_chunks", "dense_files"]
    if "colbert" in roles:
        out.append("plaid")
    return out


def _empty_index(name: str, store: Store) -> Any:
    if name == "lexical":
        from codesearch.indexer.lexical import LexicalIndex

        return LexicalIndex()
    kind = DERIVED[name][1]
    dim = store.models()["dense" if kind in ("dense", "file") else "colbert"].dim
    if name == "plaid":
        from codesearch.indexer.plaid import PlaidIndex

        return PlaidIndex(dim)
    from codesearch.indexer.dense import DenseIndex

    return DenseIndex(dim)


def _load_index(name: str, path: Path) -> Any:
    if name == "lexical":
        from codesearch.indexer.lexical import LexicalIndex

        return LexicalIndex.load(path)
    if name == "plaid":
        from codesearch.indexer.plaid import PlaidIndex

        return PlaidIndex.load(path)
    from codesearch.indexer.dense import DenseIndex

    return DenseIndex.load(path)


def _expected_len(name: str, store: Store) -> int:
    kind = DERIVED[name][1]
    return store.count("chunks") if kind is None else store.count_with_vectors(kind)


def _add_from_store(name: str, index: Any, store: Store, ids: Sequence[int] | None) -> None:
    """Add ``ids`` (or everything, when None) to ``index`` from the store, no encoding."""
    kind = DERIVED[name][1]
    if kind is None:
        if ids is None:
            batch_ids: list[int] = []
            texts: list[str] = []
            for rec in store.iter_chunk_records():
                batch_ids.append(rec.id)
                texts.append(rec.header + "\n" + rec.text)
            index.add(np.asarray(batch_ids, dtype=np.int64), texts)
        elif ids:
            recs = store.chunk_records(ids)
            index.add(np.asarray([r.id for r in recs], dtype=np.int64), [r.header + "\n" + r.text for r in recs])
        return
    batches = store.iter_vectors(kind) if ids is None else [store.vectors_for(ids, kind)]
    if name == "plaid":
        # PLAID trains its centroids on what it is given: one add() of everything.
        all_ids, all_vecs = [], []
        for found, arrays in batches:
            all_ids.append(found)
            all_vecs += arrays
        if all_vecs:
            index.add(np.concatenate(all_ids), all_vecs)
        return
    for found, arrays in batches:
        if len(found):
            index.add(found, np.concatenate(arrays, axis=0))


def _rebuild_index(name: str, store: Store) -> Any:
    index = _empty_index(name, store)
    _add_from_store(name, index, store, None)
    return index


def _apply_delta(name: str, index: Any, store: Store, delta: _Delta) -> None:
    kind = DERIVED[name][1]
    if name == "dense_files":
        gone = delta.removed_files + delta.changed_files
        index.remove(np.asarray(gone, dtype=np.int64))
        fresh = set(delta.changed_files)
        new_hashes = delta.newly_encoded.get("file", set())
        if new_hashes:
            # Files whose content was unchanged but that lacked a vector (model added offline).
            fresh |= set(store.file_ids_with_hashes(new_hashes))
        _add_from_store(name, index, store, sorted(fresh))
        return
    removed = [cid for cid, _ in delta.removed_chunks]
    index.remove(np.asarray(removed, dtype=np.int64))
    add = set(delta.added_chunks)
    if kind is not None:
        new_hashes = delta.newly_encoded.get(kind, set())
        if new_hashes:
            add |= set(store.chunk_ids_with_hashes(new_hashes))
    _add_from_store(name, index, store, sorted(add))


def _save_index(index: Any, path: Path) -> None:
    # Every index class writes atomically (temp file + os.replace), so a crash here leaves
    # the previous file, whose recorded generation then no longer matches the store.
    index.save(path)


def _sync_derived(idir: Path, store: Store, prev_gen: int, delta: _Delta, report: _Progress) -> None:
    gen = store.generation
    names = _wanted(store)
    for i, name in enumerate(names):
        filename, _ = DERIVED[name]
        path = idir / filename
        saved = store.get_meta(f"gen.{name}")
        index = None
        if saved == str(gen) and path.exists():
            report("sync", i + 1, len(names), message=f"{name}: up to date")
            continue
        if saved == str(prev_gen) and path.exists():
            try:
                index = _load_index(name, path)
                _apply_delta(name, index, store, delta)
                if len(index) != _expected_len(name, store) or getattr(index, "needs_rebuild", False):
                    index = None  # drifted (or PLAID's codec went stale): rebuild below
            except (CodeSearchError, ValueError, KeyError):
                index = None
        if index is None:
            index = _rebuild_index(name, store)
        _save_index(index, path)
        store.set_meta(f"gen.{name}", gen)
        report("sync", i + 1, len(names), message=name)
    for name in set(DERIVED) - set(names):
        # A model the index no longer records (after a rebuild): its index file goes too.
        store.delete_meta(f"gen.{name}")
        stale = idir / DERIVED[name][0]
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def load_derived(index_dir: str | os.PathLike[str], store: Store, *, wait_s: float = 30.0) -> dict[str, Any]:
    """Load every derived index the store calls for, at the store's generation.

    An index whose recorded generation differs from the store's, or whose file is missing
    or corrupt, is rebuilt from the store's vectors (no encoding) - in memory, and on disk
    too when no indexer holds the lock. Except while an indexer holds the lock: then the
    mismatch is its sync in progress (it committed the store and is writing the index
    files), so this waits up to ``wait_s`` seconds for those files instead of rebuilding
    what the writer is about to write.

    Returns
    -------
    dict
        ``"lexical"`` (:class:`LexicalIndex`), and where the store records the models
        ``"dense_chunks"``, ``"dense_files"`` (:class:`DenseIndex`, ids = chunk / file ids)
        and ``"plaid"`` (:class:`PlaidIndex`).
    """
    idir = Path(index_dir)
    deadline = time.monotonic() + wait_s
    out: dict[str, Any] = {}
    for _attempt in range(3):
        gen = store.generation
        if _out_of_sync(idir, store, gen):
            _wait_for_writer(idir, store, deadline)
            gen = store.generation
        out = {}
        stale: list[str] = []
        for name in _wanted(store):
            path = idir / DERIVED[name][0]
            index = None
            if store.get_meta(f"gen.{name}") == str(gen) and path.exists():
                with contextlib.suppress(IndexCorruptError):
                    index = _load_index(name, path)
                if index is not None and len(index) != _expected_len(name, store):
                    index = None
            if index is None:
                index = _rebuild_index(name, store)
                stale.append(name)
            out[name] = index
        if stale:
            _persist_rebuilt(idir, store, gen, {n: out[n] for n in stale})
        # A writer may have committed while we loaded; then load again.
        if store.generation == gen:
            return out
    return out


def _out_of_sync(idir: Path, store: Store, gen: int) -> bool:
    return any(
        store.get_meta(f"gen.{name}") != str(gen) or not (idir / DERIVED[name][0]).exists()
        for name in _wanted(store)
    )


def _wait_for_writer(idir: Path, store: Store, deadline: float) -> None:
    """Poll (cheap meta reads) until the derived files match the store, or no writer is left."""
    while time.monotonic() < deadline and IndexLock.writer_active(idir):
        time.sleep(0.05)
        if not _out_of_sync(idir, store, store.generation):
            return


def _persist_rebuilt(idir: Path, store: Store, gen: int, indexes: dict[str, Any]) -> None:
    if not os.access(idir, os.W_OK):
        return
    if IndexLock.writer_active(idir):
        return  # the writer brings them up to date itself
    try:
        lock = IndexLock(idir).acquire(role="reader")
    except (IndexLockedError, OSError):
        return
    try:
        writer = Store(idir / STORE_FILE) if store.readonly else store
        try:
            if writer.generation != gen:
                return
            for name, index in indexes.items():
                _save_index(index, idir / DERIVED[name][0])
                writer.set_meta(f"gen.{name}", gen)
        finally:
            if writer is not store:
                writer.close()
    finally:
        lock.release()


# -- staleness and info -------------------------------------------------------------------------


def staleness(
    root: str | os.PathLike[str],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_file_bytes: int | None = None,
) -> Staleness:
    """Which files were added, changed or removed since the last index run.

    Cheap: a walk and a ``stat`` per file; a file is read and hashed only when its size
    or mtime differ from the store. ``max_file_bytes`` defaults to the last run's.
    """
    from codesearch.indexer.walk import quiet_skips, walk

    root_path = _check_root(root)
    idir = Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(root_path)
    store_path = idir / STORE_FILE
    old: dict[str, Any] = {}
    if store_path.is_file():
        with Store(store_path, readonly=True) as store:
            old = store.files()
            if max_file_bytes is None:
                max_file_bytes = int(store.get_meta("max_file_bytes", "1000000") or 1_000_000)
    with quiet_skips():  # the index run reported them; a check before each query stays quiet
        result = walk(
            root_path, include=include, exclude=exclude,
            max_file_bytes=max_file_bytes if max_file_bytes is not None else 1_000_000, index_dir=idir,
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
                digest = _hash_bytes(Path(sf.abs_path).read_bytes())
            except OSError:
                continue
            (touched if digest == rec.hash else changed).append(sf.path)
    removed = sorted(p for p in old if p not in seen)
    return Staleness(indexed=store_path.is_file(), added=added, changed=changed, removed=removed, touched=touched)


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
        )

