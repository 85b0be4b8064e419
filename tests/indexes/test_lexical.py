"""LexicalIndex: tokenizer, BM25 against a hand computation, postings, persistence, updates, damage."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from fixtures.lexical import chunk, file_ids, store_of, write_lexical

from codesearch.errors import IndexCorruptError
from codesearch.indexes import lexical_writer
from codesearch.indexes.lexical import (
    LexicalIndex,
    query_tokens,
    split_identifier,
    tokenize,
)
from codesearch.store import Store


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


def _index(tmp_path, texts: dict[str, str], **params) -> LexicalIndex:
    """One chunk per file; single-letter folders and names, which give no tokens, so each
    document is its text."""
    store = store_of({path: [chunk(path, 1, 1, text)] for path, text in texts.items()})
    return write_lexical(store, tmp_path / "lexical", **params)


def _ids(index: LexicalIndex) -> dict[str, int]:
    """path -> chunk id of a one-chunk-per-file index."""
    rows, _ = index.file_rows(index.live_files())
    ids = index.row_values("ids", rows).tolist()
    return dict(zip(index.paths(index.file_of(rows)), ids))


def test_bm25_scores_match_hand_computation(tmp_path):
    idx = _index(tmp_path, {"a/x": "apple apple banana", "b/x": "banana cherry", "c/x": "cherry cherry cherry date"},
                 stem=False, stopwords=False)
    by_path = _ids(idx)
    avgdl = (3 + 2 + 4) / 3
    ids, scores = idx.search(["apple cherry"], k=10)[0]
    expected = {
        by_path["a/x"]: _bm25(2, 3, avgdl, 3, 1),
        by_path["b/x"]: _bm25(1, 2, avgdl, 3, 2),
        by_path["c/x"]: _bm25(3, 4, avgdl, 3, 2),
    }
    assert ids.tolist() == sorted(expected, key=lambda i: -expected[i])
    np.testing.assert_allclose(scores, [expected[i] for i in ids.tolist()], rtol=1e-6)
    # A term no document has scores nothing; k cuts the list.
    assert idx.search(["zebra"], k=5)[0][0].tolist() == []
    assert len(idx.search(["cherry"], k=1)[0][0]) == 1


def test_search_takes_a_list_of_queries(tmp_path):
    idx = _index(tmp_path, {"a/x": "fn main() {}"})
    with pytest.raises(TypeError):
        idx.search("main", k=1)
    assert [len(r[0]) for r in idx.search(["main", "nothing"], k=3)] == [1, 0]


def test_identifier_matches_split_and_whole_queries(tmp_path):
    idx = _index(tmp_path, {"a/x": "class HttpClient:\n    pass", "b/x": "def parse_url(url): ..."})
    by_path = _ids(idx)
    for q in ("HttpClient", "http client", "httpclient"):
        assert idx.search([q], k=1)[0][0].tolist() == [by_path["a/x"]], q
    assert idx.search(["parse url"], k=1)[0][0].tolist() == [by_path["b/x"]]


def test_updates_give_the_scores_of_an_index_built_from_scratch(tmp_path):
    """A removed file, a file written again and a new one: live counts, document
    frequencies and lengths are those of the live files only."""
    files = {"a/x": "alpha beta", "b/x": "beta gamma", "c/x": "gamma delta"}
    store = store_of({p: [chunk(p, 1, 1, t)] for p, t in files.items()})
    idx = write_lexical(store, tmp_path / "lexical", stem=False, stopwords=False)
    gone = file_ids(store, ["b/x"])
    store_of({"a/x": [chunk("a/x", 1, 1, "omega")], "d/x": [chunk("d/x", 1, 1, "omega omega beta")]}, store,
             removed=("b/x",))
    idx = lexical_writer.update(idx, store, gone, file_ids(store, ["a/x", "d/x"]))
    idx.save(tmp_path / "lexical")
    idx = LexicalIndex.load(tmp_path / "lexical")
    assert len(idx) == 3
    fresh = _index(tmp_path / "fresh", {"a/x": "omega", "c/x": "gamma delta", "d/x": "omega omega beta"},
                   stem=False, stopwords=False)
    for q in ("beta", "gamma", "omega delta", "alpha"):
        a, b = idx.search([q], k=5)[0], fresh.search([q], k=5)[0]
        paths = [sorted(i.paths(i.file_of(i.rows_of(ids)))) for i, ids in ((idx, a[0]), (fresh, b[0]))]
        assert paths[0] == paths[1]
        np.testing.assert_array_equal(np.sort(a[1]), np.sort(b[1]))  # bit for bit


def test_save_load_round_trip(tmp_path):
    texts = {"a/x": "def open_db(path)", "b/x": "class Cursor: fetch rows", "c/x": "fetchAll rows from db"}
    idx = _index(tmp_path, texts, k1=1.5, b=0.5)
    back = LexicalIndex.load(tmp_path / "lexical")
    assert (back.k1, back.b, len(back)) == (1.5, 0.5, 3)
    assert not [p for p in (tmp_path / "lexical").iterdir() if ".tmp" in p.name]
    for q in ("db", "fetch rows", "Cursor"):
        a, b = idx.search([q], k=3)[0], back.search([q], k=3)[0]
        assert a[0].tolist() == b[0].tolist()
        np.testing.assert_array_equal(a[1], b[1])


def test_empty_index_round_trip(tmp_path):
    idx = write_lexical(Store(":memory:"), tmp_path / "lexical")
    back = LexicalIndex.load(tmp_path / "lexical")
    assert len(idx) == len(back) == 0 and back.search(["x y"], k=3)[0][0].tolist() == []


@pytest.mark.parametrize("damage", ["garbage", "truncate", "missing", "version", "segment gone", "segment cut"])
def test_corrupt_file_raises_index_corrupt_error(tmp_path, damage):
    _index(tmp_path, {"a/x": "alpha beta", "b/x": "gamma"})
    folder = tmp_path / "lexical"
    manifest = folder / "manifest.json"
    segment = next(folder.glob("seg-*.bin"))
    if damage == "garbage":
        manifest.write_bytes(b"not a manifest at all")
    elif damage == "truncate":
        manifest.write_bytes(manifest.read_bytes()[:100])
    elif damage == "missing":
        manifest.unlink()
    elif damage == "version":
        manifest.write_text(manifest.read_text().replace('"version": 1', '"version": 99'))
    elif damage == "segment gone":
        segment.unlink()
    else:
        segment.write_bytes(segment.read_bytes()[:300])
    with pytest.raises(IndexCorruptError, match="--rebuild") as err:
        LexicalIndex.load(folder)
    assert "lexical" in str(err.value)


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


def test_postings_hold_the_counts_of_per_token_counting(tmp_path):
    """Every term's postings (rows and counts) equal those of counting each token of each
    chunk's header and text (the reference tokenizer)."""
    from collections import Counter

    texts = _REAL_SOURCES * 2 + [t.upper() for t in _REAL_SOURCES]
    files = {f"d{i}/f{i}.py": [chunk(f"d{i}/f{i}.py", 1, 1, t)] for i, t in enumerate(texts)}
    idx = write_lexical(store_of(files), tmp_path / "lexical")
    expected: dict[str, dict[str, int]] = {}
    for path, (c,) in files.items():
        for term, n in Counter(_reference_tokenize(c.header + "\n" + c.text, stem=True)).items():
            expected.setdefault(term, {})[path] = n
    for term, by_path in expected.items():
        p = idx.postings(term)
        assert dict(zip(idx.paths(p.files), p.tf.astype(int).tolist())) == by_path, term
    assert idx.postings("nosuchterm") is None


