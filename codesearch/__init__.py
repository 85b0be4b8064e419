"""codesearch: semantic code search and RAG retrieval over whole repositories.

The top-level names load lazily, so ``import codesearch`` (and ``codesearch --help``)
does not import torch.

Example
-------
>>> from codesearch import CodeSearch
>>> with CodeSearch("path/to/repo") as cs:          # doctest: +SKIP
...     cs.index()
...     for hit in cs.search("where do we retry failed HTTP requests", k=5):
...         print(hit.path, hit.start_line, hit.end_line, round(hit.score, 3))
"""

from __future__ import annotations

from codesearch import _compat
from codesearch.errors import CodeSearchError

__version__ = "0.1.0"

__all__ = ["Chunk", "CodeSearch", "CodeSearchError", "SearchHit", "__version__"]

TYPE_CHECKING = False  # (typing itself costs a warm query ~3 ms: see codesearch.cli.lean)
if TYPE_CHECKING:  # pragma: no cover
    from codesearch.api import CodeSearch
    from codesearch.types import Chunk, SearchHit

_LAZY = {
    "CodeSearch": "codesearch.api",
    "SearchHit": "codesearch.types",
    "Chunk": "codesearch.types",
}


_compat.install()  # old import paths (codesearch.build.*) for one release


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'codesearch' has no attribute {name!r}")
