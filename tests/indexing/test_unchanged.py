"""The no-op ``codesearch index``: a stat-only check against the store answers "nothing
changed" before any model (or torch) is loaded, and says None at any doubt; the notices
about default models are said once per index, not on every run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.pipeline_helpers import count_reads
from fixtures.sample_repo import write_sample_repo
from fixtures.trees import git, write

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
    from codesearch.indexing.status import staleness

    opened = count_reads(monkeypatch)
    assert not staleness(lexical_repo).stale
    assert unchanged_run(lexical_repo) is not None
    assert opened == []

    edited = lexical_repo / "server/main.go"
    edited.write_text(edited.read_text() + "\n// more\n")
    (lexical_repo / "new.py").write_text("def fresh():\n    return 1\n")
    found = staleness(lexical_repo)
    assert (found.changed, found.added) == (["server/main.go"], ["new.py"])
    assert sorted(opened) == ["new.py", "server/main.go"]  # sniffed: new, or changed


# -- in a git work tree: git's listing and a stat per file, against the last run's stamp ----------


#: A little of everything a walk decides about: tracked, untracked, ignored (a pattern, a
#: folder, a folder of ignored files only), force-tracked though ignored, tracked but deleted,
#: a nested .codesearchignore, a binary file told by its bytes, a file over the size limit,
#: a symlink.
def _git_repo(root: Path) -> Path:
    write(root, ".gitignore", "*.log\nout/\n")
    write(root, "src/app.py", "def app():\n    return 1\n")
    write(root, "src/util.py", "def util():\n    return 2\n")
    write(root, "docs/guide.md", "# Guide\n\nWords.\n")
    write(root, "lib/.codesearchignore", "skip_me.py\n")
    write(root, "lib/skip_me.py", "def hidden():\n    return 3\n")
    write(root, "lib/kept.py", "def kept():\n    return 4\n")
    write(root, "blob.dat", b"\0\1\2\3" * 64)
    write(root, "big.txt", "y" * 3000)
    write(root, "forced.log", "a tracked log\n")
    write(root, "logs/run.log", "ignored\n")
    write(root, "gone.py", "def gone():\n    return 6\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "add", "-f", "forced.log")
    git(root, "commit", "-qm", "init")
    (root / "gone.py").unlink()  # tracked, deleted from the work tree: git still lists it
    write(root, "notes.py", "def untracked():\n    return 5\n")  # untracked, not ignored
    os.symlink("src/app.py", root / "link.py")
    return root


_LIMIT = 2000  # max_file_bytes of these runs: big.txt is over it


def _index(root: Path):
    with CodeSearch(root, model=None, multi_model=None, max_file_bytes=_LIMIT) as cs:
        return cs.index()


def _settle() -> None:
    """Wait two seconds into the future: files written before are ones git's stat cache
    vouches for at the end of a run that walks after (`gitstat`: only a file last written
    in a second before the walk's, less `gitstat.VOUCH_MARGIN_S`)."""
    import time

    from codesearch.indexing import gitstat

    time.sleep(1.02 + gitstat.VOUCH_MARGIN_S - time.time() % 1)


@pytest.fixture(params=["fresh", "settled"])
def git_repo(tmp_path, request) -> Path:
    """The repository, indexed. "fresh": indexed in the second its files were written (git
    vouches for none: every file is stat'ed); "settled": indexed a second later (git's
    stat cache vouches for the committed files, `gitstat`)."""
    root = _git_repo(tmp_path / "repo")
    if request.param == "settled":
        _settle()
    _index(root)
    from codesearch.indexing.walk import WALK_STAMP_KEY
    from codesearch.store import Store

    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        assert store.get_meta(WALK_STAMP_KEY), "the run recorded no stamp: the check below would walk"
    return root


def _move_mtime(path: Path, delta_ns: int = 1_000_000) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + delta_ns))


CHANGES = {
    "edit": lambda r: write(r, "src/app.py", "def app():\n    return 10\n"),
    "touch": lambda r: _move_mtime(r / "src/util.py"),
    "add untracked": lambda r: write(r, "new.py", "def new():\n    pass\n"),
    "add in a new folder": lambda r: write(r, "pkg/deep/mod.py", "def mod():\n    pass\n"),
    "add beside ignored files only": lambda r: write(r, "logs/tool.py", "def tool():\n    pass\n"),
    "delete tracked": lambda r: (r / "src/util.py").unlink(),
    "delete untracked": lambda r: (r / "notes.py").unlink(),
    "rename": lambda r: (r / "src/util.py").rename(r / "src/helpers.py"),
    "gitignore lets a file in": lambda r: write(r, ".gitignore", "out/\n"),
    "gitignore keeps a file out": lambda r: write(r, ".gitignore", "*.log\nout/\nnotes.py\n"),
    "info/exclude keeps a file out": lambda r: write(r, ".git/info/exclude", "notes.py\n"),
    "codesearchignore appears": lambda r: write(r, ".codesearchignore", "docs/\n"),
    "codesearchignore edited": lambda r: write(r, "lib/.codesearchignore", "kept.py\n"),
    "binary becomes text": lambda r: write(r, "blob.dat", "now text\n"),
    "too large shrinks": lambda r: write(r, "big.txt", "small now\n"),
    "untracked from the index": lambda r: git(r, "rm", "-q", "--cached", "forced.log"),
    "deleted tracked file back": lambda r: git(r, "checkout", "--", "gone.py"),
    "symlink retargeted": lambda r: ((r / "link.py").unlink(), os.symlink("lib/kept.py", r / "link.py")),
    "nested repository": lambda r: (write(r, "vendor2/inner.py", "def inner():\n    pass\n"),
                                    git(r / "vendor2", "init", "-q")),
}

