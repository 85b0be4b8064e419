"""Lexical index: code-aware tokens and BM25, on disk in memory-mapped segments.

Always built, needs no model. Identifiers are split on snake_case, camelCase and digit
boundaries *and* kept whole, all lower-cased, so ``HttpClient`` matches the queries
``HttpClient``, ``http client`` and ``httpclient`` alike.

Scoring is Okapi BM25 with Lucene's idf; for a query ``q`` and a document ``d``::

    score(q, d) = sum over distinct terms t of q present in d of
        idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

where ``N`` is the number of live documents, ``df(t)`` the number of them containing
``t``, ``|d|`` the document's token count and ``avgdl`` the mean of those counts. The
searcher also scores whole files the same way (a file's term counts are its chunks'
summed), which is why the index keeps raw term counts per chunk.

On disk (``.codesearch/lexical/``), written by `codesearch.indexes.lexical_writer`::

    manifest.json            format, version, BM25 parameters, the segments in order, the
                             state file, live counts; replaced atomically (the commit point)
    seg-<16 hex>.bin         one immutable segment: whole files, each file's chunks in
                             consecutive rows; per row its chunk id, file, lines, language,
                             flags (test code, imports), token count; per file its store id,
                             row range, summed length, kind, overlap flag, path, path words,
                             name stem, defined names; sorted term / symbol / path-word /
                             stem tables with their postings (rows, or files, ascending)
    state-<16 hex>.bin       per file of every segment (in manifest order): ``live`` (1 =
                             live), ``users`` (how many other files use what it defines:
                             centrality)

Each ``.bin`` is one container of arrays (`codesearch.indexes.lexical_arrays`): a table of
contents, then the arrays, mapped and checked when the file is opened.

A file re-indexed is written whole into a new segment; its old rows are dead because the
live array no longer marks their file. Document frequencies and ``N`` count live rows
only, so scores equal those of an index built from scratch. A query reads, in each
segment, the postings of its terms (a bisection of the sorted term table), the liveness
of their files, and the rows of its candidate files: nothing proportional to the
repository, and nothing but numpy (a query imports neither scipy nor torch).

Why a format of our own and not tantivy (the Rust engine under Quickwit and ParadeDB, on
PyPI as ``tantivy``): its BM25 constants are fixed at k1 = 1.2, b = 0.75 in the library
(``src/query/bm25.rs``; making them settable is an open request upstream, tantivy issue
2924), and its block-max WAND stores per-block maxima computed with them, so a second
length normalisation cannot be had from the same postings. The ranking needs two: chunks
at b = 0.75 and whole files at b = 0.3 (`RankingParams.file_b`; a file's counts are its
chunks' summed, which a tantivy document cannot give without a second index of files).
Its document lengths are kept as a one-byte "fieldnorm" code, which moves every score a
little, and its Python binding answers a query with its top hits, while the ranker reads
every matching chunk's score and its file's rows (path words, defined names, centrality)
to fuse the signals. This format keeps what tantivy gives that matters here (immutable
segments, mapped in place, deletes as a live mask, merges) and scores exactly as the
earlier in-memory matrix did.

Examples
--------
>>> tokenize("getUserName(user_id)", stem=False)
['getusername', 'get', 'user', 'name', 'user_id', 'user', 'id']
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codesearch.errors import IndexCorruptError
from codesearch.indexes.lexical_arrays import Arrays, StringTable, corrupt, encode, offsets_slice
from codesearch.store import atomic_write

__all__ = [
    "STOPWORDS",
    "LexicalIndex",
    "Postings",
    "bm25",
    "idf",
    "length_norm",
    "mean_length",
    "query_tokens",
    "split_identifier",
    "stem_word",
    "tokenize",
    "union",
]

#: The version of centrality's definition (`codesearch.indexes.features`): part of the
#: format, so an index written under another definition is rebuilt rather than read.
CENTRALITY_VERSION = 2

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




# ---- BM25, as the searcher computes it --------------------------------------------------
# Each function is the expression the scores are defined by, in float32 and in this order:
# an index read in parts (the postings of a few terms, the rows of a few files) then gives
# bit for bit the scores of one read whole.


def idf(n_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene's idf of each document frequency in ``df`` (float32)."""
    return np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)