def _many_files(n: int = 17) -> dict[str, list]:
    """``n`` small Python files in nested folders, sharing names, each with two chunks."""
    return {
        f"pkg{i % 3}/sub_{i % 2}/mod_{i}.py": [
            chunk(f"pkg{i % 3}/sub_{i % 2}/mod_{i}.py", 1, 2, f"def parse_{i}(x):\n    return Shared{i % 4}(x)",
                  symbol=f"parse_{i}, Shared{i % 4}.parse_{i}"),
            chunk(f"pkg{i % 3}/sub_{i % 2}/mod_{i}.py", 3, 4, _REAL_SOURCES[i % len(_REAL_SOURCES)],
                  symbol="Decoder" if i % 2 else None),
        ]
        for i in range(n)
    }


def test_a_runs_segments_equal_segments_written_alone(tmp_path, monkeypatch):
    """One run writes many segments through one vocabulary (run-wide keys, kept in byte
    order across segments; folder words worked out once): each segment's tables, postings
    and per-file own terms are those of a segment written alone from the same files."""
    monkeypatch.setattr(lexical_writer, "ROWS_PER_SEGMENT", 3)
    files = _many_files(13)
    index = write_lexical(store_of(files), tmp_path / "run")
    assert len(index.segments) > 4
    for s, seg in enumerate(index.segments):
        paths = [p.decode() for p in seg.paths.all()]
        alone = write_lexical(store_of({p: files[p] for p in paths}), tmp_path / f"alone{s}").segments
        assert len(alone) == 1
        for table in ("terms", "symbols", "exact", "pathwords", "stems"):
            keys = seg.tables[table].table.all()
            assert keys == alone[0].tables[table].table.all(), table
            assert keys == sorted(set(keys)), table
            for part in ("post", "vals"):
                np.testing.assert_array_equal(seg.arrays[f"{table}_{part}"], alone[0].arrays[f"{table}_{part}"])
        np.testing.assert_array_equal(seg.arrays["terms_tf"], alone[0].arrays["terms_tf"])
        np.testing.assert_array_equal(seg.arrays["length"], alone[0].arrays["length"])
        assert seg.defs.all() == alone[0].defs.all()

        def own(segment):
            terms, off = segment.tables["terms"].table.all(), segment.arrays["own_off"]
            return [{terms[t] for t in segment.arrays["own_terms"][off[f]:off[f + 1]]} for f in range(segment.m)]

        assert own(seg) == own(alone[0])
        terms = set(seg.tables["terms"].table.all())
        assert own(seg) == [{t.encode() for t in tokenize(p)} & terms for p in paths]


