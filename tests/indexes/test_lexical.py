"""LexicalIndex: tokenizer, BM25 against a hand computation, persistence, updates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codesearch.errors import IndexCorruptError
from codesearch.indexes.lexical import (
    LexicalIndex,
    query_tokens,
    split_identifier,
    tokenize,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("getUserName", ["getusername", "get", "user", "name"]),
        ("parse_http_response", ["parse_http_response", "parse", "http", "response"]),
        ("HTTPServer", ["httpserver", "http", "server"]),
        ("base64Encode", ["base64encode", "base", "encode"]),
        ("utf8", ["utf8", "utf"]),
        ("__init__", ["__init__", "init"]),
        ("plain", ["plain"]),
        ("a = 42 + x", []),  # one-letter names and bare numbers carry no signal
        ("Sinatra::Base.new", ["sinatra", "base", "new"]),
    ],
)
def test_tokenize_splits_and_keeps_whole(text, expected):
    assert tokenize(text, stem=False) == expected


def test_split_identifier_digits_and_acronyms():
    assert split_identifier("parseHTTPResponse2_fast") == ["parse", "http", "response", "2", "fast"]


@pytest.mark.parametrize(
    ("word", "stem"),
    [("parses", "pars"), ("parsing", "pars"), ("parsed", "pars"), ("parse", "pars"), ("classes", "class"),
     ("dependencies", "dependency"), ("handlers", "handler"), ("status", "status"), ("bus", "bus")],
)
def test_light_stemming_meets_variants(word, stem):
    assert tokenize(word) == [stem]


def test_query_tokens_drop_stopwords_unless_nothing_is_left():
    assert query_tokens("how are routes registered", stem=False) == ["routes", "registered"]
    assert query_tokens("how to", stem=False) == ["how", "to"]


def _bm25(tf: int, dl: int, avgdl: float, n: int, df: int, k1: float = 1.2, b: float = 0.75) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))


def test_bm25_scores_match_hand_computation():
    idx = LexicalIndex(stem=False, stopwords=False)
    docs = ["apple apple banana", "banana cherry", "cherry cherry cherry date"]
    idx.add(np.array([10, 20, 30]), docs)
    avgdl = (3 + 2 + 4) / 3
    ids, scores = idx.search(["apple cherry"], k=10)[0]
    expected = {
        10: _bm25(2, 3, avgdl, 3, 1),
        20: _bm25(1, 2, avgdl, 3, 2),
        30: _bm25(3, 4, avgdl, 3, 2),
    }
    assert ids.tolist() == sorted(expected, key=lambda i: -expected[i])
    np.testing.assert_allclose(scores, [expected[i] for i in ids.tolist()], rtol=1e-5)
    # A term no document has scores nothing; k cuts the list.
    assert idx.search(["zebra"], k=5)[0][0].tolist() == []
    assert len(idx.search(["cherry"], k=1)[0][0]) == 1


def test_search_takes_a_list_of_queries():
    idx = LexicalIndex()
    idx.add(np.array([1]), ["fn main() {}"])
    with pytest.raises(TypeError):
        idx.search("main", k=1)
    assert [r[0].tolist() for r in idx.search(["main", "nothing"], k=3)] == [[1], []]


def test_identifier_matches_split_and_whole_queries():
    idx = LexicalIndex()
    idx.add(np.array([1, 2]), ["class HttpClient:\n    pass", "def parse_url(url): ..."])
    for q in ("HttpClient", "http client", "httpclient"):
        assert idx.search([q], k=1)[0][0].tolist() == [1], q
    assert idx.search(["parse url"], k=1)[0][0].tolist() == [2]


def test_remove_and_add_update_statistics():
    idx = LexicalIndex(stem=False, stopwords=False)
    idx.add(np.array([1, 2, 3]), ["alpha beta", "beta gamma", "gamma delta"])
    idx.remove(np.array([2, 99]))  # unknown ids are ignored
    assert len(idx) == 2
    assert idx.search(["beta"], k=5)[0][0].tolist() == [1]
    # Re-adding an id replaces its text.
    idx.add(np.array([1]), ["omega"])
    assert idx.search(["beta"], k=5)[0][0].tolist() == []
    assert idx.search(["omega"], k=5)[0][0].tolist() == [1]
    # The scores equal those of an index built from scratch on the same live texts.
    fresh = LexicalIndex(stem=False, stopwords=False)
    fresh.add(np.array([3, 1]), ["gamma delta", "omega"])
    for q in ("gamma", "omega delta"):
        a, b = idx.search([q], k=5)[0], fresh.search([q], k=5)[0]
        assert a[0].tolist() == b[0].tolist()
        np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_save_load_round_trip(tmp_path):
    idx = LexicalIndex(k1=1.5, b=0.5)
    idx.add(np.array([5, 6, 7]), ["def open_db(path)", "class Cursor: fetch rows", "fetchAll rows from db"])
    path = tmp_path / "lexical.npz"
    idx.save(path)
    assert not list(tmp_path.glob("*.tmp"))
    back = LexicalIndex.load(path)
    assert (back.k1, back.b, len(back)) == (1.5, 0.5, 3)
    for q in ("db", "fetch rows", "Cursor"):
        a, b = idx.search([q], k=3)[0], back.search([q], k=3)[0]
        assert a[0].tolist() == b[0].tolist()
        np.testing.assert_allclose(a[1], b[1])
    back.add(np.array([8]), ["open cursor"])  # a loaded index keeps growing
    assert 8 in back.search(["cursor"], k=5)[0][0].tolist()


def test_empty_index_round_trip(tmp_path):
    LexicalIndex().save(tmp_path / "l.npz")
    back = LexicalIndex.load(tmp_path / "l.npz")
    assert len(back) == 0 and back.search(["x y"], k=3)[0][0].tolist() == []


@pytest.mark.parametrize("damage", ["garbage", "truncate", "missing"])
def test_corrupt_file_raises_index_corrupt_error(tmp_path, damage):
    idx = LexicalIndex()
    idx.add(np.array([1, 2]), ["alpha beta", "gamma"])
    path = tmp_path / "lexical.npz"
    idx.save(path)
    if damage == "garbage":
        path.write_bytes(b"not an npz file at all")
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.unlink()
    with pytest.raises(IndexCorruptError, match="--rebuild") as err:
        LexicalIndex.load(path)
    assert "lexical.npz" in str(err.value)


def _reference_tokenize(text: str, stem: bool) -> list[str]:
    """The per-occurrence tokenizer the cached one replaced (kept here as the oracle)."""
    import re

    from codesearch.indexes.lexical import stem_word

    out: list[str] = []
    for word in re.findall(r"[A-Za-z0-9_]+", text):
        stripped = word.strip("_")
        if not stripped or stripped.isdigit():
            continue
        whole = word.lower()
        parts = split_identifier(stripped)
        if len(whole) > 1:
            out.append(whole)
        if len(parts) > 1:
            out.extend(p for p in parts if len(p) > 1 and not p.isdigit())
        elif parts and parts[0] != whole and len(parts[0]) > 1:
            out.append(parts[0])
    return [stem_word(t) for t in out] if stem else out


_REAL_SOURCES = [
    "class HTTPAdapter(BaseAdapter):\n    def send(self, request, stream=False, timeout=None):\n"
    "        # parsing retries: __init__, _private, utf8, base64Encode, 42, x_1, ___\n"
    "        return self.build_response(request, resp)  # handles classes / dependencies\n",
    "func (engine *Engine) ServeHTTP(w http.ResponseWriter, req *http.Request) {\n\tc := engine.pool.Get()\n}",
    "impl<'de> Deserialize<'de> for String { fn deserialize<D>(d: D) -> Result<String, D::Error> {} }",
    "",
    "___ 123 a b c ÄÖÜ naïve_café données",
]


@pytest.mark.parametrize("stem", [True, False])
def test_cached_tokenizer_matches_reference(stem):
    for text in [*_REAL_SOURCES, " ".join(_REAL_SOURCES) * 3]:
        assert tokenize(text, stem=stem) == _reference_tokenize(text, stem)


def test_add_builds_the_same_matrix_as_per_token_counting():
    """Vocabulary ids and every term frequency equal those of counting each token."""
    from collections import Counter

    texts = _REAL_SOURCES * 2 + [t.upper() for t in _REAL_SOURCES]
    idx = LexicalIndex()
    idx.add(np.arange(len(texts)), texts)
    vocab: dict[str, int] = {}
    rows = []
    for text in texts:
        counts = Counter(_reference_tokenize(text, stem=True))
        rows.append({vocab.setdefault(t, len(vocab)): c for t, c in counts.items()})
    assert idx.vocab == vocab
    dense = idx.tf.toarray()
    expected = np.zeros_like(dense)
    for r, row in enumerate(rows):
        for col, c in row.items():
            expected[r, col] = c
    np.testing.assert_array_equal(dense, expected)
