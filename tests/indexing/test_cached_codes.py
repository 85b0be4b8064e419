"""PLAID codes kept with cached multi-vectors (`codesearch.indexing.cachedcodes`).

A second copy of a repository adopts the codec the first copy's index trained, takes each
text's codes from the user's cache, and compresses only the rest with that codec: its index
equals one built from scratch with the same codec, code for code, and answers the same. The
tiny ColBERT's indexes are forced into PLAID mode by a low token threshold.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from fixtures.pipeline_helpers import make_repo, module_source

from codesearch.encoder.base import Encoders
from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexes.plaid import build as plaid_build
from codesearch.indexes.plaid.coded import Coded
from codesearch.indexing import cachedcodes
from codesearch.indexing import run as pipeline
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.store.cache import UserCache, cache_folder
from codesearch.types import STORE_FILE


@pytest.fixture(autouse=True)
def plaid_at_once(monkeypatch):
    # A few hundred tokens make a PLAID index, with few centroids (k-means on tiny data).
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "exact_threshold", 200)
    monkeypatch.setitem(PlaidIndex.__init__.__kwdefaults__, "max_centroids", 16)


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "main", n_files=6, n_functions=3, lines=6)


@pytest.fixture
def colbert_only(tiny_encoders):
    return Encoders(dense=None, multi=tiny_encoders[1])


def _copy(repo, where):
    return shutil.copytree(repo, where, ignore=shutil.ignore_patterns(".codesearch"))


def _plaid(root) -> PlaidIndex:
    return PlaidIndex.load(pipeline.default_index_dir(root) / "plaid")


def _by_hash(root) -> dict[str, tuple[bytes, bytes]]:
    """Text hash -> (codes, residuals) bytes of every document of ``root``'s PLAID index."""
    index = _plaid(root)
    with Store(pipeline.default_index_dir(root) / STORE_FILE, readonly=True) as store:
        hashes = store.hashes_of_chunks(index.ids().tolist())
    return {hashes[i]: (c.tobytes(), p.tobytes()) for i, (c, p) in index.doc_codes(index.ids()).items()}


def _from_scratch(root, codec) -> dict[str, tuple[bytes, bytes]]:
    """Every document of ``root``'s store compressed by ``codec`` here."""
    with Store(pipeline.default_index_dir(root) / STORE_FILE, readonly=True) as store:
        out = {}
        for ids, arrays in store.iter_vectors("colbert"):
            hashes = store.hashes_of_chunks(ids.tolist())
            for i, a in zip(ids.tolist(), arrays):
                codes, packed = codec.compress(np.asarray(a, np.float32))
                out[hashes[i]] = (codes.tobytes(), packed.tobytes())
    return out


def _kept() -> int:
    with UserCache.open(cache_folder()) as cache:
        return cache.status().coded_texts


@pytest.fixture
def builds(monkeypatch):
    """The codes every PLAID build took (None: k-means trained a codec): the ``coded`` of an
    in-memory build, or the codec and given codes of each distinct text of a `fill`."""
    calls = []
    real, real_fill = PlaidIndex._build, plaid_build.fill

    def build(self, ids, docs, coded=None):
        calls.append(coded)
        return real(self, ids, docs, coded)

    def fill(folder, ids, lens, keys, fetch, *, codec=None, given=None, **kw):
        texts = sorted({k.decode() if isinstance(k, bytes) else k for k in np.asarray(keys).tolist()})
        calls.append(None if codec is None else Coded(*codec, list(given(texts)) if given else [None] * len(texts)))
        return real_fill(folder, ids, lens, keys, fetch, codec=codec, given=given, **kw)

    monkeypatch.setattr(PlaidIndex, "_build", build)
    monkeypatch.setattr(plaid_build, "fill", fill)
    return calls


def test_a_second_copy_adopts_the_first_copys_codec_and_codes(repo, tmp_path, colbert_only, builds):
    build_index(repo, encoders=colbert_only)
    first = _plaid(repo)
    assert first.kind == "plaid" and builds and all(c is None for c in builds)
    assert _kept() == len(_by_hash(repo))  # every text's codes went to the cache

    builds.clear()
    second = _copy(repo, tmp_path / "worktree")
    build_index(second, encoders=colbert_only)
    index = _plaid(second)
    assert index.codec.fingerprint == first.codec.fingerprint  # adopted: no k-means
    assert index.build_error == first.build_error  # the codec's honest error came with it
    assert builds and all(c is not None and all(d is not None for d in c.docs) for c in builds)
    assert _by_hash(second) == _by_hash(repo) == _from_scratch(second, first.codec)
    q = [np.asarray(np.random.default_rng(1).standard_normal((4, first.dim)), np.float32)]
    assert [r[0].tolist() for r in index.search(q, 5)] == [r[0].tolist() for r in first.search(q, 5)]


def test_a_copy_some_files_away_compresses_only_its_new_texts(repo, tmp_path, colbert_only):
    build_index(repo, encoders=colbert_only)
    first = _plaid(repo)
    branch = _copy(repo, tmp_path / "branch")
    (branch / "pkg/mod0.py").write_text(module_source("changed", 3, lines=6))
    build_index(branch, encoders=colbert_only)
    index = _plaid(branch)
    assert index.codec.fingerprint == first.codec.fingerprint  # most tokens were coded by it
    assert _by_hash(branch) == _from_scratch(branch, first.codec)
    assert _kept() == len(set(_by_hash(repo)) | set(_by_hash(branch)))  # the new texts' codes too


