"""Output read by another program follows the conventions of the tools people pipe into:
a header line on tab-separated rows, ``label: value`` lines without box characters or a
value folded over two lines, and help that names values as a command line does.

The console script runs in real subprocesses, so stdout and stderr are real pipes.
"""

from __future__ import annotations

import re

import pytest
import typer
from fixtures.console import cli
from fixtures.sample_repo import write_sample_repo
from typer.testing import CliRunner

from codesearch.cli.app import app

BOX = re.compile("[\u2500-\u257f]")  # rich's table borders: ─ │ ┏ ┃ ╇ ...


def test_models_list_piped_is_tab_separated_with_a_header(tmp_path):
    done = cli("models", "list", env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split("\t") == ["name", "role", "cached", "size_bytes", "path"]
    rows = [line.split("\t") for line in lines[1:]]
    assert rows and all(len(row) == 5 for row in rows)
    assert ["lightonai/LateOn-Code-edge", "default multi-vector", "no", "", ""] in rows


def test_index_summary_piped_has_no_box_and_one_line_per_row(tmp_path):
    repo = write_sample_repo(tmp_path / "repo")
    (repo / "blob.bin").write_bytes(b"\x00\xff" * 64)  # skipped: binary
    (repo / "big.py").write_text("x = 1\n" * 40_000)  # skipped: too_large
    done = cli("index", repo, "--model", "none", "--multi-model", "none", "--max-file-size", "100k")
    assert done.returncode == 0, done.stderr
    assert not BOX.search(done.stderr), done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("Notice: ")]
    assert lines[0] == f"codesearch index {repo}"
    rows = dict(line.split(": ", 1) for line in lines[1:])
    assert set(rows) >= {"files indexed", "skipped", "chunks", "time by stage (s)", "models"}, lines
    # Each value whole on its line, however long (the table folded them at 80 columns).
    assert re.fullmatch(r"binary: \d+, too_large: 1", rows["skipped"]), rows["skipped"]
    assert all(f"{stage}: " in rows["time by stage (s)"] for stage in ("walk", "chunk", "encode"))
    assert rows["models"] == "none (lexical only)"


def _commands(command, path=()):
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        found.extend(_commands(sub, (*path, name)))
    return found


@pytest.mark.parametrize("path", _commands(typer.main.get_command(app)), ids=lambda p: " ".join(p) or "codesearch")
def test_help_names_values_as_a_command_line_does(path):
    out = CliRunner().invoke(app, [*path, "--help"], terminal_width=200).output
    assert "list[" not in out, out  # Typer's Python-typed <list[str]>, <list[Path]>
    if path == ("query",):
        assert re.search(r"--lang LANG\s", out), out
    if path == ("serve",):
        assert "[PATH]..." in out and re.search(r"^\s+PATH <path>\s", out, re.M), out
