"""What an index is: the one interface every derived index shares.

Each index maps int64 ids (chunk ids, or file ids for a per-file index) to what it ranks
them by, and answers a batch of queries with ``(ids, scores)`` per query, best first. It
is derived data: the registry (`codesearch.indexes.registry`) fills it from the store,
updates it by deltas and rebuilds it when it drifts; nothing here knows about models.

A brute-force implementation of each (a BM25 computed by hand, exact inner products, exact
MaxSim) is its oracle in the tests.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, TypeAlias, runtime_checkable

import numpy as np

__all__ = ["Index", "Items"]

#: What an index ranks by, and what it is queried with: texts (lexical), an ``(n, dim)``
#: array (dense), one ``(tokens, dim)`` array per text (multi-vector).
Items: TypeAlias = "Sequence[str] | np.ndarray | Sequence[np.ndarray]"


@runtime_checkable
class Index(Protocol):
    """add / remove / search / save / load / len, as PyLate's ``indexes/base.py`` has it.

    ``items`` are what the index ranks by: texts for the lexical index, an ``(n, dim)``
    float array for a dense one, one ``(tokens, dim)`` array per id for a multi-vector one.
    ``save`` writes atomically (a temp name, then ``os.replace``), so a crash leaves the old
    file or the new one. An index whose internals went stale after many updates (PLAID's
    centroids) says so with a true ``needs_rebuild``; the registry then rebuilds it.
    """

    @property
    def needs_rebuild(self) -> bool: ...

    def add(self, ids: np.ndarray, items: Items) -> None: ...

    def remove(self, ids: np.ndarray) -> None: ...

    def search(self, queries: Items, k: int) -> list[tuple[np.ndarray, np.ndarray]]: ...

    def save(self, path: str | os.PathLike) -> None: ...

    @classmethod
    def load(cls, path: str | os.PathLike) -> Index: ...

    def __len__(self) -> int: ...
