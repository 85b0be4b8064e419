"""The no-op ``codesearch index``: a stat-only check against the store answers "nothing
changed" before any model (or torch) is loaded, and says None at any doubt; the notices
about default models are said once per index, not on every run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.sample_repo import write_sample_repo

from codesearch.api import CodeSearch
from codesearch.indexing.unchanged import unchanged_run
from codesearch.types import DEFAULT


@pytest.fixture
def lexical_repo(tmp_path) -> Path:
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return root


def test_nothing_changed_gives_the_summary_of_a_run_that_would_do_nothing(lexical_repo):
    with CodeSearch(lexical_repo) as cs:
        real = cs.index()
    fast = unchanged_run(lexical_repo)
    assert fast is not None
    assert (fast.files_indexed, fast.files_unchanged, fast.chunks_total, fast.chunks_encoded) == (
        real.files_indexed, real.files_unchanged, real.chunks_total, real.chunks_encoded)
    assert fast.skipped == real.skipped and fast.models == real.models == {}


@pytest.mark.parametrize("change", ["touch", "edit", "add", "remove", "options", "model"])
def test_any_change_or_other_option_means_a_run(lexical_repo, change):
    path = lexical_repo / "server/main.go"
    kwargs: dict = {}
    if change == "touch":
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    elif change == "edit":
        path.write_text(path.read_text() + "\n// more\n")
    elif change == "add":
        (lexical_repo / "new.py").write_text("def fresh():\n    return 1\n")
    elif change == "remove":
        path.unlink()
    elif change == "options":
        kwargs["exclude"] = ("server/**",)
    else:
        kwargs["model"] = "some-org/some-model"
    assert unchanged_run(lexical_repo, **kwargs) is None


def test_a_dense_index_is_unchanged_with_its_recorded_model(tmp_path, single_vector_dir):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    fast = unchanged_run(root, model=DEFAULT, multi_model=DEFAULT)
    assert fast is not None and fast.models == {"dense": str(single_vector_dir)}
    assert unchanged_run(root, model=str(single_vector_dir), multi_model=DEFAULT) is not None
    assert unchanged_run(root, model=None) is None  # switching it off is a run


def test_the_cli_no_op_index_imports_no_torch(tmp_path, single_vector_dir):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, model=str(single_vector_dir), multi_model=None) as cs:
        cs.index()
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", "from codesearch.cli import main; main()", "index",
                           str(root)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "torch" not in imported and "codesearch.encoder.loading" not in imported
    assert "files unchanged" in done.stderr  # the summary goes where progress goes


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_default_model_notices_are_said_once_per_index(offline_hub, tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    with CodeSearch(root, device="cpu") as cs:
        first = cs.index().notices
        assert any(n.startswith("No dense model by default") for n in first), first
        (root / "new.py").write_text("def fresh():\n    return 1\n")
        second = cs.index().notices
    assert not any(n.startswith(("No dense model by default", "Default model")) for n in second), second
    # And nothing left to say: the stat-only check answers without a run.
    assert unchanged_run(root, device="cpu") is not None


def test_checks_for_changes_read_no_unchanged_file(lexical_repo, monkeypatch):
    """A staleness check (before each query, in the daemon too) and the no-op index cost a
    ``stat`` per file: a file whose size and mtime the store records is not opened again."""
    import codesearch.indexing.walk as walk_module
    from codesearch.indexing.status import staleness

    opened: list[str] = []
    real = walk_module.read_inside

    def counting(root, rel, *args, **kwargs):
        opened.append(rel)
        return real(root, rel, *args, **kwargs)

    monkeypatch.setattr(walk_module, "read_inside", counting)
    assert not staleness(lexical_repo).stale
    assert unchanged_run(lexical_repo) is not None
    assert opened == []

    edited = lexical_repo / "server/main.go"
    edited.write_text(edited.read_text() + "\n// more\n")
    (lexical_repo / "new.py").write_text("def fresh():\n    return 1\n")
    found = staleness(lexical_repo)
    assert (found.changed, found.added) == (["server/main.go"], ["new.py"])
    assert sorted(opened) == ["new.py", "server/main.go"]  # sniffed: new, or changed
