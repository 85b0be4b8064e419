"""Query analysis: what a query names (identifiers, tests, docs) before any index is read."""

from __future__ import annotations

import re
from dataclasses import dataclass

from codesearch.indexes.lexical import (
    query_tokens,
)

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:(?:::|\.|->|\\)[A-Za-z_][A-Za-z0-9_]*)*")


# Looks like code inside a sentence: camelCase, PascalCase with two humps, snake_case or a
# qualified name. A lone capitalised word ("Session", "JSON") counts only as a whole query.
_CODEY_RE = re.compile(r"[a-z][A-Z]|[A-Z][a-z0-9]+[A-Z]|_|::|\.|->")


_TEST_WORDS = frozenset({"test", "tests", "testing", "spec", "specs", "mock", "mocks", "fixture", "fixtures"})


_DOC_WORDS = frozenset({"doc", "docs", "documentation", "example", "examples", "readme", "tutorial", "sample"})


_BENCH_WORDS = frozenset({"bench", "benchmark", "benchmarks", "perf"})
_IMPORT_WORDS = frozenset({"import", "imports", "imported", "include", "includes", "require", "requires",
                           "dependency", "dependencies"})


@dataclass(frozen=True)
class Query:
    text: str
    tokens: list[str]  # stemmed, stopwords removed (lexical terms)
    identifiers: list[str]  # lower-cased identifiers that look like code, or the lone word
    exact: frozenset[str]  # the same, case kept (full and last qualified part)
    wants_tests: bool
    wants_docs: bool
    wants_bench: bool
    wants_imports: bool
    is_symbol: bool  # the whole query is one identifier ("HTTPAdapter", "Sinatra::Base")


def analyse(query: str) -> Query:
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", query)]
    raw = _IDENT_RE.findall(query)
    single = len(query.split()) == 1
    idents: list[str] = []
    exact: set[str] = set()
    for r in raw:
        if single or _CODEY_RE.search(r):
            last = re.split(r"::|\.|->|\\", r)[-1]
            exact.update((r, last))
            idents.extend({r.lower(), last.lower()})
    return Query(
        text=query,
        tokens=query_tokens(query),
        identifiers=list(dict.fromkeys(idents)),
        exact=frozenset(exact),
        wants_tests=any(w in _TEST_WORDS for w in words),
        wants_docs=any(w in _DOC_WORDS for w in words),
        wants_bench=any(w in _BENCH_WORDS for w in words),
        wants_imports=any(w in _IMPORT_WORDS for w in words),
        is_symbol=single and bool(raw) and raw[0] == query.strip(),
    )
