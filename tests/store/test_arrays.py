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


def _plaid_v1(tmp_path):
    """A PLAID index in plaid mode, written in the one-file format before folders (still
    read: an index written then, an older export): its arrays and its manifest."""

    from codesearch.indexes.folder import read_folder
    from codesearch.indexes.plaid import PlaidIndex

    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((20, 8)).astype(np.float32) for _ in range(30)]
    docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    index = PlaidIndex(8, mode="plaid", n_centroids=4)
    index.add(np.arange(30), docs)
    index.save(tmp_path / "plaid")
    h, a = (lambda f: (f.header, f.arrays))(read_folder(tmp_path / "plaid", "test"))
    arrays = {"ids": np.concatenate([a["ids"], a["tail_ids"]]).astype(np.int64),
              "doclens": np.concatenate([a["doclens"], a["tail_doclens"]]).astype(np.int64),
              "centroids": np.array(a["centroids"]), "cutoffs": np.array(a["cutoffs"]),
              "weights": np.array(a["weights"]),
              "codes": np.concatenate([a["codes"], a["tail_codes"]]),
              "residuals": np.concatenate([a["residuals"], a["tail_residuals"]])}
    manifest = {"format": 1, "dim": h["dim"], "params": h["params"], "kind": "plaid",
                "n_docs": len(arrays["ids"]), "n_tokens": int(arrays["doclens"].sum()),
                "build_error": h["build_error"], "added_error_sum": 0.0, "added_tokens": 0}
    return PlaidIndex, arrays, manifest


def _save_v1(path, arrays, manifest):
    import json

    manifest = {**manifest, "shapes": {name: list(a.shape) for name, a in arrays.items()}}
    with open(path, "wb") as fh:
        np.savez(fh, manifest=np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8), **arrays)


def test_the_multi_vector_loader_refuses_a_nan_codec_and_codes_past_its_centroids(tmp_path):
    """The one-file format is read whole, so its loader checks the codec and the codes
    before any search."""
    cls, good, manifest = _plaid_v1(tmp_path)
    _save_v1(tmp_path / "good.npz", good, manifest)
    assert len(cls.load(tmp_path / "good.npz")) == 30
    for change in ("nan", "codes"):
        arrays = {name: a.copy() for name, a in good.items()}
        if change == "nan":
            arrays["centroids"] = np.full_like(arrays["centroids"], np.nan)
        else:
            arrays["codes"] = np.full_like(arrays["codes"], 40)
        _save_v1(tmp_path / "bad.npz", arrays, manifest)
        with pytest.raises(IndexCorruptError):
            cls.load(tmp_path / "bad.npz")
