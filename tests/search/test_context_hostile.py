"""Context lines (``--context``) from files that changed under the index: swapped for a
symlink out of the repository, a FIFO, a device, a folder, a hard link, or edited; and
lines counted the chunker's way (``\\n`` only) in files with form feeds and U+2028.

A widened hit comes only from the file the index holds (a regular file inside the root
whose hash is the indexed one); any other hit is returned as it was ranked.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codesearch.api import CodeSearch
from codesearch.cli.app import app
from codesearch.search.snippets import fit
from codesearch.types import SearchHit, SearchRequest, SearchResult

SECRET = "TOP_SECRET_OUTSIDE_THE_REPOSITORY"
HANG_GUARD_S = 60  # a read that blocks on a FIFO never returns: fail instead of hanging the suite


def function(name: str, body_lines: int = 80) -> str:
    return f"def {name}(x):\n" + "".join(f"    y_{i} = x * {i}\n" for i in range(body_lines)) + "    return x\n\n\n"


def source() -> str:
    """Functions big enough to be a chunk each: the needle's hit is lines of the middle."""
    return "".join(function(f"helper_above_{i}") for i in range(3)) + function("needle_function") + "".join(
        function(f"helper_below_{i}") for i in range(3))


def outside_file(tmp_path: Path, text: str | None = None) -> Path:
    out = tmp_path / "outside" / "a.py"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text if text is not None else "".join(f"{SECRET} {i}\n" for i in range(400)))
    return out


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text(source())
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def query(root: Path, context: int = 20):
    box: list = []

    def run() -> None:
        with CodeSearch(root, model=None, multi_model=None) as cs:
            box.append(cs.query("needle_function", 1, mode="lexical", context=context))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "the query blocked (a FIFO read?)"
    return box[0].hits[0]


def _symlink_out(path: Path, tmp_path: Path) -> None:
    target = outside_file(tmp_path)
    path.unlink()
    path.symlink_to(target)


def _symlink_out_same_bytes(path: Path, tmp_path: Path) -> None:
    # Same content, so the hash matches: only the check that the file is inside the root stops it.
    target = outside_file(tmp_path, path.read_text())
    path.unlink()
    path.symlink_to(target)


def _folder_symlink_out(path: Path, tmp_path: Path) -> None:
    outside = outside_file(tmp_path, path.read_text()).parent
    folder = path.parent
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)


def _hard_link_out(path: Path, tmp_path: Path) -> None:
    target = outside_file(tmp_path)
    path.unlink()
    os.link(target, path)


