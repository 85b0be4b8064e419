"""The encode stage: every chunk and file that lacks a vector of each model, most useful
first, encoded in batches that are each committed whole and published to the vector indexes
as they come.

The stream is planned without the texts (a text's size is what batching and the PLAID
sample need); each batch reads its own from the store (a chunk's) or the file (a whole
file's) when its turn comes, so the stage holds one batch of texts whatever the number of
texts to encode."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from codesearch.encoder.base import Encoder, encode_stream
from codesearch.indexing.codes import plan_codes, window_tokens
from codesearch.indexing.commit import Commits
from codesearch.indexing.encoders import EMBEDDED_KEY, VECTORS_PENDING_KEY
from codesearch.indexing.options import Run
from codesearch.indexing.publish import Publisher
from codesearch.indexing.reuse import _CACHE_ERRORS, Reuse, cache_model
from codesearch.pathnames import text_name
from codesearch.store import VECTOR_KINDS
from codesearch.store.files import decode_source, hash_bytes, read_inside
from codesearch.types import path_kind

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexes.plaid.coded import CodeBook

__all__ = ["ENCODE_BATCH", "ENCODE_BATCH_CHARS", "encode_missing"]

#: One text to encode: (priority, vector kind, text hash, characters, where the text is: a
#: chunk id, or a file id for a per-file kind); priority sorts the stream.
_Item = tuple[tuple[int, int], str, str, int, int]

#: Texts per encode call (and per committed batch of cached vectors).
ENCODE_BATCH = 64
#: Characters per encode call (and committed batch).
ENCODE_BATCH_CHARS = 64_000


def _file_chars(max_length: int) -> int:
    # The encoder truncates at its max length anyway; cutting the string first keeps a
    # 1 MB file from being tokenized whole (code runs well under 16 chars per token).
    return max(1, max_length) * 16


def _file_text_for_encoder(path: str, text: str, max_length: int) -> str:
    return f"{text_name(path)}\n{text[: _file_chars(max_length)]}"


def _encodes_elsewhere(enc: Encoder) -> bool:
    """Whether ``enc`` computes off this process's CPU (a pool of workers, a GPU): then a
    publication runs beside its batches, not between them."""
    return enc.offloaded


def encode_missing(run: Run) -> None:
    """Encode what the vector cache lacks for the committed chunks and files, in batches that
    are each committed whole (a killed run loses the batch in flight, and at most one group
    of quick batches: see :class:`Commits`), and publish the vectors to the indexes as they
    come.

    The order makes a partial index answer most questions: source code before tests, then
    docs, examples and benchmarks (`types.path_kind`), small files before large ones.
    """
    store, roles = run.store, run.encoders.by_role()
    pending = [role for role in run.recorded if role not in roles]
    if pending and run.opts.defer_vectors and (run.changes.indexed or run.plan.rechunk_all):
        with store.transaction():  # the next search that uses the vectors adds them
            store.set_meta(VECTORS_PENDING_KEY, json.dumps(pending))
    elif roles and not pending:
        with store.transaction():  # this run encodes whatever lacks a vector
            store.delete_meta(VECTORS_PENDING_KEY)
    changed = bool(run.changes.indexed or run.plan.rechunk_all)
    for role in run.recorded:
        if role not in roles:
            if run.opts.defer_vectors:
                if not changed:  # (a run that found no changed code has nothing to say)
                    continue
                run.notices.append(
                    f"changed code has no {role} vectors yet; the next 'codesearch index' (or a search that "
                    "needs them) adds them"
                )
            else:
                # Offline run of an index that has vectors: they are added by a later run.
                run.notices.append(
                    f"No {role} encoder in this run; new or changed chunks have no {role} vectors yet "
                    f"(run 'codesearch index' again with {run.recorded[role].name} available to add them)"
                )
    if not roles:
        return
    # What sorts the stream: source code before tests, then docs, examples and benchmarks
    # (`types.path_kind`), small files before large ones. Per file, made once.
    priorities = {fid: (path_kind(path), size) for fid, path, size in store.file_sizes()}

    # One stream of texts per encoder (a dense model's chunks and whole files together), so
    # a small edit costs one encode call, not one per kind.
    streams: list[tuple[Encoder, list[_Item]]] = []
    for role, enc in roles.items():
        items: list[_Item] = []
        for kind in (k.name for k in VECTOR_KINDS.values() if k.role == role):
            if VECTOR_KINDS[kind].per_file:
                seen: set[str] = set()  # the cache is keyed by text: a copy is encoded once
                for fid, path, h in store.files_missing_vectors(enc.identity, kind):
                    if h not in seen:
                        seen.add(h)
                        chars = len(text_name(path)) + 1 + min(priorities[fid][1], _file_chars(enc.max_length))
                        items.append((priorities[fid], kind, h, chars, fid))
            else:  # (one chunk of each text: the store's query keeps one)
                items += [(priorities[fid], kind, h, chars, cid)
                          for cid, fid, h, chars in store.chunks_missing_vectors(enc.identity, kind)]
        if items:
            items.sort(key=lambda it: it[0])
            streams.append((enc, items))
    if not streams:
        return
    commits = Commits(store)
    publisher = Publisher(run, commits, background=any(_encodes_elsewhere(enc) for enc, _ in streams))
    reuse = Reuse.open()
    try:
        # What the user's vector cache holds (another worktree, branch or clone made it) is
        # copied into this index, which stays whole without the cache; the rest is encoded.
        arrays: dict[str, tuple[str, int]] = {}  # colbert text hash -> (array_key, tokens) taken from the cache
        streams = [(enc, _take_cached(run, enc, items, reuse, commits, publisher, arrays)) for enc, items in streams]
        planned = []
        for enc, items in streams:  # PLAID codes on the workers, for a large first index
            book = _cached_codes(run, enc, reuse, items, arrays) if enc.multivector else None
            codes, items = plan_codes(run.opts.idir, enc, items, book)
            if codes is not None and book is not None:  # the index's own codes go to the cache too
                codes.book.keep = book.keep
            publisher.codes = publisher.codes or codes
            publisher.book = publisher.book or book
            if book is not None:
                publisher.keepers.append(book.keep)
            planned.append((enc, items))
        total = sum(len(items) for _, items in planned)
        _encode_streams(run, planned, roles, total, commits, publisher, reuse)
    except BaseException:
        # The batches of an open group are whole: a failed run keeps them, and a publication
        # in flight ends (its files are written whole) before the run lets go of the index.
        # If the store itself failed, the run's own error is the one to tell.
        with contextlib.suppress(Exception):
            commits.commit(report=False)
        with contextlib.suppress(Exception):
            publisher.finish()
        raise
    finally:
        for keeper in publisher.keepers:  # codes of the last publication (and of a failed run's)
            keeper.flush()
        reuse.close()


#: Texts per store write of vectors taken from the user's cache.
_REUSE_BATCH = 512


def _take_cached(
    run: Run, enc: Encoder, items: list[_Item], reuse: Reuse, commits: Commits, publisher: Publisher,
    arrays: dict[str, tuple[str, int]] | None = None,
) -> list[_Item]:
    """Write into the store the vectors of ``items`` that the user's cache holds; returns the
    items left to encode, in their order. ``arrays`` gets each ColBERT array's `array_key`
    and tokens, by text hash (the key of its cached PLAID codes)."""
    if not reuse.enabled or not items:
        return items
    taken: set[int] = set()
    model = cache_model(enc)
    for kind in dict.fromkeys(it[1] for it in items):
        where = [i for i, it in enumerate(items) if it[1] == kind]
        for start in range(0, len(where), _REUSE_BATCH):  # a part in memory at a time
            part = where[start : start + _REUSE_BATCH]
            texts = _texts(run, enc, [items[i] for i in part])
            taken.update(i for i, t in zip(part, texts) if t is None)  # (a file changed since: the next run's)
            part = [i for i, t in zip(part, texts) if t is not None]
            found = reuse.take(model, kind, [t for t in texts if t is not None])
            del texts
            if not found:
                continue
            rows = [(items[part[j]][2], *v) for j, v in sorted(found.items())]
            if arrays is not None and kind == "colbert":
                arrays.update((h, (hash_bytes(blob), n)) for h, n, _, blob in rows)
            with commits.batch():
                run.store.put_encoded(enc.identity, kind, rows)
                run.texts_reused += len(rows)
            publisher.add(kind, (r[0] for r in rows))
            taken.update(part[j] for j in found)
    return [it for i, it in enumerate(items) if i not in taken]


def _cached_codes(run: Run, enc: Encoder, reuse: Reuse, items: list[_Item], arrays: dict[str, tuple[str, int]]
                  ) -> CodeBook | None:
    """The PLAID codes of the user's cache for the multi-vector index (`cachedcodes`): a
    `CodeBook` with the codec to use and the cached codes under it (no codec: the index
    trains its own), which keeps in the cache what the index computes; None without a cache.
    ``arrays``: text hash -> (`array_key`, tokens) of the arrays taken from the cache;
    ``items``: the texts left to encode."""
    if not reuse.enabled:
        return None
    from codesearch.indexes.plaid import PlaidIndex
    from codesearch.indexes.plaid.files import read_codec
    from codesearch.indexing.cachedcodes import CodeKeeper, adopt_codes, book_for

    keeper = CodeKeeper(cache_model(enc), reuse)
    stored = read_codec(run.opts.idir / "plaid")
    try:
        total = sum(run.store.chunk_token_counts(enc.identity, "colbert").values())
        total += sum(window_tokens(chars, int(enc.max_length)) for _, kind, _, chars, _ in items if kind == "colbert")
        found = adopt_codes(reuse.cache, keeper.model, dict(arrays.values()), total, codec=stored,
                            nbits=PlaidIndex().nbits, dim=enc.dim)
    except _CACHE_ERRORS as exc:
        reuse._give_up(exc)
        found = None
    if found is None:
        return book_for(*(stored or (None, 0.0)), {}, keeper)
    codec, error, docs = found
    keeper.cached.update(docs)
    by_text = {h: docs[key] for h, (key, _) in arrays.items() if key in docs}
    keeper.taken.update(by_text)
    run.codes_reused = len(by_text)
    return book_for(codec, error, by_text, keeper)


def _encode_streams(
    run: Run, streams: list[tuple[Encoder, list[_Item]]], roles: dict[str, Encoder], total: int, commits: Commits,
    publisher: Publisher, reuse: Reuse,
) -> None:
    store = run.store
    enc_t0 = time.perf_counter()
    kinds = [""]  # the kinds of the last batch, for the progress message

    def committed() -> None:  # progress counts what is committed: a killed run keeps that much
        elapsed = max(time.perf_counter() - enc_t0, 1e-9)
        run.report(
            "encode", run.texts_encoded, total, files=run.changes.indexed, chunks=run.chunks_made,
            tokens=run.tokens_encoded, tokens_per_s=run.tokens_encoded / elapsed, message=kinds[0],
        )

    commits.on_commit = committed
    for enc, items in streams:
        model = cache_model(enc) if reuse.enabled else enc.identity
        # (nothing left to encode: the encoder is not asked how it batches, which loads a
        # deferred one)
        # Each batch's texts are read as the encoder takes the batch, and dropped once its
        # vectors are written: the batches in flight (a pool of workers holds a few) are
        # all the texts in memory.
        loaded: collections.deque[list[tuple[str, str, str]]] = collections.deque()
        texts_of = _read_as_taken(run, enc, _batches(items, _batch_size(enc)) if items else iter(()), loaded)

        def idle() -> None:  # while a pool of workers (codesearch[ray]) computes
            commits.commit_if_older()
            publisher.poll()

        outputs = encode_stream(enc, texts_of, kind="document", idle=idle)
        codes = publisher.codes if publisher.codes is not None and publisher.codes.enc is enc else None
        for out in outputs:
            batch = loaded.popleft()
            vectors = list(out) if enc.multivector else [np.asarray(out)[i] for i in range(len(batch))]
            if codes is not None:  # before a publication reads them
                codes.take([t for *_, t in batch], [h for _, h, _ in batch], [k for k, *_ in batch], vectors)
            by_kind: dict[str, list[tuple[str, np.ndarray]]] = defaultdict(list)
            for (kind, h, _), v in zip(batch, vectors):
                by_kind[kind].append((h, v))
            tokens = sum(min(n, int(enc.max_length)) for n in enc.count_tokens([t for _, _, t in batch]))
            if reuse.enabled:
                # Keyed by the text each vector was made from, and kept before the store commits
                # it: a run killed in between finds it there when it resumes.
                for kind in by_kind:
                    reuse.keep(model, kind, ((t, v) for (k, _, t), v in zip(batch, vectors) if k == kind))
            with commits.batch():  # the batch is cached whole or not at all
                for kind, pairs in by_kind.items():
                    store.put_vectors(enc.identity, kind, pairs)
                run.texts_encoded += len(batch)
                run.tokens_encoded += tokens
                kinds[0] = "/".join(by_kind)
            for kind, pairs in by_kind.items():
                publisher.add(kind, (h for h, _ in pairs))
            publisher.poll()
            if codes is not None:  # once the sample is in, no more batches until its codec reaches the workers
                codes.hold(idle)
            if run.texts_encoded < total and publisher.due(total - run.texts_encoded):
                publisher.start()
        # How this model was embedded, for 'status': recorded as its stream ends, so that a
        # run that fails in the next model's stream still tells how this one's were made.
        embedded = {role: enc.describe() for role, e in roles.items() if e is enc}
        commits.commit()
        with store.transaction():
            store.set_meta(EMBEDDED_KEY, json.dumps(json.loads(store.get_meta(EMBEDDED_KEY) or "{}") | embedded))
    publisher.finish()
    if publisher.codes is not None:
        publisher.codes.wait()
    if publisher.pending:
        publisher.start(background=False)  # the last one: nothing left to run beside


def _read_as_taken(run: Run, enc: Encoder, batches: Iterator[list[_Item]],
                   loaded: collections.deque[list[tuple[str, str, str]]]) -> Iterator[list[str]]:
    """The texts of each of ``batches`` for the encoder, read as it takes them; each batch
    goes to ``loaded`` as ``(kind, hash, text)``, for the writer to take when its vectors come.
    A text gone from its batch (a file changed since the walk) is the next run's."""
    for part in batches:
        batch = [(it[1], it[2], t) for it, t in zip(part, _texts(run, enc, part)) if t is not None]
        if batch:
            loaded.append(batch)
            yield [t for _, _, t in batch]


