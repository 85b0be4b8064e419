"""The Python API: one `CodeSearch` object per repository, used by the CLI, the server and
RAG apps alike.

`CodeSearch` holds the settings (which models, which files), loads the encoders lazily and
once, and shares them between indexing and searching. A lexical search never loads a model,
so it never imports torch.

Example
-------
>>> from codesearch import CodeSearch
>>> with CodeSearch("path/to/repo", model=None, multi_model=None) as cs:   # doctest: +SKIP
...     summary = cs.index()
...     for hit in cs.search("retry failed http requests", k=3, mode="lexical"):
...         print(f"{hit.path}:{hit.start_line}-{hit.end_line}", round(hit.score, 3))
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codesearch.encoder.base import Encoder, Encoders
from codesearch.errors import (
    CodeSearchError,
    IndexLockedError,
    IndexWriteError,
    NotIndexedError,
    PathError,
)
from codesearch.globs import escape_glob, glob_deadline, scope_globs
from codesearch.indexing.encoders import DEFAULT, DISABLED_KEY, VECTORS_PENDING_KEY, resolve_encoders
from codesearch.indexing.pipeline import WALK_EXCLUDE_KEY, WALK_INCLUDE_KEY, build_index
from codesearch.indexing.status import Staleness, index_info, staleness
from codesearch.indexing.walk import quiet_skips
from codesearch.search import snippets
from codesearch.search.snippets import fit as fit_result
from codesearch.search.snippets import shape as shape_result
from codesearch.search.snippets import with_context as widen_result
from codesearch.store import IndexLock, ReadWriteLock
from codesearch.types import (
    MODES,
    SCHEMA_VERSION,
    STORE_FILE,
    IndexSummary,
    Mode,
    ProgressEvent,
    SearchRequest,
    default_index_dir,
    hit_document,
    result_document,
)

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder.ray import RayEncoders, WorkerPool
    from codesearch.search.searcher import Searcher
    from codesearch.types import SearchHit, SearchResult

__all__ = [
    "DEFAULT",
    "MODES",
    "SCHEMA_VERSION",
    "CodeSearch",
    "EncoderPool",
    "IndexStatus",
    "Mode",
    "ModelInfo",
    "SearchRequest",
    "Snapshot",
    "check_query",
    "escape_glob",
    "find_index_root",
    "fit_result",
    "glob_deadline",
    "hit_document",
    "list_models",
    "model_info",
    "pull_model",
    "result_document",
    "scope_globs",
    "shape_result",
    "widen_result",
]



def find_index_root(start: str | Path = ".") -> Path:
    """Return the nearest folder at or above `start` that holds ``.codesearch/store.sqlite``.

    Parameters
    ----------
    start : str or Path
        Where to start walking up (usually the current folder).

    Raises
    ------
    NotIndexedError
        When no folder on the way up to the file-system root has an index.
    """
    here = Path(start).resolve()
    for folder in (here, *here.parents):
        if (default_index_dir(folder) / STORE_FILE).is_file():
            return folder
    raise NotIndexedError(
        f"no index found in {str(here)!r} or any parent folder "
        "(run 'codesearch index PATH' first, or pass --path)"
    )


def check_query(query: str, k: int = 10, *, mode: str = "hybrid") -> None:
    """Refuse an empty query, an unknown mode or ``k < 1`` before any index is opened.

    The same checks as building a `SearchRequest` (which the CLI does first, so an empty
    query in a folder without an index is reported as the empty query it is).

    Raises
    ------
    QueryError
    """
    SearchRequest(query, k, mode)


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

    @property
    def is_stale(self) -> bool:
        """True when some file was added, changed or removed since the last index run."""
        return any(self.stale.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``codesearch status --json``)."""
        return {"schema_version": SCHEMA_VERSION, **dataclasses.asdict(self), "is_stale": self.is_stale}