def mean_length(total: int, n: int) -> float:
    """``avgdl``: the mean of ``n`` lengths summing to ``total``, as numpy's float32 mean
    of them gives it (exact below 2**24 tokens); 1.0 when there are none."""
    if n <= 0:
        return 1.0
    mean = float(np.float32(total) / np.float32(n))
    return mean if mean > 0 else 1.0


def length_norm(lengths: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """``k1 * (1 - b + b * |d| / avgdl)`` per document (``lengths`` float32)."""
    return (k1 * (1.0 - b + b * lengths / avgdl)).astype(np.float32)


def bm25(weight: np.float32, tf: np.ndarray, norm: np.ndarray, k1: float) -> np.ndarray:
    """One term's BM25 in each document holding it: ``idf * tf * (k1 + 1) / (tf + norm)``."""
    return weight * tf * (k1 + 1.0) / (tf + norm)


# ---- the files ---------------------------------------------------------------------------

FORMAT = "codesearch-lexical"
#: The on-disk format's version: a manifest of another version is not read (the registry
#: rebuilds the index from the store).
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: A manifest larger than this is not a manifest (a few hundred segments take ~100 KB).
MAX_MANIFEST_BYTES = 16 << 20
SEGMENT_RE = re.compile(r"seg-[0-9a-f]{16}\Z")
STATE_RE = re.compile(r"state-[0-9a-f]{16}\Z")
#: A name tables are searched by, per kind of table: the values are rows or files.
TABLES = {"terms": "rows", "symbols": "rows", "exact": "rows", "pathwords": "files", "stems": "files"}
#: The counts a segment's manifest entry gives: every array's shape follows from them.
SIZE_KEYS = (
    "rows", "files", "paths_bytes", "defs", "defs_bytes", "own",
    *(f"{t}{suffix}" for t in TABLES for suffix in ("", "_bytes", "_postings")),
)
_MAX_SIZE = 1 << 40
_TF_DTYPES = ("<u2", "<u4")
#: Row flags.
TEST_CODE, IMPORTS = 1, 2
#: File flags.
OVERLAPS = 1


def segment_spec(z: dict[str, int]) -> dict[str, tuple[str | tuple[str, ...], tuple[int, ...]]]:
    """name -> (dtype, shape) of every array of a segment with counts ``z``."""
    n, m = z["rows"], z["files"]
    spec: dict[str, tuple[str | tuple[str, ...], tuple[int, ...]]] = {
        # rows, a file's in consecutive rows
        "ids": ("<i8", (n,)),
        "row_file": ("<i4", (n,)),
        "lines": ("<i4", (n, 2)),
        "lang": ("<u2", (n,)),
        "flags": ("|u1", (n,)),
        "length": ("<i4", (n,)),
        "ids_sorted": ("<i8", (n,)),
        "ids_rows": ("<i4", (n,)),
        "terms_tf": (_TF_DTYPES, (z["terms_postings"],)),
        # files
        "file_ids": ("<i8", (m,)),
        "file_rows": ("<i8", (m + 1,)),
        "file_len": ("<i8", (m,)),
        "file_kind": ("|i1", (m,)),
        "file_flags": ("|u1", (m,)),
        "fids_sorted": ("<i8", (m,)),
        "fids_files": ("<i4", (m,)),
        "paths": ("|u1", (z["paths_bytes"],)),
        "paths_off": ("<i8", (m + 1,)),
        "defs": ("|u1", (z["defs_bytes"],)),
        "defs_off": ("<i8", (z["defs"] + 1,)),
        "file_defs": ("<i8", (m + 1,)),
        "own_off": ("<i8", (m + 1,)),
        "own_terms": ("<i4", (z["own"],)),
    }
    for t in TABLES:
        spec[t] = ("|u1", (z[f"{t}_bytes"],))
        spec[f"{t}_off"] = ("<i8", (z[t] + 1,))
        spec[f"{t}_post"] = ("<i8", (z[t] + 1,))
        spec[f"{t}_vals"] = ("<i4", (z[f"{t}_postings"],))
    return spec


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """A segment as the manifest lists it."""

    name: str
    sizes: dict[str, int]
    languages: tuple[str, ...]  # the row language codes' names

    def to_json(self) -> dict:
        return {"name": self.name, "sizes": self.sizes, "languages": list(self.languages)}


@dataclass(frozen=True, slots=True)
class Manifest:
    """What ``manifest.json`` says: the parameters, the segments in order, the state file
    (liveness and centrality of every file of them), and the live totals BM25 needs."""

    k1: float
    b: float
    stem: bool
    stopwords: bool
    segments: tuple[SegmentEntry, ...]
    state: str
    live_rows: int
    live_files: int
    live_length: int  # tokens of the live rows (and so of the live files)
    top: float  # log(1 + the most users of a live file): centrality's normaliser
    stale_files: int  # files written since centrality was last computed for every file

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT, "version": FORMAT_VERSION, "centrality_version": _centrality_version(),
            "k1": self.k1, "b": self.b, "stem": self.stem, "stopwords": self.stopwords,
            "segments": [s.to_json() for s in self.segments], "state": self.state,
            "live_rows": self.live_rows, "live_files": self.live_files, "live_length": self.live_length,
            "top": self.top, "stale_files": self.stale_files,
        }
        return json.dumps(doc, indent=0).encode()

    @classmethod
    def parse(cls, data: bytes, where: Path) -> Manifest:
        """Read and check a manifest: any deviation raises `IndexCorruptError`."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a lexical index manifest")
            if doc.get("version") != FORMAT_VERSION or doc.get("centrality_version") != _centrality_version():
                raise ValueError(
                    f"format version {doc.get('version')!r} (centrality {doc.get('centrality_version')!r}), "
                    f"expected {FORMAT_VERSION} ({_centrality_version()})"
                )
            k1, b, top = (_number(doc, key) for key in ("k1", "b", "top"))
            # (b < 1: with b = 1 an empty chunk's length norm is 0, and 0 / 0 a score.)
            if not (0 < k1 <= 100 and 0 <= b < 1 and 0 <= top <= 100):
                raise ValueError(f"k1 {k1}, b {b}, top {top} out of range")
            segments = []
            for s in _field(doc, "segments", list):
                if not isinstance(s, dict) or not SEGMENT_RE.match(str(s.get("name"))):
                    raise ValueError(f"bad segment entry {str(s)[:80]!r}")
                sizes = _field(s, "sizes", dict)
                if set(sizes) != set(SIZE_KEYS) or not all(_count(v) for v in sizes.values()):
                    raise ValueError(f"bad sizes in segment {s['name']}")
                langs = _field(s, "languages", list)
                if len(langs) > 65536 or not all(isinstance(x, str) for x in langs):
                    raise ValueError(f"bad languages in segment {s['name']}")
                segments.append(SegmentEntry(s["name"], dict(sizes), tuple(langs)))
            if len({s.name for s in segments}) != len(segments):
                raise ValueError("a segment is listed twice")
            state = _field(doc, "state", str)
            if not STATE_RE.match(state):
                raise ValueError(f"bad state name {state[:40]!r}")
            counts = {k: _field(doc, k, int) for k in ("live_rows", "live_files", "live_length", "stale_files")}
            if not all(_count(v) for v in counts.values()):
                raise ValueError("negative or huge count")
            return cls(k1, b, bool(_field(doc, "stem", bool)), bool(_field(doc, "stopwords", bool)),
                       tuple(segments), state, top=top, **counts)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise corrupt(where, str(exc)) from None


def _centrality_version() -> int:
    return CENTRALITY_VERSION


def _field(doc: dict, key: str, kind: type):
    v = doc[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise ValueError(f"{key}: {type(v).__name__}, expected {kind.__name__}")
    return v


def _number(doc: dict, key: str) -> float:
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise ValueError(f"{key}: not a number")
    return float(v)


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_SIZE


class Inverted:
    """A sorted string table and, per entry, its ascending postings (rows or files of the
    segment), each slice checked as it is read."""

    def __init__(self, arrays: Arrays, name: str, limit: int) -> None:
        self.arrays, self.name, self.limit = arrays, name, limit
        self.table = StringTable(arrays, name)
        self._post = arrays[name + "_post"]
        self._vals = arrays[name + "_vals"]

    def span(self, i: int, j: int | None = None) -> tuple[int, int]:
        """The postings of entries ``i`` (to ``j - 1``): a slice of the values."""
        return offsets_slice(self._post, i, i + 1 if j is None else j, len(self._vals), self.arrays)

    def values(self, lo: int, hi: int, *, ascending: bool = True) -> np.ndarray:
        """Values ``lo:hi`` (int64), checked in range, and ascending (one entry's)."""
        v = self.arrays.read(self.name + "_vals", lo, hi).astype(np.int64)  # (read, not mapped: `Arrays`)
        if len(v):
            if ascending:
                bad = v[0] < 0 or v[-1] >= self.limit or (len(v) > 1 and not (v[1:] > v[:-1]).all())
            else:
                bad = v.min() < 0 or v.max() >= self.limit
            if bad:
                raise corrupt(self.arrays.path, f"{self.name} postings out of order or out of range")
        return v

    def get(self, key: bytes) -> np.ndarray | None:
        i = self.table.find(key)
        return None if i < 0 else self.values(*self.span(i))

    def prefixed(self, prefix: bytes) -> np.ndarray:
        """The values of every entry starting with ``prefix`` (one slice: entries, and so
        their postings, lie in key order), not in order, maybe repeated."""
        i, j = self.table.prefix_range(prefix)
        return self.values(*self.span(i, j), ascending=False) if j > i else np.zeros(0, np.int64)


class Segment:
    """One segment file, mapped (and its table of contents checked) when it is opened: a
    segment an index run deletes after this opened it stays readable."""

    def __init__(self, folder: Path, entry: SegmentEntry) -> None:
        self.entry = entry
        self.n, self.m = entry.sizes["rows"], entry.sizes["files"]
        self.arrays = Arrays(folder / f"{entry.name}.bin", segment_spec(entry.sizes))
        fr = np.asarray(self.arrays["file_rows"])
        # Checked whole (m + 1 numbers): every row range and the rows' order rely on it.
        if fr[0] != 0 or fr[-1] != self.n or (np.diff(fr) < 0).any():
            raise corrupt(self.arrays.path, "file row ranges out of order")
        self.tables = {t: Inverted(self.arrays, t, self.n if kind == "rows" else self.m) for t, kind in TABLES.items()}
        self.paths = StringTable(self.arrays, "paths")
        self.defs = StringTable(self.arrays, "defs")

    def files_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The local file of each local row (checked against the files' row ranges)."""
        lf = self.arrays["row_file"][rows].astype(np.int64)
        if len(lf):
            if lf.min() < 0 or lf.max() >= self.m:
                raise corrupt(self.arrays.path, "a row's file out of range")
            fr = self.arrays["file_rows"]
            if ((fr[lf] > rows) | (fr[lf + 1] <= rows)).any():
                raise corrupt(self.arrays.path, "a row outside its file's rows")
        return lf


def _expand(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, vectorised."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total, dtype=np.int64)


def union(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The distinct values of ascending int64 ``arrays``, ascending: a merge (a stable sort
    of sorted runs), cheaper than `np.unique`'s hashing on posting lists."""
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    if len(arrays) == 1:
        return np.asarray(arrays[0], dtype=np.int64)
    x = np.concatenate(arrays).astype(np.int64, copy=False)
    x.sort(kind="stable")
    return x[np.r_[True, x[1:] != x[:-1]]] if len(x) else x


def runs(ascending: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, index of each one's first place) of an ascending array."""
    if not len(ascending):
        return ascending, np.zeros(0, dtype=np.int64)
    first = np.flatnonzero(np.r_[True, ascending[1:] != ascending[:-1]])
    return ascending[first], first


def _ascending(x: np.ndarray) -> bool:
    return len(x) < 2 or bool((x[1:] >= x[:-1]).all())


@dataclass(frozen=True, slots=True)
class Postings:
    """A term's live postings across the segments: global rows (ascending), the term's count
    in each (float32, as BM25 reads it), and each row's global file (ascending with it)."""

    rows: np.ndarray
    tf: np.ndarray
    files: np.ndarray


class LexicalIndex:
    """The lexical index of one folder as its manifest last committed it, read in place.

    Rows and files are numbered globally: the segments' rows (files) in manifest order,
    dead ones included; `rows_of` and `files_of` find the live row (file) of a chunk id
    (store file id). Every accessor takes and returns global numbers. Written by
    `codesearch.indexes.lexical_writer` (`build`, `update`); this class only reads.

    Examples
    --------
    >>> idx = LexicalIndex.load("repo/.codesearch/lexical")   # doctest: +SKIP
    >>> ids, scores = idx.search(["http client"], k=5)[0]     # doctest: +SKIP
    """

    #: Counts are exact after any update (`Index.needs_rebuild`).
    needs_rebuild = False

    def __init__(
        self, folder: Path, manifest: Manifest, *, live: np.ndarray | None = None, users: np.ndarray | None = None
    ) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.k1, self.b = manifest.k1, manifest.b
        self.stem, self.stopwords = manifest.stem, manifest.stopwords
        self.segments = [Segment(self.folder, e) for e in manifest.segments]
        self.row_base = np.zeros(len(self.segments) + 1, dtype=np.int64)
        self.file_base = np.zeros(len(self.segments) + 1, dtype=np.int64)
        np.cumsum([s.n for s in self.segments], out=self.row_base[1:])
        np.cumsum([s.m for s in self.segments], out=self.file_base[1:])
        self.n_rows, self.n_files = int(self.row_base[-1]), int(self.file_base[-1])
        if live is None or users is None:  # (the writer passes the state it is making)
            state = Arrays(self.folder / f"{manifest.state}.bin",
                           {"live": ("|u1", (self.n_files,)), "users": ("<f4", (self.n_files,))})
            live, users = state["live"], state["users"]
        self.live, self._users = live, users
        #: Notices for the searcher's next answer (the registry's, when it rebuilt this index).
        self.notices: list[str] = []

    @classmethod
    def load(cls, path: str | Path) -> LexicalIndex:
        """Open the index committed in the folder ``path``.

        Raises
        ------
        IndexCorruptError
            No manifest, a manifest of another format or version, or a file it lists that is
            missing or does not hold what the manifest says.
        """
        folder = Path(path)
        for _attempt in range(3):
            data = _read_manifest(folder)
            try:
                return cls(folder, Manifest.parse(data, folder / MANIFEST))
            except IndexCorruptError:
                # An index run may have committed (and deleted what this manifest listed)
                # between the read and the opening: read the new one.
                if _read_manifest(folder) == data:
                    raise
        return cls(folder, Manifest.parse(_read_manifest(folder), folder / MANIFEST))

    def __len__(self) -> int:
        """Live chunks."""
        return self.manifest.live_rows

    def save(self, path: str | Path) -> None:
        """Commit this index as the folder ``path``'s (`commit`): what an update or a build
        wrote is searchable from then on. The caller holds the index lock."""
        commit(self, Path(path))

    def close(self) -> None:
        """Drop the mapped arrays (they are unmapped once nothing else refers to them)."""
        for seg in self.segments:
            seg.arrays.close()

    # ---- statistics ------------------------------------------------------------------

    @functools.cached_property
    def avgdl(self) -> float:
        return mean_length(self.manifest.live_length, self.manifest.live_rows)

    @functools.cached_property
    def file_avgdl(self) -> float:
        return mean_length(self.manifest.live_length, self.manifest.live_files)

    # ---- terms -----------------------------------------------------------------------

    def postings(self, term: str) -> Postings | None:
        """``term``'s live postings, or None when no live chunk holds it."""
        key = encode(term)
        parts = []
        for s, seg in enumerate(self.segments):
            terms = seg.tables["terms"]
            i = terms.table.find(key)
            if i < 0:
                continue
            lo, hi = terms.span(i)
            rows = terms.values(lo, hi)
            files = seg.files_of_rows(rows) + self.file_base[s]
            alive = self.live[files] != 0
            if alive.any():
                tf = seg.arrays.read("terms_tf", lo, hi)[alive].astype(np.float32)
                parts.append((rows[alive] + self.row_base[s], tf, files[alive]))
        if not parts:
            return None
        return Postings(*(np.concatenate(x) for x in zip(*parts)))

    def chunk_scores(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, BM25) of every live chunk holding one of ``tokens`` (rows ascending)."""
        found = [p for t in tokens if (p := self.postings(t)) is not None]
        if not found:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        rows = union([p.rows for p in found])
        norm = length_norm(self.row_values("length", rows).astype(np.float32), self.avgdl, self.k1, self.b)
        out = np.zeros(len(rows), dtype=np.float32)
        weights = idf(self.manifest.live_rows, np.array([len(p.rows) for p in found], dtype=np.float32))
        for w, p in zip(weights, found):
            at = np.searchsorted(rows, p.rows)
            out[at] += bm25(w, p.tf, norm[at], self.k1)
        return rows, out

    def search(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top ``k`` chunks by BM25 per query, best first (ties by chunk id): ``(ids int64,
        scores float32)``; only chunks sharing a term with the query."""
        if isinstance(queries, str):
            raise TypeError("search() takes a list of queries, not one string")
        out = []
        for q in queries:
            rows, scores = self.chunk_scores(query_tokens(q, stem=self.stem, stopwords=self.stopwords))
            ids = self.row_values("ids", rows)
            top = np.lexsort((ids, -scores))[:k]
            out.append((ids[top], scores[top]))
        return out

    # ---- names -----------------------------------------------------------------------

    def table_rows(self, table: str, names: Sequence[str]) -> np.ndarray:
        """The live rows (ascending, distinct) listed under any of ``names`` in ``table``
        (``symbols`` or ``exact``)."""
        return union([self._live_rows(s, v) for s, v in self._lookups(table, names)])

    def table_files(self, table: str, names: Sequence[str], *, prefix: str | None = None) -> np.ndarray:
        """The live files (ascending, distinct) listed under any of ``names`` in ``table``
        (``pathwords`` or ``stems``), and with ``prefix``, under every entry it begins."""
        found = list(self._lookups(table, names))
        if prefix is not None:
            key = encode(prefix)
            found += [(s, np.unique(seg.tables[table].prefixed(key))) for s, seg in enumerate(self.segments)]
        files = union([v + self.file_base[s] for s, v in found])
        return files[self.live[files] != 0]

    def table_has(self, table: str, name: str) -> bool:
        """Whether a live file (row) is listed under ``name`` in ``table``."""
        if TABLES[table] == "files":
            return len(self.table_files(table, [name])) > 0
        return len(self.table_rows(table, [name])) > 0

    def _lookups(self, table: str, names: Sequence[str]) -> Iterator[tuple[int, np.ndarray]]:
        keys = [encode(n) for n in names]
        for s, seg in enumerate(self.segments):
            for key in keys:
                v = seg.tables[table].get(key)
                if v is not None and len(v):
                    yield s, v

    def _live_rows(self, s: int, rows: np.ndarray) -> np.ndarray:
        seg = self.segments[s]
        files = seg.files_of_rows(rows) + self.file_base[s]
        return rows[self.live[files] != 0] + self.row_base[s]

    # ---- rows and files --------------------------------------------------------------

    def row_values(self, name: str, rows: np.ndarray) -> np.ndarray:
        """The per-row array ``name`` at ``rows`` (global, any order)."""
        return self._gather(name, rows, self.row_base)

    def file_values(self, name: str, files: np.ndarray) -> np.ndarray:
        """The per-file array ``name`` at ``files`` (global, any order)."""
        return self._gather(name, files, self.file_base)

    def file_of(self, rows: np.ndarray) -> np.ndarray:
        """The global file of each of ``rows`` (any order)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty(len(rows), dtype=np.int64)
        order = None if _ascending(rows) else np.argsort(rows, kind="stable")
        srt = rows if order is None else rows[order]
        res = np.empty(len(rows), dtype=np.int64)
        for s, lo, hi in self._spans(srt, self.row_base):
            res[lo:hi] = self.segments[s].files_of_rows(srt[lo:hi] - self.row_base[s]) + self.file_base[s]
        if order is None:
            return res
        out[order] = res
        return out

    def file_rows(self, files: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row of ``files`` (global, ascending, distinct): (rows ascending, the index
        into ``files`` of each row's file)."""
        rows, owner = [], []
        for s, lo, hi in self._spans(files, self.file_base):
            fr = self.segments[s].arrays["file_rows"]
            local = files[lo:hi] - self.file_base[s]
            start = fr[local]
            counts = fr[local + 1] - start
            rows.append(_expand(start, counts) + self.row_base[s])
            owner.append(np.repeat(np.arange(lo, hi, dtype=np.int64), counts))
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(owner)

    def ids(self) -> np.ndarray:
        """Every live chunk id, in row order (a pass over every live row)."""
        return self.row_values("ids", self.file_rows(self.live_files())[0])

    def live_files(self) -> np.ndarray:
        """Every live file (one pass over the live array: for filters that need them all)."""
        return np.flatnonzero(self.live).astype(np.int64)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The live row of each chunk id (-1 for an id no live row holds)."""
        return self._find(np.asarray(ids, dtype=np.int64), "ids", self.row_base, rows=True)

    def files_of(self, file_ids: np.ndarray) -> np.ndarray:
        """The live file of each store file id (-1 for none)."""
        return self._find(np.asarray(file_ids, dtype=np.int64), "file_ids", self.file_base, rows=False)

    def paths(self, files: np.ndarray) -> list[str]:
        """The path of each of ``files``."""
        out: list[str] = [""] * len(files)
        seg_of = np.searchsorted(self.file_base, files, side="right") - 1
        for i, (f, s) in enumerate(zip(np.asarray(files).tolist(), seg_of.tolist())):
            out[i] = self.segments[s].paths.get(f - int(self.file_base[s])).decode("utf-8", "surrogateescape")
        return out

    def languages(self, rows: np.ndarray) -> list[str]:
        """The language of each of ``rows`` (ascending)."""
        out: list[str] = []
        for s, lo, hi in self._spans(rows, self.row_base):
            names = self.segments[s].entry.languages
            codes = self.segments[s].arrays["lang"][rows[lo:hi] - self.row_base[s]]
            if len(codes) and int(codes.max()) >= len(names):
                raise corrupt(self.segments[s].arrays.path, "a language code out of range")
            out += [names[c] for c in codes.tolist()]
        return out

    def language_mask(self, rows: np.ndarray, languages: Sequence[str]) -> np.ndarray:
        """Whether each of ``rows`` (ascending) is in one of ``languages``."""
        wanted = set(languages)
        out = np.zeros(len(rows), dtype=bool)
        for s, lo, hi in self._spans(rows, self.row_base):
            names = self.segments[s].entry.languages
            got = self.segments[s].arrays["lang"][rows[lo:hi] - self.row_base[s]]
            if len(got) and int(got.max()) >= len(names):
                raise corrupt(self.segments[s].arrays.path, "a language code out of range")
            codes = [i for i, name in enumerate(names) if name in wanted]
            if codes:
                out[lo:hi] = np.isin(got, codes)
        return out

    def users(self, files: np.ndarray) -> np.ndarray:
        """How many other files use what each of ``files`` defines (centrality's count),
        finite and non-negative whatever the file holds."""
        u = np.asarray(self._users[files], dtype=np.float32)
        return np.clip(np.nan_to_num(u, nan=0.0, posinf=0.0, neginf=0.0), 0.0, np.float32(1e30))

    # ---- internals -------------------------------------------------------------------

    def _spans(self, ascending: np.ndarray, base: np.ndarray) -> Iterator[tuple[int, int, int]]:
        """(segment, lo, hi): ``ascending[lo:hi]`` are the segment's (rows or files)."""
        bounds = np.searchsorted(ascending, base).tolist()
        for s in range(len(self.segments)):
            if bounds[s + 1] > bounds[s]:
                yield s, bounds[s], bounds[s + 1]

    def _gather(self, name: str, at: np.ndarray, base: np.ndarray) -> np.ndarray:
        at = np.asarray(at, dtype=np.int64)
        order = None if _ascending(at) else np.argsort(at, kind="stable")
        srt = at if order is None else at[order]
        out = None
        for s, lo, hi in self._spans(srt, base):
            part = self.segments[s].arrays[name][srt[lo:hi] - base[s]]
            if out is None:
                out = np.empty((len(at), *part.shape[1:]), dtype=part.dtype.newbyteorder("="))
            out[lo:hi] = part
        if out is None:
            dtype, _ = segment_spec(dict.fromkeys(SIZE_KEYS, 0))[name]
            width = (2,) if name == "lines" else ()
            return np.empty((0, *width), dtype=np.dtype(dtype if isinstance(dtype, str) else dtype[0]))
        if order is not None:
            res = np.empty_like(out)
            res[order] = out
            return res
        return out

    def _find(self, keys: np.ndarray, name: str, base: np.ndarray, *, rows: bool) -> np.ndarray:
        out = np.full(len(keys), -1, dtype=np.int64)
        sorted_name, where_name = ("ids_sorted", "ids_rows") if rows else ("fids_sorted", "fids_files")
        for s, seg in enumerate(self.segments):
            srt = seg.arrays[sorted_name]
            limit = seg.n if rows else seg.m
            if not limit or not len(keys):
                continue
            pos = np.searchsorted(srt, keys).clip(0, limit - 1)
            hit = np.flatnonzero(srt[pos] == keys)
            if not len(hit):
                continue
            local = seg.arrays[where_name][pos[hit]].astype(np.int64)
            if local.min() < 0 or local.max() >= limit:
                raise corrupt(seg.arrays.path, f"{where_name} out of range")
            ok = seg.arrays[name][local] == keys[hit]
            files = (seg.files_of_rows(local) if rows else local) + self.file_base[s]
            ok &= self.live[files] != 0
            out[hit[ok]] = local[ok] + base[s]
        return out


def _read_manifest(folder: Path) -> bytes:
    path = folder / MANIFEST
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise corrupt(folder, f"no manifest: {exc.strerror or exc}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise corrupt(path, "manifest too large")
    return data


TMP_RE = re.compile(r"tmp-(\d+)-[0-9a-f]{8}\Z")


# ---- the commit --------------------------------------------------------------------------


def commit(index: LexicalIndex, path: Path) -> None:
    """Make ``index`` the committed index of the folder ``path``: its segments and state
    moved there if they were written elsewhere, then the manifest replaced atomically, then
    whatever no manifest lists deleted. The caller holds the index lock."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    src = index.folder
    if src.resolve() != path.resolve():
        for name in _files_of(index.manifest):
            try:
                os.replace(src / name, path / name)
            except OSError:  # another file system: copy (to a temp name, then renamed)
                tmp = path / f".{name}.tmp-{os.getpid()}"
                shutil.copy2(src / name, tmp)
                os.replace(tmp, path / name)
        index.folder = path
        for seg in index.segments:
            seg.arrays.path = path / f"{seg.entry.name}.bin"
    with atomic_write(path / MANIFEST) as fh:
        fh.write(index.manifest.to_json())
    collect_garbage(path, index.manifest)


def collect_garbage(path: Path, manifest: Manifest) -> None:
    """Delete what ``manifest`` does not list: older segments and state files, and the
    folders of builds whose process is gone."""
    keep = set(_files_of(manifest))
    for entry in os.scandir(path):
        name = entry.name
        if name in keep or name == MANIFEST:
            continue
        tmp = TMP_RE.match(name)
        stem = name.split(".", 1)[0]
        stale = SEGMENT_RE.match(stem) or STATE_RE.match(stem)
        if tmp and _alive(int(tmp.group(1))):
            continue
        if stale or tmp:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _files_of(manifest: Manifest) -> list[str]:
    return [*(f"{e.name}.bin" for e in manifest.segments), f"{manifest.state}.bin"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return pid != 0
