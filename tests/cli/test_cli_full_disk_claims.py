"""What a full disk's error says the index holds is what it holds.

With about 1 MiB free, ``index`` said "the disk is full ... the last complete index still
answers searches", yet the files' new content had been committed, and searches answered
from it: the write that failed came after the commit (the cleanup of old vectors).

Mounting a tmpfs needs root (or CAP_SYS_ADMIN): elsewhere these tests skip.
"""

from __future__ import annotations

import json

import pytest
from fixtures.disks import fill, tmpfs
from fixtures.pipeline_helpers import make_repo, module_source
from typer.testing import CliRunner

from codesearch.cli.app import app

LEXICAL = ("--model", "none", "--multi-model", "none")


def cli(*argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


@pytest.mark.parametrize("free_kb", [256, 512, 640, 704, 768, 832, 896, 1024])
def test_the_error_of_a_full_disk_says_which_content_answers(tmp_path, free_kb):
    with tmpfs(tmp_path / "disk", size="8m") as disk:
        repo = make_repo(disk / "repo", n_files=8, lines=30)
        assert cli("index", repo, *LEXICAL, "-q").exit_code == 0
        (repo / "pkg" / "mod0.py").write_text(module_source("mod0_edited", 4, 30))
        filler = fill(disk, free_kb)
        result = cli("index", repo, "-q")
        found = cli("query", "mod0_edited_fn1", "-p", repo, "--mode", "lexical", "--json", "--no-refresh",
                    "--no-server")
        filler.unlink()
    assert found.exit_code == 0, found.output
    new = any("mod0_edited_fn1" in hit["text"] for hit in json.loads(found.stdout)["results"])
    if result.exit_code == 0:
        assert new
        return
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.output
    if "the last complete index still answers" in result.stderr:
        assert not new, result.stderr
    else:
        assert new and "holds the files' new content" in result.stderr, result.stderr