SAME = {
    "nothing": lambda r: None,
    "ignored file added": lambda r: write(r, "debug.log", "noise\n"),
    "ignored folder written": lambda r: write(r, "out/gen.py", "def gen():\n    pass\n"),
    "git add and commit": lambda r: (git(r, "add", "notes.py"), git(r, "commit", "-qm", "more")),
    "index folder written": lambda r: write(r, ".codesearch/scratch", "x"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_of_a_git_work_tree_means_a_run(git_repo, change):
    from codesearch.indexing.status import staleness

    CHANGES[change](git_repo)
    assert unchanged_run(git_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is None
    if change != "touch":  # (a touch records a stat, and changes no file of the index)
        assert staleness(git_repo, max_file_bytes=_LIMIT).stale  # (what a query's refresh asks)
        real = _index(git_repo)
        assert real.files_indexed or real.files_removed, "the change was one a run does not see"


@pytest.mark.parametrize("same", list(SAME))
def test_what_changes_nothing_indexed_is_still_a_no_op(git_repo, same):
    from codesearch.indexing.status import staleness

    SAME[same](git_repo)
    fast = unchanged_run(git_repo, model=None, multi_model=None, max_file_bytes=_LIMIT)
    assert fast is not None and not staleness(git_repo, max_file_bytes=_LIMIT).stale
    real = _index(git_repo)
    assert (real.files_indexed, real.files_removed) == (0, 0)
    assert (fast.files_unchanged, fast.chunks_total, fast.skipped) == (
        real.files_unchanged, real.chunks_total, real.skipped)


@pytest.mark.parametrize("option", [{"include": ("src/**",)}, {"exclude": ("docs/**",)}, {"max_file_bytes": 4000}])
def test_other_walk_options_mean_a_run(git_repo, option):
    kwargs = {"model": None, "multi_model": None, "max_file_bytes": _LIMIT, **option}
    assert unchanged_run(git_repo, **kwargs) is None


def _stamp(root: Path) -> str | None:
    from codesearch.indexing.walk import WALK_STAMP_KEY
    from codesearch.store import Store

    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        return store.get_meta(WALK_STAMP_KEY)


def test_a_watchers_word_skips_the_work_trees_stats_and_nothing_else(git_repo, monkeypatch):
    """``vouched_since`` (the daemon's watcher saw no change since a check found the index
    current): no file of the work tree is looked at, git is not run, and the summary is the
    stat check's; any other reason for a run (another option, another model) still means a
    run, and so does what a watcher does not see, git's own state, changed since then."""
    import time

    from codesearch.indexing import walk

    checked = unchanged_run(git_repo, model=None, multi_model=None, max_file_bytes=_LIMIT)
    time.sleep(walk.VOUCH_MARGIN_S + 0.05)
    since = time.time()

    def looked(*args, **kwargs):
        raise AssertionError("a file was looked at")

    monkeypatch.setattr(walk, "unchanged_since", looked)
    monkeypatch.setattr(walk, "start_listings", looked)
    lexical = {"model": None, "multi_model": None, "max_file_bytes": _LIMIT}
    vouched = unchanged_run(git_repo, vouched_since=since, **lexical)
    assert checked is not None and vouched is not None
    assert (vouched.files_unchanged, vouched.chunks_total, vouched.skipped) == (
        checked.files_unchanged, checked.chunks_total, checked.skipped)
    for other in ({"exclude": ("docs/**",)}, {"model": "some-org/some-model"}):
        assert unchanged_run(git_repo, vouched_since=since, **{**lexical, **other}) is None
    # git's index or excludes written since: the work tree is checked (and here it is the same).
    monkeypatch.undo()
    for change in (lambda: git(git_repo, "rm", "-q", "--cached", "forced.log"),
                   lambda: write(git_repo, ".git/info/exclude", "notes.py\n")):
        change()
        assert not walk.vouched_unchanged(git_repo, walk.WalkStamp.from_json(_stamp(git_repo)), since)
        assert unchanged_run(git_repo, vouched_since=since, **lexical) is None


def test_the_stamp_holds_names_that_are_not_utf8(git_repo):
    odd = os.fsdecode(b"data-\xff.dat")  # watched (binary by its bytes), and kept beside it
    write(git_repo, odd, b"\0\1\2" * 100)
    write(git_repo, os.fsdecode(b"caf\xe9.py"), "def cafe():\n    return 1\n")
    _index(git_repo)
    assert unchanged_run(git_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is not None
    write(git_repo, odd, "text now\n")
    assert unchanged_run(git_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is None


# -- git's stat cache as the witness (`gitstat`) ------------------------------------------------


@pytest.fixture
def settled_repo(tmp_path) -> Path:
    root = _git_repo(tmp_path / "repo")
    git(root, "update-index", "--assume-unchanged", "docs/guide.md")  # git would not see it change
    _settle()
    _index(root)
    return root


def _vouch(root: Path):
    from codesearch.indexing.walk import WalkStamp

    stamp = WalkStamp.from_json(_stamp(root))
    assert stamp is not None
    return stamp.git


def test_git_vouches_for_the_committed_files_and_the_check_stats_only_the_rest(settled_repo, monkeypatch):
    """Where git's index records the store's stats, the no-op check and a query's refresh
    read no file stats from the store and stat only the files git does not vouch for:
    untracked, a symlink, one git is told not to look at."""
    from codesearch.indexing.status import staleness
    from codesearch.store import Store

    vouch = _vouch(settled_repo)
    assert vouch is not None and sorted(vouch.own) == ["docs/guide.md", "link.py", "notes.py"]

    def read_all(self):
        raise AssertionError("every file's stat was read")

    monkeypatch.setattr(Store, "file_stats", read_all)
    assert unchanged_run(settled_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is not None
    assert not staleness(settled_repo, max_file_bytes=_LIMIT).stale


@pytest.mark.parametrize("change", ["same size, same second", "assume-unchanged edited", "symlink target edited",
                                    "git add of an edit", "untracked edited"])
def test_what_git_does_not_see_is_still_a_change(settled_repo, change):
    """The files git vouches for are those whose every write it sees; the others are
    stat'ed, and an edit git's index takes in (``git add``) is no vouch."""
    from codesearch.indexing.status import staleness

    if change == "same size, same second":  # the same size, the mtime put back into its old second
        path = settled_repo / "src/util.py"
        st = path.stat()
        path.write_text(path.read_text().replace("2", "7"))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    elif change == "assume-unchanged edited":
        write(settled_repo, "docs/guide.md", "# Guide\n\nOther words.\n")
    elif change == "symlink target edited":  # link.py -> src/app.py: the link is stat'ed by its target
        (settled_repo / "link.py").unlink()
        write(settled_repo, "target.txt", "x")
        os.symlink("target.txt", settled_repo / "link.py")
    elif change == "git add of an edit":
        write(settled_repo, "src/util.py", "def util():\n    return 9\n")  # (app.py is link.py's target)
        git(settled_repo, "add", "src/util.py")
    else:
        write(settled_repo, "notes.py", "def untracked():\n    return 8\n")
    assert unchanged_run(settled_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is None
    assert staleness(settled_repo, max_file_bytes=_LIMIT).stale


def test_git_vouches_for_nothing_written_in_the_second_of_the_walk(tmp_path):
    """A file written in the second the walk began may be written again in that second
    unseen by git (which compares whole seconds): no vouch for it, and where that leaves
    git vouching for less than half the files, no vouch at all."""
    root = _git_repo(tmp_path / "repo")
    _index(root)
    assert _vouch(root) is None
    _settle()
    write(root, "src/app.py", "def app():\n    return 11\n")
    git(root, "add", "src/app.py")
    _index(root)
    vouch = _vouch(root)
    assert vouch is not None and "src/app.py" in vouch.own and "src/util.py" not in vouch.own


def test_a_stamp_with_a_damaged_vouch_is_checked_file_by_file(settled_repo):
    import json

    from codesearch.indexing.walk import WALK_STAMP_KEY
    from codesearch.store import Store

    doc = json.loads(_stamp(settled_repo))
    doc["git"]["own"] = "nonsense"
    with Store(settled_repo / ".codesearch" / "store.sqlite") as store:
        store.set_meta(WALK_STAMP_KEY, json.dumps(doc))
    assert _vouch(settled_repo) is None
    assert unchanged_run(settled_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is not None
    write(settled_repo, "src/app.py", "def app():\n    return 12\n")
    assert unchanged_run(settled_repo, model=None, multi_model=None, max_file_bytes=_LIMIT) is None


def test_a_store_gone_before_the_stats_are_read_is_a_difference(settled_repo, tmp_path):
    """The check reads the store's file stats only where git does not vouch for them; a
    store that cannot be read by then says "changed" (a run, which says what is wrong), not
    a traceback."""
    from codesearch.indexing import walk
    from codesearch.indexing.unchanged import file_stats_of

    gone = file_stats_of(tmp_path / "nowhere" / "store.sqlite")
    assert gone() is None
    stamp = walk.WalkStamp.from_json(_stamp(settled_repo))
    write(settled_repo, "src/util.py", "def util():\n    return 13\n")  # (git no longer vouches)
    assert walk.unchanged_since(settled_repo, stamp, gone) is False