def _segment_bytes(index: LexicalIndex) -> list[tuple]:
    return [(seg.entry.sizes, seg.entry.languages, {k: np.asarray(seg.arrays[k]).tobytes() for k in seg.arrays.spec})
            for seg in index.segments]


#: Where the workers of a parallel build note their pid (set by the test; forked workers see it).
_PIDS: list = []


def _write_group_noting_pid(*args):
    (_PIDS[0] / str(os.getpid())).touch()
    return _REAL_WRITE_GROUP(*args)


def _write_group_failing(*args):
    raise RuntimeError("a worker that dies")


_REAL_WRITE_GROUP = lexical_writer._write_group


@pytest.mark.parametrize("cores", [2, 3])
def test_a_build_in_worker_processes_writes_what_one_process_writes(tmp_path, monkeypatch, cores):
    """Past `PARALLEL_MIN_ROWS`, a build writes runs of consecutive segments in as many
    processes as there are cores, each with its own numbering of the words: the segments
    are those one process writes, array for array, and so is the index's centrality."""
    monkeypatch.setattr(lexical_writer, "ROWS_PER_SEGMENT", 3)
    monkeypatch.setattr(lexical_writer.os, "cpu_count", lambda: cores)
    # Forked workers (those of a caller with no other thread), whatever threads earlier tests
    # left: they see this module's patches, and so note their pids.
    monkeypatch.setattr(lexical_writer, "start_method", lambda: "fork")
    store = store_of(_many_files(), Store(tmp_path / "store.sqlite"))
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS", 10**9)
    alone = write_lexical(store, tmp_path / "alone")
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS", 0)
    groups = lexical_writer._groups(store, "fork")
    assert groups is not None and len(groups) == cores
    assert sum(g[2] for g in groups) == store.count("chunks") and sum(g[3] for g in groups) == store.count("files")
    pids = tmp_path / "pids"
    pids.mkdir()
    _PIDS[:] = [pids]
    monkeypatch.setattr(lexical_writer, "_write_group", _write_group_noting_pid)
    split = write_lexical(store, tmp_path / "split", parallel=True)
    workers = {int(p.name) for p in pids.iterdir()}
    assert len(workers) == cores - 1 and os.getpid() not in workers  # (this process writes the first run)
    assert len(split.segments) == len(alone.segments) > cores
    assert _segment_bytes(split) == _segment_bytes(alone)
    files = np.arange(alone.n_files)
    np.testing.assert_array_equal(split.users(files), alone.users(files))
    for (ids_a, scores_a), (ids_b, scores_b) in zip(split.search(["parse shared decoder", "http adapter"], 10),
                                                    alone.search(["parse shared decoder", "http adapter"], 10)):
        assert len(ids_a) and ids_a.tolist() == ids_b.tolist() and scores_a.tolist() == scores_b.tolist()


