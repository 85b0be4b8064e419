"""An index run's side of the user's vector cache (`codesearch.store.cache`): what an index
lacks is looked up there before anything is chunked or encoded, and what is made is added.

**Vectors.** The key is the model's identity with its tokenizer's (`cache_model`), and the
hash of the exact text the encoder reads: for a chunk, its header (path and enclosing
signatures) and code; for a whole file, its name and the part of it the window holds. So a
vector is reused only for the very input it was made from, whatever the repository, branch
or chunking that produced that input.

**Chunks.** A file's chunks are keyed by everything `chunk_source` reads (`chunk_key`): the
file's content hash, its name, its language, and the chunking parameters (chunker and
grammar versions, the budget, the tokenizer that counts tokens). The name is in the key, not
rebuilt: it is in every chunk's header, and the header's tokens come out of each scope's
budget, so the same content under another name can be cut at other lines. A worktree or a
clone has the same names, so it reuses every unchanged file; a renamed file is chunked again.
The records hold line ranges, byte offsets and labels, not the text, which comes from the
file itself; records that do not fit the file read as a miss.

The cache is never needed: when it is off, unwritable or damaged, a run encodes as it did
before it existed, and an error of the cache never fails a run (it is logged, and the run
stops using it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch.errors import CodeSearchError
from codesearch.store.cache import UserCache
from codesearch.store.files import hash_bytes, hash_text
from codesearch.types import Chunk

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from codesearch.encoder.base import Encoder, TokenCounter

__all__ = ["Reuse", "cache_model", "chunk_key", "chunking_key", "tokenizer_identity", "vector_key"]

log = logging.getLogger(__name__)

#: What a failing cache raises (then the run goes on without it).
_CACHE_ERRORS = (CodeSearchError, sqlite3.Error, OSError)


#: Bumped when the chunk records' layout changes (`pack_chunks`).
CHUNK_RECORDS_VERSION = 1
#: The tokenizer files that change what ids a text becomes (the vocabulary, normaliser and
#: pre-tokeniser; the special tokens the heads add).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def vector_key(text: str) -> str:
    """The cache key of the vector of ``text`` as the encoder reads it."""
    return hash_text(text)


def tokenizer_identity(counter: TokenCounter) -> str | None:
    """A hash of the tokenizer files beside ``counter``'s ``tokenizer.json`` and the tokens
    its head adds; None for a counter that names no file (nothing to key it by)."""
    path = getattr(counter, "tokenizer_path", None)
    if path is None:
        return None
    folder = Path(path).parent
    stats = []
    for name in _TOKENIZER_FILES:
        try:
            st = os.stat(folder / name)
        except OSError:
            stats.append((name, None))
            continue
        stats.append((name, (st.st_size, st.st_mtime_ns, st.st_ino)))
    return f"{_files_hash(str(folder), tuple(stats))}+{int(getattr(counter, 'extra', 0))}"


@functools.lru_cache(maxsize=32)
def _files_hash(folder: str, stats: tuple) -> str:
    """xxh3 of the named files (memoised by their stat: hashed once per process)."""
    parts = []
    for name, st in stats:
        if st is None:
            continue
        try:
            data = Path(folder, name).read_bytes()
        except OSError:
            continue
        parts.append(f"{name}:{len(data)}:{hash_bytes(data)}")
    return hash_text("|".join(parts))[:16]


def cache_model(enc: Encoder) -> str:
    """The model part of ``enc``'s vector keys: its identity (weights, config, head) and its
    tokenizer's. The identity hashes no tokenizer file, so a changed ``tokenizer.json`` beside
    the same weights would otherwise take vectors made from other ids."""
    tok = tokenizer_identity(enc.token_counter())
    return enc.identity if tok is None else f"{enc.identity}+tok:{tok}"


@functools.lru_cache(maxsize=1)
def _grammars() -> str:
    """The versions of the parsers the chunker uses: a new grammar may cut other lines."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("tree-sitter", "tree-sitter-language-pack"):
        try:
            found.append(f"{package}={version(package)}")
        except PackageNotFoundError:
            found.append(f"{package}=-")
    return ",".join(found)


def chunking_key(budget: int, counter: TokenCounter | None) -> str | None:
    """Every chunking parameter of a run but the file's own (see `chunk_key`); None when
    the counter cannot be identified (then chunks are not cached)."""
    from codesearch.indexing.chunking import CHUNKER_VERSION

    count = "approx" if counter is None else tokenizer_identity(counter)
    if count is None:
        return None
    return json.dumps([CHUNK_RECORDS_VERSION, CHUNKER_VERSION, _grammars(), int(budget), count])


def chunk_key(chunking: str, name: str, language: str, content_hash: str) -> str:
    """The cache key of one file's chunks: `chunking_key`, the name its chunks' headers
    carry, its language, and the hash of its bytes."""
    return hash_text(json.dumps([chunking, name, language, content_hash]))


def pack_chunks(name: str, chunks: Sequence[Chunk]) -> bytes:
    """A file's chunks as cache records: JSON rows without the text (the file has it) or the
    name (the key has it)."""
    rows = []
    for c in chunks:
        if c.path != name or not c.header.startswith(name):
            raise ValueError(f"chunk of {c.path!r} is not one of {name!r}")
        rows.append([c.start_line, c.end_line, c.start_byte, c.end_byte, c.symbol, c.kind, c.scope,
                     c.header[len(name):]])
    return json.dumps(rows, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def unpack_chunks(data: bytes, name: str, text: str, language: str) -> list[Chunk] | None:
    """The chunks ``pack_chunks`` stored, with their text cut from ``text``; None when the
    records do not fit it (a damaged or foreign entry: a miss)."""
    try:
        rows = json.loads(data.decode("utf-8", "surrogatepass"))
        lines = text.split("\n")
        out = []
        for start, end, start_byte, end_byte, symbol, kind, scope, header in rows:
            if not (isinstance(start, int) and isinstance(end, int) and 1 <= start <= end <= len(lines)):
                return None
            if not (isinstance(start_byte, int) and isinstance(end_byte, int) and isinstance(kind, str)
                    and isinstance(header, str) and (symbol is None or isinstance(symbol, str))
                    and (scope is None or isinstance(scope, str))):
                return None
            out.append(Chunk(path=name, start_line=start, end_line=end, start_byte=start_byte, end_byte=end_byte,
                             language=language, symbol=symbol, kind=kind, scope=scope,
                             text="\n".join(lines[start - 1 : end]), header=name + header))
        return out
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


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

    def take_chunks(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Key -> chunk records (`pack_chunks`), for the files the cache holds."""
        if self.cache is None or not keys:
            return {}
        try:
            return self.cache.get_chunks(keys)
        except _CACHE_ERRORS as exc:
            self._give_up(exc)
            return {}

    def keep_chunks(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Add ``(key, records)`` of files just chunked."""
        if self.cache is None:
            return
        try:
            self.cache.put_chunks(items)
        except _CACHE_ERRORS as exc:
            self._give_up(exc)

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
