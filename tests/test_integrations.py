"""The LangChain and LlamaIndex retrievers against the real installed libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fixtures.sample_repo import EXPECTED, write_sample_repo

from codesearch import CodeSearch

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")


@pytest.fixture(scope="module")
def cs(tmp_path_factory):
    root = write_sample_repo(tmp_path_factory.mktemp("retriever_repo"))
    search = CodeSearch(root, model=None, multi_model=None)
    search.index()
    yield search
    search.close()


META = {"path", "start_line", "end_line", "score", "language", "symbol", "kind", "source"}


@pytest.mark.parametrize("query,path", sorted(EXPECTED.items()))
def test_langchain_retriever_returns_documents_with_locations(cs, query, path):
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from codesearch.integrations.langchain import CodeSearchRetriever

    retriever = CodeSearchRetriever(codesearch=cs, k=2, mode="lexical")
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke(query)
    assert 1 <= len(docs) <= 2 and all(isinstance(d, Document) for d in docs)
    top = docs[0]
    assert set(top.metadata) == META
    assert top.metadata["path"] == path
    assert top.metadata["source"] == f"{path}:{top.metadata['start_line']}-{top.metadata['end_line']}"
    hit = cs.search(query, k=1, mode="lexical")[0]
    assert top.page_content == hit.text and top.metadata["score"] == pytest.approx(hit.score)


def test_langchain_retriever_passes_filters(cs):
    from codesearch.integrations.langchain import CodeSearchRetriever

    docs = CodeSearchRetriever(codesearch=cs, k=5, mode="lexical", language="go").invoke("server database")
    assert docs and {d.metadata["language"] for d in docs} == {"go"}
    batch = CodeSearchRetriever(codesearch=cs, k=1, mode="lexical").batch(["parseConfigFile", "openDatabaseConnection"])
    assert [b[0].metadata["path"] for b in batch] == ["src/config.js", "server/main.go"]


@pytest.mark.parametrize("query,path", sorted(EXPECTED.items()))
def test_llamaindex_retriever_returns_nodes_with_scores(cs, query, path):
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

    from codesearch.integrations.llamaindex import CodeSearchRetriever

    retriever = CodeSearchRetriever(cs, k=2, mode="lexical")
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve(query)
    assert 1 <= len(nodes) <= 2 and all(isinstance(n, NodeWithScore) for n in nodes)
    top = nodes[0]
    assert isinstance(top.node, TextNode) and set(top.node.metadata) == META
    assert top.node.metadata["path"] == path and top.node.node_id == top.node.metadata["source"]
    assert top.score == pytest.approx(top.node.metadata["score"])
    assert [n.score for n in nodes] == sorted((n.score for n in nodes), reverse=True)
    llm_text = top.node.get_content(metadata_mode=MetadataMode.LLM)
    assert top.node.metadata["source"] in llm_text and top.node.text in llm_text


def test_llamaindex_retriever_takes_a_query_bundle_and_filters(cs):
    from llama_index.core.schema import QueryBundle

    from codesearch.integrations.llamaindex import CodeSearchRetriever

    nodes = CodeSearchRetriever(cs, k=3, mode="lexical", glob="src/**").retrieve(QueryBundle("retry config"))
    assert nodes and all(n.node.metadata["path"].startswith("src/") for n in nodes)


@pytest.mark.parametrize(
    "module,blocked,extra",
    [
        ("codesearch.integrations.langchain", "langchain_core", "langchain"),
        ("codesearch.integrations.llamaindex", "llama_index", "llamaindex"),
    ],
)
def test_missing_extra_names_the_pip_command(module, blocked, extra):
    # Make the framework unimportable in a fresh interpreter, as if it were not installed.
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name == {blocked!r} or name.startswith({blocked!r} + '.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from codesearch.errors import MissingDependencyError\n"
        "try:\n"
        f"    import {module}\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f'pip install "codesearch-local[{extra}]"' in out
