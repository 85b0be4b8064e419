"""FolderReader: `read_inside` for files read in path order, with the last folder kept open;
what it reads, and what it refuses, is what `read_inside` reads and refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codesearch.store.files import FolderReader, read_inside


def _tree(root: Path) -> list[str]:
    files = {"a.py": "a\n", "pkg/b.py": "b\n", "pkg/c.py": "c" * 10_000, "pkg/sub/d.py": "d\n", "z.txt": "z\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return sorted(files)


def test_it_reads_what_read_inside_reads(tmp_path):
    paths = _tree(tmp_path)
    with FolderReader(tmp_path) as reader:
        for rel in paths:
            data, st = reader.read(rel)
            want, want_st = read_inside(tmp_path, rel)
            assert data == want and st.st_size == want_st.st_size
        assert reader.read("pkg/c.py", limit=100)[0] == b"c" * 100


def test_a_folder_swapped_for_a_symlink_out_of_the_root_is_not_followed(tmp_path):
    root = tmp_path / "repo"
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "d.py").write_text("SECRET\n")
    _tree(root)
    with FolderReader(root) as reader:
        reader.read("pkg/b.py")  # pkg/ is held open
        (root / "pkg" / "sub" / "d.py").unlink()
        (root / "pkg" / "sub").rmdir()
        os.symlink(outside / "sub", root / "pkg" / "sub")
        with pytest.raises(OSError):
            reader.read("pkg/sub/d.py")
        assert reader.read("z.txt")[0] == b"z\n"


def test_symlinks_inside_the_root_and_fifos(tmp_path):
    _tree(tmp_path)
    os.symlink("pkg", tmp_path / "linked")
    os.symlink("../a.py", tmp_path / "pkg" / "alias.py")
    os.mkfifo(tmp_path / "pkg" / "fifo")
    with FolderReader(tmp_path) as reader:
        with pytest.raises(OSError):  # (as read_inside: no path goes through a linked folder)
            reader.read("linked/b.py")
        assert reader.read("pkg/alias.py")[0] == b"a\n"
        with pytest.raises(OSError):
            reader.read("pkg/fifo")  # never waited on
        with pytest.raises(FileNotFoundError):
            reader.read("pkg/missing.py")
        assert reader.read("pkg/b.py")[0] == b"b\n"