class CodeSearch:
    """Index and search one repository.

    Parameters
    ----------
    path : str or Path
        The repository folder.
    index_dir : str or Path, optional
        Where the index lives; default ``<path>/.codesearch``.
    model : str or None
        Dense (single-vector) model: a hub id or a local checkpoint folder. `DEFAULT` picks
        the model the index was built with, or the default model for a new index; None
        disables dense vectors.
    multi_model : str or None
        Multi-vector (ColBERT) model, same conventions as `model`.
    device : str
        ``"auto"``, ``"cpu"`` or ``"cuda"``: where the encoders run.
    include, exclude : sequence of str
        Glob patterns of files to index or to skip (on top of .gitignore), used by
        `index`. The index remembers them: a ``refresh=True`` search and `status` compare
        the files with the options of the last `index` run, not with these.
    max_file_bytes : int
        Files larger than this are skipped (by `index`; remembered likewise).
    encoder_pool : EncoderPool, optional
        Load models through this pool, shared with other `CodeSearch` objects (a server
        serving several repositories); default: this object loads its own.
    ray : str, WorkerPool or None
        Embed `index` runs on a Ray cluster: ``"auto"`` (``RAY_ADDRESS``, else a local
        cluster), an address, or a `codesearch.encoder.ray.WorkerPool` to share with other
        objects. Searches encode locally.

    Notes
    -----
    Encoders load on first use (an `index()` run, or a dense/colbert/hybrid search) and are
    then shared. Searches may run from several threads at once; an index run (including the
    refresh a ``refresh=True`` search triggers) waits for running searches and blocks new
    ones until it is done.

    Examples
    --------
    >>> with CodeSearch("path/to/repo") as cs:          # doctest: +SKIP
    ...     cs.index()
    ...     hits = cs.search("where is the config parsed", k=5)
    """

    def __init__(
        self,
        path: str | Path = ".",
        *,
        index_dir: str | Path | None = None,
        model: str | object | None = DEFAULT,
        multi_model: str | object | None = DEFAULT,
        device: str = "auto",
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        max_file_bytes: int = 1_000_000,
        encoder_pool: EncoderPool | None = None,
        ray: str | WorkerPool | None = None,
    ) -> None:
        root = Path(path).expanduser()
        if not root.exists():
            raise PathError(f"path {str(path)!r} does not exist (pass the folder of a repository)")
        if not root.is_dir():
            raise PathError(f"path {str(path)!r} is not a folder (pass the folder of a repository)")
        self.root = root.resolve()
        self.index_dir = (
            Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(self.root)
        )
        self.model = model
        self.multi_model = multi_model
        self.device = device
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.max_file_bytes = int(max_file_bytes)
        # Models load through a pool keyed by resolved name, so an index run (which asks for
        # the defaults) and a search (which asks for what the index records) share one load.
        self._own_pool = encoder_pool is None
        self.encoder_pool = encoder_pool if encoder_pool is not None else EncoderPool()
        self.ray = ray
        # The Ray pool and encoders, kept between runs (made here: a missing extra fails
        # before any work).
        self._ray: RayEncoders | None = None
        if ray is not None:
            from codesearch.encoder.ray import RayEncoders, require_ray

            require_ray()
            self._ray = RayEncoders(ray)
        # (dense, multi) model arguments -> (encoders, notices from resolving them).
        self._encoders: dict[tuple[Any, Any], tuple[Encoders, list[str]]] = {}
        # One Searcher for every mode: opened without encoders (a lexical search never loads
        # a model), given the query encoders by the first search that needs them; _attached
        # says which searcher got them and what resolving them said.
        self._searcher: Any = None
        self._attached: tuple[Any, list[str]] | None = None  # (searcher given the encoders, notices)
        self._retired: list[Any] = []  # searchers replaced by a newer generation, closed with this object
        self._state_lock = threading.Lock()  # guards the searcher's creation and replacement
        self._encoders_lock = threading.Lock()  # model loads: a lexical search never waits on one
        self._attach_lock = threading.Lock()  # one thread loads and attaches the query encoders
        self._rw = ReadWriteLock()  # searches read, index runs write
        self._closed = False

    # -- life cycle --------------------------------------------------------------------

    def __enter__(self) -> CodeSearch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the searcher and the encoders. Idempotent."""
        with self._rw.writing(), self._state_lock:
            self._close_searchers()
            self._encoders.clear()
            if self._own_pool:
                self.encoder_pool.clear()
            if self._ray is not None:
                self._ray.close()
            self._closed = True

    def __repr__(self) -> str:
        return f"CodeSearch({str(self.root)!r}, index_dir={str(self.index_dir)!r})"

    # -- indexing ------------------------------------------------------------------------

    def index(
        self,
        *,
        rebuild: bool = False,
        progress: Callable[[ProgressEvent], None] | None = None,
        lexical_only: bool = False,
    ) -> IndexSummary:
        """Bring the index up to date with the files (incremental unless `rebuild`).

        Parameters
        ----------
        rebuild : bool
            Drop the existing index first and embed everything again.
        progress : callable, optional
            Called with each `ProgressEvent` (stage, done/total, files, chunks, tokens/s).
        lexical_only : bool
            Load no model and write no vectors in this run (seconds, not minutes), without
            switching the models off: the next run with the default models adds the
            vectors. ``codesearch query`` uses it to answer at once in a folder that has
            no index yet.

        Returns
        -------
        IndexSummary
            Files indexed/unchanged/removed, skipped files by reason, chunks, tokens, time,
            models and notices (e.g. "default model not cached: lexical-only index").

        Raises
        ------
        NothingToIndexError, IndexLockedError, ModelUnavailableError, ModelMismatchError,
        IndexCorruptError, IndexWriteError
        """
        self._check_open()
        if self.index_dir.exists() and not self.index_dir.is_dir():
            raise IndexWriteError(
                f"the index folder {str(self.index_dir)!r} is a file (move it away, or pass --index-dir FOLDER)"
            )
        if lexical_only:
            return self._index((None, None), rebuild=rebuild, progress=progress, defer_vectors=True)
        return self._index((self.model, self.multi_model), rebuild=rebuild, progress=progress)

    # -- searching -----------------------------------------------------------------------

    def query(
        self,
        query: str | SearchRequest,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | Sequence[str] | None = None,
        glob: str | Sequence[str] | None = None,
        files_only: bool = False,
        refresh: bool = False,
        **options: Any,
    ) -> SearchResult:
        """Search and return the hits together with how they were found.

        Parameters
        ----------
        query : str or SearchRequest
            Natural language or code; or a whole `SearchRequest` (the other search
            arguments are then not used; `refresh` still is).
        k : int
            How many hits (or files, with `files_only`) are ranked.
        mode : {"hybrid", "lexical", "dense", "colbert"}
            Which indexes rank the hits. ``hybrid`` fuses every index that exists.
        language : str or sequence of str, optional
            Only hits in (any of) these languages (``"python"``, ``"go"``, ...).
        glob : str or sequence of str, optional
            Only hits whose path passes these ripgrep-style globs (``"src/**/*.py"``,
            ``"!tests/**"``, ``"*.{rs,md}"``; see `codesearch.globs`).
        files_only : bool
            One hit per file, best chunk first.
        refresh : bool
            When files changed since the last index run, index them first; the result's
            notices then say so.
        **options
            The other `SearchRequest` fields: ``languages``, ``globs`` (added to
            `language`/`glob`), ``context``, ``max_lines``, ``no_snippet``, ``min_score``,
            ``budget``.

        Returns
        -------
        SearchResult
            ``hits``, ``mode``, ``indexes_used``, ``notices`` and ``left_out`` (hits the
            output controls left out, or None).

        Raises
        ------
        QueryError
            An empty query, an unknown mode, k < 1, an invalid glob or output control.
        NotIndexedError
            When the folder has no index yet.
        """
        self._check_open()
        request = (
            query if isinstance(query, SearchRequest)
            else SearchRequest.of(query, k, mode=mode, language=language, glob=glob, files_only=files_only, **options)
        )
        self._require_index()
        notices: list[str] = []
        if refresh:
            notices.extend(self._refresh(lexical=request.mode is Mode.lexical))
        with self._rw.reading():
            searcher, encoder_notices = self._get_searcher(lexical=request.mode is Mode.lexical)
            result = searcher.search(request)
        notices.extend(encoder_notices)
        if notices:
            # The refresh and the search share one encoder load, and so its notices: say
            # each thing once.
            merged = list(dict.fromkeys([*notices, *result.notices]))
            result = dataclasses.replace(result, notices=merged)
        return snippets.shape(result, request, self.root, index_dir=self.index_dir)

    def search(
        self,
        query: str | SearchRequest,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | Sequence[str] | None = None,
        glob: str | Sequence[str] | None = None,
        files_only: bool = False,
        refresh: bool = False,
        **options: Any,
    ) -> list[SearchHit]:
        """Search and return the hits, best first. Same parameters as `query`.

        Examples
        --------
        >>> for hit in cs.search("open the database", k=3):   # doctest: +SKIP
        ...     print(hit.path, hit.start_line, hit.score)
        """
        return list(
            self.query(
                query, k, mode=mode, language=language, glob=glob, files_only=files_only, refresh=refresh, **options
            ).hits
        )

    def snapshot(self, *, wrap_encoder: Callable[[Encoder], Encoder] | None = None) -> Snapshot:
        """A searcher held on the index generation committed now, with its query encoders.

        Unlike `query`, a snapshot never waits for an index run of this object and never
        sees one half-way: it keeps answering from its generation (records included) while
        runs commit newer ones, until it is closed. A long-running process searches a
        snapshot, takes a new one after each run, and closes the old one when its last
        search returns.

        Parameters
        ----------
        wrap_encoder : callable, optional
            Applied to each query encoder of this snapshot (not to the ones `index` uses),
            e.g. to encode the queries of concurrent searches in one batch.

        Returns
        -------
        Snapshot
            Close it when done (or use it as a context manager).

        Raises
        ------
        NotIndexedError
            When the folder has no index yet.

        Examples
        --------
        >>> with cs.snapshot() as snap:                      # doctest: +SKIP
        ...     hits = snap.search("open the database", k=3).hits
        """
        from codesearch.search.searcher import Searcher

        self._check_open()
        self._require_index()
        with self._rw.reading():
            searcher = Searcher(self.index_dir)
            try:
                while not searcher.pin():  # another process committed in between: reopen
                    searcher.close()
                    searcher = Searcher(self.index_dir)
                encoders, notices = self._get_encoders(self._search_models())
                if wrap_encoder is not None:
                    encoders = encoders.map(wrap_encoder)
                searcher.set_encoders(encoders)
            except BaseException:
                searcher.close()
                raise
        return Snapshot(searcher, encoders, tuple(notices))

    def with_context(self, result: SearchResult, lines: int) -> SearchResult:
        """Widen each hit by `lines` lines above and below, read from the current files.

        A hit whose file is gone, no longer the indexed version, or no regular file inside
        the root (a symlink out of it, a FIFO) is left as it is.
        """
        return snippets.with_context(result, self.root, lines, index_dir=self.index_dir)

    @property
    def indexed(self) -> bool:
        """True when the folder has an index (a search can run; it may be stale)."""
        return (self.index_dir / STORE_FILE).is_file()

    # -- status --------------------------------------------------------------------------

    def status(self) -> IndexStatus:
        """Describe the index: files, chunks, languages, models, staleness, size on disk."""
        self._check_open()
        store_path = self.index_dir / STORE_FILE
        root, index_dir = str(self.root), str(self.index_dir)
        if not store_path.is_file():
            return IndexStatus(root=root, index_dir=index_dir, indexed=False)
        with self._rw.reading():
            info = index_info(self.index_dir)
            stale = self._staleness()
        return IndexStatus(
            root=root,
            index_dir=index_dir,
            indexed=True,
            files=info.files,
            chunks=info.chunks,
            languages=dict(info.languages),
            models={"dense": info.dense_model, "multi": info.multi_model},
            stale={"added": len(stale.added), "changed": len(stale.changed), "removed": len(stale.removed)},
            disk_bytes=_disk_usage(self.index_dir),
            vectors={
                kind: round(n / max(1, info.files if kind == "file" else info.chunks), 4)
                for kind, n in info.vectors.items()
            },
            embedded={"multi" if role == "colbert" else role: how for role, how in info.embedded.items()},
        )

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CodeSearchError("this CodeSearch is closed (create a new one)")

    def _require_index(self) -> None:
        if not self.indexed:
            raise NotIndexedError(
                f"{str(self.root)!r} is not indexed yet (run 'codesearch index {self.root}' first)"
            )

    def _search_models(self) -> tuple[Any, Any]:
        """The models a search (or the refresh before it) needs: for a role left at
        DEFAULT, the one the index records, or none when the index has no such vectors.

        Why not DEFAULT as is: it would load the package default model for an index that
        was built without it (lexical-only, or --model none), only to find no vectors.
        """
        info = index_info(self.index_dir)
        dense = self.model if self.model != DEFAULT else (DEFAULT if info.dense_model else None)
        multi = self.multi_model if self.multi_model != DEFAULT else (DEFAULT if info.multi_model else None)
        return dense, multi

    def _get_encoders(self, models: tuple[Any, Any]) -> tuple[Encoders, list[str]]:
        # Loading imports torch and reads weights: once per distinct pair of models, and
        # never for (None, None). The usual case (index, then search) shares one load.
        with self._encoders_lock:
            cached = self._encoders.get(models)
            if cached is None:
                if models == (None, None):
                    # Nothing to load; both roles are switched off, as resolving would record.
                    cached = (Encoders(disabled=("colbert", "dense")), [])
                else:
                    cached = resolve_encoders(
                        models[0], models[1], device=self.device, index_dir=self.index_dir,
                        load=self.encoder_pool.load,
                    )
                self._encoders[models] = cached
            return cached

    def _get_searcher(self, *, lexical: bool) -> tuple[Any, list[str]]:
        """The searcher, with the query encoders attached unless ``lexical``, and the
        notices from loading them."""
        with self._state_lock:
            searcher = self._searcher
        if searcher is not None and not searcher.is_current():
            # Another process committed (an index run publishes files first, then vectors
            # as they come): move to its generation. The old searcher may still be in use
            # by another thread, so it is closed with this object, not now.
            from codesearch.search.searcher import Searcher

            opened = Searcher(self.index_dir)
            with self._state_lock:
                if self._searcher is searcher:
                    self._retired.append(searcher)
                    self._searcher = opened
                else:
                    opened.close()
                searcher = self._searcher
        if searcher is None:
            from codesearch.search.searcher import Searcher

            opened = Searcher(self.index_dir)
            with self._state_lock:
                if self._searcher is None:
                    self._searcher = opened
                else:  # another thread got there first
                    opened.close()
                searcher = self._searcher
        if lexical:
            return searcher, []
        with self._attach_lock:
            attached = self._attached
            if attached is None or attached[0] is not searcher:
                encoders, notices = self._get_encoders(self._search_models())
                searcher.set_encoders(encoders)
                attached = self._attached = (searcher, list(notices))
            return searcher, attached[1]

    def _close_searchers(self) -> None:
        # The caller holds _state_lock and the write lock, so no search is under way; the
        # attachment goes too, or it would keep the closed searcher's indexes in memory.
        searcher, self._searcher, self._attached = self._searcher, None, None
        retired, self._retired = self._retired, []
        for old in [*retired, searcher]:
            if old is not None:
                old.close()

    def _index(
        self,
        models: tuple[Any, Any],
        *,
        rebuild: bool = False,
        progress: Callable[[ProgressEvent], None] | None = None,
        walk: tuple[tuple[str, ...], tuple[str, ...], int] | None = None,
        disabled: tuple[str, ...] | None = None,
        defer_vectors: bool = False,
    ) -> IndexSummary:
        """One index run with the encoders of ``models``; ``disabled`` (when given) is the
        list of switched-off model roles the run records, instead of the resolved one;
        ``defer_vectors``: a run without models that leaves the recorded ones as they are
        (their vectors of changed code come with the next run that encodes)."""
        include, exclude, max_bytes = walk or (self.include, self.exclude, self.max_file_bytes)
        with self._rw.writing():
            IndexLock.check_free(self.index_dir)  # before a model load of seconds, not after
            notices: list[str] = []

            ray = self._ray if walk is None else None  # a search's small refresh stays local

            def load() -> Encoders:
                encoders, said = self._get_encoders(models)
                notices.extend(said)
                if ray is not None:
                    encoders = ray.wrap(encoders)
                return encoders if disabled is None else dataclasses.replace(encoders, disabled=tuple(disabled))

            with self._encoders_lock:
                # Loading takes seconds on a CPU (torch, weights): the pipeline calls `load`
                # once the repository is searchable, so a first index answers queries sooner.
                lazy = models not in self._encoders and self._chunks_without_model(models)
            if lazy:  # a named model that cannot be found fails before the run writes anything
                from codesearch.encoder.loading import locate

                for name in models:
                    if name not in (None, DEFAULT):
                        locate(name)
            encoders = None if lazy else load()
            if ray is not None:
                progress = ray.with_rates(progress)
            try:
                summary = build_index(
                    self.root,
                    index_dir=self.index_dir,
                    encoders=encoders,
                    load_encoders=load if lazy else None,
                    include=include,
                    exclude=exclude,
                    max_file_bytes=max_bytes,
                    rebuild=rebuild,
                    progress=progress,
                    defer_vectors=defer_vectors,
                )
            except OSError as exc:
                # Unreadable source files are skipped by the pipeline; what reaches here is
                # the index folder itself (not creatable, read-only, disk full).
                where = exc.filename or self.index_dir
                raise IndexWriteError(
                    f"cannot write the index at {str(where)!r}: {exc.strerror or exc} "
                    "(check permissions and free disk space, or pass --index-dir FOLDER)"
                ) from exc
            # Searchers hold the previous generation; the next search opens the new one.
            with self._state_lock:
                self._close_searchers()
        if notices:
            summary = dataclasses.replace(summary, notices=[*notices, *summary.notices])
        return summary

    def _chunks_without_model(self, models: tuple[Any, Any]) -> bool:
        """Whether ``models`` chunk by the byte estimate (`chunk_budget`): a wide-window
        ColBERT model alone. Only then can a run index lexically before loading them: with
        any other model the chunks are sized in its tokens, and a lexical pass would be
        chunked again (new chunk ids) once the model is loaded. Decided from the
        checkpoint's JSON files; anything unknown says no (the model loads first)."""
        from codesearch.encoder import DEFAULT_MULTI_MODEL
        from codesearch.encoder.loading import colbert_window
        from codesearch.indexing.encoders import MAX_CHUNK_TOKENS, default_models, holds_estimated_chunks

        dense, multi = models
        if multi is None:
            return False
        try:
            recorded = index_info(self.index_dir) if self.indexed else None
        except CodeSearchError:  # unreadable: the run says so, as it always did
            return False
        if dense == DEFAULT:
            if recorded is not None and recorded.dense_model:
                return False
            # "auto" would import torch to ask for CUDA (the seconds this saves): any sign of
            # an NVIDIA driver counts as CUDA (the model then loads first, as it always did);
            # without one, the CPU default has no dense model
            device = "cuda" if self.device == "auto" and _nvidia_driver() else self.device
            if device != "auto" and default_models(device)[0] is not None:
                return False
        elif dense is not None:
            return False
        if multi == DEFAULT:
            multi = recorded.multi_model if recorded is not None and recorded.multi_model else DEFAULT_MULTI_MODEL
        window = colbert_window(multi)
        return window is not None and holds_estimated_chunks(window, MAX_CHUNK_TOKENS)

    def _recorded(self) -> _Recorded:
        """What the last index run recorded that a refresh must reuse, in one read.

        Why the walk options: a refresh (or a status) must compare the files with the index
        as it was built; with this object's own (possibly default) options, files left out
        on purpose by ``index --include/--exclude/--max-file-size`` would look new.
        """
        from codesearch.store import Store

        with Store(self.index_dir / STORE_FILE, readonly=True) as store:
            return _Recorded(
                include=tuple(json.loads(store.get_meta(WALK_INCLUDE_KEY) or "[]")),
                exclude=tuple(json.loads(store.get_meta(WALK_EXCLUDE_KEY) or "[]")),
                max_file_bytes=int(store.get_meta("max_file_bytes") or self.max_file_bytes),
                disabled=tuple(json.loads(store.get_meta(DISABLED_KEY) or "[]")),
                vectors_pending=bool(store.get_meta(VECTORS_PENDING_KEY)),
            )

    def _staleness(self, recorded: _Recorded | None = None) -> Staleness:
        include, exclude, max_bytes = (recorded or self._recorded()).walk
        return staleness(
            self.root, index_dir=self.index_dir, include=include, exclude=exclude, max_file_bytes=max_bytes
        )

    def _refresh(self, *, lexical: bool = False) -> list[str]:
        recorded = self._recorded()
        stale = self._staleness(recorded)
        # An earlier lexical search's refresh may have left changed code without vectors: a
        # search that uses them adds them.
        add_vectors = not lexical and recorded.vectors_pending
        if not stale.stale and not add_vectors:
            return []
        n = len(stale.added) + len(stale.changed) + len(stale.removed)
        # A lexical search needs no vectors: its refresh loads no model (0.8 s, not 8 s after
        # a one-line edit); the changed code gets its vectors from the next run that encodes.
        models = (None, None) if lexical else self._search_models()
        try:
            # A refresh keeps the index's record of what the user switched off. It is part
            # of a query: the index run reported unreadable files already.
            with quiet_skips():
                summary = self._index(models, walk=recorded.walk, disabled=recorded.disabled, defer_vectors=lexical)
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


