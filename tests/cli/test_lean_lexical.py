"""A lexical query with no daemon is answered by the lean path, in this process, without
typer, rich or torch; what it prints is what the Typer path prints for the same index.

``--no-server`` sends a query to the Typer path (the lean path leaves that option to it),
so the two are compared on the same index, output form by output form."""

from __future__ import annotations

import sys

import pytest
from fixtures.console import cli
from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = write_sample_repo(tmp_path_factory.mktemp("lexical") / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


FORMS = [[], ["--json"], ["--jsonl"], ["-l"], ["--no-snippet"], ["-C", "2", "--max-lines", "3"],
         ["--lang", "python", "-k", "3"], ["--min-score", "0.5", "--json"], ["--budget", "40", "--json"],
         ["--glob", "*.go"]]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: " ".join(f) or "plain")
def test_the_lean_lexical_answer_is_the_typer_one(repo, form):
    args = ["query", "parse the config file", "--mode", "lexical", "-p", repo, *form]
    lean, typer_path = cli(*args), cli(*args, "--no-server")
    assert (lean.returncode, lean.stdout, lean.stderr) == (typer_path.returncode, typer_path.stdout,
                                                           typer_path.stderr)
    assert lean.returncode == 0 and (lean.stdout or "No results." in lean.stderr)


@pytest.mark.parametrize("form", [[], ["--json"], ["--mode", "hybrid", "-k", "3"]],
                         ids=lambda f: " ".join(f) or "plain")
def test_a_default_query_of_an_index_without_a_model_is_the_lean_lexical_one(repo, form):
    """The default mode (hybrid) of an index that records no model is BM25 alone: answered
    here without typer, rich or torch, as the Typer path would answer it."""
    args = ["query", "parse the config file", "-p", repo, *form]
    lean = cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    typer_path = cli(*args, "--no-server")
    imported = {line.rsplit("|", 1)[-1].strip() for line in lean.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not imported & {"typer", "rich", "torch", "click"}
    said = "\n".join(line for line in lean.stderr.splitlines() if not line.startswith("import time:"))
    assert (lean.returncode, lean.stdout, said) == (typer_path.returncode, typer_path.stdout,
                                                    typer_path.stderr.rstrip("\n"))
    assert lean.returncode == 0 and lean.stdout


def test_nothing_found_and_a_bad_glob_are_said_as_the_typer_path_says_them(repo):
    for extra in (["--glob", "*.nothing"], ["--glob", "a{b"]):
        args = ["query", "parse the config file", "--mode", "lexical", "-p", repo, *extra]
        lean, typer_path = cli(*args), cli(*args, "--no-server")
        assert (lean.returncode, lean.stdout, lean.stderr) == (typer_path.returncode, typer_path.stdout,
                                                               typer_path.stderr)


def test_the_lean_lexical_query_imports_no_typer_rich_or_torch(repo):
    done = cli("query", "parse the config file", "--mode", "lexical", "-p", repo,
               env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not imported & {"typer", "rich", "torch", "click"}


def test_an_import_error_of_a_codesearch_module_is_not_hidden(repo, monkeypatch):
    """Only a platform without fcntl falls back to the Typer path; a broken import is a bug."""
    import codesearch.server
    from codesearch.cli import lean

    # (Both: `from codesearch.server import daemon_client` takes the package's attribute first.)
    monkeypatch.delattr(codesearch.server, "daemon_client", raising=False)
    monkeypatch.setitem(sys.modules, "codesearch.server.daemon_client", None)
    with pytest.raises(ModuleNotFoundError):
        lean.run(["query", "parse", "-p", str(repo)])


def test_a_platform_without_fcntl_leaves_the_query_to_the_typer_path(repo, monkeypatch):
    import codesearch.server
    from codesearch.cli import lean
    from codesearch.server import daemon_client

    monkeypatch.setattr(codesearch.server, "daemon_client", daemon_client)  # put back after
    monkeypatch.delattr(codesearch.server, "daemon_client")
    monkeypatch.delitem(sys.modules, "codesearch.server.daemon_client")
    monkeypatch.setitem(sys.modules, "fcntl", None)
    assert lean.run(["query", "parse", "-p", str(repo)]) is None
    assert "codesearch.server.daemon_client" not in sys.modules  # its import was tried, and failed on fcntl
