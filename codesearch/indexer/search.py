"""Query time: candidates from every available index, fused, re-ranked for code.

A query is scored against every chunk by a few signals, each normalised to [0, 1]:

- ``lexical``: chunk BM25 (:mod:`codesearch.indexer.lexical`);
- ``file_lexical``: BM25 of the chunk's whole file (chunk term frequencies summed per
  file), so a chunk of the file that is *about* the query outranks a stray mention;
- ``dense``: the chunk's rank among the query's nearest chunk vectors, as
  ``(k + 1) / (k + 1 + rank)`` (a small model's cosines are too bunched to add as scores);
- ``file_dense``: cosine of the query with the file's vector: the long-context whole-file
  vector, or for short-context models the normalised mean of the file's chunk vectors;
- ``colbert``: rank by MaxSim over the multi-vector (PLAID) index;
- ``path``: share of the query's words found in the file's name and folder;
- ``symbol``: the query names the chunk's symbol (``Engine`` -> ``type Engine struct``).

The fused score is a weighted sum, multiplied by a demotion for tests, docs, examples and
benchmarks when the query does not ask for them. Hits are then picked greedily with a
per-file decay (so the top 10 spans several files), overlapping chunks dropped and a hard
cap on hits per file. Every weight was chosen on the dev split of the semble benchmark
(``benchmarks/quality.py``); see BENCHMARKS.md "Search quality" for the ablations.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import re
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from codesearch.errors import NotIndexedError, QueryError
from codesearch.indexer.lexical import BM25Matrix, LexicalIndex, query_tokens, split_identifier, stem_word, tokenize
from codesearch.indexer.store import CENTRALITY_FILE, atomic_write
from codesearch.request import MODES

__all__ = ["SearchHit", "SearchResult", "Searcher", "MODES", "RankingParams"]

#: The version of _centrality's definition in CENTRALITY_FILE (Searcher._cached_centrality):
#: bump it when the definition changes, so copies written by an older release are recomputed.
CENTRALITY_VERSION = 2

#: A whole-file vector is used only when the model reads at least this many tokens: from
#: a 256-token model (MiniLM) it encodes little more than the file's imports and licence
#: header, and using it cost 0.5 NDCG points on the benchmark (0.861 -> 0.856, hybrid).
FILE_VECTOR_MIN_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One ranked chunk.

    ``sources`` names the indexes that proposed it (``"lexical"``, ``"dense"``, ...).
    """

    path: str
    start_line: int
    end_line: int
    score: float
    language: str
    symbol: str | None
    kind: str
    scope: str | None
    text: str
    chunk_id: int
    sources: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(float(self.score), 6),
            "language": self.language,
            "symbol": self.symbol,
            "kind": self.kind,
            "scope": self.scope,
            "text": self.text,
            "chunk_id": self.chunk_id,
            "sources": list(self.sources),
        }


@dataclass(frozen=True)
class SearchResult:
    """The hits of one query, with the indexes used and any notice for the user."""

    query: str
    mode: str
    hits: list[SearchHit]
    indexes_used: tuple[str, ...]
    notices: list[str] = field(default_factory=list)
    #: Ranked hits an output control (min_score, budget) left out; None when none was asked.
    left_out: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (hits as dicts)."""
        return {
            "query": self.query,
            "mode": self.mode,
            "hits": [h.to_dict() for h in self.hits],
            "indexes_used": list(self.indexes_used),
            "notices": list(self.notices),
        }


@dataclass(frozen=True)
class RankingParams:
    """Weights of the ranking signals (defaults chosen on the benchmark's dev split)."""

    w_lexical: float = 1.5  # chunk BM25, max-normalised
    w_file_lexical: float = 0.6  # whole-file BM25, max-normalised
    w_dense: float = 0.75  # chunk vector score (see fusion)
    w_file_dense: float = 0.5  # whole-file cosine (long-context models only, see FILE_VECTOR_MIN_TOKENS)
    w_colbert: float = 1.0  # MaxSim (see fusion)
    w_path: float = 2.0  # share of query words in the file's name / folder
    path_prefix: int = 4  # prefix matching of query words and path words (0: exact only)
    w_symbol: float = 1.0  # the query names the chunk's symbol
    w_stem: float = 0.5  # the query names the file (stem equals an identifier of the query)
    file_b: float = 0.3  # BM25 length normalisation of the whole-file score
    w_file_cover: float = 0.0  # idf-weighted share of the query's words the file contains
    demote: float = 0.3  # multiplier for tests/docs/examples/benchmarks not asked for
    file_decay: float = 0.2  # each further hit from one file is multiplied by this
    max_per_file: int = 3  # hard cap on hits from one file
    dense_candidates: int = 100  # chunks taken from the dense / colbert indexes
    vector_symbol_scale: float = 0.3  # vector weights on a bare-identifier query
    vector_norm: str = "minmax"  # fusion="score": "minmax" over the candidates, or "z" (z-score / 3, clipped)
    # Measured and left off (BENCHMARKS.md "Search quality"), kept so the runs can be repeated:
    w_file_vector_max: float = 0.0  # the file's best chunk vector score, given to all its chunks
    file_vector_top: int = 1  # w_file_vector_max: mean of the file's top-n chunk vector scores
    w_file_lex_max: float = 0.0  # the file's best chunk BM25 (max-normalised), given to all its chunks
    w_file_fused_max: float = 0.0  # the file's best fused score, given to all its chunks
    split_query_for_vectors: bool = False  # encode "HTTPAdapter" as "HTTP Adapter" for the vector model
    vector_code_scale: float = 1.0  # vector weights on a sentence that names code identifiers
    w_file_agree: float = 0.0  # min(file's best chunk BM25, file's best vector score): both indexes back the file
    # How vector scores enter the sum: "rank" = (k + 1) / (k + 1 + rank) over the candidates
    # (k = rank_k), "score" = the normalised cosine (vector_norm). Rank-based is steadier:
    # a model's cosines are bunched, so min-max over 100 candidates turns small cosine gaps
    # into large score gaps (hybrid 0.8665 -> 0.8720 on the dev split, both held-out halves up).
    fusion: str = "rank"
    rank_k: float = 60.0
    # Cosine of the query with the normalised mean of the file's chunk vectors (short-context
    # models only; long-context ones have a real file vector, w_file_dense): lets a file whose
    # chunks each say a part of what the query asks for rise as a whole.
    w_file_centroid: float = 0.5
    # Centrality: the fused score times (1 + w * c), c in [0, 1] growing with how many other
    # files use a name the file defines (see _centrality). The file a question is about is
    # more often the one the rest of the code leans on (SqlMapper.cs, not SqlMapper.Cache.cs).
    w_central: float = 0.3


# ---- query analysis ---------------------------------------------------------------------

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:(?:::|\.|->|\\)[A-Za-z_][A-Za-z0-9_]*)*")
# Looks like code inside a sentence: camelCase, PascalCase with two humps, snake_case or a
# qualified name. A lone capitalised word ("Session", "JSON") counts only as a whole query.
_CODEY_RE = re.compile(r"[a-z][A-Z]|[A-Z][a-z0-9]+[A-Z]|_|::|\.|->")
_TEST_WORDS = frozenset({"test", "tests", "testing", "spec", "specs", "mock", "mocks", "fixture", "fixtures"})
_DOC_WORDS = frozenset({"doc", "docs", "documentation", "example", "examples", "readme", "tutorial", "sample"})
_BENCH_WORDS = frozenset({"bench", "benchmark", "benchmarks", "perf"})

