"""The features the lexical index is written with (`codesearch.indexes.features`)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from codesearch.indexes.features import defined_terms, exact_names, labels_owner, symbol_names


def _labels_owner_by_regex(symbol: str | None, scope: str | None) -> bool:
    """The definition: the symbol, not inside a longer word, in the scope's innermost part."""
    if not symbol or not scope or "," in symbol:
        return False
    inner = scope.rsplit(" > ", 1)[-1]
    return re.search(rf"(?<![\w$]){re.escape(symbol)}(?![\w$])", inner) is not None


_TEXT = st.text(alphabet="ab$_.: >é1(", max_size=14)


@settings(max_examples=400, deadline=None)
@given(symbol=st.one_of(st.none(), _TEXT), scope=st.one_of(st.none(), _TEXT))
def test_labels_owner_equals_its_regex_definition(symbol, scope):
    assert labels_owner(symbol, scope) == _labels_owner_by_regex(symbol, scope)


def test_labels_owner_examples():
    assert labels_owner("Plug.Session", "defmodule Plug.Session")
    assert labels_owner("run", "class Engine: > def run(self):")
    assert not labels_owner("run", "class Engine: > def run_all(self):")
    assert not labels_owner("run", "def run(): > def inner():")  # only the innermost part counts
    assert not labels_owner("a, b", "fn a")


def test_names_a_chunk_defines():
    assert symbol_names("$ZodType, parse") == {"zodtype", "parse"}
    assert exact_names("$ZodType, Serialize for str, a::B") == {"ZodType", "Serialize for str", "a::B", "B"}
    # Identifier-like names (3+ letters) and the file's stem, whole and without underscores,
    # stemmed as the index's terms are (a word with an underscore is not).
    assert defined_terms({"handlers", "parse_configs", "x", "a.b"}, "src/http_client.py") == {
        "handler", "parse_configs", "http_client", "httpclient"}
