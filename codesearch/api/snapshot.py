"""`Snapshot`: one committed index generation held open for searching, what a long-running
process searches while index runs commit newer ones (`CodeSearch.snapshot`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from codesearch.encoder.base import Encoders
from codesearch.search.searcher import Searcher
from codesearch.types import Mode, SearchRequest, SearchResult

__all__ = ["Snapshot"]


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
        return with_notices(result, () if request.mode is Mode.lexical else self.notices)

    def close(self) -> None:
        """Release the store connection and the indexes held in memory. Idempotent."""
        self._searcher.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def with_notices(result: SearchResult, notices: Sequence[str]) -> SearchResult:
    """``result`` with ``notices`` first, each thing said once (the refresh, the encoders and
    the search may say the same)."""
    if not notices:
        return result
    return dataclasses.replace(result, notices=list(dict.fromkeys([*notices, *result.notices])))