_TEST_PATH_RE = re.compile(
    r"(?:^|/)(?:tests?|__tests__|spec|specs|testing|testdata|test_?utils?)(?:/|$)"
    r"|(?:^|/)test_[^/]*$|_test\.[a-z]+$|_spec\.[a-z]+$|\.(?:test|spec)\.[a-z]+$"
    r"|(?:^|/)[^/]*(?:Tests?|Spec|Suite)\.[A-Za-z]+$"
)
_DOC_PATH_RE = re.compile(
    r"(?:^|/)(?:docs?|_?examples?|samples?|tutorials?|docs_src)(?:/|$)"
    # Prose and build/config files: they mention every public name, so they match many
    # queries lexically, yet the code that implements the thing is what is looked for.
    r"|\.(?:md|markdown|rst|txt|adoc|xml|json|ya?ml|toml|ini|cfg|conf|properties|pro|lock|csv|svg|html?)$"
)
_BENCH_PATH_RE = re.compile(r"(?:^|/)(?:bench|benches|benchmarks?)(?:/|$)")


@dataclass(frozen=True)
class _Query:
    text: str
    tokens: list[str]  # stemmed, stopwords removed (lexical terms)
    identifiers: list[str]  # lower-cased identifiers that look like code, or the lone word
    exact: frozenset[str]  # the same, case kept (full and last qualified part)
    wants_tests: bool
    wants_docs: bool
    wants_bench: bool
    is_symbol: bool  # the whole query is one identifier ("HTTPAdapter", "Sinatra::Base")


def _analyse(query: str) -> _Query:
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", query)]
    raw = _IDENT_RE.findall(query)
    single = len(query.split()) == 1
    idents: list[str] = []
    exact: set[str] = set()
    for r in raw:
        if single or _CODEY_RE.search(r):
            last = re.split(r"::|\.|->|\\", r)[-1]
            exact.update((r, last))
            idents.extend({r.lower(), last.lower()})
    return _Query(
        text=query,
        tokens=query_tokens(query),
        identifiers=list(dict.fromkeys(idents)),
        exact=frozenset(exact),
        wants_tests=any(w in _TEST_WORDS for w in words),
        wants_docs=any(w in _DOC_WORDS for w in words),
        wants_bench=any(w in _BENCH_WORDS for w in words),
        is_symbol=single and bool(raw) and raw[0] == query.strip(),
    )


def _split_identifiers(query: str) -> str:
    """``"how does HTTPAdapter.send work"`` -> ``"how does HTTP Adapter send work"``."""

    def split(m: re.Match[str]) -> str:
        word = m.group(0)
        parts = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+", word)
        return " ".join(parts) if parts else word

    return re.sub(r"[A-Za-z0-9_]+", split, query.replace("::", " ").replace("->", " "))


def _stem_and_parent(path: str) -> tuple[str, str]:
    """``PurePosixPath(path).stem`` and ``.parent.name``, by string operations (start-up cost)."""
    parts = [x for x in path.split("/") if x and x != "."]
    name = parts[-1] if parts else ""
    parent = parts[-2] if len(parts) > 1 else ""
    i = name.rfind(".")
    stem = name[:i] if 0 < i < len(name) - 1 else name
    return stem, parent


@functools.lru_cache(maxsize=1 << 16)
def _path_word_tokens(word: str) -> frozenset[str]:
    toks = {stem_word(word.lower())}
    toks.update(stem_word(s) for s in split_identifier(word))
    return frozenset(toks)


def _path_tokens(path: str) -> frozenset[str]:
    """Stemmed words of a file's name and its parent folder ("binding/json.go" -> json, binding)."""
    stem, parent = _stem_and_parent(path)
    toks: set[str] = set()
    for part in (stem, parent) if parent else (stem,):
        for w in re.findall(r"[A-Za-z0-9]+", part):
            toks |= _path_word_tokens(w)
    return frozenset(t for t in toks if len(t) > 1)


# ---- corpus: per-chunk metadata as arrays -----------------------------------------------


