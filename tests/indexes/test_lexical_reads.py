"""A query's postings are copied from the segment file (`Arrays.read`), not read through
the mapping: the same values, from the file that was opened, and checked bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch.errors import IndexCorruptError
from codesearch.indexes.lexical import LexicalIndex, segment_spec
from codesearch.indexes.lexical_arrays import Arrays
from codesearch.indexing import run as pipeline


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = write_sample_repo(tmp_path_factory.mktemp("reads") / "repo")
    pipeline.build_index(root)
    return root / ".codesearch" / "lexical"


def _segment(folder: Path) -> Arrays:
    entry = LexicalIndex.load(folder).manifest.segments[0]
    return Arrays(folder / f"{entry.name}.bin", segment_spec(entry.sizes))


def test_a_read_slice_equals_the_mapped_one_for_every_array(folder):
    a = _segment(folder)
    rng = np.random.default_rng(0)
    flat = [name for name in a.spec if len(a[name].shape) == 1]
    assert {"terms_vals", "terms_tf", "symbols_vals", "pathwords_vals"} <= set(flat)
    for name in flat:
        n = len(a[name])
        for lo, hi in [(0, n), (0, 0), (n, n), *sorted(rng.integers(0, n + 1, size=(5, 2)).tolist())]:
            lo, hi = min(lo, hi), max(lo, hi)
            got = a.read(name, lo, hi)
            assert got.dtype == a[name].dtype and np.array_equal(got, a[name][lo:hi]), (name, lo, hi)


@pytest.mark.parametrize("lo,hi", [(-1, 2), (3, 2), (0, 10**9)])
def test_a_slice_outside_the_array_is_a_corrupt_index(folder, lo, hi):
    with pytest.raises(IndexCorruptError):
        _segment(folder).read("terms_vals", lo, hi)


def test_postings_come_from_the_file_opened_even_once_it_is_replaced(folder, tmp_path):
    copy = tmp_path / "lexical"
    copy.mkdir()
    for f in folder.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    index = LexicalIndex.load(copy)
    term = "config"
    before = index.postings(term)
    assert before is not None and len(before.rows)
    for seg in index.manifest.segments:  # an index run's merge: the file deleted, the name reused
        path = copy / f"{seg.name}.bin"
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data[:64])
    after = index.postings(term)
    assert after is not None
    assert np.array_equal(after.rows, before.rows) and np.array_equal(after.tf, before.tf)
