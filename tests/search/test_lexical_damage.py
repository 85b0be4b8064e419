"""A damaged or crafted lexical index never crashes a search and never reaches a score.

Each case rewrites one array of a real index (the container files are rewritten whole, so
only the values lie) and searches with a new `Searcher`, as a new process would: what the
checks catch is rebuilt from the store and the answer is the undamaged one; what can only
lie (a file's centrality count, a chunk's length) is bounded so every score stays finite.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch.indexes.lexical import LexicalIndex, segment_spec
from codesearch.indexes.lexical_arrays import Arrays, write_arrays
from codesearch.indexing import run as pipeline
from codesearch.search.searcher import Searcher

QUERIES = ["parse config file", "HttpClient", "retry with backoff", "nothing matches zzzq"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    root = write_sample_repo(tmp_path_factory.mktemp("damage") / "repo")
    pipeline.build_index(root)
    with Searcher(root / ".codesearch") as s:
        answers = {q: _answer(s, q) for q in QUERIES}
    return root, answers


def _answer(s: Searcher, query: str, **kw) -> list[tuple[str, int, float]]:
    return [(h.path, h.start_line, h.score) for h in s.search(query, 5, mode="lexical", **kw).hits]


def _rewrite(path: Path, spec: dict, change) -> None:
    a = Arrays(path, spec)
    arrays = {name: np.array(a[name]) for name in spec}
    del a
    change(arrays)
    write_arrays(path, arrays)


def _segment(folder: Path) -> tuple[Path, dict]:
    index = LexicalIndex.load(folder)
    entry = index.manifest.segments[0]
    return folder / f"{entry.name}.bin", segment_spec(entry.sizes)


def _state(folder: Path) -> tuple[Path, dict]:
    index = LexicalIndex.load(folder)
    n = index.n_files
    return folder / f"{index.manifest.state}.bin", {"live": ("|u1", (n,)), "users": ("<f4", (n,))}


def _reverse_postings(a):
    a["terms_post"][1:-1] = a["terms_post"][1:-1][::-1].copy()


def _rows_past_the_end(a):
    a["terms_vals"][:] = 1 << 30


def _files_out_of_range(a):
    a["row_file"][:] = -7


def _file_rows_out_of_order(a):
    a["file_rows"][1] = a["file_rows"][-1] + 5


def _term_offsets_out_of_order(a):
    a["terms_off"][1:-1] = a["terms_off"][-1] + 100


REBUILT = {
    "postings offsets": _reverse_postings,
    "postings rows": _rows_past_the_end,
    "row files": _files_out_of_range,
    "file row ranges": _file_rows_out_of_order,
    "term table": _term_offsets_out_of_order,
}


@pytest.mark.parametrize("damage", sorted(REBUILT))
def test_a_damaged_segment_is_rebuilt_and_the_answer_is_the_same(built, tmp_path, damage):
    root, answers = built
    repo = Path(shutil.copytree(root, tmp_path / "repo"))
    folder = repo / ".codesearch" / "lexical"
    before = (folder / "manifest.json").read_bytes()
    _rewrite(*_segment(folder), REBUILT[damage])
    with Searcher(repo / ".codesearch") as s:
        for q in QUERIES:
            assert _answer(s, q) == answers[q], (damage, q)
    assert (folder / "manifest.json").read_bytes() != before  # rebuilt, and saved for the next process
    with Searcher(repo / ".codesearch") as s:
        assert _answer(s, QUERIES[0]) == answers[QUERIES[0]]


@pytest.mark.parametrize("sizes", [{"rows": 1 << 39}, {"terms": -1}, {"files": "3"}])
def test_a_crafted_manifest_is_rebuilt(built, tmp_path, sizes):
    import json

    root, answers = built
    repo = Path(shutil.copytree(root, tmp_path / "repo"))
    manifest = repo / ".codesearch" / "lexical" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["segments"][0]["sizes"].update(sizes)
    manifest.write_text(json.dumps(doc))
    with Searcher(repo / ".codesearch") as s:
        assert _answer(s, QUERIES[1]) == answers[QUERIES[1]]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e38, -5.0])
def test_crafted_centrality_counts_never_reach_a_score(built, tmp_path, value):
    root, answers = built
    repo = Path(shutil.copytree(root, tmp_path / "repo"))

    def craft(a):
        a["users"][:] = value

    _rewrite(*_state(repo / ".codesearch" / "lexical"), craft)
    with Searcher(repo / ".codesearch") as s:
        for q in QUERIES:
            got = _answer(s, q)
            # The same hits (centrality only scales scores), each score finite.
            assert {p for p, _, _ in got} == {p for p, _, _ in answers[q]}, q
            assert all(math.isfinite(score) and score > 0 for _, _, score in got), q


def test_crafted_lengths_and_counts_keep_scores_finite(built, tmp_path):
    root, _ = built
    repo = Path(shutil.copytree(root, tmp_path / "repo"))

    def craft(a):
        a["length"][:] = -(1 << 30)
        a["terms_tf"][:] = np.iinfo(a["terms_tf"].dtype).max
        a["file_len"][:] = 1 << 60

    _rewrite(*_segment(repo / ".codesearch" / "lexical"), craft)
    with Searcher(repo / ".codesearch") as s:
        for q in QUERIES[:3]:
            got = _answer(s, q)
            assert got and all(math.isfinite(score) for _, _, score in got), q


def test_a_language_code_past_the_segments_list_is_rebuilt(built, tmp_path):
    root, _ = built
    repo = Path(shutil.copytree(root, tmp_path / "repo"))

    def craft(a):
        a["lang"][:] = 999

    _rewrite(*_segment(repo / ".codesearch" / "lexical"), craft)
    with Searcher(root / ".codesearch") as clean:
        expected = _answer(clean, "parse config file", language="javascript")
    with Searcher(repo / ".codesearch") as s:
        assert _answer(s, "parse config file", language="javascript") == expected != []
