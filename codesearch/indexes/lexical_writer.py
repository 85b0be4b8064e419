"""Writing the lexical index (`codesearch.indexes.lexical`): segments streamed from the store,
updates by whole files, a bounded merge policy, centrality, and the commit.

Memory is bounded by the segment size, not the repository: chunks are read from the store
one at a time (`Store.iter_file_chunks`), and a segment is written to disk once it holds
`ROWS_PER_SEGMENT` rows. An update writes the changed files into a new segment and marks
their old rows dead; merges rewrite at most `ROWS_PER_SEGMENT` live rows at a time.

Merge policy: after an update, a segment whose live rows fell below half of its rows is
rewritten (its dead rows dropped; one with none live is dropped outright), and once
`MAX_SMALL` segments of fewer than `ROWS_PER_SEGMENT // 8` rows pile up they are merged.
Inputs are packed, in order, into outputs of at most `ROWS_PER_SEGMENT` live rows. So all
segments but a few small ones hold at least 1/16 of `ROWS_PER_SEGMENT` live rows: their
number grows with the live rows, not with the updates, and a query's work per segment is a
bisection per term.

Centrality (`codesearch.indexes.features.file_users`) is computed for every file when the
index is built, and again once the files written since then reach `CENTRALITY_REFRESH` of
the live files (or on any change while the repository has at most `CENTRALITY_ALWAYS`
files). In between, a new or changed file's count is computed exactly against the whole
current index, and the other files keep theirs: a new file's uses of older names are
counted at the next full computation, never wrongly (the counts only lag).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import weakref
from array import array
from collections import _count_elements  # `Counter`'s counting loop, in C
from collections.abc import Iterable, Iterator
from itertools import chain, groupby, repeat
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from codesearch.indexes.features import (
    centrality_top,
    exact_names,
    file_users,
    labels_owner,
    name_terms,
    norm_ident,
    part_tokens,
    stem_and_parent,
    stem_terms,
    symbol_names,
)
from codesearch.indexes.lexical import (
    _WORD_RE,
    IMPORTS,
    OVERLAPS,
    SIZE_KEYS,
    TABLES,
    TEST_CODE,
    LexicalIndex,
    Manifest,
    SegmentEntry,
    _expand,
    _word_tokens,
    commit,
)
from codesearch.indexes.lexical_arrays import corrupt, encode, pack_strings, write_arrays
from codesearch.types import path_kind
from codesearch.workers import leave_signals_to_the_parent, start_method, stop_workers

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.store import Store

__all__ = ["ROWS_PER_SEGMENT", "build", "commit", "update"]  # (`commit` is the format's, in `lexical`)

log = logging.getLogger("codesearch.indexes.lexical")

#: Rows a segment takes before it is written (a file's chunks always share one segment).
#: ~3M postings at ~100 distinct terms a chunk: the writer's peak stays near 350 MB.
ROWS_PER_SEGMENT = 32768
#: Segments under ROWS_PER_SEGMENT // 8 rows are merged once this many pile up.
MAX_SMALL = 8
#: Centrality is computed for every file again once the files written since reach this
#: share of the live files ...
CENTRALITY_REFRESH = 0.05
#: ... and on every change while the repository has at most this many files.
CENTRALITY_ALWAYS = 20_000


class Vocabulary:
    """The words and keys of the segments one run writes: a word is split, stemmed and its
    terms numbered once per run, not once per segment (re-learning each 32k-row segment's
    words was a third of the writer's time on 114k files); so are a symbol's names and every
    other table's keys (re-keying a symbol's names per segment was a tenth of it). Bounded:
    a run starts a new one once it holds `MAX_WORDS` words."""

    def __init__(self, stem: bool) -> None:
        self.stem = stem
        # Per table: key -> id, in first-seen order (a segment writes the ones it uses).
        self.keys: dict[str, dict[bytes, int]] = {t: {} for t in TABLES}
        self.terms = self.keys["terms"]
        self.words: dict[str, int] = {}  # regex word -> id
        self.word_tids = array("i")  # the terms of word w: word_tids[word_off[w]:word_off[w + 1]]
        self.word_off = array("q", [0])
        # symbol -> (symbols key ids, exact key ids, defined terms (`name_terms`, encoded))
        self.symbols: dict[str, tuple[tuple[int, ...], tuple[int, ...], frozenset[bytes]]] = {}
        # A file's path work done once per folder: its parent folder's name -> the key ids of
        # its path words (`part_tokens`); its folder -> `path_terms` of the folder.
        self.parents: dict[str, frozenset[int]] = {}
        self.folders: dict[str, frozenset[int]] = {}
        # Per table: the key ids in byte order of their keys, as of the last `in_order`.
        self.ordered: dict[str, np.ndarray] = {t: np.zeros(0, np.int64) for t in TABLES}

    def key(self, table: str, key: bytes) -> int:
        keys = self.keys[table]
        k = keys.get(key)
        if k is None:
            k = keys[key] = len(keys)
        return k

    def in_order(self, table: str) -> np.ndarray:
        """Every key id of ``table`` in byte order of the keys (the order a segment's table is
        written in): only the keys new since the last call sorted, then merged in (Timsort
        merges two sorted runs in linear time), not the run's keys sorted again per segment."""
        done = self.ordered[table]
        if len(done) < len(self.keys[table]):
            keys = list(self.keys[table])
            new = sorted(range(len(done), len(keys)), key=keys.__getitem__)
            merged = sorted(done.tolist() + new, key=keys.__getitem__) if len(done) else new
            done = self.ordered[table] = np.array(merged, dtype=np.int64)
        return done

    def symbol(self, symbol: str) -> tuple[tuple[int, ...], tuple[int, ...], frozenset[bytes]]:
        """A chunk symbol's names as key ids of the symbols (lower-cased) and exact tables,
        and the terms it defines (`name_terms`)."""
        got = self.symbols.get(symbol)
        if got is None:
            names = symbol_names(symbol)
            got = self.symbols[symbol] = (
                tuple(self.key("symbols", encode(n)) for n in names),
                tuple(self.key("exact", encode(n)) for n in exact_names(symbol)),
                frozenset(encode(t) for t in name_terms(names)))
        return got

    def new_word(self, word: str) -> int:
        self.word_tids.extend([self.key("terms", t.encode()) for t in _word_tokens(word, self.stem)])
        self.word_off.append(len(self.word_tids))
        w = self.words[word] = len(self.words)
        return w

    def path_words(self, part: str) -> frozenset[int]:
        """Key ids of the path words (`part_tokens`) of one part of a path."""
        return frozenset(self.key("pathwords", encode(w)) for w in part_tokens(part))

    def parent_words(self, parent: str) -> frozenset[int]:
        """`path_words` of a parent folder's name, once per run."""
        got = self.parents.get(parent)
        if got is None:
            got = self.parents[parent] = self.path_words(parent)
        return got

    def path_terms(self, text: str) -> tuple[frozenset[int], bool]:
        """The ids of `tokenize` ``text``'s tokens that are terms, and whether that is final:
        every word of ``text`` is known, so no later chunk can add a term of it."""
        out: set[int] = set()
        final = True
        for w in _WORD_RE.findall(text):
            i = self.words.get(w)
            if i is not None:
                out.update(self.word_tids[self.word_off[i] : self.word_off[i + 1]])
            else:
                final = False
                out.update(t for tok in _word_tokens(w, self.stem) if (t := self.terms.get(tok.encode())) is not None)
        return frozenset(out), final

    def folder_terms(self, folder: str) -> frozenset[int]:
        """`path_terms` of a file's folder, kept once final."""
        got = self.folders.get(folder)
        if got is None:
            got, final = self.path_terms(folder)
            if final:
                self.folders[folder] = got
        return got


