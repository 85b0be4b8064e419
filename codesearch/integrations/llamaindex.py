"""A LlamaIndex retriever over a codesearch index (``pip install "codesearch-local[llamaindex]"``).

Example
-------
>>> from codesearch import CodeSearch
>>> from codesearch.integrations.llamaindex import CodeSearchRetriever
>>> retriever = CodeSearchRetriever(CodeSearch("path/to/repo"), k=4)         # doctest: +SKIP
>>> nodes = retriever.retrieve("where do we retry failed requests")        # doctest: +SKIP
>>> nodes[0].node.metadata["source"], nodes[0].score                       # doctest: +SKIP
('src/http/client.py:40-71', 0.83)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from codesearch.integrations import hit_metadata, missing

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.api import CodeSearch

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # only a missing package; a broken one re-raises below
    if exc.name is None or not exc.name.startswith("llama_index"):
        raise
    raise missing("llamaindex", "llama-index-core") from exc

__all__ = ["CodeSearchRetriever"]


class CodeSearchRetriever(BaseRetriever):
    """Return code chunks as LlamaIndex `NodeWithScore`s, best first.

    Parameters
    ----------
    codesearch : codesearch.CodeSearch
        An indexed repository.
    k : int
        How many nodes per query.
    mode : str
        ``"hybrid"``, ``"lexical"``, ``"dense"`` or ``"colbert"``.
    language, glob : str, optional
        Filters, as in `CodeSearch.search`.

    Each node is a `TextNode` whose text is the chunk's source, whose id is
    ``"path:start-end"`` and whose metadata holds ``path``, ``start_line``, ``end_line``,
    ``score``, ``language``, ``symbol``, ``kind`` and ``source``.
    """

    def __init__(
        self,
        codesearch: CodeSearch,
        k: int = 5,
        *,
        mode: str = "hybrid",
        language: str | None = None,
        glob: str | None = None,
        **kwargs: object,
    ) -> None:
        self.codesearch = codesearch
        self.k = k
        self.mode = mode
        self.language = language
        self.glob = glob
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = self.codesearch.search(
            query_bundle.query_str, self.k, mode=self.mode, language=self.language, glob=self.glob
        )
        return [
            NodeWithScore(
                node=TextNode(
                    id_=meta["source"],
                    text=hit.text,
                    metadata=meta,
                    # Keep the prompt text clean: metadata stays available but is not
                    # prepended to the chunk when the LLM sees it (the path is, via source).
                    excluded_llm_metadata_keys=[key for key in meta if key != "source"],
                    excluded_embed_metadata_keys=list(meta),
                ),
                score=float(hit.score),
            )
            for hit in hits
            for meta in (hit_metadata(hit),)
        ]