@dataclass
class _Corpus:
    """Metadata of every chunk, rows aligned with the lexical index's rows."""

    ids: np.ndarray  # (n,) int64 chunk ids
    file_idx: np.ndarray  # (n,) int32 index into files
    start: np.ndarray  # (n,) int32
    end: np.ndarray  # (n,) int32
    language: np.ndarray  # (n,) object
    symbols: list[frozenset[str]]  # lower-cased names a chunk defines (a block may define several)
    exact_symbols: list[frozenset[str]]  # the same names, case kept, whole entries only
    files: list[str]  # file paths
    file_ids: np.ndarray  # (n_files,) int64 store file ids
    file_kind: np.ndarray  # (n_files,) int8: 0 code, 1 test, 2 doc/example, 3 bench
    path_tokens: list[frozenset[str]]
    stems: list[str]  # file name before its first dot, lower-cased, without _ and -

    @classmethod
    def build(cls, rows: list[tuple[int, int, str, int, int, str, str | None]]) -> _Corpus:
        """From ``(chunk_id, file_id, path, start, end, language, symbol)`` tuples."""
        file_index: dict[int, int] = {}
        files: list[str] = []
        fids: list[int] = []
        fidx = np.empty(len(rows), dtype=np.int32)
        for i, (_, file_id, path, *_rest) in enumerate(rows):
            j = file_index.get(file_id)
            if j is None:
                j = file_index[file_id] = len(files)
                files.append(path)
                fids.append(file_id)
            fidx[i] = j
        kinds = np.array([_file_kind(p) for p in files], dtype=np.int8)
        # Symbols repeat (and most chunks have none): parse each distinct string once.
        names: dict[str | None, tuple[frozenset[str], frozenset[str]]] = {}
        for r in rows:
            if r[6] not in names:
                names[r[6]] = (_symbol_names(r[6]), _exact_names(r[6]))
        pairs = [names[r[6]] for r in rows]
        return cls(
            ids=np.array([r[0] for r in rows], dtype=np.int64),
            file_idx=fidx,
            start=np.array([r[3] for r in rows], dtype=np.int32),
            end=np.array([r[4] for r in rows], dtype=np.int32),
            language=np.array([r[5] for r in rows], dtype=object),
            symbols=[a for a, _ in pairs],
            exact_symbols=[b for _, b in pairs],
            files=files,
            file_ids=np.array(fids, dtype=np.int64),
            file_kind=kinds,
            path_tokens=[_path_tokens(p) for p in files],
            stems=[_norm_ident(_stem_and_parent(p)[0]) for p in files],
        )

    def __len__(self) -> int:
        return len(self.ids)


def _symbol_names(symbol: str | None) -> frozenset[str]:
    """``"$ZodType, parse"`` -> {"zodtype", "parse"}; qualified names also by their last part."""
    if not symbol:
        return frozenset()
    out: set[str] = set()
    for name in re.split(r"[,\s]+", symbol):
        name = re.sub(r"[^A-Za-z0-9_.:]", "", name).lower()
        if name:
            out.add(name)
            out.add(re.split(r"::|\.", name)[-1])
    out.discard("")
    return frozenset(out)


def _exact_names(symbol: str | None) -> frozenset[str]:
    """``"$ZodType, Serialize for str, a::B"`` -> {"ZodType", "Serialize for str", "a::B", "B"}."""
    if not symbol:
        return frozenset()
    out: set[str] = set()
    for name in symbol.split(","):
        name = name.strip().lstrip("$@#&*")
        if name:
            out.add(name)
            out.add(re.split(r"::|\.", name)[-1])
    return frozenset(out)


def _norm_ident(name: str) -> str:
    return re.sub(r"[_\-]", "", name.lower())


def _file_kind(path: str) -> int:
    if _TEST_PATH_RE.search(path):
        return 1
    if _DOC_PATH_RE.search(path):
        return 2
    if _BENCH_PATH_RE.search(path):
        return 3
    return 0