#: A chunk's row flags by its kind.
_KIND_FLAGS = {"test": TEST_CODE, "imports": IMPORTS}

#: A run's `Vocabulary` is started afresh past this many words (~100 MB).
MAX_WORDS = 500_000


class SegmentBuilder:
    """One segment in the making: whole files added (tokenized from the store's chunks, or
    copied from another segment), written by `finish`."""

    def __init__(self, folder: Path, *, stem: bool, vocab: Vocabulary | None = None) -> None:
        self.folder = folder
        self.stem = stem
        self.vocab = vocab or Vocabulary(stem)
        self.ids = array("q")
        self.row_file = array("i")
        self.lines = array("i")
        self.lang = array("H")
        self.flags = array("B")
        self.length = array("i")
        self.languages: dict[str, int] = {}
        # Per table: the postings as (key id, value) pairs (key ids: the vocabulary's).
        self.post_key: dict[str, array] = {t: array("i") for t in TABLES}
        self.post_val: dict[str, array] = {t: array("i") for t in TABLES}
        self.tf = array("I")
        self.ordered = True  # every table's values added in ascending order (no file copied in)
        self.file_ids = array("q")
        self.file_rows = array("q", [0])
        self.file_kind = array("b")
        self.file_flags = array("B")
        self.paths: list[bytes] = []
        self.defs: list[bytes] = []
        self.file_defs = array("q", [0])
        self.own_terms = array("i")
        self.own_off = array("q", [0])
        # Tokenized rows: per distinct word of each chunk, the word's id (in the vocabulary)
        # and count; per chunk, its number of distinct words.
        self.w_ids = array("i")
        self.w_cnt = array("I")
        self.row_words = array("I")

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    def add_file(self, file_id: int, path: str, chunks: list[tuple]) -> None:
        """Add one file: its chunks as `Store.iter_file_chunks` rows.

        A chunk's words are counted (`_counts` over the regex matches, in C) and each
        distinct word's term ids looked up once per run (`Vocabulary`); the (word, count)
        pairs are kept flat and turned into term counts per row by numpy in `finish`: the
        per-token Python work of counting into a dict was most of a large build. The flat
        arrays grow once per file, not per chunk.
        """
        vocab = self.vocab
        f = len(self.file_ids)
        r0 = len(self.ids)
        # The chunks' columns: (id, file_id, path, start_line, end_line, language, symbol,
        # kind, scope, header, text).
        ids, _, _, starts, ends, languages, symbols, kinds, scopes, headers, texts = zip(*chunks)
        findall = _WORD_RE.findall
        # The encoder text: header, then code.
        counts = [_counts(findall(h + "\n" + t)) for h, t in zip(headers, texts)]
        wids = list(map(vocab.words.get, chain.from_iterable(counts)))
        if None in wids:  # new words, numbered in the order they first occur
            words = list(chain.from_iterable(counts))
            get, new_word = vocab.words.get, vocab.new_word
            for i in [i for i, w in enumerate(wids) if w is None]:
                w = get(words[i])
                wids[i] = w if w is not None else new_word(words[i])
        # (`fromlist`: half the time of `extend`, which grows the array item by item.)
        self.w_ids.fromlist(wids)
        self.w_cnt.fromlist(list(chain.from_iterable(map(dict.values, counts))))
        self.row_words.extend(map(len, counts))
        defined: set[bytes] = set()
        sym_keys: list[int] = []
        sym_rows: list[int] = []
        exact_keys: list[int] = []
        exact_rows: list[int] = []
        for r, symbol, scope in zip(range(r0, r0 + len(chunks)), symbols, scopes):
            if symbol and not labels_owner(symbol, scope):
                lower, exact, terms = vocab.symbol(symbol)
                defined |= terms
                sym_keys += lower
                sym_rows += [r] * len(lower)
                exact_keys += exact
                exact_rows += [r] * len(exact)
        self.post_key["symbols"].extend(sym_keys)
        self.post_val["symbols"].extend(sym_rows)
        self.post_key["exact"].extend(exact_keys)
        self.post_val["exact"].extend(exact_rows)
        n = len(chunks)
        self.ids.extend(ids)
        self.row_file.extend([f] * n)
        self.lines.extend(chain.from_iterable(zip(starts, ends)))
        langs = self.languages
        self.lang.extend([langs.setdefault(x, len(langs)) for x in languages])
        self.flags.extend(map(_KIND_FLAGS.get, kinds, repeat(0)))
        self.length.extend([-1] * n)  # counted in `finish`
        stem, parent = stem_and_parent(path)
        defs = sorted(defined.union(map(encode, stem_terms(stem))))  # `defined_terms`
        self._add_file_row(file_id, path, len(self.ids), _overlaps(list(zip(starts, ends))), defs)
        pathwords = vocab.path_words(stem) | vocab.parent_words(parent) if parent else vocab.path_words(stem)
        self.post_key["pathwords"].extend(pathwords)
        self.post_val["pathwords"].extend([f] * len(pathwords))
        self.post_key["stems"].append(vocab.key("stems", encode(norm_ident(stem))))
        self.post_val["stems"].append(f)
        # `tokenize(path)`'s terms: its folder's words, then its name's ("/" splits words).
        folder, _, name = path.rpartition("/")
        self.own_terms.extend(sorted(vocab.folder_terms(folder) | vocab.path_terms(name)[0]))
        self.own_off.append(len(self.own_terms))

    def _add_file_row(self, file_id: int, path: str | bytes, end_row: int, overlaps: bool, defs: list[bytes]) -> None:
        self.file_ids.append(file_id)
        self.file_rows.append(end_row)
        self.file_kind.append(path_kind(path if isinstance(path, str) else path.decode("utf-8", "surrogateescape")))
        self.file_flags.append(OVERLAPS if overlaps else 0)
        self.paths.append(encode(path) if isinstance(path, str) else path)
        self.defs += defs
        self.file_defs.append(len(self.defs))

    def add_from(self, index: LexicalIndex, s: int, local_files: np.ndarray) -> None:
        """Copy files ``local_files`` (ascending) of segment ``s`` of ``index``: their rows,
        features and postings, nothing tokenized again."""
        seg = index.segments[s]
        a = seg.arrays
        fr = a["file_rows"]
        start = fr[local_files]
        counts = fr[local_files + 1] - start
        old_rows = _expand(start, counts)
        if len(old_rows) and (seg.files_of_rows(old_rows) != np.repeat(local_files, counts)).any():
            raise corrupt(a.path, "rows outside their files")
        row0, file0 = len(self.ids), len(self.file_ids)
        remap = np.full(seg.n, -1, dtype=np.int64)
        remap[old_rows] = row0 + np.arange(len(old_rows))
        fremap = np.full(seg.m, -1, dtype=np.int64)
        fremap[local_files] = file0 + np.arange(len(local_files))
        _extend(self.ids, a["ids"][old_rows], "q")
        _extend(self.row_file, fremap[a["row_file"][old_rows]], "i")
        _extend(self.lines, a["lines"][old_rows].reshape(-1), "i")
        names = seg.entry.languages
        codes = np.asarray(a["lang"][old_rows], dtype=np.int64)
        if len(codes) and codes.max() >= len(names):
            raise corrupt(a.path, "a language code out of range")
        lang_map = np.array([self.languages.setdefault(x, len(self.languages)) for x in names] or [0], np.int64)
        _extend(self.lang, lang_map[codes], "H")
        _extend(self.flags, a["flags"][old_rows], "B")
        _extend(self.length, np.maximum(a["length"][old_rows], 0), "i")
        defs = seg.defs.all()
        fd = a["file_defs"]
        terms = seg.tables["terms"].table.all()
        own_off, own_terms = a["own_off"], a["own_terms"]
        ends = (row0 + np.cumsum(counts)).tolist()
        for f, end in zip(local_files.tolist(), ends):
            lo, hi = int(fd[f]), int(fd[f + 1])
            olo, ohi = int(own_off[f]), int(own_off[f + 1])
            if not (0 <= lo <= hi <= len(defs) and 0 <= olo <= ohi <= len(own_terms)):
                raise corrupt(a.path, "file offsets out of range")
            self._add_file_row(int(a["file_ids"][f]), seg.paths.get(f), end, bool(a["file_flags"][f] & OVERLAPS),
                               defs[lo:hi])
            own = own_terms[olo:ohi]
            if len(own) and (own.min() < 0 or own.max() >= len(terms)):
                raise corrupt(a.path, "own terms out of range")
            self.own_terms.extend(sorted({self.vocab.key("terms", terms[t]) for t in own.tolist()}))
            self.own_off.append(len(self.own_terms))
        for table, kind in TABLES.items():
            inv = seg.tables[table]
            keys = inv.table.all() if table != "terms" else terms
            post = np.asarray(a[f"{table}_post"])
            vals = a[f"{table}_vals"]
            if post[0] != 0 or post[-1] != len(vals) or (np.diff(post) < 0).any():
                raise corrupt(a.path, f"{table} postings out of order")
            key_of = np.repeat(np.arange(len(keys), dtype=np.int64), np.diff(post))
            v = np.asarray(vals, dtype=np.int64)
            limit = seg.n if kind == "rows" else seg.m
            if len(v) and (v.min() < 0 or v.max() >= limit):
                raise corrupt(a.path, f"{table} postings out of range")
            new = (remap if kind == "rows" else fremap)[v]
            keep = new >= 0
            ids = np.array([self.vocab.key(table, k) for k in keys] or [0], dtype=np.int64)
            _extend(self.post_key[table], ids[key_of[keep]], "i")
            _extend(self.post_val[table], new[keep], "i")
            if table == "terms":
                _extend(self.tf, np.asarray(a["terms_tf"])[keep], "I")
        self.ordered = False

    def finish(self) -> SegmentEntry | None:
        """Write the segment (sorted tables, postings by key then value); None when empty."""
        if not self.file_ids:
            return None
        name = f"seg-{secrets.token_hex(8)}"
        n, m = len(self.ids), len(self.file_ids)
        ids = np.frombuffer(self.ids, dtype=np.int64)
        # The tokenized rows' term counts: each (word, count) pair once per term of the word.
        # (Kept to 32-bit arrays, freed as soon as used: this is the writer's peak memory.)
        length = np.frombuffer(self.length, dtype=np.int32).copy()
        tokenized = np.flatnonzero(length < 0).astype(np.int32)
        word_off = np.frombuffer(self.vocab.word_off, dtype=np.int64)
        w_ids = np.frombuffer(self.w_ids, dtype=np.int32)
        w_cnt = np.frombuffer(self.w_cnt, dtype=np.uint32)
        row_words = np.frombuffer(self.row_words, dtype=np.uint32)
        w_len = np.diff(word_off).astype(np.int32)[w_ids]
        t_rows = np.repeat(np.repeat(tokenized, row_words), w_len)
        t_count = np.repeat(w_cnt, w_len)
        t_tids = np.frombuffer(self.vocab.word_tids, dtype=np.int32)[_spans(word_off[:-1][w_ids], w_len)]
        # A row's length: its words' counts times their numbers of terms, summed (a row's
        # words are adjacent).
        total = np.zeros(len(w_ids) + 1, dtype=np.int64)
        np.cumsum(w_cnt * w_len.astype(np.int64), out=total[1:])
        ends = np.cumsum(row_words, dtype=np.int64)
        length[tokenized] = total[ends] - total[ends - row_words]
        del w_len, total, ends
        file_rows = np.frombuffer(self.file_rows, dtype=np.int64)
        sizes = {"rows": n, "files": m}
        arrays: dict[str, np.ndarray] = {
            "ids": ids,
            "row_file": np.frombuffer(self.row_file, dtype=np.int32),
            "lines": np.frombuffer(self.lines, dtype=np.int32).reshape(n, 2),
            "lang": np.frombuffer(self.lang, dtype=np.uint16),
            "flags": np.frombuffer(self.flags, dtype=np.uint8),
            "length": length,
            "ids_rows": np.argsort(ids, kind="stable").astype(np.int32),
            "file_ids": np.frombuffer(self.file_ids, dtype=np.int64),
            "file_rows": file_rows,
            "file_len": np.add.reduceat(length.astype(np.int64), file_rows[:-1]),  # every file has a row
            "file_kind": np.frombuffer(self.file_kind, dtype=np.int8),
            "file_flags": np.frombuffer(self.file_flags, dtype=np.uint8),
            "file_defs": np.frombuffer(self.file_defs, dtype=np.int64),
            "own_off": np.frombuffer(self.own_off, dtype=np.int64),
        }
        arrays["ids_sorted"] = ids[arrays["ids_rows"]]
        arrays["fids_files"] = np.argsort(arrays["file_ids"], kind="stable").astype(np.int32)
        arrays["fids_sorted"] = arrays["file_ids"][arrays["fids_files"]]
        arrays["paths"], arrays["paths_off"] = pack_strings(self.paths)
        sizes["paths_bytes"] = len(arrays["paths"])
        arrays["defs"], arrays["defs_off"] = pack_strings(self.defs)
        sizes["defs"], sizes["defs_bytes"] = len(self.defs), len(arrays["defs"])
        for table in TABLES:
            keys = np.frombuffer(self.post_key[table], dtype=np.int32)
            vals = np.frombuffer(self.post_val[table], dtype=np.int32)
            counts = None
            if table == "terms":
                keys = np.concatenate([t_tids, keys])
                vals = np.concatenate([t_rows, vals])
                counts = np.concatenate([t_count, np.frombuffer(self.tf, dtype=np.uint32)])
                del t_tids, t_rows, t_count
            rank = self._write_table(table, keys, vals, counts, arrays, sizes)
            del keys, vals, counts
            if table == "terms":
                # A file's own path terms: in its rows (every chunk's header holds the path),
                # each file's in byte order of the terms (as the table), so a segment does not
                # depend on the run's numbering of its words (worker processes number their own).
                own = rank[np.frombuffer(self.own_terms, dtype=np.int32).astype(np.int64)]
                own_files = np.repeat(np.arange(m, dtype=np.int64), np.diff(arrays["own_off"]))
                arrays["own_terms"] = own[np.lexsort((own, own_files))].astype(np.int32)
                assert not (arrays["own_terms"] < 0).any()
                sizes["own"] = len(own)
        assert set(sizes) == set(SIZE_KEYS), set(sizes) ^ set(SIZE_KEYS)
        write_arrays(self.folder / f"{name}.bin", arrays)
        langs = sorted(self.languages, key=self.languages.__getitem__)
        return SegmentEntry(name, sizes, tuple(langs))

    def _write_table(self, table: str, keys: np.ndarray, vals: np.ndarray, counts: np.ndarray | None,
                     arrays: dict[str, np.ndarray], sizes: dict[str, int]) -> np.ndarray:
        """The sorted table ``table`` and its postings: (key, value) pairs ordered by key (in
        byte order), then value, the counts of equal pairs summed (terms)."""
        every = list(self.vocab.keys[table])
        # The keys this segment uses (a run's keys are shared by its segments), in byte order.
        in_order = self.vocab.in_order(table)
        if len(keys):
            in_order = in_order[np.bincount(keys, minlength=len(every))[in_order] > 0]
        else:
            in_order = in_order[:0]
        strings = list(map(every.__getitem__, in_order.tolist()))
        rank = np.full(len(every), -1, dtype=np.int32)
        rank[in_order] = np.arange(len(strings), dtype=np.int32)
        rk = rank[keys] if len(keys) else np.zeros(0, np.int32)
        # Values come in ascending order (rows, files, as added) unless files were copied
        # from other segments: then both keys order.
        perm = _stable_order(rk) if self.ordered else np.lexsort((vals, rk))
        rk, vals = rk[perm], vals[perm]
        first = np.flatnonzero(np.r_[True, (rk[1:] != rk[:-1]) | (vals[1:] != vals[:-1])]) if len(rk) else perm[:0]
        arrays[table], arrays[f"{table}_off"] = pack_strings(strings)
        post = np.zeros(len(strings) + 1, dtype=np.int64)
        np.cumsum(np.bincount(rk[first], minlength=len(strings)), out=post[1:])
        arrays[f"{table}_post"] = post
        arrays[f"{table}_vals"] = vals[first].astype(np.int32)
        if counts is not None:
            tf = np.add.reduceat(counts[perm], first) if len(first) else np.zeros(0, np.uint32)
            arrays["terms_tf"] = tf.astype(np.uint16) if not len(tf) or tf.max() < 1 << 16 else tf.astype(np.uint32)
        sizes[table], sizes[f"{table}_bytes"], sizes[f"{table}_postings"] = (
            len(strings), len(arrays[table]), len(arrays[f"{table}_vals"]))
        return rank.astype(np.int64)


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of non-negative int32 keys, as two 16-bit radix
    passes (numpy sorts 16-bit integers by radix): a third of the time of the 32-bit sort,
    which was the largest part of writing a segment's postings."""
    low = (keys & 0xFFFF).astype(np.uint16)
    order = np.argsort(low, kind="stable")
    if len(keys) and int(keys.max()) >= 1 << 16:
        order = order[np.argsort((keys >> 16).astype(np.uint16)[order], kind="stable")]
    return order


