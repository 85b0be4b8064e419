"""`RayEncoder`: the `Encoder` protocol on a Ray cluster, and `RayEncoders`, what an API
object keeps of it between index runs.

Walking, chunking, the store diff, the lexical index and the vector writer stay in this
process; only the texts that need vectors travel. A `RayEncoder` wraps a locally loaded
encoder (whose name, identity, dim, max length and token counter describe the vectors) and
sends its document batches to the actors of a `WorkerPool`
(:mod:`codesearch.encoder.ray.pool`):

- at most ``depth`` batches in flight per actor (one running, one queued, so an actor never
  waits for the driver) and a bounded window overall, so memory stays bounded whatever the
  size of the run; results come back in input order;
- a batch whose actor is gone for good goes to another one. When the cluster itself is
  lost, a one-line :class:`~codesearch.errors.ClusterError` ends the run
  (:mod:`codesearch.encoder.ray.cluster`); the index run has committed every finished
  batch to the vector cache, so the next run resumes from there.

Queries are encoded locally (a round trip to the cluster per query would cost more than the
query's own forward pass).

Examples
--------
>>> from codesearch.encoder import load
>>> from codesearch.encoder.ray import RayEncoder
>>> enc = RayEncoder(load("lightonai/LateOn-Code-edge"), address="auto")     # doctest: +SKIP
>>> for vectors in enc.encode_batches([["def f(): ..."], ["class A: ..."]]):  # doctest: +SKIP
...     print(len(vectors))
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codesearch.encoder.base import BatchEncoder, Encoders, TokenCounter, Vectors
from codesearch.encoder.ray.cluster import ray_get, require_ray
from codesearch.encoder.ray.pool import ClusterProgress, ModelSpec, WorkerPool, cause, replace_stats
from codesearch.types import ProgressEvent

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder.runtime import Encoder as LocalEncoder

#: Token counts (from the workers) of this many recent batches are kept, so that the
#: pipeline's own ``count_tokens`` on a batch just yielded costs a lookup, not a tokenisation.
_COUNT_MEMO = 64
#: Batches whose PLAID codes wait for the pipeline (it takes each as it writes the batch).
_CODES_MEMO = 4096


@dataclass
class _Task:
    seq: int
    texts: list[str]
    worker: int
    ref: Any


_RETRY = object()


# --------------------------------------------------------------------------------------------
# RayEncoder
# --------------------------------------------------------------------------------------------


class RayEncoder(BatchEncoder):
    """An `Encoder` whose document batches run on a :class:`WorkerPool`.

    Describes its vectors as the local encoder it wraps does (``name``, ``identity``,
    ``dim``, ``max_length``, ``multivector``, ``count_tokens``, ``token_counter``), and
    streams batches (`BatchEncoder.encode_batches`), which keeps every actor busy. The
    cluster and the actors start on the first batch, so a run with nothing to embed never
    touches Ray.

    Parameters
    ----------
    local : codesearch.encoder.runtime.Encoder
        The same checkpoint loaded here: its attributes describe the vectors, queries are
        encoded with it, and the actors load ``local.name`` and must match ``local.identity``.
    pool : WorkerPool, optional
        The actors (shared by the encoders of a run); default: a pool of its own, made from
        ``pool_kwargs`` and closed by :meth:`close`.
    dtype : str, optional
        The actors' dtype. Default: the local encoder's on CPU actors (vectors equal to a
        local run's), the device's default (bf16) on GPU actors.
    progress : callable, optional
        Called with the pool's :class:`ClusterProgress` after every batch.
    **pool_kwargs
        ``address``, ``workers``, ... of :class:`WorkerPool`, when ``pool`` is not given.
    """

    def __init__(
        self,
        local: LocalEncoder,
        pool: WorkerPool | None = None,
        *,
        dtype: str | None = None,
        progress: Callable[[ClusterProgress], None] | None = None,
        **pool_kwargs: object,
    ) -> None:
        self.local = local
        self.owns_pool = pool is None
        self.pool = pool if pool is not None else WorkerPool(**pool_kwargs)
        self.dtype = dtype
        self.progress = progress
        self._counts: OrderedDict[tuple[str, ...], list[int]] = OrderedDict()
        self._codes: OrderedDict[tuple[str, ...], tuple[str, list]] = OrderedDict()
        self._codec: Any = None  # PLAID codec the actors compress documents with (set_codec)
        self._codec_ref: Any = None

    # -- the local encoder's face ----------------------------------------------------------

    @property
    def name(self) -> str:
        return self.local.name

    @property
    def identity(self) -> str:
        return self.local.identity

    @property
    def dim(self) -> int:
        return self.local.dim

    @property
    def max_length(self) -> int:
        return self.local.max_length

    @property
    def multivector(self) -> bool:
        return self.local.multivector

    def __repr__(self) -> str:
        return f"RayEncoder({self.identity!r}, {self.pool!r})"

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Document tokens per text, like the local encoder's. For a batch just encoded, what
        its worker counted as it tokenized, which is capped at ``max_length`` (all that the
        pipeline reads); the driver tokenizing every text again bounded a cluster at one
        core's tokenizer, ~750k tok/s of libuv code on 2 cores."""
        hit = self._counts.get(tuple(texts))
        return list(hit) if hit is not None else self.local.count_tokens(texts)

    def set_codec(self, codec: Any) -> None:
        """Have the actors return PLAID codes under ``codec`` with every document batch sent
        from now on (a retried batch too), for :meth:`codes_for`; None stops it."""
        self._codec, self._codec_ref = codec, None

    def codes_for(self, texts: list[str]) -> tuple[str, list] | None:
        """``(codec fingerprint, one DocCodes per text)`` of a batch just encoded, if its actor
        made codes (see :meth:`set_codec`)."""
        return self._codes.pop(tuple(texts), None)

    def token_counter(self) -> TokenCounter:
        """The local encoder's picklable token counter."""
        return self.local.token_counter()

    def describe(self) -> str:
        """How this encoder embeds, for ``status``: ``ray local: 2 cpu workers (float32)``."""
        return self.pool.describe(self.identity)

    @property
    def offloaded(self) -> bool:
        """Always: the actors compute, this process only writes."""
        return True

    @property
    def batch_tokens(self) -> int:
        """No preference: the pool keeps its actors fed with batches of any size."""
        return 0

    def close(self) -> None:
        """Close the pool if it is this encoder's own."""
        if self.owns_pool:
            self.pool.close()

    def start(self) -> None:
        """Start the pool and load the model on every actor (the first batch does it too).

        Raises
        ------
        ClusterError
            The cluster cannot be reached or has no room for the workers.
        CodeSearchError
            An actor cannot load the model, or loads another checkpoint under its name.
        """
        self.pool.start()
        self.pool.load(self._spec())

    def _spec(self) -> ModelSpec:
        dtype = self.dtype
        if dtype is None and not self.pool.gpus:
            dtype = str(self.local.dtype).removeprefix("torch.")  # vectors equal to a local run's
        return ModelSpec(self.local.name, self.local.identity, dtype)

    # -- encoding ----------------------------------------------------------------------------

    def encode(self, texts: list[str], kind: str = "document", batch_tokens: int | None = None) -> Vectors:
        """Vectors for ``texts`` in input order: documents on the cluster, queries locally.

        For many batches use :meth:`encode_batches`, which keeps every actor busy.
        """
        if kind == "query" or batch_tokens is not None:
            return self.local.encode(texts, kind=kind, batch_tokens=batch_tokens)
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not one string; wrap it: encode([text])")
        return next(iter(self.encode_batches([list(texts)], kind=kind)))

    def encode_batches(
        self, batches: Iterable[list[str]], kind: str = "document", idle: Callable[[], None] | None = None
    ) -> Iterator[Vectors]:
        """One output per input batch, in input order, each as ``encode`` returns it.

        ``batches`` is consumed lazily: at most ``depth`` batches per actor are in flight and
        at most as many again wait here to be yielded in order, so memory stays bounded.
        ``idle`` is called about every `cluster.IDLE_S` while no batch is done (the pipeline
        commits a waiting group of batches there).

        Raises
        ------
        ClusterError
            The connection to the cluster is lost, or every actor died for good.
        """
        if kind not in ("document", "query"):
            raise ValueError(f"kind must be 'document' or 'query', not {kind!r}")
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return
        self.start()
        pool, ray = self.pool, require_ray()
        spec = self._spec()
        if pool.t0 is None:
            pool.t0 = time.perf_counter()
        it = itertools.chain([first], it)
        window = 2 * pool.depth * len(pool.actors)
        pending: dict[Any, _Task] = {}  # object ref -> its task
        ready: dict[int, Any] = {}  # finished outputs waiting for their turn
        retry: list[tuple[int, list[str]]] = []  # batches whose actor died for good
        load = [0] * len(pool.actors)
        seq = next_out = 0
        exhausted = False

        def submit(s: int, texts: list[str], worker: int) -> None:
            args: tuple = (spec, texts, kind)
            if self._codec is not None and kind == "document":
                if self._codec_ref is None:  # in the object store once, not with every batch
                    self._codec_ref = ray.put(self._codec)
                args += (self._codec_ref,)
            task = _Task(s, texts, worker, pool.actors[worker].encode.remote(*args))
            pending[task.ref] = task
            load[worker] += 1

        try:
            while True:
                # Retries first, whatever the window: they already count in it.
                while retry and (worker := pool.pick(load)) is not None:
                    submit(*retry.pop(0), worker)
                # New batches to the least loaded live actors while the window has room.
                while not exhausted and len(pending) + len(ready) < window and (worker := pool.pick(load)) is not None:
                    nxt = next(it, None)
                    if nxt is None:
                        exhausted = True
                        break
                    texts = list(nxt)
                    if texts:
                        submit(seq, texts, worker)
                    else:  # nothing to send: the local encoder's empty result
                        ready[seq] = self.local.encode([], kind=kind)
                    seq += 1
                while next_out in ready:
                    yield ready.pop(next_out)
                    next_out += 1
                if not pending:
                    if retry or not any(pool.alive):  # work left and no actor to take it
                        raise pool.all_dead()
                    if exhausted:
                        return
                    continue
                for ref in pool.wait(list(pending), idle):
                    task = pending.pop(ref)
                    load[task.worker] -= 1
                    out = self._collect(ray, task)
                    if out is _RETRY:
                        retry.append((task.seq, task.texts))
                    else:
                        ready[task.seq] = out
        finally:
            for ref in pending:  # a consumer that stopped early (Ctrl-C, an error)
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - best effort: the cluster may be gone
                    pass

    def _collect(self, ray: Any, task: _Task) -> Any:
        pool = self.pool
        try:
            out, busy, counts, *codes = ray_get(ray, task.ref, where=pool.where)
        except ray.exceptions.RayActorError as exc:
            # Ray restarted the actor and retried its calls max_restarts times already:
            # this actor is gone for good; its batch goes to another one.
            pool.mark_dead(task.worker, exc, "; its batches go to the other workers")
            s = pool.stats[task.worker]
            pool.stats[task.worker] = replace_stats(s, restarts=s.restarts + 1)
            if not any(pool.alive):
                raise pool.all_dead(exc) from None
            return _RETRY
        except ray.exceptions.RayTaskError as exc:
            raise cause(exc) from None
        self._counts[tuple(task.texts)] = counts
        while len(self._counts) > _COUNT_MEMO:
            self._counts.popitem(last=False)
        if codes:
            self._codes[tuple(task.texts)] = codes[0]
            while len(self._codes) > _CODES_MEMO:
                self._codes.popitem(last=False)
        s = pool.stats[task.worker]
        pool.stats[task.worker] = replace_stats(
            s,
            batches=s.batches + 1,
            texts=s.texts + len(task.texts),
            tokens=s.tokens + sum(counts),
            busy_s=s.busy_s + busy,
        )
        if self.progress is not None:
            self.progress(pool.progress())
        return out


# --------------------------------------------------------------------------------------------
# What an API object keeps between runs
# --------------------------------------------------------------------------------------------


class RayEncoders:
    """The Ray side of one `CodeSearch`: a `WorkerPool` made on first use (or the caller's),
    and one `RayEncoder` per model identity, kept between index runs so that the actors start
    and load each model once.

    Parameters
    ----------
    target : str or WorkerPool
        An address (``"auto"``, see :func:`~codesearch.encoder.ray.cluster.connect`), or a
        pool the caller owns (to share actors between several ``CodeSearch`` objects).
    """

    def __init__(self, target: str | WorkerPool) -> None:
        self.target = target
        self.pool: WorkerPool | None = None
        self._by_identity: dict[str, RayEncoder] = {}

    def wrap(self, encoders: Encoders) -> Encoders:
        """``encoders`` with each one wrapped in this pool's `RayEncoder` for its model (the
        local encoders stay as they are, for searches)."""
        return encoders.map(self._wrap)

    def _wrap(self, enc: LocalEncoder) -> RayEncoder:
        if self.pool is None:
            self.pool = self.target if isinstance(self.target, WorkerPool) else WorkerPool(self.target)
        if enc.identity not in self._by_identity:
            self._by_identity[enc.identity] = RayEncoder(enc, self.pool)
        return self._by_identity[enc.identity]

    def close(self) -> None:
        """Stop the pool made here (not one the caller passed), and forget the encoders."""
        if self.pool is not None and self.pool is not self.target:
            self.pool.close()
        self.pool = None
        self._by_identity.clear()

    def with_rates(self, progress: Callable[[ProgressEvent], None] | None) -> Callable[[ProgressEvent], None] | None:
        """``progress`` with the cluster's rates, overall and per worker, as the message of
        each ``encode`` event (None stays None); the CLI's progress bar shows it."""
        if progress is None:
            return None

        def report(event: ProgressEvent) -> None:
            if event.stage == "encode" and self.pool is not None:
                rates = self.pool.progress()
                if rates.batches:  # replaces the kinds ("dense/file"), which no renderer shows
                    event = dataclasses.replace(event, message=rates.describe())
            progress(event)

        return report