def _fifo(path: Path, tmp_path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _folder(path: Path, tmp_path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inner.py").write_text(f"{SECRET}\n" * 200)


def _device(path: Path, tmp_path: Path) -> None:
    path.unlink()
    try:
        # /dev/null's numbers (not /dev/zero's: a read of it never ends, and the code before
        # this fix read it until the memory ran out)
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")


def _symlink_to_device(path: Path, tmp_path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/null")


def _edited(path: Path, tmp_path: Path) -> None:
    # As many lines, other content: the lines at the hit are no longer the hit's.
    path.write_text("\n".join(f"{SECRET}_{i}" for i in range(len(path.read_text().split("\n")))))


SWAPS = {
    "symlink out of the repository": _symlink_out,
    "symlink out, same bytes": _symlink_out_same_bytes,
    "folder swapped for a symlink out": _folder_symlink_out,
    "hard link to an outside file": _hard_link_out,
    "FIFO": _fifo,
    "folder": _folder,
    "device": _device,
    "symlink to a device": _symlink_to_device,
    "edited": _edited,
}


def test_context_widens_the_indexed_file(repo):
    hit = query(repo)
    lines = (repo / "pkg" / "a.py").read_text().split("\n")
    ranked = query(repo, context=0)
    assert ranked.text.startswith("def needle_function") and 1 < ranked.start_line
    assert (hit.start_line, hit.end_line) == (ranked.start_line - 20, ranked.end_line + 20)
    assert hit.text == "\n".join(lines[hit.start_line - 1 : hit.end_line])


@pytest.mark.parametrize("swap", SWAPS)
def test_context_is_never_read_from_a_swapped_file(repo, tmp_path, swap):
    ranked = query(repo, context=0)
    SWAPS[swap](repo / "pkg" / "a.py", tmp_path)
    hit = query(repo)
    assert SECRET not in hit.text
    assert (hit.text, hit.start_line, hit.end_line) == (ranked.text, ranked.start_line, ranked.end_line)


@pytest.mark.parametrize("swap", ["symlink out of the repository", "hard link to an outside file", "FIFO"])
def test_the_cli_serves_no_context_from_a_swapped_file(repo, tmp_path, swap):
    SWAPS[swap](repo / "pkg" / "a.py", tmp_path)
    box: list = []
    argv = ["query", "needle_function", "-p", str(repo), "--context", "20", "--no-refresh", "--no-server", "--json"]
    worker = threading.Thread(target=lambda: box.append(CliRunner().invoke(app, argv)), daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive(), "the query blocked (a FIFO read?)"
    assert box[0].exit_code == 0, (box[0].stderr, box[0].exception)
    assert SECRET not in box[0].stdout and "needle_function" in box[0].stdout


# -- lines are counted the chunker's way --------------------------------------------------------

# Characters str.splitlines() breaks at and the chunker (git, editors) does not.
ODD_BREAKS = ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]


def odd_source() -> str:
    parts = []
    for i, ch in enumerate(ODD_BREAKS):
        body = "".join(f"    v_{j} = x{ch} + {j}  # {ch}\n" for j in range(40))
        parts.append(f"# section {i}{ch} continues\n{ch}\ndef odd_{i}(x):\n{body}    return x{ch} + {i}\n\n\n")
    body = "".join(f"    w_{j} = x\f\n" for j in range(40))
    return "".join(parts) + "def needle_function(x):\n" + body + "    return x\n"


@pytest.mark.parametrize("context", [1, 3, 20])
def test_context_lines_are_the_files_lines_despite_form_feeds_and_u2028(tmp_path, context):
    root = tmp_path / "repo"
    root.mkdir()
    text = odd_source()
    (root / "odd.py").write_text(text, encoding="utf-8", newline="")
    lines = text.split("\n")
    n_lines = len(lines) - (1 if text.endswith("\n") else 0)
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        plain = cs.query("odd_3 needle_function odd_7", 20, mode="lexical")
        wide = cs.query("odd_3 needle_function odd_7", 20, mode="lexical", context=context)
    assert len(plain.hits) >= 3
    for before, hit in zip(plain.hits, wide.hits):
        assert before.text == "\n".join(lines[before.start_line - 1 : before.end_line])  # the chunker's lines
        assert hit.start_line == max(1, before.start_line - context)
        assert hit.end_line == min(n_lines, before.end_line + context)
        assert hit.text == "\n".join(lines[hit.start_line - 1 : hit.end_line])


def test_a_40_line_file_never_ends_past_line_40(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    text = "".join(f"x_{i} = {i}  #\f page {i}\u2028\n" for i in range(38)) + "def needle_function():\n    pass\n"
    (root / "m.py").write_text(text, encoding="utf-8")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        hit = cs.query("needle_function", 1, mode="lexical", context=10).hits[0]
    assert hit.end_line == 40 and hit.text.split("\n")[-2:] == ["def needle_function():", "    pass"]


def test_max_lines_counts_lines_the_chunkers_way():
    text = "\n".join(f"line {i}\u2028still line {i}\fand still" for i in range(10))
    hit = SearchHit(
        path="a.py",
        start_line=1,
        end_line=10,
        score=1.0,
        language="python",
        symbol=None,
        kind="block",
        scope=None,
        text=text,
        chunk_id=1,
    )
    result = SearchResult(query="q", mode="lexical", hits=[hit], indexes_used=("lexical",))
    cut = fit(result, SearchRequest("q", max_lines=3)).hits[0]
    assert cut.text.split("\n") == text.split("\n")[:3] and (cut.end_line, cut.more_lines) == (3, 7)
