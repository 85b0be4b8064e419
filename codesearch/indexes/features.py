"""What ranking knows of each chunk and file beyond its terms, computed when the lexical index
is written: the names a chunk defines, a file's path words, name stem and kind, and the
centrality prior. Query time reads the results from the index (`codesearch.search.corpus`);
nothing here runs per query.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import numpy as np

from codesearch.indexes.lexical import CENTRALITY_VERSION, _expand, split_identifier, stem_word

__all__ = [
    "CENTRALITY_VERSION",
    "defined_terms",
    "exact_names",
    "file_users",
    "labels_owner",
    "name_terms",
    "norm_ident",
    "part_tokens",
    "path_tokens",
    "stem_and_parent",
    "stem_terms",
    "symbol_names",
]


_WORD_CHAR = re.compile(r"[\w$]")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
_IDENT_JOINERS = re.compile(r"[_\-]")
_NAME_SEPARATORS = re.compile(r"[,\s]+")
_NOT_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:]")
_QUALIFIERS = re.compile(r"::|\.")


def stem_and_parent(path: str) -> tuple[str, str]:
    """``PurePosixPath(path).stem`` and ``.parent.name``, by string operations."""
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


def path_tokens(path: str) -> frozenset[str]:
    """Stemmed words of a file's name and its parent folder ("binding/json.go" -> json, binding)."""
    stem, parent = stem_and_parent(path)
    return part_tokens(stem) | part_tokens(parent) if parent else part_tokens(stem)


def part_tokens(part: str) -> frozenset[str]:
    """`path_tokens` of one part of a path: a file's name stem or its parent folder's name."""
    toks: set[str] = set()
    for w in _ALNUM_RUN.findall(part):
        toks |= _path_word_tokens(w)
    return frozenset(t for t in toks if len(t) > 1)


def norm_ident(name: str) -> str:
    """Lower-cased, without ``_`` and ``-``: how a file stem and an identifier are compared."""
    return _IDENT_JOINERS.sub("", name.lower())


@functools.lru_cache(maxsize=1 << 16)
def symbol_names(symbol: str | None) -> frozenset[str]:
    """``"$ZodType, parse"`` -> {"zodtype", "parse"}; qualified names also by their last part."""
    if not symbol:
        return frozenset()
    out: set[str] = set()
    for name in _NAME_SEPARATORS.split(symbol):
        name = _NOT_NAME_CHARS.sub("", name).lower()
        if name:
            out.add(name)
            out.add(_QUALIFIERS.split(name)[-1])
    out.discard("")
    return frozenset(out)


@functools.lru_cache(maxsize=1 << 16)
def exact_names(symbol: str | None) -> frozenset[str]:
    """``"$ZodType, Serialize for str, a::B"`` -> {"ZodType", "Serialize for str", "a::B", "B"}."""
    if not symbol:
        return frozenset()
    out: set[str] = set()
    for name in symbol.split(","):
        name = name.strip().lstrip("$@#&*")
        if name:
            out.add(name)
            out.add(_QUALIFIERS.split(name)[-1])
    return frozenset(out)


def labels_owner(symbol: str | None, scope: str | None) -> bool:
    """Whether ``symbol`` is the enclosing definition's name, given to a piece cut from it.

    The chunker labels a piece that defines nothing with its innermost enclosing definition
    (``symbol="Plug.Session"``, scope ``"defmodule Plug.Session"``): that name is defined by
    the definition's head chunk, not by this piece. "Is the name in the scope's last part,
    not inside a longer word": a search with `str.find` rather than a regex made per call
    (a new pattern per chunk overflowed `re`'s cache: 50 s of 600k chunks' start-up).
    """
    if not symbol or not scope or "," in symbol:
        return False
    inner = scope.rsplit(" > ", 1)[-1]
    start = inner.find(symbol)
    while start >= 0:
        end = start + len(symbol)
        before = start > 0 and _WORD_CHAR.match(inner, start - 1) is not None
        after = end < len(inner) and _WORD_CHAR.match(inner, end) is not None
        if not before and not after:
            return True
        start = inner.find(symbol, start + 1)
    return False


_DEF_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{2,}")


def defined_terms(symbols: set[str] | frozenset[str], path: str) -> set[str]:
    """The lexical terms of the names a file defines, for centrality: each defined symbol
    name that looks like an identifier, and the file's name stem (``http_client`` whole, as
    the tokenizer keeps it, and ``httpclient``), at least 3 letters long; stemmed as the
    index's terms are."""
    return name_terms(symbols) | stem_terms(stem_and_parent(path)[0])


def name_terms(names: Iterable[str]) -> set[str]:
    """`defined_terms` of symbol names (lower-cased, as `symbol_names` gives them)."""
    return {stem_word(name) for name in names if _DEF_NAME_RE.fullmatch(name)}


