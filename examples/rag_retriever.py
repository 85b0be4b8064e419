"""Retrieve code context for an LLM prompt (RAG).

Usage: python examples/rag_retriever.py PATH QUESTION [--lexical]

Prints the prompt you would send to a model: the question plus the best chunks, each
labelled with its `path:start-end` so the answer can cite it. With langchain-core installed
(pip install "codesearch-local[langchain]") the same context comes from a LangChain retriever.
"""

from __future__ import annotations

import sys

from codesearch import CodeSearch
from codesearch.errors import MissingDependencyError

PROMPT = """Answer the question using only the code below. Cite files as path:lines.

{context}

Question: {question}
"""


def build_context(cs: CodeSearch, question: str, *, k: int = 4, mode: str = "hybrid", budget: int = 6000) -> str:
    """The best chunks, labelled, until `budget` characters are used."""
    parts: list[str] = []
    used = 0
    for hit in cs.search(question, k=k, mode=mode):
        block = f"### {hit.path}:{hit.start_line}-{hit.end_line}\n```{hit.language}\n{hit.text.rstrip()}\n```"
        if used + len(block) > budget:
            break
        parts.append(block)
        used += len(block)
    return "\n\n".join(parts)


def main(argv: list[str]) -> None:
    lexical = "--lexical" in argv
    path, question = [a for a in argv if a != "--lexical"][:2]
    models = {"model": None, "multi_model": None} if lexical else {}
    mode = "lexical" if lexical else "hybrid"
    with CodeSearch(path, **models) as cs:
        cs.index()
        print(PROMPT.format(context=build_context(cs, question, mode=mode), question=question))

        try:  # the same retrieval through LangChain, when the extra is installed
            from codesearch.integrations.langchain import CodeSearchRetriever
        except MissingDependencyError:
            return
        docs = CodeSearchRetriever(codesearch=cs, k=2, mode=mode).invoke(question)
        print("LangChain sources:", ", ".join(d.metadata["source"] for d in docs), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
