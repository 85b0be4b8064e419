"""The corpus side of ranking: what is known of each chunk and file beyond its terms (its
file, lines, kind flags, defined names; a file's kind, path words, name stem, centrality),
read from the lexical index for the rows and files a query touches.

Everything here was computed when the index was written (`codesearch.indexes.features`,
`codesearch.indexes.lexical_writer`); opening a corpus reads a manifest and maps arrays,
and each accessor reads only what it is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from codesearch.indexes.features import centrality, norm_ident
from codesearch.indexes.lexical import IMPORTS, OVERLAPS, TEST_CODE, LexicalIndex

__all__ = ["Corpus", "norm_ident"]


class Corpus:
    """Per-chunk and per-file features of one lexical index, by global row and file number
    (see `LexicalIndex`); ``rows`` and ``files`` arguments may come in any order unless
    said otherwise."""

    def __init__(self, index: LexicalIndex) -> None:
        self.index = index

    @property
    def n_rows(self) -> int:
        """Rows of every segment, dead ones included: the size of a per-row array."""
        return self.index.n_rows

    @property
    def n_files(self) -> int:
        """Files of every segment, dead ones included: the size of a per-file array."""
        return self.index.n_files

    def __len__(self) -> int:
        """Live chunks."""
        return len(self.index)

    # ---- rows ------------------------------------------------------------------------

    def ids(self, rows: np.ndarray) -> np.ndarray:
        """Chunk ids (int64)."""
        return self.index.row_values("ids", rows)

    def file_of(self, rows: np.ndarray) -> np.ndarray:
        """Each row's file."""
        return self.index.file_of(rows)

    def lines(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), 2) int32: start and end line, 1-based, inclusive."""
        return self.index.row_values("lines", rows)

    def languages(self, rows: np.ndarray) -> list[str]:
        """Each row's language (``rows`` ascending)."""
        return self.index.languages(rows)

    def in_languages(self, rows: np.ndarray, languages: Iterable[str]) -> np.ndarray:
        """Whether each of ``rows`` (ascending) is in one of ``languages``."""
        return self.index.language_mask(rows, list(languages))

    def test_code(self, rows: np.ndarray) -> np.ndarray:
        """Test code inside a source file (chunk kind ``test``)."""
        return (self.index.row_values("flags", rows) & TEST_CODE) != 0

    def imports(self, rows: np.ndarray) -> np.ndarray:
        """Nothing but imports (chunk kind ``imports``)."""
        return (self.index.row_values("flags", rows) & IMPORTS) != 0

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The live row of each chunk id (-1 for an id the index lacks)."""
        return self.index.rows_of(ids)

    # ---- files -----------------------------------------------------------------------

    def file_rows(self, files: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row of ``files`` (ascending, distinct): (rows ascending, each row's index
        into ``files``)."""
        return self.index.file_rows(files)

    def file_ids(self, files: np.ndarray) -> np.ndarray:
        """Store file ids."""
        return self.index.file_values("file_ids", files)

    def files_of(self, file_ids: np.ndarray) -> np.ndarray:
        """The live file of each store file id (-1 for none)."""
        return self.index.files_of(file_ids)

    def paths(self, files: np.ndarray) -> list[str]:
        return self.index.paths(files)

    def file_kind(self, files: np.ndarray) -> np.ndarray:
        """0 code, 1 test, 2 doc/example, 3 bench (`codesearch.types.path_kind`); any other
        value a file may hold reads as 0."""
        kind = self.index.file_values("file_kind", files).astype(np.int64)
        return np.where((kind >= 0) & (kind <= 3), kind, 0)

    def overlapping(self, files: np.ndarray) -> np.ndarray:
        """Whether two of the file's chunks share a line (then selection checks each pair)."""
        return (self.index.file_values("file_flags", files) & OVERLAPS) != 0

    def centrality(self, files: np.ndarray) -> np.ndarray:
        """In [0, 1]: `codesearch.indexes.features.centrality` of each file."""
        return np.clip(centrality(self.index.users(files), self.index.manifest.top), 0.0, 1.0)

    def live_files(self) -> np.ndarray:
        """Every live file, ascending (a pass over all files: for filters that need them all)."""
        return self.index.live_files()

    # ---- names -----------------------------------------------------------------------

    def symbol_rows(self, names: Iterable[str]) -> np.ndarray:
        """Rows defining any of ``names`` (lower-cased, as `features.symbol_names` keeps them)."""
        return self.index.table_rows("symbols", sorted(set(names)))

    def exact_rows(self, names: Iterable[str]) -> np.ndarray:
        """Rows defining any of ``names`` exactly as written (`features.exact_names`)."""
        return self.index.table_rows("exact", sorted(set(names)))

    def stem_files(self, names: Iterable[str]) -> np.ndarray:
        """Files whose name stem (`norm_ident` of it) is one of ``names``."""
        return self.index.table_files("stems", sorted(set(names)))

    def path_files(self, word: str, min_prefix: int) -> np.ndarray:
        """Files with ``word`` among their path words (`features.path_tokens`), or, when the
        shorter has ``min_prefix`` letters, a path word it is a prefix of or prefixed by
        ("implementations" ~ impls.rs); 0: exact only."""
        names = [word]
        if min_prefix:
            names += [word[:n] for n in range(min_prefix, len(word))]
        prefix = word if min_prefix and len(word) >= min_prefix else None
        return self.index.table_files("pathwords", names, prefix=prefix)
