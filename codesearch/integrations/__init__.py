"""Retriever adapters for RAG frameworks, each behind its own optional extra.

- `codesearch.integrations.langchain.CodeSearchRetriever` (``pip install "codesearch-local[langchain]"``)
- `codesearch.integrations.llamaindex.CodeSearchRetriever` (``pip install "codesearch-local[llamaindex]"``)

Both wrap a `codesearch.CodeSearch` and put the same metadata on every result (see
`hit_metadata`), so a prompt can cite ``path:start-end`` whichever framework built it.
They live in their own sub-package, away from `codesearch.api`, so that importing the core
never imports a framework and a missing framework fails only where it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from codesearch.errors import MissingDependencyError, install_line

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.types import JSONDict, SearchHit


def hit_metadata(hit: SearchHit) -> JSONDict:
    """The metadata every adapter attaches to a hit: the fields of the JSON schema
    (`codesearch.api.hit_document`) but the text, which is the document's content, plus
    ``source`` (``"path:start-end"``) for citing it."""
    from codesearch.types import hit_document

    meta = hit_document(hit)
    del meta["text"]
    meta["source"] = f"{hit.path}:{hit.start_line}-{hit.end_line}"
    return meta


def missing(extra: str, module: str) -> MissingDependencyError:
    """The error raised when an adapter's framework is not installed."""
    return MissingDependencyError(
        f"the {extra} retriever needs {module!r}, which is not installed ({install_line(extra)})"
    )
