"""A full disk at every stage of an index run, on a real tmpfs of a set size.

At each free-space level an index run ends in success or one ``Error:`` line (never a
traceback); the index it leaves answers queries (with and without the refresh a query
makes); and once space is freed the next run succeeds and equals a clean index of the same
files. A first run (no index before) that fails leaves nothing that looks indexed.

Mounting a tmpfs needs root (or CAP_SYS_ADMIN): elsewhere these tests skip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.disks import fill, tmpfs
from fixtures.pipeline_helpers import check_consistent, chunk_set, make_repo, module_source
from typer.testing import CliRunner

from codesearch.cli.app import app

LEXICAL = ("--model", "none", "--multi-model", "none")
#: Free space (KiB) left on the disk before the second run: from none at all to enough. The
#: runs fail at every stage in between (the store's open, the commit of the files, the
#: lexical index file, the vectors, their publication) for the lexical and the model runs.
LEVELS_KB = (0, 128, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 8192)


def cli(*argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


def succeeded_or_said_why(result) -> bool:
    """True for a success; a failure must be exit 1 and one ``Error:`` line, no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code == 0:
        return True
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return False


@dataclass(frozen=True)
class Variant:
    """The models of a run, and a repository small enough to encode in seconds on a CPU."""

    args: tuple
    n_files: int
    lines: int

    def repo(self, root: Path) -> Path:
        return make_repo(root, n_files=self.n_files, lines=self.lines)

    def edit(self, repo: Path) -> None:
        """The second version of the files: one edited, one removed, three added."""
        (repo / "pkg" / "mod0.py").write_text(module_source("mod0_edited", 4, self.lines))
        (repo / "pkg" / "mod1.py").unlink()
        for i in range(3):
            (repo / "pkg" / f"added{i}.py").write_text(module_source(f"added{i}", 3, self.lines))


def search(repo: Path, query: str, *extra: str) -> list[dict]:
    result = cli("query", query, "-p", repo, "--mode", "lexical", "--json", "--no-server", *extra)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return json.loads(result.stdout)["results"]


_CLEAN: dict[str, set] = {}


@pytest.fixture(params=["lexical", "models"])
def variant(request):
    if request.param == "lexical":
        return Variant(LEXICAL, n_files=8, lines=30)
    colbert = request.getfixturevalue("colbert_dir")
    dense = request.getfixturevalue("single_vector_dir")
    return Variant(("--model", dense, "--multi-model", colbert, "--device", "cpu"), n_files=3, lines=4)


@pytest.fixture()
def clean(tmp_path_factory, variant):
    """The chunks of a clean index of the second version of the files (made once)."""
    key = str(variant.args)
    if key not in _CLEAN:
        repo = variant.repo(tmp_path_factory.mktemp("clean"))
        variant.edit(repo)
        assert cli("index", repo, *variant.args, "-q").exit_code == 0
        _CLEAN[key] = chunk_set(repo / ".codesearch")
    return _CLEAN[key]


@pytest.mark.parametrize("free_kb", LEVELS_KB)
def test_a_run_on_a_full_disk_keeps_the_index_answering_and_the_next_run_heals_it(tmp_path, variant, clean,
                                                                                    free_kb):
    with tmpfs(tmp_path / "disk") as disk:
        repo = variant.repo(disk / "repo")
        first = cli("index", repo, *variant.args, "-q")
        assert first.exit_code == 0, (first.stderr, first.exception)
        variant.edit(repo)
        filler = fill(disk, free_kb)

        ok = succeeded_or_said_why(cli("index", repo, *variant.args, "-q"))
        assert ok or free_kb < LEVELS_KB[-1]  # the last level has room enough
        assert not ok or free_kb > 0  # and the first none at all
        # The old index (or the new one) answers; code no file changed in is found.
        assert search(repo, "mod2_fn1", "--no-refresh")[0]["path"] == "pkg/mod2.py"
        # A query's own refresh on the full disk says why it searched the current index.
        refreshed = cli("query", "mod2_fn1", "-p", repo, "--mode", "lexical", "--json", "--no-server")
        assert refreshed.exit_code == 0, (refreshed.stderr, refreshed.exception)
        assert json.loads(refreshed.stdout)["results"][0]["path"] == "pkg/mod2.py"
        if ok:
            assert search(repo, "added1_fn2", "--no-refresh")[0]["path"] == "pkg/added1.py"

        filler.unlink()
        healed = cli("index", repo, *variant.args, "-q")
        assert healed.exit_code == 0, (healed.stderr, healed.exception)
        assert chunk_set(repo / ".codesearch") == clean
        check_consistent(repo / ".codesearch")
        assert search(repo, "added1_fn2", "--no-refresh")[0]["path"] == "pkg/added1.py"


@pytest.mark.parametrize("free_kb", LEVELS_KB)
def test_a_first_run_on_a_full_disk_leaves_an_index_or_nothing(tmp_path, free_kb):
    with tmpfs(tmp_path / "disk") as disk:
        repo = make_repo(disk / "repo", n_files=8)
        filler = fill(disk, free_kb)
        ok = succeeded_or_said_why(cli("index", repo, *LEXICAL, "-q"))
        assert ok == (free_kb == LEVELS_KB[-1]) or 0 < free_kb < LEVELS_KB[-1]
        store = repo / ".codesearch" / "store.sqlite"
        if ok or store.exists():
            # What a failed first run kept was committed: it answers.
            assert search(repo, "mod2_fn1", "--no-refresh")[0]["path"] == "pkg/mod2.py"
        else:
            status = cli("status", repo)
            assert status.exit_code == 0 and "not indexed" in status.stdout, (status.stdout, status.stderr)
        filler.unlink()
        assert cli("index", repo, *LEXICAL, "-q").exit_code == 0
        check_consistent(repo / ".codesearch")
        assert search(repo, "mod2_fn1", "--no-refresh")[0]["path"] == "pkg/mod2.py"
