"""Which models a `CodeSearch` uses, loaded once: the pool shared by several objects (a
server), the encoders resolved for each pair of model arguments, and the model commands
(``codesearch models list | pull | info``).

A lexical search never gets here, so it never imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from codesearch.encoder.base import Encoder, Encoders
from codesearch.errors import CodeSearchError
from codesearch.indexing.encoders import resolve_encoders
from codesearch.indexing.status import IndexInfo, index_info
from codesearch.types import DEFAULT, JSONDict

__all__ = ["EncoderPool", "ModelArgs", "ModelInfo", "Models", "list_models", "model_info", "pull_model"]

#: (dense, multi) model arguments: a hub id or folder, `DEFAULT` (what the index records,
#: else the package default), or None (no such vectors).
ModelArgs = tuple[str | None, str | None]


class EncoderPool:
    """Models loaded once and shared by every `CodeSearch` given this pool.

    A process that keeps several `CodeSearch` objects (a server: one per repository) passes
    one pool to all of them, so a model named by several of them, or recorded by several
    indexes, is loaded once. Models are keyed by name (a hub id; for `DEFAULT`, the name the
    index records) and device; a local folder by its resolved path, so that two spellings
    of one folder (``venv/lib/m`` and ``venv/bin/../lib/m``, a symlink) are one load. A
    folder's files are checked (names, sizes, mtimes) when it is asked for again: a folder
    moved away or changed in place is loaded anew, or fails to load as it would in a fresh
    process, rather than answering from what was read before. Thread-safe.

    Examples
    --------
    >>> pool = EncoderPool()
    >>> a = CodeSearch("repo-a", encoder_pool=pool)          # doctest: +SKIP
    >>> b = CodeSearch("repo-b", encoder_pool=pool)          # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], Encoder] = {}
        self._files: dict[tuple[str, str], tuple | None] = {}  # a local folder's files when loaded
        self._keys: dict[int, tuple[str, str]] = {}  # id of each encoder handed out -> its key
        self._lock = threading.Lock()
        self.dropped = 0  # models let go of because their folder moved or changed (see `sweep`)

    def load(self, name: str, *, device: str = "auto") -> Encoder:
        """The encoder for ``name`` on ``device``, loading it on first use.

        Raises
        ------
        ModelError
            The model cannot be loaded (not cached offline, a bad checkpoint, a folder that
            is gone).
        """
        from codesearch.encoder import load

        key = (model_key(name), device)
        # One lock for every load: two threads asking for the same model load it once, and
        # distinct models would only compete for the same cores.
        with self._lock:
            encoder = self._loaded.get(key)
            if encoder is not None and self._files[key] != folder_files(key[0]):
                self._drop(key)
                encoder = None
            if encoder is None:
                encoder = load(key[0], device=device)
                self._loaded[key], self._files[key] = encoder, folder_files(key[0])
                self._keys[id(encoder)] = key
            return encoder

    def current(self, encoder: Encoder) -> bool:
        """False when ``encoder`` came from this pool and was let go of since (`sweep`), or
        from a local folder that has since moved or changed (its next `load` reads the folder
        again); True otherwise (an encoder of another pool, or of none)."""
        with self._lock:
            key = self._keys.get(id(encoder))
            if key is None:
                return True
            return self._loaded.get(key) is encoder and self._files[key] == folder_files(key[0])

    def sweep(self) -> int:
        """Let go of every model whose folder moved or changed since it was loaded; returns
        `dropped`, the count so far (a holder that saw another count re-resolves its models)."""
        with self._lock:
            for key in [k for k in self._loaded if self._files[k] != folder_files(k[0])]:
                self._drop(key)
            return self.dropped

    def _drop(self, key: tuple[str, str]) -> None:
        del self._loaded[key], self._files[key]
        self.dropped += 1

    def loaded(self) -> list[Encoder]:
        """The encoders loaded so far, in loading order."""
        with self._lock:
            return list(self._loaded.values())

    def clear(self) -> None:
        """Forget every loaded encoder (their memory frees once no searcher holds them)."""
        with self._lock:
            self._loaded.clear()
            self._files.clear()
            self._keys.clear()