def test_below_the_share_a_new_index_trains_its_own(repo, tmp_path, colbert_only, builds, monkeypatch):
    build_index(repo, encoders=colbert_only)
    monkeypatch.setattr(cachedcodes, "ADOPT_SHARE", 1.01)  # no cached codec covers enough
    builds.clear()
    second = _copy(repo, tmp_path / "worktree")
    build_index(second, encoders=colbert_only)
    assert builds and all(c is None for c in builds)  # k-means (on the same vectors: the same codec)
    assert _by_hash(second) == _by_hash(repo)


def test_damaged_codes_are_a_miss_and_the_index_is_still_exact(repo, tmp_path, colbert_only):
    build_index(repo, encoders=colbert_only)
    first = _plaid(repo)
    with UserCache.open(cache_folder()) as cache, cache.transaction():
        cache.conn.execute("UPDATE codes SET data = zeroblob(length(data)) WHERE id % 2 = 0")
    second = _copy(repo, tmp_path / "worktree")
    build_index(second, encoders=colbert_only)
    assert _plaid(second).codec.fingerprint == first.codec.fingerprint
    assert _by_hash(second) == _from_scratch(second, first.codec)


def test_deleting_the_cache_after_adoption_breaks_no_search(repo, tmp_path, colbert_only):
    build_index(repo, encoders=colbert_only)
    second = _copy(repo, tmp_path / "worktree")
    build_index(second, encoders=colbert_only)
    shutil.rmtree(cache_folder())
    index = _plaid(second)
    q = [np.ones((3, index.dim), np.float32) / np.sqrt(index.dim)]
    assert len(index.search(q, 3)[0][0]) == 3


@pytest.fixture
def arrays_read(monkeypatch):
    """How many vector arrays the stores of this process decode (from rows or segments)."""
    from codesearch.store.vectors import VectorCache

    count = [0]
    real = VectorCache._array

    def counted(self, *row):
        count[0] += 1
        return real(self, *row)

    monkeypatch.setattr(VectorCache, "_array", counted)
    return count


def test_a_second_copy_reads_back_no_array_it_has_codes_for(repo, tmp_path, colbert_only, arrays_read):
    """Its PLAID add needs only each document's length and codes: reading every array back was
    4.2 of the 4.5 CPU-s of a default-model second worktree (BENCHMARKS.md, 'Second worktree
    and prebuilt index')."""
    build_index(repo, encoders=colbert_only)
    second = _copy(repo, tmp_path / "worktree")
    arrays_read[0] = 0
    build_index(second, encoders=colbert_only)
    assert arrays_read[0] == 0
    assert _by_hash(second) == _by_hash(repo) == _from_scratch(second, _plaid(repo).codec)


def test_an_add_given_most_codes_equals_one_given_every_array(repo, colbert_only, arrays_read):
    """The registry's add reads only the arrays of texts without codes, and makes the index
    that every array makes: ids, lengths, codes, residuals, errors and answers."""
    from codesearch.indexes import registry
    from codesearch.indexes.plaid.codec import DocCodes
    from codesearch.indexes.plaid.coded import CodeBook

    build_index(repo, encoders=colbert_only)
    first = _plaid(repo)
    with Store(pipeline.default_index_dir(repo) / STORE_FILE, readonly=True) as store:
        ids, arrays = store.vectors_for(first.ids().tolist(), "colbert")
        hashes = store.hashes_of_chunks(ids.tolist())
        book = CodeBook(first.codec, first.build_error)
        uncoded = set(ids.tolist()[::3])  # a third of the texts are compressed by the add
        codes = first.doc_codes(ids)
        book.put(first.codec.fingerprint, [
            (hashes[i], DocCodes(*codes[i], float(first.codec.error(np.asarray(a, np.float32), *codes[i]).sum())))
            for i, a in zip(ids.tolist(), arrays) if i not in uncoded
        ])
        full = registry._empty_index("plaid", store)
        full.add(ids, arrays, coded=book.coded([hashes[i] for i in ids.tolist()]))
        arrays_read[0] = 0
        lazy = registry._rebuild_index("plaid", store, book)
        assert arrays_read[0] == len(uncoded)
        changed = np.asarray(ids.tolist()[1::3])
        again = store.vectors_for(changed.tolist(), "colbert")
        for index in (full, lazy):  # an add to an index that is PLAID already (a delta)
            index.remove(changed)
        full.add(*again, coded=book.coded([hashes[i] for i in changed.tolist()]))
        arrays_read[0] = 0
        registry._add_from_store("plaid", lazy, store, changed.tolist(), book)
        assert arrays_read[0] == len(set(changed.tolist()) & uncoded)
    assert full.kind == lazy.kind == "plaid" and lazy.codec.fingerprint == first.codec.fingerprint
    for attr in ("_ids", "_doclens", "_starts", "_alive", "_codes", "_residuals"):
        assert np.array_equal(getattr(lazy, attr), getattr(full, attr)), attr
    assert (lazy.build_error, lazy.added_error) == (full.build_error, full.added_error)
    q = [np.asarray(np.random.default_rng(2).standard_normal((4, first.dim)), np.float32) for _ in range(3)]
    for (a_ids, a_s), (b_ids, b_s) in zip(lazy.search(q, 5), full.search(q, 5)):
        assert a_ids.tolist() == b_ids.tolist() and np.array_equal(a_s, b_s)
