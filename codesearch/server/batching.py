"""Query micro-batching: concurrent searches share one encoder forward pass.

A hybrid search spends most of its CPU encoding the query. When several searches arrive
together, encoding their queries one by one costs nearly one forward pass each, while one
batched pass costs far less per query. `QueryBatcher` wraps an encoder: the first search
thread that finds the encoder idle becomes the leader and encodes every query waiting at
that moment (up to ``max_batch``) in one call; the others wait for their row. No timer: a
lone query is encoded at once, so batching adds no latency when the server is quiet.
"""

from __future__ import annotations

import threading
from typing import overload

from codesearch.encoder.base import Encoder, Encoders, TokenCounter, Vectors

MAX_BATCH = 32


class _Item:
    __slots__ = ("done", "error", "result", "text")

    def __init__(self, text: str):
        self.text = text
        self.done = False
        self.result: Vectors | None = None
        self.error: BaseException | None = None


class QueryBatcher:
    """An `Encoder` whose single-query ``encode(..., kind="query")`` calls are batched.

    Every other call goes straight to the wrapped encoder, and it describes itself as the
    wrapped one does, so the wrapper can stand wherever the encoder does.

    Parameters
    ----------
    encoder:
        Any `codesearch.encoder.Encoder` (single-vector: rows of an array; multi-vector: a
        list of per-query arrays).
    max_batch:
        Most queries per forward pass.
    """

    def __init__(self, encoder: Encoder, *, max_batch: int = MAX_BATCH):
        self._encoder = encoder
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._pending: list[_Item] = []
        self._busy = False
        self.batches = 0  # forward passes made (tests and stats)
        self.queries = 0  # queries encoded through them

    @property
    def wrapped(self) -> Encoder:
        """The encoder underneath."""
        return self._encoder

    # -- the wrapped encoder's description (the `Encoder` protocol) --------------------------

    @property
    def name(self) -> str:
        return self._encoder.name

    @property
    def identity(self) -> str:
        return self._encoder.identity

    @property
    def dim(self) -> int:
        return self._encoder.dim

    @property
    def max_length(self) -> int:
        return self._encoder.max_length

    @property
    def multivector(self) -> bool:
        return self._encoder.multivector

    @property
    def offloaded(self) -> bool:
        return self._encoder.offloaded

    @property
    def batch_tokens(self) -> int:
        return self._encoder.batch_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self._encoder.count_tokens(texts)

    def token_counter(self) -> TokenCounter:
        return self._encoder.token_counter()

    def describe(self) -> str:
        return self._encoder.describe()

    def __repr__(self) -> str:
        return f"QueryBatcher({self._encoder!r})"

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, texts: list[str], kind: str = "document") -> Vectors:
        """Batched for one query; anything else (documents, several texts) passes through."""
        if kind != "query" or len(texts) != 1:
            return self._encoder.encode(texts, kind=kind)
        item = _Item(texts[0])
        with self._cond:
            self._pending.append(item)
            while not item.done:
                if self._busy:
                    self._cond.wait()
                    continue
                self._busy = True
                batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
                self._cond.release()
                try:
                    self._run(batch)
                finally:
                    self._cond.acquire()
                    self._busy = False
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error
        assert item.result is not None  # set with done, when no error was
        return item.result

    def _run(self, batch: list[_Item]) -> None:
        try:
            out = self._encoder.encode([item.text for item in batch], kind="query")
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the failure, none hangs
            for item in batch:
                item.error, item.done = exc, True
            return
        self.batches += 1
        self.queries += len(batch)
        multivector = self._encoder.multivector
        for i, item in enumerate(batch):
            # Same shape as an unbatched call: (1, dim) rows, or a one-element list.
            item.result = [out[i]] if multivector else out[i : i + 1]
            item.done = True


_BATCHERS: dict[int, tuple[Encoder, QueryBatcher]] = {}  # id(encoder) -> (encoder, its batcher)
_BATCHERS_LOCK = threading.Lock()


@overload
def batcher_for(encoder: Encoder) -> QueryBatcher: ...
@overload
def batcher_for(encoder: None) -> None: ...


def batcher_for(encoder: Encoder | None) -> QueryBatcher | None:
    """The one `QueryBatcher` of ``encoder`` in this process (None stays None).

    One per encoder object, so readers of successive generations and roots that share a
    model also share the batching.
    """
    if encoder is None or isinstance(encoder, QueryBatcher):
        return encoder
    with _BATCHERS_LOCK:
        entry = _BATCHERS.get(id(encoder))
        if entry is None or entry[0] is not encoder:
            entry = (encoder, QueryBatcher(encoder))
            _BATCHERS[id(encoder)] = entry
        return entry[1]


def batched_encoders(encoders: Encoders) -> Encoders:
    """A copy of ``encoders`` whose encoders batch their queries."""
    return encoders.map(batcher_for)


def batching_stats() -> list[dict[str, str | int]]:
    """Per encoder: forward passes made for queries and queries encoded (``GET /status``)."""
    with _BATCHERS_LOCK:
        entries = list(_BATCHERS.values())
    return [{"encoder": str(enc.name), "batches": b.batches, "queries": b.queries} for enc, b in entries]