def _invert(sets: list[frozenset[str]]) -> dict[str, np.ndarray]:
    """name -> sorted row numbers of the sets that contain it."""
    out: dict[str, list[int]] = {}
    for i, names in enumerate(sets):
        for name in names:
            out.setdefault(name, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def _lookup(inverted: dict[str, np.ndarray], names: set[str] | frozenset[str]) -> np.ndarray:
    """Distinct rows holding any of ``names``."""
    found = [inverted[x] for x in names if x in inverted]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def _minmax(x: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Scale the present entries to [0, 1]; absent entries are 0."""
    out = np.zeros_like(x, dtype=np.float32)
    if not present.any():
        return out
    lo, hi = float(x[present].min()), float(x[present].max())
    out[present] = (x[present] - lo) / (hi - lo) if hi > lo else 1.0
    return out


def _normalise(x: np.ndarray, present: np.ndarray, how: str) -> np.ndarray:
    """Vector scores to roughly [0, 1]; "z" keeps a flat (unsure) ranking small."""
    if how == "minmax":
        return _minmax(x, present)
    out = np.zeros_like(x, dtype=np.float32)
    if present.sum() < 2:
        return _minmax(x, present)
    v = x[present]
    sd = float(v.std())
    if sd <= 0:
        return out
    out[present] = np.clip((v - float(v.mean())) / (3.0 * sd), 0.0, 1.0)
    return out


def _file_top_mean(norm: np.ndarray, present: np.ndarray, file_idx: np.ndarray, n_files: int, top: int) -> np.ndarray:
    """Per file, the mean of its ``top`` best present scores (missing ones count as 0)."""
    best = np.zeros(n_files, dtype=np.float32)
    rows = np.flatnonzero(present)
    if not len(rows):
        return best
    if top <= 1:
        np.maximum.at(best, file_idx[rows], norm[rows])
        return best
    f = file_idx[rows]
    order = np.lexsort((-norm[rows], f))
    f, v = f[order], norm[rows][order]
    start = np.r_[0, np.flatnonzero(np.diff(f)) + 1]
    rank = np.arange(len(f)) - np.repeat(start, np.diff(np.r_[start, len(f)]))
    keep = rank < top
    np.add.at(best, f[keep], v[keep])
    return best / top


def _maxnorm(x: np.ndarray) -> np.ndarray:
    m = float(x.max()) if len(x) else 0.0
    return x / m if m > 0 else x


_DEF_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{2,}")


def _centrality(
    corpus: _Corpus,
    file_tf: sp.spmatrix,
    vocab: dict[str, int],
    *,
    max_share: float = 0.25,
    exact_max_users: int = 1000,
    own_path_counts: bool = False,
) -> np.ndarray:
    """Per file, ``log(1 + u) / log(1 + max u)``, ``u`` = how many other files use a name the
    file defines (a symbol of one of its chunks, or its file name's stem).

    "Uses" means contains the name as a whole token (the lexical index's per-file term
    counts). A name found in more than ``max_share`` of the files (``get``, ``index``) says
    nothing about who depends on whom and is left out, and so is a name a file only carries
    in its own path (every chunk's header holds its path: ``engine/cache.py`` does not use
    ``engine.py``) unless ``own_path_counts``. Distinct users are counted exactly through
    names in at most ``exact_max_users`` files; a name in more (only in repositories over
    4,000 files) adds its user count as a lower bound instead, which bounds the work to
    definitions x ``exact_max_users`` pairs.
    """
    nf = len(corpus.files)
    if nf < 2 or not vocab:
        return np.zeros(nf, dtype=np.float32)
    rows: list[int] = []
    cols: list[int] = []
    term = functools.lru_cache(maxsize=None)(lambda name: vocab.get(stem_word(name)))
    for i, names in enumerate(corpus.symbols):
        for name in names:
            if _DEF_NAME_RE.fullmatch(name) and (t := term(name)) is not None:
                rows.append(int(corpus.file_idx[i]))
                cols.append(t)
    for f, path in enumerate(corpus.files):
        raw = _stem_and_parent(path)[0].lower()  # "http_client": the tokenizer keeps it whole
        for stem in {raw, corpus.stems[f]}:
            if len(stem) >= 3 and (t := term(stem)) is not None:
                rows.append(f)
                cols.append(t)
    n_terms = file_tf.shape[1]
    defines = sp.csr_matrix((np.ones(len(rows), bool), (rows, cols)), shape=(nf, n_terms), dtype=bool)
    uses = sp.csr_matrix(file_tf, copy=True).astype(bool)
    if not own_path_counts:
        own = [(f, t) for f, path in enumerate(corpus.files) for t in {vocab.get(x) for x in tokenize(path)} if t is not None]
        if own:
            fr, tc = zip(*own)
            uses = uses > sp.csr_matrix((np.ones(len(own), bool), (fr, tc)), shape=uses.shape, dtype=bool)
    df = np.diff(uses.tocsc().indptr)
    common = df > max(5.0, max_share * nf)
    exact = ~common & (df <= exact_max_users)
    users = np.zeros(nf, dtype=np.float32)
    uses_t = (uses @ sp.diags(exact.astype(np.float32))).astype(bool).T.tocsr()
    for lo in range(0, nf, 2048):  # files x files in row blocks: bounded memory on big repos
        block = defines[lo : lo + 2048]
        pairs = (block.astype(np.float32) @ uses_t.astype(np.float32)).tocsr()
        pairs.eliminate_zeros()
        rows_in = np.arange(lo, min(lo + 2048, nf))
        self_use = np.asarray(pairs[rows_in - lo, rows_in]).ravel() > 0
        users[lo : lo + 2048] = np.diff(pairs.indptr) - self_use
    wide = ~common & ~exact
    if wide.any():  # lower bound: the users of the file's most used wide name, itself left out
        keep = sp.diags(wide.astype(np.float32))
        d = (defines.astype(np.float32) @ keep).tocsr()
        others = d.multiply(df[None, :].astype(np.float32)) - d.multiply(uses.astype(np.float32))
        best = sp.csr_matrix(others).max(axis=1)
        users = np.maximum(users, np.asarray(best.todense()).ravel())
    out = np.log1p(users)
    top = float(out.max())
    return (out / top).astype(np.float32) if top > 0 else out.astype(np.float32)


# ---- the ranking core (no store, no model: arrays in, rows out) --------------------------


class _Ranker:
    """Fuses the signals over a corpus; shared by :class:`Searcher` and the benchmark."""

    def __init__(self, corpus: _Corpus, lexical: LexicalIndex, params: RankingParams | None = None) -> None:
        self.corpus = corpus
        self.lexical = lexical
        self.params = params or RankingParams()
        self._centrality: np.ndarray | None = None
        self.centrality_source: Any = None  # () -> array, set by Searcher (a cached copy)
        n, nf = len(corpus), len(corpus.files)
        # Lexical rows -> corpus rows (the corpus is built in lexical order, but a lexical
        # index may hold ids the store no longer has, or miss some).
        self._id_order = np.argsort(corpus.ids, kind="stable")
        self._sorted_ids = corpus.ids[self._id_order]
        lex_rows = self.rows_of(lexical.ids)
        ok = lex_rows >= 0
        self._lex_src = np.flatnonzero(ok)
        self._lex_dst = lex_rows[ok]
        # Whole-file term frequencies = chunk rows summed per file: (files x chunks) @ tf.
        tf = lexical.tf[self._lex_src]
        g = sp.csr_matrix(
            (np.ones(len(self._lex_dst), np.float32), (corpus.file_idx[self._lex_dst], np.arange(len(self._lex_dst)))),
            shape=(nf, len(self._lex_dst)),
        )
        self._file_tf = (g @ tf).tocsc()
        self._file_bm25: BM25Matrix | None = None
        self._n = n
        # Inverted maps, so a query touches only the rows that match instead of looping
        # over every chunk in Python (134k chunks: 50 ms -> a few ms).
        self._by_symbol = _invert(corpus.symbols)
        self._by_exact = _invert(corpus.exact_symbols)
        self._by_path_token = _invert(corpus.path_tokens)
        self._path_words = sorted(self._by_path_token)
        self._by_stem = _invert([frozenset((st,)) for st in corpus.stems])

    @property
    def centrality(self) -> np.ndarray:
        """Per file, in [0, 1]: see :func:`_centrality`. Made on first use by the source the
        searcher gave (its per-generation file), else computed; two threads racing here
        both compute the same array, which is cheaper than a lock held across repos."""
        c = self._centrality
        if c is None:
            c = self._centrality = (self.centrality_source or self.compute_centrality)()
        return c

    def compute_centrality(self) -> np.ndarray:
        return _centrality(self.corpus, self._file_tf, self.lexical.vocab)

    @property
    def file_bm25(self) -> BM25Matrix:
        if self._file_bm25 is None or self._file_bm25.b != self.params.file_b:
            self._file_bm25 = BM25Matrix(self._file_tf, k1=self.lexical.k1, b=self.params.file_b)
        return self._file_bm25

    def file_cover(self, term_ids: list[int]) -> np.ndarray:
        """Per file, the idf-weighted share of the query terms it contains at all."""
        nf = self._file_tf.shape[0]
        out = np.zeros(nf, dtype=np.float32)
        idf = self.file_bm25.idf
        denom = float(sum(idf[t] for t in term_ids))
        if denom <= 0:
            return out
        indptr, indices = self._file_tf.indptr, self._file_tf.indices
        for t in term_ids:
            out[indices[indptr[t] : indptr[t + 1]]] += idf[t]
        return out / denom

    def path_share(self, tokens: list[str], min_prefix: int) -> np.ndarray:
        """Per file, the idf-weighted share of ``tokens`` found in its name and folder.

        idf-weighted so that "json array" in gson names JsonArray.java rather than every
        Json*.java; a word also matches a path word it is a prefix of, or that is a prefix
        of it, when the shorter has ``min_prefix`` letters ("implementations" ~ impls.rs).
        """
        c = self.corpus
        vocab = self.lexical.vocab
        idf = self.file_bm25.idf
        w = {t: float(idf[vocab[t]]) if t in vocab else 0.0 for t in tokens}
        denom = sum(w.values())
        if denom <= 0:
            return np.zeros(len(c.files), dtype=np.float32)
        share = np.zeros(len(c.files), dtype=np.float32)
        for t, wt in w.items():
            if wt <= 0:
                continue
            hits = [self._by_path_token[pt] for pt in self._path_matches(t, min_prefix)]
            if hits:
                share[np.unique(np.concatenate(hits))] += wt
        return share / denom

    def _path_matches(self, t: str, min_prefix: int) -> set[str]:
        """Path words equal to ``t``, or, when the shorter has ``min_prefix`` letters, a
        prefix of it or prefixed by it. Binary search over the sorted path words instead of
        a scan (1.5 ms per query on 10k chunks)."""
        out = {t} if t in self._by_path_token else set()
        if min_prefix:
            words = self._path_words
            if len(t) >= min_prefix:
                i = bisect.bisect_left(words, t)
                while i < len(words) and words[i].startswith(t):
                    out.add(words[i])
                    i += 1
            for n in range(min_prefix, len(t)):
                if t[:n] in self._by_path_token:
                    out.add(t[:n])
        return out

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Corpus rows of chunk ids (-1 for an id the corpus lacks)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(self._sorted_ids):
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self._sorted_ids, ids).clip(0, len(self._sorted_ids) - 1)
        return np.where(self._sorted_ids[pos] == ids, self._id_order[pos], -1).astype(np.int64)

    def score(
        self,
        q: _Query,
        *,
        use_lexical: bool,
        dense: tuple[np.ndarray, np.ndarray] | None = None,
        file_dense: tuple[np.ndarray, np.ndarray] | None = None,
        colbert: tuple[np.ndarray, np.ndarray] | None = None,
        mask: np.ndarray | None = None,
        params: RankingParams | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Fused score per corpus row, and the raw per-source scores (for ``sources``).

        ``dense``/``colbert`` are ``(rows, scores)`` of candidates; ``file_dense`` is
        ``(file indexes, scores)``.
        """
        p = params or self.params
        c = self.corpus
        n = self._n
        total = np.zeros(n, dtype=np.float32)
        sources: dict[str, np.ndarray] = {}
        term_ids = [self.lexical.vocab[t] for t in q.tokens if t in self.lexical.vocab]
        lex_file_best = None
        if use_lexical:
            lex = np.zeros(n, dtype=np.float32)
            lex[self._lex_dst] = self.lexical.bm25.scores(term_ids)[self._lex_src]
            sources["lexical"] = lex
            lexn = _maxnorm(lex)
            total += p.w_lexical * lexn
            lex_file_best = None
            if p.w_file_agree:
                lex_file_best = np.zeros(len(c.files), dtype=np.float32)
                np.maximum.at(lex_file_best, c.file_idx, lexn)
            if p.w_file_lex_max:
                best = np.zeros(len(c.files), dtype=np.float32)
                np.maximum.at(best, c.file_idx, lexn)
                total += p.w_file_lex_max * best[c.file_idx]
            if p.w_file_lexical:
                flex = _maxnorm(self.file_bm25.scores(term_ids))
                total += p.w_file_lexical * flex[c.file_idx]
            if p.w_file_cover and term_ids:
                total += p.w_file_cover * self.file_cover(term_ids)[c.file_idx]
            if p.w_path and q.tokens:
                total += p.w_path * self.path_share(q.tokens, p.path_prefix)[c.file_idx]
            if p.w_symbol and q.identifiers:
                idents = set(q.identifiers)
                # Half for a case-insensitive hit on any defined name ("session()" for
                # "Session"), full for the exact name as defined ("class Session").
                sym = np.zeros(n, dtype=np.float32)
                sym[_lookup(self._by_symbol, idents)] += 0.5
                sym[_lookup(self._by_exact, q.exact)] += 0.5
                total += p.w_symbol * sym
            if p.w_stem and q.identifiers:
                names = {_norm_ident(i) for i in q.identifiers}
                names |= {n[:-1] for n in names if n.endswith("s")} | {n + "s" for n in names}
                stem_hit = np.zeros(len(c.files), dtype=np.float32)
                stem_hit[_lookup(self._by_stem, names)] = 1.0
                total += p.w_stem * stem_hit[c.file_idx]
        # A bare identifier is a lookup: the exact-name signals know best, vectors blur it.
        vscale = p.vector_symbol_scale if q.is_symbol else (p.vector_code_scale if q.identifiers else 1.0)
        for name, cand, w in (("dense", dense, p.w_dense * vscale), ("colbert", colbert, p.w_colbert * vscale)):
            if cand is None or not len(cand[0]):
                continue
            rows, scores = cand
            keep = rows >= 0
            raw = np.zeros(n, dtype=np.float32)
            present = np.zeros(n, dtype=bool)
            raw[rows[keep]] = scores[keep]
            present[rows[keep]] = True
            sources[name] = np.where(present, raw, 0)
            if p.fusion == "rank":
                norm = np.zeros(n, dtype=np.float32)
                order = rows[keep][np.argsort(-scores[keep], kind="stable")]
                norm[order] = (p.rank_k + 1.0) / (p.rank_k + 1.0 + np.arange(len(order), dtype=np.float32))
            else:
                norm = _normalise(raw, present, p.vector_norm)
            total += w * norm
            if p.w_file_agree and use_lexical and lex_file_best is not None:
                vbest = _file_top_mean(norm, present, c.file_idx, len(c.files), 1)
                total += p.w_file_agree * vscale * np.minimum(lex_file_best, vbest)[c.file_idx]
            if p.w_file_vector_max:
                best = _file_top_mean(norm, present, c.file_idx, len(c.files), p.file_vector_top)
                total += p.w_file_vector_max * vscale * best[c.file_idx]
        w_fd = p.w_file_centroid or p.w_file_dense
        if file_dense is not None and len(file_dense[0]) and w_fd:
            fidx, scores = file_dense
            keep = fidx >= 0
            raw = np.zeros(len(c.files), dtype=np.float32)
            present = np.zeros(len(c.files), dtype=bool)
            raw[fidx[keep]] = scores[keep]
            present[fidx[keep]] = True
            total += w_fd * vscale * _normalise(raw, present, p.vector_norm)[c.file_idx]
        if p.w_file_fused_max:
            best = np.zeros(len(c.files), dtype=np.float32)
            np.maximum.at(best, c.file_idx, total)
            total = total + p.w_file_fused_max * best[c.file_idx]
        if p.w_central:
            total *= 1.0 + p.w_central * self.centrality[c.file_idx]
        if p.demote < 1.0:
            factor = np.ones(4, dtype=np.float32)
            factor[1] = 1.0 if q.wants_tests else p.demote
            factor[2] = 1.0 if q.wants_docs else p.demote
            factor[3] = 1.0 if q.wants_bench else p.demote
            total *= factor[c.file_kind][c.file_idx]
        if mask is not None:
            total = np.where(mask, total, 0.0).astype(np.float32)
        return total, sources

    def select(
        self, total: np.ndarray, k: int, *, files_only: bool = False, params: RankingParams | None = None
    ) -> list[tuple[int, float]]:
        """Greedy top-k with per-file decay, overlap removal and a per-file cap."""
        p = params or self.params
        c = self.corpus
        pos = np.flatnonzero(total > 0)
        if not len(pos):
            return []
        pool = max(k * 8, 64)
        if len(pos) > pool:
            pos = pos[np.argpartition(-total[pos], pool - 1)[:pool]]
        order = pos[np.lexsort((pos, -total[pos]))]
        cap = 1 if files_only else p.max_per_file
        taken: dict[int, list[int]] = {}
        chosen: list[tuple[float, int]] = []
        for r in order.tolist():
            s = float(total[r])
            # Decay only lowers scores, so once the k-th best beats the next raw score, stop.
            if len(chosen) >= k and s <= chosen[k - 1][0]:
                break
            f = int(c.file_idx[r])
            prev = taken.setdefault(f, [])
            if len(prev) >= cap:
                continue
            if any(c.start[r] <= c.end[o] and c.start[o] <= c.end[r] for o in prev):
                continue
            prev.append(r)
            chosen.append((s * p.file_decay ** (len(prev) - 1), r))
            chosen.sort(key=lambda t: -t[0])
        return [(r, s) for s, r in chosen[:k]]


# ---- the searcher -----------------------------------------------------------------------


class Searcher:
    """Searches one index folder; safe to share between threads.

    Parameters
    ----------
    index_dir : path
        The ``.codesearch`` folder (``store.sqlite`` and the derived index files).
    encoders : pipeline.Encoders, optional
        Query encoders for the dense and multi-vector indexes; without them only the
        lexical index is searched (the result's ``notices`` say so).

    Examples
    --------
    >>> s = Searcher("repo/.codesearch")                       # doctest: +SKIP
    >>> for hit in s.search("parse the config file", k=5).hits:  # doctest: +SKIP
    ...     print(hit.path, hit.start_line, round(hit.score, 3))
    """

    def __init__(self, index_dir: str | Path, *, encoders: Any = None, params: RankingParams | None = None) -> None:
        from codesearch.indexer import pipeline  # late: pipeline imports this module's peers
        from codesearch.indexer.store import Store

        self.index_dir = Path(index_dir)
        store_path = self.index_dir / "store.sqlite"
        if not store_path.is_file():
            raise NotIndexedError(f"no index in {str(self.index_dir)!r} (run 'codesearch index' first)")
        self._lock = threading.RLock()
        self._store = Store(store_path, readonly=True)
        derived = pipeline.load_derived(self.index_dir, self._store)
        self._encoders = encoders
        self._dense = _get(derived, "dense", "dense_chunks")
        self._dense_files = _get(derived, "dense_files")
        self._plaid = _get(derived, "plaid", "colbert")
        lexical = _get(derived, "lexical")
        if lexical is None:
            lexical = LexicalIndex()
            lexical.add(*_lexical_inputs(self._store))
        # Metadata only: chunk text is fetched for the returned hits (see _hits), which
        # keeps start-up on a large index to reading a few small columns.
        rows = list(self._store.iter_chunk_meta())
        rows = _in_lexical_order(rows, lexical.ids)
        self._ranker = _Ranker(_Corpus.build(rows), lexical, params)
        self._generation = self._store.generation
        self._ranker.centrality_source = self._cached_centrality
        self._file_row = {int(f): j for j, f in enumerate(self._ranker.corpus.file_ids.tolist())}

    # -- public ----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        k: int = 10,
        *,
        mode: str = "hybrid",
        language: str | Sequence[str] | None = None,
        glob: str | Sequence[str] | None = None,
        files_only: bool = False,
    ) -> SearchResult:
        """Rank the index's chunks for ``query``.

        Parameters
        ----------
        query : str
            Words, an identifier, or a piece of code.
        k : int
            Number of hits.
        mode : {"hybrid", "lexical", "dense", "colbert"}
            ``hybrid`` fuses every index the folder has; the others use one index (plus
            the code-aware signals), and fail when that index was not built.
        language : str or sequence of str, optional
            Keep only chunks in (any of) these languages.
        glob : str or sequence of str, optional
            Keep only chunks whose path passes these ripgrep-style rules (gitignore
            globs, ``!`` excludes, ``{a,b}``; see :mod:`codesearch.globs`).
        files_only : bool
            At most one hit per file.

        Raises
        ------
        QueryError
            Empty query, unknown mode, ``k < 1``, or a mode whose index is missing.
        """
        if not query or not query.strip():
            raise QueryError("the query is empty (pass some words or code to search for)")
        if mode not in MODES:
            raise QueryError(f"unknown mode {mode!r} (use one of: {', '.join(MODES)})")
        if k < 1:
            raise QueryError(f"k must be at least 1, got {k} (pass k=10 for example)")
        notices: list[str] = []
        q = _analyse(query)
        dense_built = self._dense is not None and len(self._dense) > 0
        colbert_built = self._plaid is not None and len(self._plaid) > 0
        # A model is asked for only by a mode that searches its vectors.
        has_dense = dense_built and mode in ("hybrid", "dense") and self._encoder("dense") is not None
        has_colbert = colbert_built and mode in ("hybrid", "colbert") and self._encoder("multi") is not None
        if mode == "dense" and not has_dense:
            raise QueryError(
                "dense search needs the index's model to encode the query and it is not loaded (make the "
                "model available again, or re-embed with 'codesearch index --rebuild --model PATH_OR_ID')"
                if dense_built
                else "this index has no dense vectors (index with a model: 'codesearch index --model PATH_OR_ID')"
            )
        if mode == "colbert" and not has_colbert:
            raise QueryError(
                "colbert search needs the index's ColBERT model to encode the query and it is not loaded "
                "(make it available again, or re-embed with 'codesearch index --rebuild --multi-model PATH_OR_ID')"
                if colbert_built
                else "this index has no multi-vector index (index with a ColBERT model: 'codesearch index --multi-model ID')"
            )
        use_lex = mode in ("hybrid", "lexical")
        use_dense = has_dense and mode in ("hybrid", "dense")
        use_colbert = has_colbert and mode in ("hybrid", "colbert")
        # Said only when this query lost vectors the index has: an index built lexical-only
        # says so once, at index time, and indexes_used shows it on every answer.
        if mode == "hybrid" and not (has_dense or has_colbert) and (dense_built or colbert_built):
            notices.append(
                "lexical index only: this index's model is not loaded, so its vectors were not searched "
                "(make the model available again, or 'codesearch index --rebuild --model PATH_OR_ID')"
            )
        mask = self._mask(language, glob)
        p = self._ranker.params
        n_cand = max(p.dense_candidates, 4 * k)
        dense = file_dense = colbert = None
        used: list[str] = ["lexical"] if use_lex else []
        if use_dense:
            qtext = _split_identifiers(query) if p.split_query_for_vectors else query
            qv = np.asarray(self._encoder("dense").encode([qtext], kind="query"), dtype=np.float32)
            ids, scores = self._dense.search(qv, n_cand)[0]
            dense = (self._ranker.rows_of(ids), scores)
            used.append("dense")
            long_context = int(getattr(self._encoder("dense"), "max_length", 0) or 0) >= FILE_VECTOR_MIN_TOKENS
            if p.w_file_centroid and not long_context:
                cent = self._file_centroids()
                file_dense = (np.arange(len(cent), dtype=np.int64), cent @ qv[0])
                used.append("dense_files")
            elif long_context and self._dense_files is not None and len(self._dense_files):
                fids, fscores = self._dense_files.search(qv, max(50, k * 5))[0]
                file_dense = (np.array([self._file_row.get(int(f), -1) for f in fids], dtype=np.int64), fscores)
                used.append("dense_files")
        if use_colbert:
            qm = self._encoder("multi").encode([query], kind="query")
            ids, scores = self._plaid.search([qm[0]], n_cand)[0]
            colbert = (self._ranker.rows_of(ids), scores)
            used.append("colbert")
        total, sources = self._ranker.score(
            q, use_lexical=use_lex, dense=dense, file_dense=file_dense, colbert=colbert, mask=mask
        )
        picked = self._ranker.select(total, k, files_only=files_only)
        hits = self._hits(picked, sources)
        return SearchResult(query=query, mode=mode, hits=hits, indexes_used=tuple(used), notices=notices)

    def set_encoders(self, encoders: Any) -> None:
        """Use these query encoders from the next search on (``None``: lexical only)."""
        with self._lock:
            self._encoders = encoders

    def close(self) -> None:
        """Release the store connection (idempotent)."""
        with self._lock:
            self._store.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _encoder(self, role: str) -> Any:
        enc = self._encoders
        if enc is None:
            return None
        names = {"dense": ("dense", "dense_encoder"), "multi": ("multi", "colbert", "multi_encoder")}[role]
        for name in names:
            value = getattr(enc, name, None)
            if callable(value) and not hasattr(value, "encode"):
                value = value()
            if value is not None:
                return value
        return None

    def _cached_centrality(self) -> np.ndarray:
        """The ranker's centrality from ``centrality.npz`` when that file was written for this
        generation and these files; else computed, and written for the next process (a CLI
        query is one process per query) when the folder is writable.

        The file validates itself (algorithm version, generation, sizes, file ids), so it
        needs no lock: an index run makes it stale by moving the generation on, and two readers
        writing at once each replace it atomically with the same array.
        """
        c = self._ranker.corpus
        path = self.index_dir / CENTRALITY_FILE
        # What the array depends on, beyond the generation (a store rebuilt after damage
        # counts generations from 0 again): the chunks, and the term counts it reads.
        tf = self._ranker._file_tf
        shape = np.array([CENTRALITY_VERSION, self._generation, len(c), tf.shape[1], tf.nnz], dtype=np.int64)
        try:
            with np.load(path) as z:
                if np.array_equal(z["shape"], shape) and np.array_equal(z["file_ids"], c.file_ids):
                    return z["values"].astype(np.float32)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # missing, stale or damaged: compute it
        values = self._ranker.compute_centrality()
        if os.access(self.index_dir, os.W_OK):
            with contextlib.suppress(OSError), atomic_write(path) as fh:
                np.savez(fh, shape=shape, file_ids=c.file_ids, values=values)
        return values

    def _file_centroids(self) -> np.ndarray:
        """(n_files, dim) normalised mean of each file's chunk vectors (built on first use)."""
        with self._lock:
            cent = getattr(self, "_centroids", None)
            if cent is None:
                # Streamed from the store in batches (the same vectors the dense index
                # holds), so a large index never holds a second full copy in memory.
                c = self._ranker.corpus
                cent = np.zeros((len(c.files), self._dense.dim), dtype=np.float32)
                for ids, arrays in self._store.iter_vectors("dense"):
                    rows = self._ranker.rows_of(ids)
                    ok = rows >= 0
                    if ok.any():
                        vecs = np.concatenate(arrays, axis=0).astype(np.float32, copy=False)
                        np.add.at(cent, c.file_idx[rows[ok]], vecs[ok])
                cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-9)
                self._centroids = cent
        return cent

    def _mask(self, language: str | Sequence[str] | None, glob: str | Sequence[str] | None) -> np.ndarray | None:
        c = self._ranker.corpus
        mask = None
        languages = [language] if isinstance(language, str) else list(language or ())
        languages = [lang.lower() for lang in languages if lang]
        if languages:
            mask = np.isin(c.language, languages)
            if not mask.any():
                known = ", ".join(sorted(set(c.language.tolist()))) or "none"
                asked = " or ".join(repr(lang) for lang in languages)
                raise QueryError(f"no indexed chunk is in language {asked} (indexed: {known})")
        globs = [glob] if isinstance(glob, str) else list(glob or ())
        if globs:
            from codesearch.globs import GlobFilter

            spec = GlobFilter.of(globs)
            fmask = np.fromiter((spec.match(f) for f in c.files), dtype=bool, count=len(c.files))
            gm = fmask[c.file_idx]
            mask = gm if mask is None else mask & gm
        return mask

    def _hits(self, picked: list[tuple[int, float]], sources: dict[str, np.ndarray]) -> list[SearchHit]:
        c = self._ranker.corpus
        ids = [int(c.ids[r]) for r, _ in picked]
        with self._lock:
            recs = {r.id: r for r in self._store.chunk_records(ids)}
        hits = []
        for r, s in picked:
            rec = recs.get(int(c.ids[r]))
            if rec is None:
                continue
            src = tuple(name for name, v in sources.items() if v[r] > 0)
            hits.append(
                SearchHit(
                    path=rec.path,
                    start_line=rec.start_line,
                    end_line=rec.end_line,
                    score=float(s),
                    language=rec.language,
                    symbol=rec.symbol,
                    kind=rec.kind,
                    scope=rec.scope,
                    text=rec.text,
                    chunk_id=rec.id,
                    sources=src,
                )
            )
        return hits


def _in_lexical_order(rows: list[tuple], lex_ids: np.ndarray) -> list[tuple]:
    """``rows`` (by chunk id) reordered to the lexical index's row order; ids it lacks last, by id."""
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    lex_ids = np.asarray(lex_ids, dtype=np.int64)
    if len(ids) == len(lex_ids) and np.array_equal(ids, lex_ids):
        return rows
    # Key = position in the lexical index, or len + id for rows it does not hold.
    order = np.argsort(lex_ids, kind="stable")
    pos = np.searchsorted(lex_ids[order], ids).clip(0, max(len(lex_ids) - 1, 0))
    found = (lex_ids[order][pos] == ids) if len(lex_ids) else np.zeros(len(ids), dtype=bool)
    key = np.where(found, order[pos] if len(lex_ids) else 0, len(lex_ids) + ids)
    return [rows[i] for i in np.argsort(key, kind="stable").tolist()]


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, dict):
            if obj.get(name) is not None:
                return obj[name]
        elif getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return None


def _lexical_inputs(store: Any) -> tuple[np.ndarray, list[str]]:
    recs = list(store.iter_chunk_records())
    return np.array([r.id for r in recs], dtype=np.int64), [f"{r.header}\n{r.text}" for r in recs]