def _texts(run: Run, enc: Encoder, items: Sequence[_Item]) -> list[str | None]:
    """The texts of ``items`` as ``enc`` reads them, in order: a chunk's from the store, a whole
    file's from the file if it still has the hash the store records (else None: the next
    run, which sees the new content, encodes it)."""
    store = run.store
    chunks = store.encoder_texts([it[4] for it in items if not VECTOR_KINDS[it[1]].per_file])
    out: list[str | None] = []
    for _, kind, h, _, ref in items:
        if not VECTOR_KINDS[kind].per_file:
            found = chunks.get(ref)
            out.append(found[0] if found is not None and found[1] == h else None)
            continue
        rec = store.file_record(ref)
        text = None
        if rec is not None and rec.hash == h:
            try:
                data, _ = read_inside(run.opts.root, rec.path)
            except OSError:
                data = None
            if data is not None and hash_bytes(data) == h:
                text = _file_text_for_encoder(rec.path, decode_source(data), enc.max_length)
        out.append(text)
    return out


def _batch_size(enc: Encoder) -> tuple[int, int]:
    """(texts, characters) per encode call and committed batch.

    On a CPU the encoder's own budget is small and a batch of 64 texts keeps each commit
    (and so what a kill loses) small. A GPU wants far larger passes (up to 262k tokens,
    `Encoder.batch_tokens`): there the call holds about what the encoder can run at once,
    at about 4 characters per token, so the device is never fed 20k-token crumbs.
    """
    budget = int(enc.batch_tokens)
    if not enc.offloaded or budget <= 0:
        return ENCODE_BATCH, ENCODE_BATCH_CHARS
    return max(ENCODE_BATCH, budget // 64), max(ENCODE_BATCH_CHARS, 4 * budget)


def _batches(items: Sequence[_Item], size: tuple[int, int] | None = None) -> Iterator[list[_Item]]:
    """Consecutive runs of ``items`` of at most ``size`` = (texts, characters)."""
    max_texts, max_chars = size or (ENCODE_BATCH, ENCODE_BATCH_CHARS)
    batch: list[_Item] = []
    chars = 0
    for item in items:
        if batch and (len(batch) >= max_texts or chars + item[3] > max_chars):
            yield batch
            batch, chars = [], 0
        batch.append(item)
        chars += item[3]
    if batch:
        yield batch