def test_a_build_beside_other_threads_starts_its_workers_from_a_forkserver(tmp_path, monkeypatch, caplog):
    """A caller with threads (the daemon indexes on one) gets workers from a forkserver: they
    import the writer afresh (none of this process's state, patches included), and write the
    same segments, cut where this process would cut them."""
    import threading

    monkeypatch.setattr(lexical_writer, "ROWS_PER_SEGMENT", 3)
    monkeypatch.setattr(lexical_writer.os, "cpu_count", lambda: 2)
    store = store_of(_many_files(), Store(tmp_path / "store.sqlite"))
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS", 10**9)
    alone = write_lexical(store, tmp_path / "alone")
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS_FORKSERVER", 0)
    methods, built = [], []

    def build() -> None:
        methods.append(lexical_writer.start_method())
        built.append(write_lexical(Store(tmp_path / "store.sqlite", readonly=True), tmp_path / "served", parallel=True))

    worker = threading.Thread(target=build)
    worker.start()
    worker.join(timeout=120)
    assert methods == ["forkserver"] and built
    assert not [r for r in caplog.records if "worker" in r.getMessage()]  # (the worker wrote its part)
    assert _segment_bytes(built[0]) == _segment_bytes(alone)


def test_a_build_whose_worker_fails_writes_its_segments_here(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(lexical_writer, "ROWS_PER_SEGMENT", 3)
    monkeypatch.setattr(lexical_writer, "start_method", lambda: "fork")  # (the workers see the failing stand-in)
    monkeypatch.setattr(lexical_writer.os, "cpu_count", lambda: 2)
    store = store_of(_many_files(), Store(tmp_path / "store.sqlite"))
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS", 10**9)
    alone = write_lexical(store, tmp_path / "alone")
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS", 0)
    monkeypatch.setattr(lexical_writer, "_write_group", _write_group_failing)
    assert _segment_bytes(write_lexical(store, tmp_path / "here", parallel=True)) == _segment_bytes(alone)
    assert ["a lexical segment worker failed (a worker that dies); writing its 9 files here"] == [
        r.getMessage() for r in caplog.records if "worker" in r.getMessage()]


def test_a_build_inside_a_transaction_in_memory_or_without_the_lock_is_written_here(tmp_path, monkeypatch):
    """Workers read the store from its file: what a transaction of this process has not
    committed, or an in-memory store, they could not see; nor may a run commit between their
    reads, which the index lock rules out (a reader's rebuild does not hold it)."""
    monkeypatch.setattr(lexical_writer, "ROWS_PER_SEGMENT", 3)
    monkeypatch.setattr(lexical_writer, "PARALLEL_MIN_ROWS", 0)
    monkeypatch.setattr(lexical_writer.os, "cpu_count", lambda: 2)
    assert lexical_writer._groups(store_of(_many_files()), "fork") is None
    store = store_of(_many_files(), Store(tmp_path / "store.sqlite"))
    assert lexical_writer._groups(store, "fork") is not None
    with store.transaction():
        assert lexical_writer._groups(store, "fork") is None
    # A reader's build (it holds no lock: a run may commit while workers read) is written here.
    monkeypatch.setattr(lexical_writer, "_write_all", None)
    assert len(write_lexical(store, tmp_path / "reader").segments) > 2