def _counts(words: list[str]) -> dict[str, int]:
    """``Counter(words)`` as a plain dict, without `Counter`'s Python-level set-up (2 us a
    chunk: 1.5 s of a 600k-chunk build)."""
    counts: dict[str, int] = {}
    _count_elements(counts, words)
    return counts


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`lexical._expand` (``concatenate([arange(s, s + c) ...])``) in 32-bit integers when
    they hold it: half the memory traffic over a segment's millions of postings."""
    ends = np.cumsum(counts, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    if total >= 1 << 31 or (len(starts) and int(starts.max()) >= 1 << 31):
        return _expand(starts, counts)
    ends = ends.astype(np.int32)
    return np.repeat(starts.astype(np.int32) - (ends - counts), counts) + np.arange(total, dtype=np.int32)


def _extend(arr: array, values: np.ndarray, code: str) -> None:
    arr.frombytes(np.ascontiguousarray(values, dtype=np.dtype(code)).tobytes())


def _overlaps(spans: list[tuple[int, int]]) -> bool:
    """Whether two of a file's chunks share a line."""
    end = None
    for s, e in sorted(spans):
        if end is not None and s <= end:
            return True
        end = e if end is None else max(end, e)
    return False


def _by_file(rows: Iterable[tuple]) -> Iterator[tuple[int, str, list[tuple]]]:
    """`Store.iter_file_chunks` rows grouped: (file id, path, chunks)."""
    for file_id, group in groupby(rows, itemgetter(1)):
        chunks = list(group)
        yield file_id, chunks[0][2], chunks


def _write_segments(folder: Path, rows: Iterable[tuple], stem: bool, per_segment: int | None = None
                    ) -> list[SegmentEntry]:
    """Segments of the files in ``rows``, each written once it reaches ``per_segment``
    (`ROWS_PER_SEGMENT`) rows."""
    per_segment = ROWS_PER_SEGMENT if per_segment is None else per_segment
    entries: list[SegmentEntry] = []
    vocab = Vocabulary(stem)
    builder = SegmentBuilder(folder, stem=stem, vocab=vocab)
    for file_id, path, chunks in _by_file(rows):
        builder.add_file(file_id, path, chunks)
        if builder.n_rows >= per_segment:
            entries.append(builder.finish())  # type: ignore[arg-type]
            if len(vocab.words) > MAX_WORDS:
                vocab = Vocabulary(stem)
            builder = SegmentBuilder(folder, stem=stem, vocab=vocab)
    last = builder.finish()
    return entries + ([last] if last is not None else [])


# ---- the index as a whole --------------------------------------------------------------


def build(store: Store, folder: Path, *, k1: float = 1.2, b: float = 0.75, stem: bool = True,
          stopwords: bool = True, parallel: bool = False) -> LexicalIndex:
    """The lexical index of every chunk in ``store``, written into ``folder`` (made if
    missing) and not yet committed: `commit` (``save``) makes it the folder's index.

    ``parallel``: a caller that holds the index lock (no run commits while the workers read
    the store) lets a large build write its segments in worker processes (`_write_all`)."""
    if folder.exists() and not folder.is_dir():
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    entries = _write_all(folder, store, stem) if parallel else _write_segments(folder, store.iter_file_chunks(), stem)
    n_files = sum(e.sizes["files"] for e in entries)
    params = Manifest(k1, b, stem, stopwords, (), "state-0000000000000000", 0, 0, 0, 0.0, 0)
    return _finish(folder, params, entries, np.ones(n_files, np.uint8), np.zeros(n_files, np.float32),
                   new_files=None, stale=0)


#: A build of at least this many rows writes its segments in as many processes as there are
#: cores, each a run of consecutive segments (the segments a single process writes, byte for
#: byte: a segment's files, tables and postings do not depend on the vocabulary's numbering).
#: Forked workers start at once; forkserver workers (a caller with threads: the daemon)
#: import numpy and this module first.
PARALLEL_MIN_ROWS = 20_000
PARALLEL_MIN_ROWS_FORKSERVER = 40_000


def _write_all(folder: Path, store: Store, stem: bool) -> list[SegmentEntry]:
    """`_write_segments` of every file in ``store``: in worker processes when the build is
    big enough and they can read the store as this process does (a committed store on disk,
    no transaction of this process's open), else here."""
    method = start_method()
    groups = _groups(store, method)
    if groups is None:
        return _write_segments(folder, store.iter_file_chunks(), stem)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    per_segment = ROWS_PER_SEGMENT
    done: dict[int, list[SegmentEntry]] = {}
    try:
        pool = ProcessPoolExecutor(len(groups) - 1, mp_context=ctx, initializer=leave_signals_to_the_parent)
    except OSError:  # no process to be had: this one writes them all
        pool = None
    try:
        futures = [] if pool is None else [
            pool.submit(_write_group, store.path, folder, stem, per_segment, g) for g in groups[1:]]
        done[0] = _write_segments(folder, store.iter_file_chunks(between=groups[0][:2]), stem, per_segment)
        for i, future in enumerate(futures, start=1):
            try:
                done[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - its files are written here (a real error shows then)
                log.warning("a lexical segment worker failed (%s); writing its %d files here", exc, groups[i][3])
    except BaseException:  # Ctrl-C: the workers ignore it, and their segments are not wanted
        if pool is not None:
            stop_workers(pool)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    entries: list[SegmentEntry] = []
    for i, group in enumerate(groups):
        got = done.get(i)
        if got is not None and (sum(e.sizes["rows"] for e in got), sum(e.sizes["files"] for e in got)) != group[2:]:
            log.warning("a lexical segment worker read other rows than planned (the store changed?); writing "
                        "its %d files here", group[3])
            got = None
        if got is None:
            got = _write_segments(folder, store.iter_file_chunks(between=group[:2]), stem, per_segment)
        entries += got
    return entries


def _write_group(store_path: str, folder: Path, stem: bool, per_segment: int,
                 group: tuple[int, int, int, int]) -> list[SegmentEntry]:
    """A worker's part of `_write_all`: the segments of the files with ids in ``group``."""
    from codesearch.store import Store

    with Store(store_path, readonly=True) as store:
        return _write_segments(folder, store.iter_file_chunks(between=group[:2]), stem, per_segment)


def _groups(store: Store, method: str) -> list[tuple[int, int, int, int]] | None:
    """``(first file id, last file id, rows, files)`` of each worker's run of consecutive
    segments, cut where one process would cut them; None when the build is written here."""
    n_workers = os.cpu_count() or 1
    if n_workers < 2 or store.path == ":memory:" or store.conn.in_transaction:
        return None
    counts = store.chunk_counts()
    total = sum(n for _, n in counts)
    if total < (PARALLEL_MIN_ROWS if method == "fork" else PARALLEL_MIN_ROWS_FORKSERVER):
        return None
    # Where one process cuts: after the file that brings a segment to ROWS_PER_SEGMENT rows.
    ends: list[int] = []  # index in counts of each segment's last file
    rows = 0
    for i, (_, n) in enumerate(counts):
        rows += n
        if rows >= ROWS_PER_SEGMENT:
            ends.append(i)
            rows = 0
    if not ends or ends[-1] != len(counts) - 1:
        ends.append(len(counts) - 1)
    n_groups = min(n_workers, len(ends))
    if n_groups < 2:
        return None
    # Consecutive segments, as many a group (all but the last hold about ROWS_PER_SEGMENT rows).
    cum = np.cumsum([n for _, n in counts])
    groups: list[tuple[int, int, int, int]] = []
    first = 0
    for g in range(1, n_groups + 1):
        last = ends[g * len(ends) // n_groups - 1]
        rows_in = int(cum[last] - (cum[first - 1] if first else 0))
        groups.append((counts[first][0], counts[last][0], rows_in, last - first + 1))
        first = last + 1
    return groups


def update(
    index: LexicalIndex, store: Store, removed_files: Iterable[int], changed_files: Iterable[int]
) -> LexicalIndex:
    """``index`` with ``removed_files`` gone and ``changed_files`` (store file ids) written
    again from ``store``, merged as the policy says; not yet committed."""
    folder = index.folder
    changed = sorted({int(f) for f in changed_files})
    gone = index.files_of(np.array(sorted({int(f) for f in removed_files} | set(changed)), dtype=np.int64))
    live = np.array(index.live, dtype=np.uint8)
    live[gone[gone >= 0]] = 0
    users = np.array(index.users(np.arange(index.n_files)), dtype=np.float32)
    new = _write_segments(folder, store.iter_file_chunks(changed), index.stem) if changed else []
    n_new = sum(e.sizes["files"] for e in new)
    entries = [*index.manifest.segments, *new]
    live = np.concatenate([live, np.ones(n_new, np.uint8)])
    users = np.concatenate([users, np.zeros(n_new, np.float32)])
    fresh = np.concatenate([np.zeros(index.n_files, bool), np.ones(n_new, bool)])
    entries, live, (users, fresh) = _merge(folder, index.manifest, entries, live, (users, fresh))
    return _finish(folder, index.manifest, entries, live, users, new_files=np.flatnonzero(fresh),
                   stale=index.manifest.stale_files + n_new)


def _merge(folder: Path, params: Manifest, entries: list[SegmentEntry], live: np.ndarray,
           carried: tuple[np.ndarray, ...]) -> tuple[list[SegmentEntry], np.ndarray, tuple[np.ndarray, ...]]:
    """Apply the merge policy (module doc): drop segments with no live row, rewrite the
    ones mostly dead, merge small ones once MAX_SMALL pile up. ``carried``: per-file arrays
    that move with their files."""
    view = _view(folder, params, entries, live, carried[0])
    base = view.file_base
    live_rows = []
    for s, seg in enumerate(view.segments):
        alive = live[base[s] : base[s + 1]] != 0
        live_rows.append(int(np.diff(np.asarray(seg.arrays["file_rows"]))[alive].sum()))
    small = [s for s, e in enumerate(entries) if 0 < live_rows[s] and e.sizes["rows"] < ROWS_PER_SEGMENT // 8]
    chosen = {s for s, e in enumerate(entries) if 0 < live_rows[s] < e.sizes["rows"] / 2}
    if len(small) >= MAX_SMALL:
        chosen |= set(small)
    dropped = {s for s in range(len(entries)) if live_rows[s] == 0}
    if not chosen and not dropped:
        return entries, live, carried
    groups: list[list[int]] = []
    size = 0
    for s in sorted(chosen):
        if not groups or size + live_rows[s] > ROWS_PER_SEGMENT:
            groups.append([])
            size = 0
        groups[-1].append(s)
        size += live_rows[s]
    kept = [s for s in range(len(entries)) if s not in chosen and s not in dropped]
    out_entries = [entries[s] for s in kept]
    out_live = [live[base[s] : base[s + 1]] for s in kept]
    out = [[c[base[s] : base[s + 1]] for s in kept] for c in carried]
    for group in groups:
        builder = SegmentBuilder(folder, stem=params.stem)
        moved: list[np.ndarray] = []
        for s in group:
            files = np.flatnonzero(live[base[s] : base[s + 1]]).astype(np.int64)
            builder.add_from(view, s, files)
            view.segments[s].arrays.release()
            moved.append(base[s] + files)
        entry = builder.finish()
        if entry is not None:
            out_entries.append(entry)
            out_live.append(np.ones(entry.sizes["files"], np.uint8))
            at = np.concatenate(moved)
            for o, c in zip(out, carried):
                o.append(c[at])
    view.close()
    joined = tuple(np.concatenate(o) if o else c[:0] for o, c in zip(out, carried))
    return out_entries, np.concatenate(out_live) if out_live else live[:0], joined


def _view(folder: Path, params: Manifest, entries: list[SegmentEntry], live: np.ndarray,
          users: np.ndarray) -> LexicalIndex:
    """An index over ``entries`` with this liveness, before any state file is written."""
    manifest = Manifest(params.k1, params.b, params.stem, params.stopwords, tuple(entries), params.state,
                        0, 0, 0, params.top, params.stale_files)
    return LexicalIndex(folder, manifest, live=live, users=users)


def _finish(folder: Path, params: Manifest, entries: list[SegmentEntry], live: np.ndarray, users: np.ndarray,
            *, new_files: np.ndarray | None, stale: int) -> LexicalIndex:
    """Totals, centrality and the state files of ``entries``; the index, not yet committed."""
    view = _view(folder, params, entries, live, users)
    rows = files = length = 0
    for s, seg in enumerate(view.segments):
        alive = live[view.file_base[s] : view.file_base[s + 1]] != 0
        fr = np.asarray(seg.arrays["file_rows"])
        rows += int(np.diff(fr)[alive].sum())
        files += int(alive.sum())
        length += int(np.asarray(seg.arrays["length"], dtype=np.int64)[np.repeat(alive, np.diff(fr))].sum())
    everything = new_files is None or files <= CENTRALITY_ALWAYS or stale >= CENTRALITY_REFRESH * files
    if everything:
        users = compute_users(view, None, files)
        stale = 0
    elif len(new_files):
        users = users.copy()
        users[new_files] = compute_users(view, new_files, files)[new_files]
    users[live == 0] = 0
    top = centrality_top(users[live != 0]) if files else 0.0
    state = f"state-{secrets.token_hex(8)}"
    write_arrays(folder / f"{state}.bin", {"live": live.astype(np.uint8), "users": users.astype("<f4")})
    manifest = Manifest(params.k1, params.b, params.stem, params.stopwords, tuple(entries), state,
                        rows, files, length, top, stale)
    view.close()
    return LexicalIndex(folder, manifest)


def compute_users(
    view: LexicalIndex, files: np.ndarray | None, n_live: int, *, exact_max_users: int = 1000
) -> np.ndarray:
    """`file_users` of ``files`` (every live file when None) against the whole index:
    per file, how many other live files use a name it defines."""
    n = view.n_files
    # The defined terms of the files asked about, numbered in first-seen order.
    dmap: dict[bytes, int] = {}
    def_files, def_terms = array("q"), array("q")
    targets = view.live_files() if files is None else np.asarray(files, dtype=np.int64)
    for s, lo, hi in view._spans(np.sort(targets), view.file_base):
        seg = view.segments[s]
        defs = seg.defs.all()
        fd = np.asarray(seg.arrays["file_defs"])
        local = np.sort(targets)[lo:hi] - view.file_base[s]
        a, b = fd[local], fd[local + 1]
        if ((a < 0) | (a > b) | (b > len(defs))).any():
            raise corrupt(seg.arrays.path, "defined names out of range")
        _extend(def_files, np.repeat(local + view.file_base[s], b - a), "q")
        names = list(map(defs.__getitem__, _expand(a, b - a).tolist()))
        fresh = [d for d in dict.fromkeys(names) if d not in dmap]  # numbered in first-seen order
        dmap.update(zip(fresh, range(len(dmap), len(dmap) + len(fresh))))
        def_terms.extend(map(dmap.__getitem__, names))
    nd = len(dmap)
    df = np.zeros(nd, dtype=np.int64)
    dfile = np.frombuffer(def_files, dtype=np.int64)
    dterm = np.frombuffer(def_terms, dtype=np.int64)
    self_use = np.zeros(len(dfile), dtype=bool)
    use_keys: list[np.ndarray] = []
    exact_max = exact_max_users
    if not nd:
        return np.zeros(n, dtype=np.float32)
    for s, seg in enumerate(view.segments):
        d_of_tid, tids = _defined_in(seg, dmap, every=files is None)
        if not len(tids):
            continue
        post = np.asarray(seg.arrays["terms_post"])
        starts, ends = post[tids], post[tids + 1]
        if ((starts > ends) | (ends > seg.arrays["terms_vals"].shape[0]) | (starts < 0)).any():
            raise corrupt(seg.arrays.path, "term postings out of range")
        counts = ends - starts
        rows = np.asarray(seg.arrays["terms_vals"][_expand(starts, counts)], dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= seg.n):
            raise corrupt(seg.arrays.path, "term postings out of range")
        lf = seg.files_of_rows(rows)
        d = np.repeat(d_of_tid[tids], counts)
        # (defined term, local file) pairs, distinct: a term's postings ascend by row, so a
        # file's rows are adjacent in them.
        new = np.r_[True, (lf[1:] != lf[:-1]) | (d[1:] != d[:-1])] if len(lf) else np.zeros(0, bool)
        keys = np.sort(d[new] * seg.m + lf[new])
        # Not a use: a term a file holds only through its own path (every chunk's header).
        own_off = np.asarray(seg.arrays["own_off"])
        own_t = np.asarray(seg.arrays["own_terms"], dtype=np.int64)
        if own_off[0] != 0 or own_off[-1] != len(own_t) or (np.diff(own_off) < 0).any():
            raise corrupt(seg.arrays.path, "own terms out of order")
        if len(own_t) and (own_t.min() < 0 or own_t.max() >= len(d_of_tid)):
            raise corrupt(seg.arrays.path, "own terms out of range")
        own_files = np.repeat(np.arange(seg.m, dtype=np.int64), np.diff(own_off))
        own_d = d_of_tid[own_t] if len(own_t) else np.zeros(0, np.int64)
        own_keys = np.sort(own_d[own_d >= 0] * seg.m + own_files[own_d >= 0])
        keys = keys[~_member(keys, own_keys)]
        gfile = keys % seg.m + view.file_base[s]
        keys = keys[view.live[gfile] != 0]
        kd, kf = keys // seg.m, keys % seg.m + view.file_base[s]
        df += np.bincount(kd, minlength=nd)
        mine = (dfile >= view.file_base[s]) & (dfile < view.file_base[s + 1])
        if mine.any():
            self_use[mine] = _member(dterm[mine] * seg.m + (dfile[mine] - view.file_base[s]), keys)
        use_keys.append(kd * n + kf)
        seg.arrays.release()
        # Keep only the pairs of names still within the exact limit (bounded memory).
        uk = np.concatenate(use_keys)
        use_keys = [uk[df[uk // n] <= exact_max]]
    uk = np.concatenate(use_keys) if use_keys else np.zeros(0, np.int64)
    return file_users(dfile, dterm, df, uk // n, uk % n, self_use, n, n_live=n_live, exact_max_users=exact_max)


def _member(x: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """Whether each of ``x`` is in ``ascending`` (a bisection each: `np.isin` hashes both)."""
    if not len(ascending):
        return np.zeros(len(x), dtype=bool)
    at = np.searchsorted(ascending, x).clip(0, len(ascending) - 1)
    return ascending[at] == x


def _defined_in(seg, dmap: dict[bytes, int], *, every: bool) -> tuple[np.ndarray, np.ndarray]:
    """(defined-term number of each of the segment's terms, -1 for none; the term ids of the
    defined terms it holds). Every term read once when most are asked for, else bisected."""
    table = seg.tables["terms"].table
    if every:
        d_of_tid = np.fromiter(map(dmap.get, table.all(), repeat(-1)), dtype=np.int64, count=len(table))
    else:
        d_of_tid = np.full(len(table), -1, dtype=np.int64)
        for key, d in dmap.items():
            i = table.find(key)
            if i >= 0:
                d_of_tid[i] = d
    return d_of_tid, np.flatnonzero(d_of_tid >= 0)


def build_elsewhere(store: Store, path: Path | None) -> LexicalIndex:
    """`build` for a reader that cannot write ``path`` now (no lock): into a private folder,
    ``path/tmp-<pid>-<hex>`` when ``path`` is writable (`commit` moves it in later), else a
    temporary folder; either is deleted when the index object goes."""
    try:
        if path is None:
            raise OSError("no folder")
        path.mkdir(parents=True, exist_ok=True)
        folder = path / f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
        folder.mkdir()
    except OSError:
        folder = Path(tempfile.mkdtemp(prefix="codesearch-lexical-"))
    try:
        index = build(store, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(index, shutil.rmtree, folder, True)
    return index