def stem_terms(stem: str) -> set[str]:
    """`defined_terms` of a file's name stem (`stem_and_parent`)."""
    out = set()
    raw = stem.lower()
    for s in {raw, norm_ident(raw)}:
        if len(s) >= 3:
            out.add(stem_word(s))
    return out


def file_users(
    def_files: np.ndarray,
    def_terms: np.ndarray,
    df: np.ndarray,
    use_terms: np.ndarray,
    use_files: np.ndarray,
    self_use: np.ndarray,
    n_files: int,
    *,
    n_live: int | None = None,
    max_share: float = 0.25,
    exact_max_users: int = 1000,
    block_pairs: int = 4_000_000,
) -> np.ndarray:
    """Per file, ``u`` = how many other files use a name the file defines.

    Parameters
    ----------
    def_files, def_terms : int arrays
        The (file, term) pairs of what each file defines (`defined_terms`), distinct; terms
        numbered ``0 .. len(df) - 1``.
    df : int array
        Per term, the number of files that use it: contain it as a whole token (the index's
        per-file term counts) other than in their own path (every chunk's header holds its
        path: ``engine/cache.py`` does not use ``engine.py``).
    use_terms, use_files : int arrays
        The (term, file) pairs of those uses, at least for every term used by at most
        ``exact_max_users`` files (others are not read).
    self_use : bool array
        Per define pair, whether the defining file uses the term itself.
    n_files, n_live : int
        Files are numbered ``0 .. n_files - 1``; ``n_live`` of them are live (all when
        None): the share of files a common name is in is of those.

    A name found in more than ``max_share`` of the files (``get``, ``index``) says nothing
    about who depends on whom and is left out. Distinct users are counted exactly through
    names in at most ``exact_max_users`` files; a name in more (only in repositories over
    4,000 files) adds its user count as a lower bound instead, which bounds the work to
    definitions x ``exact_max_users`` pairs, counted ``block_pairs`` at a time (numpy only: a
    sparse product was faster, but importing scipy cost an update of one file 0.35 s).
    """
    users = np.zeros(n_files, dtype=np.float32)
    n_terms = len(df)
    if n_files < 2 or not n_terms or not len(def_files):
        return users
    df = np.asarray(df, dtype=np.int64)
    common = df > max(5.0, max_share * (n_files if n_live is None else n_live))
    exact = ~common & (df <= exact_max_users) & (df > 0)
    keep = exact[use_terms]
    order = np.argsort(use_terms[keep], kind="stable")
    use_t, use_f = use_terms[keep][order], use_files[keep][order]
    dkeep = exact[def_terms]
    by_file = np.argsort(def_files[dkeep], kind="stable")
    d_file, d_term, d_self = def_files[dkeep][by_file], def_terms[dkeep][by_file], self_use[dkeep][by_file]
    # Each exact define pair's users: a slice of the uses sorted by term.
    start = np.searchsorted(use_t, d_term, "left")
    count = np.searchsorted(use_t, d_term, "right") - start
    ends = np.cumsum(count)
    lo = 0
    while lo < len(d_file):  # blocks of whole files, ~block_pairs (file, user) pairs each: bounded memory
        hi = max(int(np.searchsorted(ends, ends[lo] - count[lo] + block_pairs, "right")), lo + 1)
        if hi < len(d_file):
            hi = int(np.searchsorted(d_file, d_file[hi - 1], "right"))
        pairs = np.repeat(d_file[lo:hi], count[lo:hi]) * n_files + use_f[_expand(start[lo:hi], count[lo:hi])]
        pairs.sort()
        pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs
        users += np.bincount(pairs // n_files, minlength=n_files).astype(np.float32)
        lo = hi
    # A file that uses one of its own exact names counts itself once among the users.
    users[np.unique(d_file[d_self])] -= 1
    wide = ~common & ~exact & (df > 0)
    w = wide[def_terms]
    if w.any():  # lower bound: the users of the file's most used wide name, itself left out
        bound = (df[def_terms[w]] - self_use[w]).astype(np.float32)
        best = np.zeros(n_files, dtype=np.float32)
        np.maximum.at(best, def_files[w], bound)
        users = np.maximum(users, best)
    return users


def centrality_top(users: np.ndarray) -> float:
    """The normaliser of `centrality`: ``log(1 + max u)`` (float32, as the values are)."""
    return float(np.log1p(users).max()) if len(users) else 0.0


def centrality(users: np.ndarray, top: float) -> np.ndarray:
    """``log(1 + u) / top`` in [0, 1] (0 where ``top`` is 0): the prior of a file's hits.

    The file a question is about is more often the one the rest of the code leans on
    (SqlMapper.cs, not SqlMapper.Cache.cs).
    """
    out = np.log1p(users.astype(np.float32, copy=False))
    return (out / top).astype(np.float32) if top > 0 else out.astype(np.float32)