def model_key(name: str) -> str:
    """How the pool knows a model: a local folder by its resolved path (symlinks and ``..``
    followed), anything else (a hub id) as named."""
    path = Path(str(name)).expanduser()
    return str(path.resolve()) if path.is_dir() else str(name)


#: How deep `folder_files` looks: a sentence-transformers folder keeps its pooling and
#: projection settings one level down (``1_Pooling/``, ``1_Dense/``).
_FOLDER_DEPTH = 2


def folder_files(key: str) -> tuple | None:
    """The files of a local model folder as (relative path, size, mtime in ns), sorted; None
    for a folder that is not there (a moved model, or a hub id). Stats only, no reads."""
    root = Path(key)
    if not root.is_dir():
        return None
    found = []
    folders = [(root, 1)]
    while folders:
        folder, depth = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir():
                    if depth < _FOLDER_DEPTH:
                        folders.append((Path(entry.path), depth + 1))
                    continue
                st = entry.stat()
            except OSError:
                continue
            found.append((os.path.relpath(entry.path, root), st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


class Models:
    """The models of one `CodeSearch`: what it was asked for, what a search of its index
    needs, and the encoders resolved for each pair of arguments (once per pair, through the
    pool, so an index run and the search after it share one load).

    Parameters
    ----------
    dense, multi : str or None
        The model arguments (`DEFAULT`, a hub id or folder, None).
    device : str
        Where the encoders run.
    index_dir : Path
        The index whose recorded models `DEFAULT` means.
    pool : EncoderPool
        Where models load.
    """

    def __init__(self, dense: str | None, multi: str | None, *, device: str, index_dir: Path,
                 pool: EncoderPool) -> None:
        self.asked: ModelArgs = (dense, multi)
        self.device = device
        self.index_dir = index_dir
        self.pool = pool
        self._resolved: dict[ModelArgs, tuple[Encoders, list[str]]] = {}
        self._lock = threading.Lock()  # model loads: a lexical search never waits on one

    def for_search(self) -> ModelArgs:
        """The models a search (or the refresh before it) needs: for a role left at
        DEFAULT, the one the index records, or none when the index has no such vectors.

        Why not DEFAULT as is: it would load the package default model for an index that
        was built without it (lexical-only, or --model none), only to find no vectors.
        """
        info = index_info(self.index_dir)
        dense, multi = self.asked
        dense = dense if dense != DEFAULT else (DEFAULT if info.dense_model else None)
        multi = multi if multi != DEFAULT else (DEFAULT if info.multi_model else None)
        return dense, multi

    def encoders(self, models: ModelArgs) -> tuple[Encoders, list[str]]:
        """The encoders of ``models`` and what resolving them said, loaded on first use.

        Loading imports torch and reads weights: once per distinct pair, never for
        (None, None).
        """
        with self._lock:
            cached = self._resolved.get(models)
            if cached is not None and not all(self.pool.current(e) for e in cached[0].present()):
                cached = None  # a model folder moved or changed: resolve as a fresh process would
            if cached is None:
                if models == (None, None):
                    # Nothing to load; both roles are switched off, as resolving would record.
                    cached = (Encoders(disabled=("colbert", "dense")), [])
                else:
                    cached = resolve_encoders(
                        models[0], models[1], device=self.device, index_dir=self.index_dir, load=self.pool.load,
                    )
                self._resolved[models] = cached
            return cached

    def for_index(self, models: ModelArgs) -> tuple[Encoders, list[str]]:
        """The encoders an index run uses: those already loaded, else encoders that load
        their model only when the run has something to encode (`codesearch.indexing.deferred`:
        a copy whose every text is in the user's cache loads none). Memoised as `encoders`
        are when every model was loaded; deferred ones are not (a search resolves its own,
        through the same pool: a model still loads once)."""
        from codesearch.indexing.deferred import DeferredEncoder, deferring

        with self._lock:
            cached = self._resolved.get(models)
        if cached is not None or models == (None, None):
            return self.encoders(models)
        resolved = resolve_encoders(
            models[0], models[1], device=self.device, index_dir=self.index_dir, load=deferring(self.pool.load),
        )
        if not any(isinstance(e, DeferredEncoder) for e in resolved[0].present()):
            with self._lock:
                resolved = self._resolved.setdefault(models, resolved)
        return resolved

    def for_search_encoders(self) -> tuple[Encoders, list[str]]:
        """`encoders` of `for_search`: what a searcher attaches."""
        return self.encoders(self.for_search())

    def loaded(self, models: ModelArgs) -> bool:
        """Whether ``models`` are resolved already."""
        with self._lock:
            return models in self._resolved

    def index_lexically_first(self, models: ModelArgs, *, indexed: bool) -> bool:
        """Whether an index run may index lexically before loading ``models``: they chunk by
        the byte estimate (`chunk_budget`), i.e. a wide-window ColBERT model alone. With any
        other model the chunks are sized in its tokens, and a lexical pass would be chunked
        again (new chunk ids) once the model is loaded. Decided from the checkpoint's JSON
        files; anything unknown says no (the model loads first)."""
        from codesearch.encoder import DEFAULT_MULTI_MODEL
        from codesearch.encoder.loading import colbert_window
        from codesearch.indexing.encoders import MAX_CHUNK_TOKENS, default_models, holds_estimated_chunks

        dense, multi = models
        if multi is None or self.loaded(models):
            return False
        try:
            recorded: IndexInfo | None = index_info(self.index_dir) if indexed else None
        except CodeSearchError:  # unreadable: the run says so, as it always did
            return False
        if dense == DEFAULT:
            if recorded is not None and recorded.dense_model:
                return False
            # "auto" would import torch to ask for CUDA (the seconds this saves): any sign of
            # an NVIDIA driver counts as CUDA (the model then loads first, as it always did);
            # without one, the CPU default has no dense model
            device = "cuda" if self.device == "auto" and nvidia_driver() else self.device
            if device != "auto" and default_models(device)[0] is not None:
                return False
        elif dense is not None:
            return False
        if multi == DEFAULT:
            multi = recorded.multi_model if recorded is not None and recorded.multi_model else DEFAULT_MULTI_MODEL
        window = colbert_window(multi)
        return window is not None and holds_estimated_chunks(window, MAX_CHUNK_TOKENS)

    def clear(self) -> None:
        """Forget the resolved encoders."""
        with self._lock:
            self._resolved.clear()


def nvidia_driver() -> bool:
    """Whether this machine shows an NVIDIA driver (Linux, WSL, or nvidia-smi on the PATH),
    without importing torch."""
    marks = ("/proc/driver/nvidia", "/dev/nvidia0", "/usr/lib/wsl/lib/libcuda.so")
    return any(Path(m).exists() for m in marks) or shutil.which("nvidia-smi") is not None


# -- the model commands ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Details of one encoder checkpoint (``codesearch models info``)."""

    name: str
    identity: str
    multivector: bool
    dim: int
    max_length: int

    def to_dict(self) -> JSONDict:
        return dataclasses.asdict(self)


def list_models() -> list[JSONDict]:
    """The models in the local Hugging Face cache, plus the two defaults even when absent.

    Each row: ``name`` (hub id), ``role`` (``"default dense"``, ``"default multi-vector"``
    or ``""``), ``cached`` (bool), ``size_bytes`` and ``path`` (None when not cached).
    No network, no torch.
    """
    from codesearch.encoder import DEFAULT_DENSE_MODEL, DEFAULT_MULTI_MODEL
    from codesearch.encoder.loading import cached_models

    roles = {DEFAULT_DENSE_MODEL: "default dense", DEFAULT_MULTI_MODEL: "default multi-vector"}
    rows = [
        {"name": m.repo_id, "role": roles.get(m.repo_id, ""), "cached": True, "size_bytes": m.size_bytes,
         "path": str(m.path)}
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
