"""The bounded array reader: a header is checked against what its member holds before
anything is allocated, and every loader of a derived index meets damage as one line."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest

from codesearch.errors import IndexCorruptError
from codesearch.store.arrays import check_finite, check_ids, check_offsets, read_npy, read_npz


def _npz(path, members: dict[str, bytes], compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _header(shape, descr="<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _one_line(path, what="Test file", **kw) -> str:
    with pytest.raises(IndexCorruptError) as err:
        read_npz(path, what=what, **kw)
    message = str(err.value)
    assert "\n" not in message and "is damaged" in message and "codesearch index --rebuild" in message
    return message


def test_arrays_read_back_as_written_and_writable(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=np.arange(5), y=np.ones((2, 3), np.float32), s=np.array(["ab", "c"]))
    got = read_npz(path, what="Test file")
    assert got["x"].tolist() == list(range(5)) and got["y"].shape == (2, 3) and got["s"].tolist() == ["ab", "c"]
    got["x"][0] = 9  # (loaders may change what they read)
    assert read_npz(path, what="Test file", names=("x",)).keys() == {"x"}


def test_a_deflate_bomb_is_refused_before_it_is_inflated(tmp_path):
    """2 MB that inflate to 512 MiB: refused from the zip's sizes, nothing allocated."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf, \
            zf.open("codes.npy", "w", force_zip64=True) as fh:
        fh.write(_header((1 << 27,)))
        block = bytes(1 << 24)
        for _ in range(32):
            fh.write(block)
    path = tmp_path / "bomb.npz"
    path.write_bytes(out.getvalue())
    assert path.stat().st_size < 4 << 20
    assert "inflates" in _one_line(path, "Multi-vector index")


@pytest.mark.parametrize("member", [
    _header((1 << 40,)) + b"\0" * 64,  # promises a terabyte, holds 64 bytes
    _header((4,)) + b"\0" * 64,  # promises 16 bytes, holds 64: np.load stopped before the CRC
    _header((-1,)) + b"\0" * 4,
    b"\x93NUMPY\x01\x00\x10\x00{'descr': 'O'}    \n",  # a pickle
    b"\x93NUMPY\x01\x00" + struct.pack("<H", 60000) + b"{" * 60000,  # a header past numpy's bound
    b"\x93NUMPY\x09\x00\x00\x00",
    b"not an array at all",
])
def test_a_member_that_is_not_what_its_header_says_is_one_line(tmp_path, member):
    _one_line(_npz(tmp_path / "x.npz", {"x.npy": member}))


def test_a_zip_whose_sizes_lie_is_one_line(tmp_path):
    path = _npz(tmp_path / "x.npz", {"x.npy": _npy(np.arange(100))})
    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x01\x02")  # the central directory entry: its uncompressed size
    data[at + 24 : at + 28] = struct.pack("<I", 1 << 31)
    path.write_bytes(bytes(data))
    _one_line(path)


@pytest.mark.parametrize("at", [100, 200, 300])
def test_a_flipped_byte_fails_the_crc(tmp_path, at):
    path = tmp_path / "x.npz"
    np.savez(path, x=np.arange(100))
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    _one_line(path)


def test_missing_and_not_zip_and_wrong_members_are_one_line(tmp_path):
    _one_line(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"junk" * 100)
    _one_line(tmp_path / "junk.npz")
    np.savez(tmp_path / "a.npz", x=np.arange(3))
    assert "no member 'y'" in _one_line(tmp_path / "a.npz", names=("x", "y"))
    assert "more than 8 bytes" in _one_line(tmp_path / "a.npz", max_bytes=8)


def test_npy_files_are_checked_against_their_size_and_can_be_mapped(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10, dtype=np.int64))
    assert read_npy(path, what="Test file").tolist() == list(range(10))
    assert read_npy(path, what="Test file", mmap=True)[3] == 3
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(IndexCorruptError, match="header promises"):
        read_npy(path, what="Test file", mmap=True)


def test_checks_of_what_the_arrays_say():
    check_offsets(np.array([0, 2, 2, 5]), items=3, total=5, what="T", path="p")
    for bad in ([0, 5, 0, 5], [1, 2, 3, 5], [0, 2, 2, 6], [0, 2, 5]):
        with pytest.raises(IndexCorruptError, match="offsets"):
            check_offsets(np.array(bad), items=3, total=5, what="T", path="p")
    check_ids(np.array([0, 4]), below=5, what="T", path="p")
    with pytest.raises(IndexCorruptError, match="out of range"):
        check_ids(np.array([0, 5]), below=5, what="T", path="p")
    with pytest.raises(IndexCorruptError, match="not finite"):
        check_finite(np.array([0.5, np.nan]), what="T", path="p")
    with pytest.raises(IndexCorruptError, match="past 1"):
        check_finite(np.array([0.5, 1e38], np.float32), what="T", path="p", bound=1.0)


def _lexical(tmp_path):
    from codesearch.indexes.lexical import LexicalIndex

    index = LexicalIndex()
    index.add(np.arange(4), ["def alpha(): pass", "beta gamma", "alpha beta", "delta"])
    path = tmp_path / "lexical.npz"
    index.save(path)
    return LexicalIndex, path


@pytest.mark.parametrize("change", ["backwards", "past_end", "term_out_of_range", "nan", "shape_lie"])
def test_the_lexical_index_loader_refuses_arrays_that_would_crash_a_query(tmp_path, change):
    """Offsets out of order segfaulted every query (scipy reads out of bounds)."""
    cls, path = _lexical(tmp_path)
    arrays = dict(np.load(path, allow_pickle=False))
    n = len(arrays["indices"])
    if change == "backwards":
        arrays["indptr"] = np.array([0, n, 0, n, n], np.int64)
    elif change == "past_end":
        arrays["indptr"] = np.array([0, 1, 2, 3, n + 5], np.int64)
    elif change == "term_out_of_range":
        arrays["indices"] = arrays["indices"] + 1000
    elif change == "nan":
        arrays["data"] = np.full_like(arrays["data"], np.nan)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    if change == "shape_lie":  # the header of 'ids' promises fewer values than it holds
        data = path.read_bytes()
        at = data.find(b"'shape': (4,)")
        path.write_bytes(data[:at] + b"'shape': (3,)" + data[at + 13 :])
    with pytest.raises(IndexCorruptError) as err:
        cls.load(path)
    assert "\n" not in str(err.value) and "--rebuild" in str(err.value)


def test_the_multi_vector_loader_refuses_a_nan_codec_and_codes_past_its_centroids(tmp_path):
    from codesearch.indexes.plaid import PlaidIndex

    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((20, 8)).astype(np.float32) for _ in range(30)]
    docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    index = PlaidIndex(8, mode="plaid", n_centroids=4)
    index.add(np.arange(30), docs)
    index.save(tmp_path / "plaid")
    file = tmp_path / "plaid" / "index.npz"
    for change in ("nan", "codes"):
        arrays = dict(np.load(file, allow_pickle=False))
        if change == "nan":
            arrays["centroids"] = np.full_like(arrays["centroids"], np.nan)
        else:
            arrays["codes"] = np.full_like(arrays["codes"], 40)
        with open(tmp_path / "bad.npz", "wb") as fh:
            np.savez(fh, **arrays)
        with pytest.raises(IndexCorruptError):
            PlaidIndex.load(tmp_path / "bad.npz")
