"""The encoder: ModernBERT (our packed implementation) and heads for dense and ColBERT vectors.

Nothing heavy is imported here: torch and transformers load on the first call to :func:`load`,
so ``import codesearch.encoder`` stays cheap. :class:`Encoder` is the protocol callers type
against (`codesearch.encoder.base`); ``load`` returns its local implementation.

Example
-------
>>> from codesearch.encoder import load
>>> enc = load("lightonai/LateOn-Code-edge")                    # doctest: +SKIP
>>> docs = enc.encode(["def add(a, b):\\n    return a + b"])    # doctest: +SKIP
>>> query = enc.encode(["add two numbers"], kind="query")       # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

DEFAULT_DENSE_MODEL = "Alibaba-NLP/gte-modernbert-base"
DEFAULT_MULTI_MODEL = "lightonai/LateOn-Code-edge"

__all__ = [
    "DEFAULT_DENSE_MODEL",
    "DEFAULT_MULTI_MODEL",
    "BatchEncoder",
    "Encoder",
    "Encoders",
    "cached_models",
    "load",
    "pull",
]

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder.base import BatchEncoder, Encoder, Encoders
    from codesearch.encoder.loading import cached_models, load, pull

_LAZY = {
    "load": "codesearch.encoder.loading",
    "pull": "codesearch.encoder.loading",
    "cached_models": "codesearch.encoder.loading",
    # The protocol every caller types against; `load` returns the local implementation
    # (`codesearch.encoder.runtime.Encoder`), which satisfies it.
    "Encoder": "codesearch.encoder.base",
    "Encoders": "codesearch.encoder.base",
    "BatchEncoder": "codesearch.encoder.base",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'codesearch.encoder' has no attribute {name!r}")
