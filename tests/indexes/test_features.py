"""The features the lexical index is written with (`codesearch.indexes.features`)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codesearch.indexes.features import defined_terms, exact_names, file_users, labels_owner, symbol_names


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


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_pairs", [1, 7, 4_000_000])
def test_file_users_counts_the_other_files_using_a_defined_name(seed, block_pairs):
    """Against the definition, for any block size: per file, the other files that use an
    exact (neither common nor wide) name it defines; a wide name's user count as a bound."""
    rng = np.random.default_rng(seed)
    n_files, n_terms = 40, 25
    uses = {(int(t), int(f)) for t, f in zip(rng.integers(0, n_terms, 300), rng.integers(0, n_files, 300))}
    defines = {(int(f), int(t)) for f, t in zip(rng.integers(0, n_files, 60), rng.integers(0, n_terms, 60))}
    df = np.bincount([t for t, _ in uses], minlength=n_terms)
    use_t, use_f = (np.array(x, dtype=np.int64) for x in zip(*sorted(uses)))
    def_f, def_t = (np.array(x, dtype=np.int64) for x in zip(*sorted(defines)))
    self_use = np.array([(t, f) in uses for f, t in sorted(defines)])
    got = file_users(def_f, def_t, df, use_t, use_f, self_use, n_files, exact_max_users=12, block_pairs=block_pairs)
    common = df > max(5.0, 0.25 * n_files)
    for f in range(n_files):
        mine = [t for g, t in defines if g == f and not common[t]]
        exact = {g for t in mine if df[t] <= 12 for u, g in uses if u == t and g != f}
        bound = max([df[t] - ((t, f) in uses) for t in mine if df[t] > 12], default=0)
        assert got[f] == max(len(exact), bound), f
