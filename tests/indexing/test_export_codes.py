"""The codes an import takes from an export's multi-vector (PLAID) index: only under a codec
that checks in full, only for texts the new store holds, only codes that fit their codec
and their text's vector; so a build skips k-means with the export's codec, and a crafted
codec costs a k-means, never a wrong or crashing index."""

from __future__ import annotations

import numpy as np
import pytest

from codesearch.indexes.folder import read_folder, write_folder
from codesearch.indexes.plaid import PlaidIndex
from codesearch.indexing.adopt import export_codes
from codesearch.store import Store
from codesearch.store.files import hash_text

DIM = 8
MODEL = "colbert-model@1"


@pytest.fixture()
def setup(tmp_path):
    """(the export's folder with its PLAID index, a new store with the texts' vectors, export
    chunk id -> text hash, the vectors by hash)."""
    rng = np.random.default_rng(0)
    texts = [f"def f{i}(): return {i}" for i in range(40)]
    hashes = [hash_text(t) for t in texts]
    docs = [rng.standard_normal((12, DIM)).astype(np.float16).astype(np.float32) for _ in texts]
    docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    index = PlaidIndex(DIM, mode="plaid", n_centroids=8)
    export_ids = np.arange(100, 140)
    index.add(export_ids, docs)
    index.save(tmp_path / "export" / "plaid")
    store = Store(tmp_path / "store.sqlite")
    store.set_model("colbert", "colbert", MODEL, DIM)
    store.put_vectors(MODEL, "colbert", zip(hashes, docs))
    fid = store.upsert_file("a.py", hash="h", size=1, mtime_ns=1, language="python", n_lines=1)
    from codesearch.types import Chunk

    for i, (text, h) in enumerate(zip(texts, hashes)):
        store.insert_chunk(fid, Chunk("a.py", i + 1, i + 1, 0, len(text), "python", None, "function", None, text,
                                      "a.py"), h)
    yield tmp_path / "export", store, dict(zip(export_ids.tolist(), hashes)), index
    store.close()


def test_the_codes_of_every_text_come_under_the_export_codec(setup):
    folder, store, chunk_hashes, index = setup
    book = export_codes(folder, store, chunk_hashes)
    assert book is not None and book.codec.fingerprint == index.codec.fingerprint
    coded = book.coded(list(chunk_hashes.values()))
    assert all(doc is not None for doc in coded.docs)
    # A build given them takes the codec: no k-means, the same codes.
    built = PlaidIndex(DIM, mode="plaid", n_centroids=8, seed=123)
    found, vectors = store.vectors_for(store.chunk_ids_with_hashes(list(chunk_hashes.values())), "colbert")
    built.add(found, vectors, coded=book.coded(list(store.hashes_of_chunks(found.tolist()).values())))
    assert built.codec.fingerprint == index.codec.fingerprint


def test_texts_the_store_does_not_hold_get_no_codes(setup):
    folder, store, chunk_hashes, _ = setup
    partial = dict(list(chunk_hashes.items())[:10])
    book = export_codes(folder, store, partial)
    assert len(book) == 10


@pytest.mark.parametrize("change", ["nan_centroids", "dim", "cutoffs", "codes_past_centroids", "doclens"])
def test_a_codec_or_codes_that_do_not_check_are_not_taken(setup, change):
    folder, store, chunk_hashes, _ = setup
    # Crafted as a sender would: the arrays changed and the folder's manifest written for them
    # (sizes and CRCs that check), so only what the import checks itself can catch it.
    opened = read_folder(folder / "plaid", "Multi-vector index")
    arrays = {name: np.array(a) for name, a in opened.arrays.items()}
    if change == "nan_centroids":
        arrays["centroids"][0, 0] = np.nan
    elif change == "dim":
        arrays["centroids"] = arrays["centroids"][:, :4]
    elif change == "cutoffs":
        arrays["cutoffs"] = arrays["cutoffs"][::-1].copy()
    elif change == "codes_past_centroids":
        arrays["codes"][:5] = 7  # (a centroid that exists: the codes decode, but not to these vectors' ids)
        arrays["codes"][5] = 60000
    elif change == "doclens":
        arrays["doclens"][0] += 1
        arrays["doclens"][1] -= 1
    write_folder(folder / "plaid", opened.header, arrays)
    book = export_codes(folder, store, chunk_hashes)
    if change == "doclens":  # the two documents whose token counts no longer fit go
        assert book is not None and len(book) == len(chunk_hashes) - 2
    else:
        assert book is None
