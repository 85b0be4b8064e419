"""What every caller of an encoder types against: the `Encoder` protocol, its batch-streaming
extension `BatchEncoder`, and `Encoders`, the pair an index or a searcher uses.

An encoder turns texts into vectors: one ``(dim,)`` vector per text (single-vector, "dense")
or one ``(tokens, dim)`` array per text (multi-vector, ColBERT). The local ModernBERT stack
(`codesearch.encoder.runtime.Encoder`, made by `codesearch.encoder.load`), the Ray backend
(`codesearch.encoder.ray.RayEncoder`) and the server's query batcher all implement it, so the
searcher, the index run and model resolution never ask an object what it is.

Nothing here imports numpy or torch: the query side imports this module for its types.

Example
-------
>>> from codesearch.encoder.base import Encoders
>>> Encoders().by_role()
{}
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["BatchEncoder", "Encoder", "Encoders", "Loader", "TokenCounter", "Vectors", "encode_stream"]

#: What `Encoder.encode` returns: a float32 ``(n, dim)`` array for a single-vector model,
#: one float32 ``(tokens, dim)`` array per text for a multi-vector one.
Vectors: TypeAlias = "np.ndarray | list[np.ndarray]"
#: ``count(text) -> tokens``, picklable, so that chunking can run in worker processes.
TokenCounter: TypeAlias = Callable[[str], int]


@runtime_checkable
class Encoder(Protocol):
    """A text encoder of one checkpoint.

    What every caller reads: `name`, `identity`, `dim`, `max_length`, `multivector`,
    `count_tokens` and `encode`. What an index run reads besides: `token_counter` (chunks
    are sized in the model's tokens), `describe` (``status`` says how vectors were made),
    `offloaded` and `batch_tokens` (how large its batches are, and whether a publication
    of vectors may run beside them).
    """

    @property
    def name(self) -> str:
        """What was asked for: a hub id or a local folder."""
        ...

    @property
    def identity(self) -> str:
        """``name@hash`` of the config, head settings and weights: indexes refuse to mix them."""
        ...

    @property
    def dim(self) -> int:
        """Size of each output vector."""
        ...

    @property
    def max_length(self) -> int:
        """Longest document in tokens; longer texts are truncated."""
        ...

    @property
    def multivector(self) -> bool:
        """True for a ColBERT model (one vector per token)."""
        ...

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens each text takes as a document, before truncation."""
        ...

    def encode(self, texts: list[str], kind: str = "document") -> Vectors:
        """Vectors for ``texts`` in input order; ``kind`` is ``"document"`` or ``"query"``."""
        ...

    def token_counter(self) -> TokenCounter:
        """A picklable ``count(text)`` equal to ``count_tokens([text])[0]``."""
        ...

    def describe(self) -> str:
        """How this encoder embeds, for ``status``: ``local cpu (float32)``, ``ray ...``."""
        ...

    @property
    def offloaded(self) -> bool:
        """True when encoding runs off this process's CPU (a GPU, a cluster): an index run
        then publishes vectors beside its batches instead of between them."""
        ...

    @property
    def batch_tokens(self) -> int:
        """Tokens one call should carry to keep the device busy; 0 for no preference."""
        ...


class Loader(Protocol):
    """``load(name, device=...)``: an encoder by hub id or folder (`codesearch.encoder.load`,
    or a pool's memoised one)."""

    def __call__(self, name: str, *, device: str = "auto") -> Encoder: ...


class BatchEncoder(abc.ABC):
    """The batch-streaming extension: an encoder that takes a stream of batches at once and
    keeps several of them in flight (a pool of workers). An index run hands such an encoder
    its whole stream; any other `Encoder` gets one `encode` call per batch.

    A subclass implements `Encoder` too.
    """

    @abc.abstractmethod
    def encode_batches(
        self, batches: Iterable[list[str]], kind: str = "document", idle: Callable[[], None] | None = None
    ) -> Iterator[Vectors]:
        """One output per input batch, in input order, each as `Encoder.encode` returns it.

        ``idle`` is called now and then while no batch is done (the index run commits a
        waiting group of batches there).
        """


def encode_stream(
    encoder: Encoder, batches: Iterable[list[str]], *, kind: str = "document", idle: Callable[[], None] | None = None
) -> Iterator[Vectors]:
    """``encoder``'s outputs for ``batches``, in order: streamed by a `BatchEncoder`, one
    `Encoder.encode` call per batch otherwise (``idle`` is then never needed)."""
    if isinstance(encoder, BatchEncoder):
        return encoder.encode_batches(batches, kind=kind, idle=idle)
    return (encoder.encode(texts, kind=kind) for texts in batches)


@dataclass(frozen=True)
class Encoders:
    """The encoders of one index or searcher: a single-vector (``dense``) and a ColBERT
    (``multi``) one.

    Either may be None; with both None the index is lexical-only. The store calls their
    roles ``dense`` and ``colbert`` (`by_role`); the API and the CLI call the second model
    the "multi" model (``multi_model``, ``--multi-model``).
    """

    dense: Encoder | None = None
    multi: Encoder | None = None
    #: Store roles the user switched off ('none'), recorded so that a later run with the
    #: default models leaves them off instead of reporting them as unavailable.
    disabled: tuple[str, ...] = ()

    def by_role(self) -> dict[str, Encoder]:
        """Store role (``dense`` | ``colbert``) -> encoder, for the encoders present."""
        out: dict[str, Encoder] = {}
        if self.dense is not None:
            out["dense"] = self.dense
        if self.multi is not None:
            out["colbert"] = self.multi
        return out

    def present(self) -> Sequence[Encoder]:
        """The encoders that are there, dense first."""
        return [e for e in (self.dense, self.multi) if e is not None]

    def map(self, wrap: Callable[[Encoder], Encoder]) -> Encoders:
        """The same pair with ``wrap`` applied to each encoder present."""
        return dataclasses.replace(
            self,
            dense=None if self.dense is None else wrap(self.dense),
            multi=None if self.multi is None else wrap(self.multi),
        )
