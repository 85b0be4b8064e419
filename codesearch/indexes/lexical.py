"""Lexical index: code-aware tokens and BM25 over a sparse term-frequency matrix.

Always built, needs no model. Identifiers are split on snake_case, camelCase and digit
boundaries *and* kept whole, all lower-cased, so ``HttpClient`` matches the queries
``HttpClient``, ``http client`` and ``httpclient`` alike.

Scoring is Okapi BM25 with Lucene's idf; for a query ``q`` and a document ``d``::

    score(q, d) = sum over distinct terms t of q present in d of
        idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

where ``N`` is the number of live documents, ``df(t)`` the number of them containing
``t``, ``|d|`` the document's token count and ``avgdl`` the mean of those counts.

The index is our own (numpy + scipy.sparse) rather than SQLite FTS5 because the searcher
needs the raw term-frequency matrix: summing chunk rows per file gives a file-level BM25
for free, and scoring a query is a few vectorised column slices (about a millisecond on
10,000 chunks).

Examples
--------
>>> idx = LexicalIndex()
>>> idx.add(np.array([1, 2]), ["def parse_url(url): ...", "class HttpClient: ..."])
>>> ids, scores = idx.search(["http client"], k=5)[0]
>>> ids.tolist()
[2]
"""

from __future__ import annotations

import functools
import json
import os
import re
import zipfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from codesearch.errors import IndexCorruptError
from codesearch.store import atomic_write
from codesearch.store.arrays import check_finite, check_ids, check_offsets, read_npz

__all__ = ["STOPWORDS", "LexicalIndex", "query_tokens", "split_identifier", "stem_word", "tokenize"]

FORMAT_VERSION = 1

# An identifier-ish run: letters, digits, underscores. Punctuation and operators never
# carry meaning a user would type into a search box.
_WORD_RE = re.compile(r"[A-Za-z0-9_]+")
# Parts of one identifier: acronyms before a capitalised word (HTTPServer -> HTTP, Server),
# capitalised or lower words, trailing acronyms, digit runs.
_PART_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

# English function words that dominate natural-language queries ("how does the router
# ...") but say nothing about which code is meant. Removed from queries only: documents
# keep them, so an exact phrase in a docstring still counts through its other words.
STOPWORDS = frozenset(
    """a an and are as at be been by can do does for from has have how i if in into is it
    its me my of on or our should so that the their them then there these this those to
    use used uses using was we what when where which while who why will with you your
    implemented implementation implement work works code handle handled handles handling
    """.split()
)


def split_identifier(word: str) -> list[str]:
    """Split one identifier into its lower-cased parts (snake_case, camelCase, digits).

    Examples
    --------
    >>> split_identifier("parseHTTPResponse2_fast")
    ['parse', 'http', 'response', '2', 'fast']
    """
    return [p.lower() for p in _PART_RE.findall(word)]


def stem_word(token: str) -> str:
    """Light, conservative suffix stripping: plurals, -ing, -ed.

    Only long-enough words are touched so that short identifiers (``is``, ``bus``,
    ``ring``) stay as they are; both documents and queries go through the same function,
    so an imperfect stem is harmless as long as it is consistent.
    """
    n = len(token)
    if n <= 4 or not token.isalpha():
        return token
    if token.endswith("ies") and n > 5:
        return token[:-3] + "y"
    if token.endswith("ing") and n > 6:
        token = token[:-3]
    elif token.endswith("ed") and n > 5 and not token.endswith("eed"):
        token = token[:-2]
    elif token.endswith(("sses", "xes", "zes", "ches", "shes")):
        token = token[:-2]
    elif token.endswith("s") and not token.endswith(("ss", "us", "is")):
        token = token[:-1]
    # "parse", "parsed", "parsing", "parses" all meet at "pars".
    if token.endswith("e") and len(token) > 4:
        token = token[:-1]
    return token


def tokenize(text: str, *, stem: bool = True) -> list[str]:
    """Code-aware tokens of ``text``: each identifier whole and split, lower-cased.

    Parameters
    ----------
    text : str
        Source code or a query.
    stem : bool
        Apply light suffix stripping (plural ``s``, ``-ing``, ``-ed``) to every token.

    Returns
    -------
    list[str]
        Tokens in text order; a compound identifier yields its whole form first, then its
        parts. Pure numbers and one-character tokens are dropped.

    Examples
    --------
    >>> tokenize("getUserName(user_id)", stem=False)
    ['getusername', 'get', 'user', 'name', 'user_id', 'user', 'id']
    """
    out: list[str] = []
    for word in _WORD_RE.findall(text):
        out.extend(_word_tokens(word, stem))
    return out