@dataclass(frozen=True, slots=True)
class _Recorded:
    """The options and state of the last index run that `CodeSearch._refresh` reuses."""

    include: tuple[str, ...]
    exclude: tuple[str, ...]
    max_file_bytes: int
    disabled: tuple[str, ...]  # model roles the user switched off
    vectors_pending: bool  # a run without models left changed code without vectors

    @property
    def walk(self) -> tuple[tuple[str, ...], tuple[str, ...], int]:
        return self.include, self.exclude, self.max_file_bytes


def _nvidia_driver() -> bool:
    """Whether this machine shows an NVIDIA driver (Linux, WSL, or nvidia-smi on the PATH),
    without importing torch."""
    import shutil

    marks = ("/proc/driver/nvidia", "/dev/nvidia0", "/usr/lib/wsl/lib/libcuda.so")
    return any(Path(m).exists() for m in marks) or shutil.which("nvidia-smi") is not None


# -- pieces for long-running processes (the server uses only these) -------------------------


class EncoderPool:
    """Models loaded once and shared by every `CodeSearch` given this pool.

    A process that keeps several `CodeSearch` objects (a server: one per repository) passes
    one pool to all of them, so a model named by several of them, or recorded by several
    indexes, is loaded once. Models are keyed by the name they were loaded by (hub id or
    folder; for `DEFAULT`, the name the index records) and the device. Thread-safe.

    Examples
    --------
    >>> pool = EncoderPool()
    >>> a = CodeSearch("repo-a", encoder_pool=pool)          # doctest: +SKIP
    >>> b = CodeSearch("repo-b", encoder_pool=pool)          # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], Encoder] = {}
        self._lock = threading.Lock()

    def load(self, name: str, *, device: str = "auto") -> Encoder:
        """The encoder for ``name`` on ``device``, loading it on first use.

        Raises
        ------
        ModelError
            The model cannot be loaded (not cached offline, a bad checkpoint).
        """
        from codesearch.encoder import load

        key = (str(name), device)
        # One lock for every load: two threads asking for the same model load it once, and
        # distinct models would only compete for the same cores.
        with self._lock:
            encoder = self._loaded.get(key)
            if encoder is None:
                encoder = self._loaded[key] = load(name, device=device)
            return encoder

    def loaded(self) -> list[Encoder]:
        """The encoders loaded so far, in loading order."""
        with self._lock:
            return list(self._loaded.values())

    def clear(self) -> None:
        """Forget every loaded encoder (their memory frees once no searcher holds them)."""
        with self._lock:
            self._loaded.clear()


class Snapshot:
    """One committed index generation, open for searching (from `CodeSearch.snapshot`).

    Attributes
    ----------
    encoders
        The query encoders attached (``.dense``, ``.multi``; None where absent).
    notices : tuple of str
        What resolving the encoders said (e.g. a default model not cached); added to the
        notices of every search that uses them.
    """

    def __init__(self, searcher: Searcher, encoders: Encoders, notices: tuple[str, ...]) -> None:
        self._searcher = searcher
        self.encoders = encoders
        self.notices = notices

    def search(
        self,
        query: str | SearchRequest,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | Sequence[str] | None = None,
        glob: str | Sequence[str] | None = None,
        files_only: bool = False,
        path_rules: Sequence[str] | None = None,
    ) -> SearchResult:
        """Search this generation; same parameters and result as `CodeSearch.query`
        (``query`` may be a whole `SearchRequest`, checked when it was made).

        ``path_rules``: glob rules to apply instead of the request's, made by the caller
        from them (a server scoping a search to a folder), so not held to a request's limits.

        Raises
        ------
        QueryError
            An empty query, an unknown mode or language, or k < 1.
        """
        request = query if isinstance(query, SearchRequest) else SearchRequest.of(
            query, k, mode=mode, language=language, glob=glob, files_only=files_only
        )
        result = self._searcher.search(request, path_rules=path_rules)
        if self.notices and request.mode is not Mode.lexical:  # a lexical search used no encoder
            result = dataclasses.replace(result, notices=list(dict.fromkeys([*self.notices, *result.notices])))
        return result

    def close(self) -> None:
        """Release the store connection and the indexes held in memory. Idempotent."""
        self._searcher.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- end of the pieces for long-running processes ------------------------------------------


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




# -- models ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Details of one encoder checkpoint (``codesearch models info``)."""

    name: str
    identity: str
    multivector: bool
    dim: int
    max_length: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def list_models() -> list[dict[str, Any]]:
    """The models in the local Hugging Face cache, plus the two defaults even when absent.

    Each row: ``name`` (hub id), ``role`` (``"default dense"``, ``"default multi-vector"``
    or ``""``), ``cached`` (bool), ``size_bytes`` and ``path`` (None when not cached).
    No network, no torch.
    """
    from codesearch.encoder import DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL
    from codesearch.encoder.loading import cached_models

    roles = {DEFAULT_DENSE_MODEL: "default dense", DEFAULT_MULTI_MODEL: "default multi-vector"}
    rows = [
        {
            "name": m.repo_id,
            "role": roles.get(m.repo_id, ""),
            "cached": True,
            "size_bytes": m.size_bytes,
            "path": str(m.path),
        }
        for m in cached_models()
    ]
    cached = {row["name"] for row in rows}
    rows += [
        {"name": name, "role": role, "cached": False, "size_bytes": 0, "path": None}
        for name, role in roles.items()
        if name not in cached
    ]
    return rows


def pull_model(name: str) -> Path:
    """Download `name` from the hub into the local cache and return its folder."""
    from codesearch.encoder.loading import pull

    return Path(pull(name))


def model_info(name: str, *, device: str = "cpu") -> ModelInfo:
    """Load `name` (hub id or local folder) and describe it. Imports torch."""
    from codesearch.encoder import load
    from codesearch.errors import ModelUnavailableError

    try:
        enc = load(name, device=device)
    except ModelUnavailableError:
        # The loader's message names `index --model`, which 'models info' does not have.
        raise ModelUnavailableError(
            f"Model {name!r} is not in the local cache and the hub cannot be reached "
            f"(pass a local checkpoint folder, or run 'codesearch models pull {name}' online)"
        ) from None
    return ModelInfo(
        name=enc.name, identity=enc.identity, multivector=enc.multivector, dim=enc.dim, max_length=enc.max_length
    )
