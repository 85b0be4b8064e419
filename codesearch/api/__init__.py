"""The Python API: one `CodeSearch` object per repository, used by the CLI, the server and
RAG apps alike.

`CodeSearch` holds the settings (which models, which files), loads the encoders lazily and
once, and shares them between indexing and searching. A lexical search never loads a model,
so it never imports torch. The pieces it is made of have modules of their own: `models`
(the encoder pool and the model commands), `snapshot`, `refresh` and `status`; the
searcher it keeps is a `codesearch.search.live.LiveSearcher`.

Example
-------
>>> from codesearch import CodeSearch
>>> with CodeSearch("path/to/repo", model=None, multi_model=None) as cs:   # doctest: +SKIP
...     summary = cs.index()
...     for hit in cs.search("retry failed http requests", k=3, mode="lexical"):
...         print(f"{hit.path}:{hit.start_line}-{hit.end_line}", round(hit.score, 3))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch import _compat
from codesearch.api.export import ImportSummary, import_index
from codesearch.api.models import EncoderPool, ModelArgs, ModelInfo, Models, list_models, model_info, pull_model
from codesearch.api.refresh import Recorded, Walk, refresh
from codesearch.api.run import run_index
from codesearch.api.snapshot import Snapshot, with_notices
from codesearch.api.status import IndexStatus, index_status
from codesearch.encoder.base import Encoder
from codesearch.errors import CodeSearchError, IndexWriteError, NotIndexedError, PathError
from codesearch.search import snippets
from codesearch.search.live import LiveSearcher, open_pinned
from codesearch.store import IndexLock, ReadWriteLock
from codesearch.types import (
    DEFAULT,
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
    from codesearch.types import SearchHit, SearchResult

__all__ = [
    "DEFAULT",
    "MODES",
    "SCHEMA_VERSION",
    "CodeSearch",
    "EncoderPool",
    "ImportSummary",
    "IndexStatus",
    "Mode",
    "ModelInfo",
    "SearchRequest",
    "Snapshot",
    "check_query",
    "find_index_root",
    "hit_document",
    "import_index",
    "list_models",
    "model_info",
    "pull_model",
    "result_document",
]

#: Names the server once took from here: each is one thing with one name in its own module.
__getattr__ = _compat.moved_names(__name__, {
    "fit_result": "codesearch.search.snippets:fit",
    "shape_result": "codesearch.search.snippets:shape",
    "widen_result": "codesearch.search.snippets:with_context",
    "escape_glob": "codesearch.globs",
    "glob_deadline": "codesearch.globs",
    "scope_globs": "codesearch.globs",
})


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
        model: str | None = DEFAULT,
        multi_model: str | None = DEFAULT,
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
        self._models = Models(model, multi_model, device=device, index_dir=self.index_dir, pool=self.encoder_pool)
        self.ray = ray
        # The Ray pool and encoders, kept between runs (made here: a missing extra fails
        # before any work).
        self._ray: RayEncoders | None = None
        if ray is not None:
            from codesearch.encoder.ray import RayEncoders, require_ray

            require_ray()
            self._ray = RayEncoders(ray)
        # One searcher for every mode, following the index as runs commit: opened without
        # encoders (a lexical search never loads a model), given them by the first search
        # that needs them.
        self._live = LiveSearcher(self.index_dir, encoders=self._models.for_search_encoders)
        self._rw = ReadWriteLock()  # searches read, index runs write
        self._closed = False

    # -- life cycle --------------------------------------------------------------------

    def __enter__(self) -> CodeSearch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the searcher and the encoders. Idempotent."""
        with self._rw.writing():
            self._live.close()
            self._models.clear()
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
        return self._index(self._models.asked, rebuild=rebuild, progress=progress)

    def export(self, path: str | Path) -> Path:
        """Write this index to the one file ``path`` (store, vectors, derived indexes, with a
        checksummed manifest); `import_index` adopts it for another checkout. Returns ``path``.

        Raises
        ------
        NotIndexedError, IndexLockedError, ExportError
        """
        from codesearch.api.export import export_index

        self._check_open()
        export_index(self.root, self.index_dir, path)
        return Path(path)

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
        **options: object,
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
        lexical = request.mode is Mode.lexical
        notices: list[str] = []
        if refresh:
            notices.extend(self._refresh(lexical=lexical))
        with self._rw.reading(), self._live.lease(lexical=lexical) as (searcher, encoder_notices):
            result = searcher.search(request)
        # The refresh and the search share one encoder load, and so its notices: say each
        # thing once.
        result = with_notices(result, [*notices, *encoder_notices])
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
        **options: object,
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
        self._check_open()
        self._require_index()
        with self._rw.reading():
            searcher = open_pinned(self.index_dir)
            try:
                encoders, notices = self._models.for_search_encoders()
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
        with self._rw.reading():
            return index_status(self.root, self.index_dir, self.max_file_bytes)

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CodeSearchError("this CodeSearch is closed (create a new one)")

    def _require_index(self) -> None:
        if not self.indexed:
            raise NotIndexedError(
                f"{str(self.root)!r} is not indexed yet (run 'codesearch index {self.root}' first)"
            )

    def live_searcher(
        self, *, wrap_encoder: Callable[[Encoder], Encoder] | None = None,
        missing: Callable[[], NotIndexedError] | None = None,
    ) -> LiveSearcher:
        """A pinned `LiveSearcher` of this index: searches never wait for an index run of this
        object, and move to a newer generation only when `LiveSearcher.swap` is called (a
        long-running process swaps after each stage of its runs). Its query encoders load
        through this object's models, each wrapped by ``wrap_encoder``; ``missing`` makes
        the error of a search before the first swap."""
        return LiveSearcher(self.index_dir, encoders=self._models.for_search_encoders, pinned=True,
                            wrap=wrap_encoder, missing=missing)

    def _refresh(self, *, lexical: bool) -> list[str]:
        recorded = Recorded.read(self.index_dir, self.max_file_bytes)
        return refresh(self.root, self.index_dir, recorded, run=self._index, search_models=self._models.for_search,
                       lexical=lexical)

    def _index(
        self,
        models: ModelArgs,
        *,
        rebuild: bool = False,
        progress: Callable[[ProgressEvent], None] | None = None,
        walk: Walk | None = None,
        disabled: tuple[str, ...] | None = None,
        defer_vectors: bool = False,
    ) -> IndexSummary:
        """One index run with the encoders of ``models``; ``disabled`` (when given) is the
        list of switched-off model roles the run records, instead of the resolved one;
        ``defer_vectors``: a run without models that leaves the recorded ones as they are
        (their vectors of changed code come with the next run that encodes)."""
        with self._rw.writing():
            IndexLock.check_free(self.index_dir)  # before a model load of seconds, not after
            summary = run_index(
                self.root, self.index_dir, self._models, models,
                walk=walk or (self.include, self.exclude, self.max_file_bytes),
                ray=self._ray if walk is None else None,  # a search's small refresh stays local
                rebuild=rebuild, progress=progress, disabled=disabled, defer_vectors=defer_vectors,
            )
            # The searcher holds the previous generation; the next search opens the new one.
            self._live.reset()
        return summary