@functools.lru_cache(maxsize=1 << 18)
def _word_tokens(word: str, stem: bool) -> tuple[str, ...]:
    """The tokens of one ``[A-Za-z0-9_]+`` run (what :func:`tokenize` emits for it).

    Cached: code repeats a small vocabulary of identifiers, so splitting and stemming each
    distinct word once made tokenizing ~75% cheaper than doing it per occurrence.
    """
    stripped = word.strip("_")
    if not stripped or stripped.isdigit():
        return ()
    whole = word.lower()
    parts = split_identifier(stripped)
    out: list[str] = []
    if len(whole) > 1:
        out.append(whole)
    if len(parts) > 1:
        out.extend(p for p in parts if len(p) > 1 and not p.isdigit())
    elif parts and parts[0] != whole and len(parts[0]) > 1:
        # `_private` / `__init__`: the bare name matches queries without underscores.
        out.append(parts[0])
    if stem:
        return tuple(stem_word(t) for t in out)
    return tuple(out)


def query_tokens(query: str, *, stem: bool = True, stopwords: bool = True) -> list[str]:
    """Distinct tokens of a query, stopwords removed unless nothing else would remain."""
    tokens = list(dict.fromkeys(tokenize(query, stem=False)))
    if stopwords:
        kept = [t for t in tokens if t not in STOPWORDS]
        tokens = kept or tokens
    if stem:
        tokens = list(dict.fromkeys(stem_word(t) for t in tokens))
    return tokens


