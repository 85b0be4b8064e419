"""A LangChain retriever over a codesearch index (``pip install "codesearch-local[langchain]"``).

Example
-------
>>> from codesearch import CodeSearch
>>> from codesearch.integrations.langchain import CodeSearchRetriever
>>> retriever = CodeSearchRetriever(codesearch=CodeSearch("path/to/repo"), k=4)  # doctest: +SKIP
>>> docs = retriever.invoke("where do we retry failed requests")                 # doctest: +SKIP
>>> docs[0].metadata["source"]                                                   # doctest: +SKIP
'src/http/client.py:40-71'
"""

from __future__ import annotations

from typing import Any

from codesearch.integrations import hit_metadata, missing

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # only a missing package; a broken one re-raises below
    if exc.name is None or not exc.name.startswith("langchain_core"):
        raise
    raise missing("langchain", "langchain-core") from exc

__all__ = ["CodeSearchRetriever"]


class CodeSearchRetriever(BaseRetriever):
    """Return code chunks as LangChain `Document`s, best first.

    Attributes
    ----------
    codesearch : codesearch.CodeSearch
        An indexed repository.
    k : int
        How many documents per query.
    mode : str
        ``"hybrid"``, ``"lexical"``, ``"dense"`` or ``"colbert"``.
    language, glob : str, optional
        Filters, as in `CodeSearch.search`.

    Each document's ``page_content`` is the chunk's source text and its ``metadata`` holds
    ``path``, ``start_line``, ``end_line``, ``score``, ``language``, ``symbol``, ``kind``
    and ``source`` (``"path:start-end"``).
    """

    codesearch: Any
    k: int = 5
    mode: str = "hybrid"
    language: str | None = None
    glob: str | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        hits = self.codesearch.search(query, self.k, mode=self.mode, language=self.language, glob=self.glob)
        return [Document(page_content=hit.text, metadata=hit_metadata(hit)) for hit in hits]
