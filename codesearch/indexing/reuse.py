"""The encode stage's side of the user's vector cache (`codesearch.store.cache`): what an
index lacks is looked up there before anything is encoded, and what is encoded is added.

The key is the hash of the exact text the encoder reads: for a chunk, its header (path and
enclosing signatures) and code; for a whole file, its name and the part of it the window
holds. So a vector is reused only for the very input it was made from, whatever the
repository, branch or chunking that produced that input.

The cache is never needed: when it is off, unwritable or damaged, a run encodes as it did
before it existed, and an error of the cache never fails a run (it is logged, and the run
stops using it).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence

import numpy as np

from codesearch.errors import CodeSearchError
from codesearch.store.cache import UserCache
from codesearch.store.files import hash_text

__all__ = ["Reuse", "vector_key"]

log = logging.getLogger(__name__)

#: What a failing cache raises (then the run goes on without it).
_CACHE_ERRORS = (CodeSearchError, sqlite3.Error, OSError)


def vector_key(text: str) -> str:
    """The cache key of the vector of ``text`` as the encoder reads it."""
    return hash_text(text)


class Reuse:
    """One run's use of the vector cache (a no-op when there is none).

    Parameters
    ----------
    cache
        The open cache, or None.
    """

    def __init__(self, cache: UserCache | None):
        self.cache = cache

    @classmethod
    def open(cls) -> Reuse:
        """The user's cache as configured (`CODESEARCH_CACHE_DIR`, `CODESEARCH_CACHE_SIZE`)."""
        try:
            return cls(UserCache.open())
        except _CACHE_ERRORS as exc:
            log.warning("the vector cache is not used in this run: %s", exc)
            return cls(None)

    @property
    def enabled(self) -> bool:
        return self.cache is not None

    def take(self, model: str, kind: str, texts: Sequence[str]) -> dict[int, tuple[int, int, bytes]]:
        """Position in ``texts`` -> the cached vector as stored (``n, dim, float16 bytes``,
        what `Store.put_encoded` takes), for the texts the cache holds."""
        if self.cache is None or not texts:
            return {}
        keys = [vector_key(t) for t in texts]
        try:
            found = self.cache.get_encoded(model, kind, keys)
        except _CACHE_ERRORS as exc:
            self._give_up(exc)
            return {}
        return {i: found[k] for i, k in enumerate(keys) if k in found}

    def keep(self, model: str, kind: str, items: Iterable[tuple[str, np.ndarray]]) -> None:
        """Add ``(text, vector)`` pairs just encoded."""
        if self.cache is None:
            return
        try:
            self.cache.put_vectors(model, kind, ((vector_key(t), v) for t, v in items))
        except _CACHE_ERRORS as exc:
            self._give_up(exc)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def _give_up(self, exc: BaseException) -> None:
        log.warning("the vector cache failed (%s); this run goes on without it", exc)
        self.close()