class BM25Matrix:
    """BM25 over a fixed (documents x terms) term-frequency matrix.

    Used for chunks by :class:`LexicalIndex` and, with chunk rows summed per file, for
    whole files by the searcher.

    Parameters
    ----------
    tf : scipy.sparse matrix
        Term frequencies, one row per document, one column per vocabulary term.
    k1, b : float
        The BM25 saturation and length-normalisation parameters.
    """

    def __init__(self, tf: sp.spmatrix, *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        csc = sp.csc_matrix(tf, dtype=np.float32)
        csc.sum_duplicates()
        self.n_docs, self.n_terms = csc.shape
        lengths = np.asarray(csc.sum(axis=1), dtype=np.float32).ravel()
        avgdl = float(lengths.mean()) if self.n_docs and lengths.mean() > 0 else 1.0
        df = np.diff(csc.indptr).astype(np.float32)
        self.idf = np.log1p((self.n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        self._norm = (k1 * (1.0 - b + b * lengths / avgdl)).astype(np.float32)
        self._csc = csc

    def scores(self, term_ids: Iterable[int], weights: Iterable[float] | None = None) -> np.ndarray:
        """BM25 score of every document for the given query terms (float32, n_docs)."""
        out = np.zeros(self.n_docs, dtype=np.float32)
        indptr, indices, data = self._csc.indptr, self._csc.indices, self._csc.data
        weights = list(weights) if weights is not None else None
        for j, t in enumerate(term_ids):
            if t < 0 or t >= self.n_terms:
                continue
            lo, hi = indptr[t], indptr[t + 1]
            if lo == hi:
                continue
            rows = indices[lo:hi]
            f = data[lo:hi]
            w = self.idf[t] * (weights[j] if weights is not None else 1.0)
            # Each row appears once per column, so fancy-index += is exact here.
            out[rows] += w * f * (self.k1 + 1.0) / (f + self._norm[rows])
        return out


class LexicalIndex:
    """BM25 index over code-aware tokens; ids are the store's chunk ids.

    Parameters
    ----------
    k1, b : float
        BM25 parameters.
    stem : bool
        Light stemming of document and query tokens (see :func:`tokenize`).
    stopwords : bool
        Drop English function words from queries.

    Examples
    --------
    >>> idx = LexicalIndex()
    >>> idx.add(np.array([7]), ["fn parse_config() {}"])
    >>> idx.search(["parse config"], k=1)[0][0].tolist()
    [7]
    """

    def __init__(self, *, k1: float = 1.2, b: float = 0.75, stem: bool = True, stopwords: bool = True) -> None:
        self.k1 = k1
        self.b = b
        self.stem = stem
        self.stopwords = stopwords
        self._vocab: dict[str, int] = {}
        self._terms: list[str] = []
        # word (a regex match) -> its term ids; vocabulary ids never change, so this only grows.
        self._word_ids: dict[str, tuple[int, ...]] = {}
        self._ids = np.zeros(0, dtype=np.int64)
        self._tf = sp.csr_matrix((0, 0), dtype=np.float32)
        self._pending: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._bm25: BM25Matrix | None = None
        self._row_of: dict[int, int] | None = None

    # ---- building ---------------------------------------------------------------------

    #: Counts are exact after any update (`Index.needs_rebuild`).
    needs_rebuild = False

    def __len__(self) -> int:
        self._flush()
        return int(self._ids.shape[0])

    def add(self, ids: Sequence[int] | np.ndarray, texts: Sequence[str]) -> None:
        """Index ``texts`` under ``ids``; an id already present is replaced."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) != len(texts):
            raise ValueError(f"add(): {len(ids)} ids for {len(texts)} texts")
        if len(ids) == 0:
            return
        self._flush()
        present = np.isin(ids, self._ids)
        if present.any():
            self.remove(ids[present])
        # Count distinct words first (Counter over the regex matches runs in C), then add
        # each word's cached term ids once, weighted by its count: the per-token Python work
        # of the straightforward loop was ~75% of a large build. Same matrix, same term ids
        # (first-appearance order is kept).
        word_ids = self._word_ids
        findall = _WORD_RE.findall
        for i, text in zip(ids.tolist(), texts):
            acc: dict[int, int] = {}
            get = acc.get
            for word, count in Counter(findall(text)).items():
                tids = word_ids.get(word)
                if tids is None:
                    tids = word_ids[word] = tuple(self._term_id(t) for t in _word_tokens(word, self.stem))
                for t in tids:
                    acc[t] = get(t, 0) + count
            cols = np.fromiter(acc.keys(), dtype=np.int64, count=len(acc))
            vals = np.fromiter(acc.values(), dtype=np.float32, count=len(acc))
            self._pending.append((i, cols, vals))
        self._bm25 = None
        self._row_of = None

    def remove(self, ids: Sequence[int] | np.ndarray) -> None:
        """Drop the documents with these ids; unknown ids are ignored."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0:
            return
        self._flush()
        keep = ~np.isin(self._ids, ids)
        if keep.all():
            return
        self._ids = self._ids[keep]
        self._tf = self._tf[keep]
        self._bm25 = None
        self._row_of = None

    def _term_id(self, term: str) -> int:
        tid = self._vocab.get(term)
        if tid is None:
            tid = self._vocab[term] = len(self._terms)
            self._terms.append(term)
        return tid

    def _flush(self) -> None:
        """Append pending documents to the matrix in one sparse stack (cheap batching)."""
        if not self._pending:
            if self._tf.shape[1] < len(self._terms):
                self._tf = sp.csr_matrix(self._tf, shape=(self._tf.shape[0], len(self._terms)))
            return
        n_terms = len(self._terms)
        indptr = np.zeros(len(self._pending) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(c) for _, c, _ in self._pending])
        indices = np.concatenate([c for _, c, _ in self._pending]) if indptr[-1] else np.zeros(0, np.int64)
        data = np.concatenate([v for _, _, v in self._pending]) if indptr[-1] else np.zeros(0, np.float32)
        new = sp.csr_matrix((data, indices, indptr), shape=(len(self._pending), n_terms))
        old = sp.csr_matrix(self._tf, shape=(self._tf.shape[0], n_terms))
        self._tf = sp.vstack([old, new], format="csr", dtype=np.float32)
        self._ids = np.concatenate([self._ids, np.array([i for i, _, _ in self._pending], dtype=np.int64)])
        self._pending = []

    # ---- reading ----------------------------------------------------------------------

    @property
    def ids(self) -> np.ndarray:
        """Document ids in row order (int64)."""
        self._flush()
        return self._ids

    @property
    def tf(self) -> sp.csr_matrix:
        """The (documents x terms) term-frequency matrix, rows in :attr:`ids` order."""
        self._flush()
        return self._tf

    @property
    def bm25(self) -> BM25Matrix:
        """The chunk-level BM25 scorer (rebuilt lazily after a change)."""
        self._flush()
        if self._bm25 is None:
            self._bm25 = BM25Matrix(self._tf, k1=self.k1, b=self.b)
        return self._bm25

    @property
    def vocab(self) -> dict[str, int]:
        """Token -> column of :attr:`tf` (read-only view; do not modify)."""
        return self._vocab

    def term_ids(self, query: str) -> list[int]:
        """Vocabulary ids of the query's tokens (unknown tokens dropped)."""
        toks = query_tokens(query, stem=self.stem, stopwords=self.stopwords)
        return [self._vocab[t] for t in toks if t in self._vocab]

    def score_all(self, query: str) -> np.ndarray:
        """BM25 score of every document (row order of :attr:`ids`) for one query."""
        return self.bm25.scores(self.term_ids(query))

    def row_of(self, doc_id: int) -> int | None:
        """Row index of a document id, or None."""
        if self._row_of is None:
            self._row_of = {int(i): r for r, i in enumerate(self.ids.tolist())}
        return self._row_of.get(int(doc_id))

    def search(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top ``k`` documents per query, best first; only documents sharing a term.

        Returns
        -------
        list[tuple[np.ndarray, np.ndarray]]
            One ``(ids int64, scores float32)`` pair per query.
        """
        if isinstance(queries, str):
            raise TypeError("search() takes a list of queries, not one string")
        results = []
        for q in queries:
            scores = self.score_all(q)
            top = _top_k(scores, k)
            results.append((self.ids[top], scores[top]))
        return results

    # ---- persistence ------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to one ``.npz`` file atomically (temp file + ``os.replace``)."""
        path = Path(path)
        self._flush()
        tf = self._tf.tocsr()
        meta = {"format": FORMAT_VERSION, "k1": self.k1, "b": self.b, "stem": self.stem, "stopwords": self.stopwords}
        with atomic_write(path) as fh:
            np.savez(
                fh,
                meta=np.array(json.dumps(meta)),
                terms=np.array(self._terms, dtype=np.str_) if self._terms else np.zeros(0, dtype="<U1"),
                ids=self._ids,
                indptr=tf.indptr.astype(np.int64),
                indices=tf.indices.astype(np.int32),
                data=tf.data.astype(np.float32),
            )

    @classmethod
    def load(cls, path: str | os.PathLike) -> LexicalIndex:
        """Read an index written by :meth:`save`.

        Raises
        ------
        IndexCorruptError
            The file is missing, truncated, or not a lexical index of this format.
        """
        path = Path(path)
        try:
            z = read_npz(path, what="Lexical index")
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != FORMAT_VERSION:
                raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT_VERSION}")
            terms = [str(t) for t in z["terms"].tolist()]
            ids = z["ids"].astype(np.int64)
            indptr, indices, data = z["indptr"], z["indices"], z["data"]
            if len(indices) != len(data):
                raise ValueError("inconsistent matrix arrays")
            check_offsets(indptr, items=len(ids), total=len(indices), what="Lexical index", path=path)
            check_ids(indices, below=len(terms), what="Lexical index", path=path)
            check_finite(data, what="Lexical index", path=path)
            tf = sp.csr_matrix((data, indices, indptr), shape=(len(ids), len(terms)), dtype=np.float32)
        except IndexCorruptError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, EOFError,
                zipfile.BadZipFile) as exc:
            raise IndexCorruptError(
                f"Lexical index {str(path)!r} cannot be read ({exc}); run `codesearch index --rebuild`"
            ) from None
        idx = cls(k1=meta["k1"], b=meta["b"], stem=meta["stem"], stopwords=meta["stopwords"])
        idx._terms = terms
        idx._vocab = {t: i for i, t in enumerate(terms)}
        idx._ids = ids
        idx._tf = tf
        return idx


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest positive scores, best first (ties by index)."""
    pos = np.flatnonzero(scores > 0)
    if len(pos) > k:
        pos = pos[np.argpartition(-scores[pos], k - 1)[:k]]
    return pos[np.lexsort((pos, -scores[pos]))]
