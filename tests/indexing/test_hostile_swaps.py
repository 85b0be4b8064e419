"""A file swapped at every stage of an index run: before the walk, between the walk and the
read (the run's own ``walk`` progress event swaps it), before a query's refresh, and while
the vectors are encoded. Swapped for a symlink out of the repository, a FIFO (an ``open``
would block forever), a device, a folder, a symlink loop.

The run finishes; nothing from outside the repository is indexed; a file that cannot be
read is left out and counted, never waited on.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from codesearch.api import CodeSearch
from codesearch.encoder.base import Encoders
from codesearch.indexing.run import build_index
from codesearch.store import Store
from codesearch.types import STORE_FILE

SECRET = "outside_secret_token"
HANG_GUARD_S = 120  # a run that waits on a FIFO never ends: fail instead of hanging the suite


def function(name: str) -> str:
    return f"def {name}(x):\n" + "".join(f"    v_{i} = x + {i}\n" for i in range(20)) + "    return x\n"


def make_repo(root: Path) -> Path:
    """Three files at the top, and ``pkg/m1.py`` (the one swapped) alone in its folder."""
    (root / "pkg").mkdir(parents=True)
    for i in range(4):
        (root / ("pkg/m1.py" if i == 1 else f"m{i}.py")).write_text(function(f"module_{i}_function"))
    return root


def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "secret.py"
    target.parent.mkdir(exist_ok=True)
    target.write_text(function(SECRET))
    return target


def _symlink_out(path: Path, tmp_path: Path) -> None:
    path.unlink()
    path.symlink_to(outside(tmp_path))


def _folder_symlink_out(path: Path, tmp_path: Path) -> None:
    # The file's folder becomes a link to an outside folder holding a file of the same name.
    target = outside(tmp_path).parent
    (target / path.name).write_text(function(SECRET))
    for f in path.parent.iterdir():
        f.unlink()
    path.parent.rmdir()
    path.parent.symlink_to(target, target_is_directory=True)


def _fifo(path: Path, tmp_path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _device(path: Path, tmp_path: Path) -> None:
    path.unlink()
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("making a device node needs root")


def _symlink_to_device(path: Path, tmp_path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/null")


def _folder(path: Path, tmp_path: Path) -> None:
    path.unlink()
    path.mkdir()


def _symlink_loop(path: Path, tmp_path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)


SWAPS = {
    "symlink out of the repository": _symlink_out,
    "folder symlinked out": _folder_symlink_out,
    "FIFO": _fifo,
    "device": _device,
    "symlink to a device": _symlink_to_device,
    "folder": _folder,
    "symlink loop": _symlink_loop,
}


def guarded(fn, *args, **kwargs):
    box: list = []
    errors: list = []

    def run() -> None:
        try:
            box.append(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 (re-raised below, on the test's thread)
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "the run blocked (a FIFO or a device read?)"
    if errors:
        raise errors[0]
    return box[0]


def indexed_text(root: Path) -> str:
    with Store(root / ".codesearch" / STORE_FILE, readonly=True) as store:
        return "\n".join(r.chunk.encoder_text for r in store.iter_chunk_records())


def indexed_paths(root: Path) -> set[str]:
    with Store(root / ".codesearch" / STORE_FILE, readonly=True) as store:
        return set(store.files())


@pytest.mark.parametrize("swap", SWAPS)
def test_a_file_swapped_before_the_walk_is_left_out(tmp_path, swap):
    root = make_repo(tmp_path / "repo")
    SWAPS[swap](root / "pkg" / "m1.py", tmp_path)
    summary = guarded(build_index, root)
    assert SECRET not in indexed_text(root)
    assert "pkg/m1.py" not in indexed_paths(root) and summary.files_indexed == 3
    assert sum(summary.skipped.values()) == (swap != "folder")  # counted (an empty folder holds nothing)


@pytest.mark.parametrize("swap", SWAPS)
def test_a_file_swapped_between_the_walk_and_the_read_is_not_read(tmp_path, swap):
    root = make_repo(tmp_path / "repo")
    swapped: list[bool] = []

    def progress(event) -> None:
        if event.stage == "walk" and event.done and not swapped:  # the walk is over, nothing read yet
            SWAPS[swap](root / "pkg" / "m1.py", tmp_path)
            swapped.append(True)

    summary = guarded(build_index, root, progress=progress)
    assert swapped and SECRET not in indexed_text(root)
    assert "pkg/m1.py" not in indexed_paths(root) and summary.files_indexed == 3
    assert summary.skipped.get("unreadable") == 1


@pytest.mark.parametrize("swap", SWAPS)
def test_a_query_refresh_after_a_swap_indexes_nothing_from_outside(tmp_path, swap):
    root = make_repo(tmp_path / "repo")
    build_index(root)
    SWAPS[swap](root / "pkg" / "m1.py", tmp_path)

    def search():
        with CodeSearch(root, model=None, multi_model=None) as cs:
            return cs.query(f"{SECRET} module_2_function", 10, mode="lexical", refresh=True, context=5)

    result = guarded(search)
    assert all(SECRET not in hit.text for hit in result.hits)
    assert result.hits[0].path == "m2.py"
    assert SECRET not in indexed_text(root) and "pkg/m1.py" not in indexed_paths(root)


@pytest.fixture(scope="module")
def dense_encoder(single_vector_dir):
    from codesearch.encoder import load

    return load(str(single_vector_dir))


@pytest.mark.parametrize("swap", ["FIFO", "symlink out of the repository", "device"])
def test_a_file_swapped_while_its_vector_is_encoded_is_not_read(tmp_path, dense_encoder, swap):
    # A file whose file-level vector is missing (a run was stopped) is read again by the run
    # that encodes it, after the walk: the swap comes then.
    root = make_repo(tmp_path / "repo")
    build_index(root, encoders=Encoders(dense=dense_encoder))
    with Store(root / ".codesearch" / STORE_FILE) as store, store.transaction():
        store.conn.execute("DELETE FROM vectors WHERE kind = 'file' AND text_hash = "
                           "(SELECT hash FROM files WHERE path = 'pkg/m1.py')")
    seen: list[str] = []

    class Recording:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def encode(self, texts, **kw):
            seen.extend(texts)
            return self.inner.encode(texts, **kw)

    def progress(event) -> None:
        if event.stage == "searchable":
            SWAPS[swap](root / "pkg" / "m1.py", tmp_path)

    guarded(build_index, root, encoders=Encoders(dense=Recording(dense_encoder)), progress=progress)
    assert not any(SECRET in text for text in seen)


def test_a_folder_swapped_for_a_symlink_is_not_listed(tmp_path):
    # The walker lists each folder it enters without following a symlink: a folder swapped
    # for a link to `/` after its parent was listed is not walked (its files would only be
    # refused one by one, after an lstat of each).
    from codesearch.indexing.walk import _list_folder

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.py").write_text("x = 1\n")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    assert _list_folder(tmp_path / "real") == [("a.py", False)]
    with pytest.raises(OSError):
        _list_folder(tmp_path / "link")


def test_a_symlink_that_stays_inside_the_repository_is_read_through(tmp_path):
    root = make_repo(tmp_path / "repo")
    (root / "alias.py").symlink_to("pkg/m1.py")
    (root / "up.py").symlink_to("pkg/../m2.py")
    build_index(root)
    assert {"alias.py", "up.py"} <= indexed_paths(root)
    with CodeSearch(root, model=None, multi_model=None) as cs:
        hits = cs.query("module_1_function", 5, mode="lexical", context=2).hits
    assert {h.path for h in hits} >= {"alias.py", "pkg/m1.py"}
