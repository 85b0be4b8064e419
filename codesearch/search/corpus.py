"""The corpus side of ranking: per-chunk and per-file features read once per index generation
(paths, symbols, file kinds) and the centrality prior."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from codesearch.indexes.lexical import (
    split_identifier,
    stem_word,
    tokenize,
)
from codesearch.types import path_kind

#: The version of centrality's definition in CENTRALITY_FILE (Searcher._cached_centrality):
#: bump it when the definition changes, so copies written by an older release are recomputed.
CENTRALITY_VERSION = 2


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


@dataclass
class Corpus:
    """Metadata of every chunk, rows aligned with the lexical index's rows."""

    ids: np.ndarray  # (n,) int64 chunk ids
    file_idx: np.ndarray  # (n,) int32 index into files
    start: np.ndarray  # (n,) int32
    end: np.ndarray  # (n,) int32
    language: np.ndarray  # (n,) object
    # Lower-cased names a chunk defines (a block may define several). A piece cut from a long
    # definition is labelled with that definition's name (its `symbol`) but does not define
    # it: it gets no names here, so the symbol signal picks the definition, not its pieces.
    symbols: list[frozenset[str]]
    exact_symbols: list[frozenset[str]]  # the same names, case kept, whole entries only
    files: list[str]  # file paths
    file_ids: np.ndarray  # (n_files,) int64 store file ids
    file_kind: np.ndarray  # (n_files,) int8: 0 code, 1 test, 2 doc/example, 3 bench
    test_code: np.ndarray  # (n,) bool: test code inside a source file (chunk kind "test")
    imports: np.ndarray  # (n,) bool: nothing but imports (chunk kind "imports")
    path_tokens: list[frozenset[str]]
    stems: list[str]  # file name before its first dot, lower-cased, without _ and -

    @classmethod
    def build(cls, rows: list[tuple]) -> Corpus:
        """From ``(chunk_id, file_id, path, start, end, language, symbol[, kind[, scope]])`` tuples."""
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
        kinds = np.array([path_kind(p) for p in files], dtype=np.int8)
        # Symbols repeat (and most chunks have none): parse each distinct string once.
        names: dict[str | None, tuple[frozenset[str], frozenset[str]]] = {}
        for r in rows:
            if r[6] not in names:
                names[r[6]] = (_symbol_names(r[6]), _exact_names(r[6]))
        nothing = (frozenset(), frozenset())
        pairs = [nothing if len(r) > 8 and _labels_owner(r[6], r[8]) else names[r[6]] for r in rows]
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
            test_code=np.array([len(r) > 7 and r[7] == "test" for r in rows], dtype=bool),
            imports=np.array([len(r) > 7 and r[7] == "imports" for r in rows], dtype=bool),
            path_tokens=[_path_tokens(p) for p in files],
            stems=[norm_ident(_stem_and_parent(p)[0]) for p in files],
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


def _labels_owner(symbol: str | None, scope: str | None) -> bool:
    """Whether ``symbol`` is the enclosing definition's name, given to a piece cut from it.

    The chunker labels a piece that defines nothing with its innermost enclosing definition
    (``symbol="Plug.Session"``, scope ``"defmodule Plug.Session"``): that name is defined by
    the definition's head chunk, not by this piece.
    """
    if not symbol or not scope or "," in symbol:
        return False
    inner = scope.rsplit(" > ", 1)[-1]
    return re.search(rf"(?<![\w$]){re.escape(symbol)}(?![\w$])", inner) is not None


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


def norm_ident(name: str) -> str:
    return re.sub(r"[_\-]", "", name.lower())


def invert(sets: list[frozenset[str]]) -> dict[str, np.ndarray]:
    """name -> sorted row numbers of the sets that contain it."""
    out: dict[str, list[int]] = {}
    for i, names in enumerate(sets):
        for name in names:
            out.setdefault(name, []).append(i)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def lookup(inverted: dict[str, np.ndarray], names: set[str] | frozenset[str]) -> np.ndarray:
    """Distinct rows holding any of ``names``."""
    found = [inverted[x] for x in names if x in inverted]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


_DEF_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{2,}")


def centrality(
    corpus: Corpus,
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
        own = [
            (f, t)
            for f, path in enumerate(corpus.files)
            for t in {vocab.get(x) for x in tokenize(path)}
            if t is not None
        ]
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
