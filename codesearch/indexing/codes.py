"""PLAID codes on the workers: on a large first index, assigning every
token to its centroid on the driver (32-61k tok/s on 2 cores) took minutes after the last
worker batch. An encoder that computes elsewhere and can compress (``set_codec`` and
``codes_for``: the Ray path) gets the codec early, and returns each text's codes with its
vectors; publications hand them to the PLAID index, so the driver only writes.

The codec: the stored index's, when it is PLAID already (an incremental run); otherwise one
trained on a uniform sample of the texts to encode, which go first in the stream. Training
runs in a thread while the stream takes no new batch (`RunCodes.hold`), and publications
wait for it (a publication that trained its own codec would make the workers' codes
useless). The few batches the workers held then come back without codes, and the index
compresses them, as before. A sample that does not
stand for the collection shows in the index's drift check, which then retrains on everything
(:meth:`PlaidIndex._build`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from codesearch.encoder.base import Encoder

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexes.plaid.coded import CodeBook

__all__ = ["RunCodes", "plan_codes"]

log = logging.getLogger(__name__)

#: Sample tokens per centroid. k-means trains on 32 per centroid (`ResidualCodec.train`),
#: drawn from the tokens of the sample's texts, so a sample of more texts covers more of the
#: collection for the same training cost (with 40 per centroid, the error over every token
#: was 0.18 against 0.12 for a codec trained on everything, `benchmarks/plaid_bench.py
#: --sample`); a fifth of the texts is held out to measure the codec's error.
SAMPLE_PER_CENTROID = 96


def _codes_capable(enc: Encoder) -> bool:
    return bool(enc.multivector and enc.offloaded and callable(getattr(enc, "set_codec", None)))


def window_tokens(chars: int, max_length: int) -> int:
    """The tokens in the window of a text of ``chars`` characters, before tokenising it: ~4
    characters a code token (a central estimate, for sizes and shares; chunking's
    `estimate_tokens` is conservative)."""
    return max(1, min(chars // 4, max_length))  # ~4 characters a code token


class RunCodes:
    """The PLAID codes of one run: the :class:`CodeBook` its publications read, and the
    training of the codec on the sample when there is one."""

    def __init__(self, enc: Encoder, book: CodeBook, sample: set[str] | None = None, n_centroids: int = 0) -> None:
        self.enc, self.book = enc, book
        self._sample = set(sample or ())
        self._vectors: dict[str, np.ndarray] = {}
        self._n_centroids = n_centroids
        self._thread: threading.Thread | None = None
        self.train_s = 0.0  # the codec's training: the stream waits for it
        self.codes_s = 0.0  # then the sample's own codes: the stream waits for them too
        self.held_s = 0.0  # the stream waited for the codec this long (hold)

    @property
    def ready(self) -> bool:
        return self.book.ready.is_set()

    def hold(self, idle: Callable[[], None]) -> None:
        """While the codec trains on the whole sample, take no more batches (calling ``idle``):
        the workers then finish the batches they hold and wait, instead of making vectors
        without codes that the driver would compress after all (minutes on a large index).
        The hold costs the training's time and the sample's own codes, once."""
        if self._thread is None or self.ready:
            return
        t0 = time.perf_counter()
        while not self.book.ready.wait(0.2):
            idle()
        self.held_s += time.perf_counter() - t0

    def take(
        self, texts: list[str], hashes: Sequence[str], kinds: Sequence[str], vectors: Sequence[np.ndarray]
    ) -> None:
        """A batch the encoder returned: keep its codes, and its vectors if they are part of
        the sample (training starts once the whole sample is in)."""
        got = self.enc.codes_for(texts)  # type: ignore[attr-defined]
        if got is not None:
            fp, docs = got
            self.book.put(fp, ((h, d) for h, k, d in zip(hashes, kinds, docs) if k == "colbert"))
        if self._sample and self._thread is None:
            for h, v in zip(hashes, vectors):
                if h in self._sample:
                    self._vectors[h] = np.asarray(v, np.float32).astype(np.float16)
            if len(self._vectors) >= len(self._sample):
                self._thread = threading.Thread(target=self._train, name="codesearch-plaid-codec", daemon=True)
                self._thread.start()

    def wait(self) -> None:
        """Until the codec is known (or its training failed: publications then train their own)."""
        if self._sample and self._thread is None:
            self._train()  # the stream ended before the whole sample came back: what there is
        self.book.ready.wait()

    def _train(self) -> None:
        from codesearch.indexes.plaid import PlaidIndex
        from codesearch.indexes.plaid.coded import compress_documents, fit_on_sample, held_out_error

        t0 = time.perf_counter()
        try:
            hashes = list(self._vectors)
            arrays = [self._vectors[h].astype(np.float32) for h in hashes]
            self._vectors = {}
            if not arrays:
                return
            p = PlaidIndex()  # the parameters of the index the registry makes
            codec, held = fit_on_sample(arrays, nbits=p.nbits, n_centroids=self._n_centroids, niter=p.kmeans_niter,
                                        seed=p.seed)
            # The book takes the workers' codes from now on; publications wait (`ready`) for
            # the sample's own codes and the codec's held-out error, made below.
            self.book.set_codec(codec, 0.0, ready=False)
            self.enc.set_codec(codec)  # type: ignore[attr-defined]
            self.train_s = time.perf_counter() - t0
            # The stream stays held for these too: made beside it, they took longer than the
            # rest of a 16M-token stream on this loaded stand-in (243 s against 146 s), and the
            # driver then waited for them after the last batch (BENCHMARKS.md, 'A large first
            # index on workers').
            docs = compress_documents(codec, arrays)
            self.book.set_codec(codec, held_out_error(docs, held), ready=False)
            self.book.put(codec.fingerprint, zip(hashes, docs))
            self.codes_s = time.perf_counter() - t0 - self.train_s
            log.info("PLAID codec of %d centroids trained on %d sample texts in %.1f s; their codes took %.1f s",
                     len(codec.centroids), len(arrays), self.train_s, self.codes_s)
        except Exception as exc:  # noqa: BLE001 - the index then trains its own codec, as before
            log.warning("PLAID codec from the sample not trained (%s); the index trains its own", exc)
            self.book.codec = None  # codes of a codec without its error are not taken
        finally:
            self.book.ready.set()


def plan_codes(idir: Path, enc: Encoder, items: list, known: CodeBook | None = None) -> tuple[RunCodes | None, list]:
    """The run's codes for the stream ``items`` of ``enc`` (``(priority, kind, hash, characters,
    where)``, as `codesearch.indexing.encode` plans it),
    and the stream in the order to encode it: the sample first. ``known``: the codec the run
    has already (the stored index's, or one adopted from the user's vector cache), with any
    codes it holds."""
    if not _codes_capable(enc):
        return None, items
    from codesearch.indexes.plaid import PlaidIndex
    from codesearch.indexes.plaid.coded import CodeBook
    from codesearch.indexes.plaid.files import read_codec

    if known is not None and known.codec is not None:
        enc.set_codec(known.codec)  # type: ignore[attr-defined]
        return RunCodes(enc, known), items

    stored = read_codec(idir / "plaid")
    if stored is not None:  # an index that is PLAID already: its codec, for the delta
        enc.set_codec(stored[0])  # type: ignore[attr-defined]
        return RunCodes(enc, CodeBook(*stored)), items
    multi = [i for i, it in enumerate(items) if it[1] == "colbert"]
    sizes = np.array([window_tokens(items[i][3], int(enc.max_length)) for i in multi], dtype=np.int64)
    total = int(sizes.sum())
    index = PlaidIndex()  # the parameters of the index the registry makes
    if total < index.exact_threshold:
        return None, items  # stays exact (or the index trains on what little there is)
    n_centroids = index._centroid_count(total)
    target = SAMPLE_PER_CENTROID * n_centroids
    if 2 * target > total:
        return None, items  # the sample would be most of it: the index trains on everything
    order = np.random.default_rng(0).permutation(len(multi))
    upto = int(np.searchsorted(np.cumsum(sizes[order]), target)) + 1
    first = set(np.asarray(multi)[order[:upto]].tolist())
    ordered = [items[i] for i in sorted(first)] + [it for i, it in enumerate(items) if i not in first]
    sample = {items[i][2] for i in first}
    return RunCodes(enc, CodeBook(), sample, n_centroids), ordered
