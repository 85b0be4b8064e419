"""Prebuilt indexes: export an index to one file, import it into another checkout.

Real git repositories, real tiny random models (dense and ColBERT), real SQLite, FAISS and
PLAID files. The oracle for "only what changed is encoded" is an ordinary incremental run
of the exporting index over the same edits.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from fixtures.disks import fill, tmpfs
from fixtures.exports import clone, git, git_repo
from fixtures.pipeline_helpers import check_consistent, function_source, make_repo, module_source
from typer.testing import CliRunner

from codesearch.api import CodeSearch, import_index
from codesearch.cli.app import app
from codesearch.errors import ExportError
from codesearch.indexing.export import MANIFEST, MANIFEST_SUM, read_manifest
from codesearch.types import STORE_FILE

QUERIES = ["compute mod2_fn1 of x", "mod0_fn2_helper value", "fixture repository README"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, single_vector_dir, colbert_dir):
    """(repo, the export file, the models) of a fully indexed repository."""
    base = tmp_path_factory.mktemp("export")
    repo = git_repo(base / "repo")
    models = {"model": str(single_vector_dir), "multi_model": str(colbert_dir), "device": "cpu"}
    with CodeSearch(repo, **models) as cs:
        cs.index()
        cs.export(base / "index.tar")
    return repo, base / "index.tar", models


def results(root: Path, models: dict, *, ties: bool = True) -> dict:
    """Each query's hits in each mode. ``ties=False``: each hit's file and score, in order of
    score then path (of two chunks of equal score, which one is shown follows the chunks'
    ids, and an import gives the chunks of a changed file new ones)."""
    with CodeSearch(root, **models) as cs:
        out = {
            (q, mode): [(h.path, h.start_line, h.end_line, round(h.score, 5)) for h in cs.search(q, k=5, mode=mode)]
            for q in QUERIES
            for mode in ("lexical", "dense", "colbert", "hybrid")
        }
    if ties:
        return out
    return {key: sorted((-h[3], h[0]) for h in hits) for key, hits in out.items()}


def test_round_trip_answers_as_the_exporting_index(exported, tmp_path):
    repo, file, models = exported
    other = clone(repo, tmp_path / "checkout")
    summary = import_index(file, other, device="cpu")
    assert (summary.run.files_indexed, summary.run.files_removed, summary.run.chunks_encoded) == (0, 0, 0)
    assert summary.exported_commit == summary.commit == git(repo, "rev-parse", "HEAD")
    check_consistent(other / ".codesearch")  # every chunk and file has every vector
    assert results(other, models) == results(repo, models)
    assert not list(tmp_path.glob("checkout/.*.import-*"))


def test_changed_checkout_reembeds_only_what_changed(exported, tmp_path):
    repo, file, models = exported
    other = clone(repo, tmp_path / "checkout")
    oracle = tmp_path / "oracle"
    shutil.copytree(repo, oracle)
    for root in (other, oracle):
        src = (root / "pkg/mod1.py").read_text()
        (root / "pkg/mod1.py").write_text(src.replace(function_source("mod1_fn1"), function_source("mod1_fn1", "new")))
        (root / "pkg/mod4.py").write_text(module_source("mod4", 2))
        (root / "pkg/mod3.py").unlink()
    with CodeSearch(oracle, **models) as cs:
        expect = cs.index()
    summary = import_index(file, other, device="cpu")
    run = summary.run
    assert (run.files_indexed, run.files_removed, run.files_unchanged) == (2, 1, 3)
    # The same texts as an incremental run of the exporting index: the edited function, the
    # new module's two, and the two files' whole-file vectors; nothing of the unchanged files.
    # (Encoded, or taken from the user's vector cache, where the oracle's run just put them.)
    assert run.chunks_encoded + run.texts_reused == expect.chunks_encoded + expect.texts_reused > 0
    assert run.chunks_encoded + run.texts_reused < summary.chunks
    check_consistent(other / ".codesearch")
    assert results(other, models, ties=False) == results(oracle, models, ties=False)


def _existing_index(root: Path) -> bytes:
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
    return (root / ".codesearch" / STORE_FILE).read_bytes()


def _assert_refused(file: Path, root: Path, *needles: str, before: bytes | None = None, **kw) -> str:
    with pytest.raises(ExportError) as err:
        import_index(file, root, device="cpu", force=before is not None, **kw)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    store = root / ".codesearch" / STORE_FILE
    if before is None:
        assert not (root / ".codesearch").exists()
    else:
        assert store.read_bytes() == before  # the index that was there is kept as it was
    assert not [p for p in root.iterdir() if ".import-" in p.name or ".replaced-" in p.name]
    return message


def _largest(file: Path, prefix: str) -> str:
    """The name of the largest member under ``prefix`` (an index folder's token arrays)."""
    with tarfile.open(file) as tar:
        return max((m for m in tar.getmembers() if m.name.startswith(prefix)), key=lambda m: m.size).name


def _member_offsets(file: Path) -> dict[str, tuple[int, int]]:
    with tarfile.open(file) as tar:
        return {m.name: (m.offset, m.offset_data) for m in tar.getmembers()}


@pytest.mark.parametrize("where", ["manifest", "store", "segment", "end_of_first_member", "last_member"])
def test_truncated_file_is_refused_whole(exported, tmp_path, where):
    repo, file, _ = exported
    offsets = _member_offsets(file)
    data = file.read_bytes()
    segment = next(n for n in offsets if n.endswith(".f16"))
    cut = {
        "manifest": offsets[MANIFEST][1] + 100,
        "store": offsets[STORE_FILE][1] + 4096,
        "segment": offsets[segment][1] + 1000,
        "end_of_first_member": offsets[STORE_FILE][0],  # at a member's boundary: later members missing
        "last_member": max(o for o, _ in offsets.values()),
    }[where]
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:cut])
    other = clone(repo, tmp_path / "checkout")
    _assert_refused(bad, other, "nothing was imported")
    before = _existing_index(other)
    _assert_refused(bad, other, "nothing was imported", before=before)


@pytest.mark.parametrize("where", ["manifest", "store", "segment", "plaid", "header"])
def test_flipped_byte_is_refused_whole(exported, tmp_path, where):
    repo, file, _ = exported
    offsets = _member_offsets(file)
    segment = next(n for n in offsets if n.endswith(".f16"))
    at = {
        "manifest": offsets[MANIFEST][1] + 20,
        "store": offsets[STORE_FILE][1] + 70_000,
        "segment": offsets[segment][1] + 999,
        "plaid": offsets[_largest(file, "plaid/")][1] + 500,
        "header": offsets[_largest(file, "plaid/")][0] + 3,  # a byte of a member's name in its tar header
    }[where]
    data = bytearray(file.read_bytes())
    data[at] ^= 0x10
    bad = tmp_path / "flipped.tar"
    bad.write_bytes(bytes(data))
    other = clone(repo, tmp_path / "checkout")
    _assert_refused(bad, other, "damaged")


def _rewrite_manifest(file: Path, dest: Path, change) -> Path:
    """A copy of ``file`` whose manifest ``change(doc)`` edited, with a matching checksum
    (what a newer codesearch or another export would write)."""
    with tarfile.open(file) as tar, tarfile.open(dest, "w") as out:
        for m in tar.getmembers():
            data = tar.extractfile(m).read()
            if m.name == MANIFEST:
                doc = json.loads(data)
                change(doc)
                data = json.dumps(doc).encode()
                body = data
            elif m.name == MANIFEST_SUM:
                data = hashlib.sha256(body).hexdigest().encode()
            m.size = len(data)
            out.addfile(m, io.BytesIO(data))
    return dest


def test_another_repository_is_refused(exported, tmp_path):
    _, file, _ = exported
    stranger = git_repo(tmp_path / "stranger", n_files=2)  # another root commit
    message = _assert_refused(file, stranger, "another repository", "root commit")
    assert message.startswith(f"{file} is an export of another repository")


def test_without_git_the_paths_decide(exported, tmp_path):
    repo, file, _ = exported
    plain = tmp_path / "plain"
    shutil.copytree(repo, plain, ignore=shutil.ignore_patterns(".git", ".codesearch"))
    assert import_index(file, plain, device="cpu").run.chunks_encoded == 0
    unrelated = tmp_path / "unrelated"
    (unrelated / "src").mkdir(parents=True)
    (unrelated / "src/other.py").write_text("def other():\n    return 1\n")
    _assert_refused(file, unrelated, "another repository", "0 of its 5 files")


def test_another_schema_or_model_is_refused(exported, tmp_path, modernbert_dir):
    repo, file, _ = exported
    other = clone(repo, tmp_path / "checkout")
    newer = _rewrite_manifest(file, tmp_path / "newer.tar", lambda d: d.update(schema_version=d["schema_version"] + 1))
    _assert_refused(newer, other, "schema version", "upgrade codesearch")
    _assert_refused(file, other, "was built with dense model", "leave --model out", model=str(modernbert_dir))
    _assert_refused(file, other, "colbert model", multi_model=None)


@pytest.mark.parametrize("content", [b"", b"not a tar file at all\n" * 100, "tar"])
def test_not_an_export_is_refused(tmp_path, content):
    bad = tmp_path / "bad.tar"
    if content == "tar":
        with tarfile.open(bad, "w") as tar:
            tar.add(__file__, arcname="hello.py")
    else:
        bad.write_bytes(content)
    root = make_repo(tmp_path / "repo")
    _assert_refused(bad, root, "is not a codesearch export")


def test_existing_index_is_replaced_only_with_force(exported, tmp_path):
    repo, file, models = exported
    other = clone(repo, tmp_path / "checkout")
    before = _existing_index(other)
    with pytest.raises(ExportError, match=r"an index already exists .*pass --force"):
        import_index(file, other)
    assert (other / ".codesearch" / STORE_FILE).read_bytes() == before
    import_index(file, other, force=True, device="cpu")
    assert results(other, models) == results(repo, models)


def test_cli_export_import_and_index_from(exported, tmp_path):
    repo, _, models = exported
    runner = CliRunner()
    out = tmp_path / "cli.tar"
    res = runner.invoke(app, ["export", str(out), "-p", str(repo)])
    assert res.exit_code == 0, res.output
    assert read_manifest(out).models["dense"]["name"] == models["model"]
    other = clone(repo, tmp_path / "checkout")
    res = runner.invoke(app, ["import", str(out), str(other), "--device", "cpu"])
    assert res.exit_code == 0 and "0 changed or new files re-indexed" in res.stdout, res.output
    res = runner.invoke(app, ["index", str(other), "--from", str(out)])
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [
        f"Error: an index already exists at {other / '.codesearch'} (pass --rebuild to replace it with {out}, "
        "or remove it first)"
    ]
    res = runner.invoke(app, ["index", str(other), "--from", str(out), "--rebuild", "-q"])
    assert res.exit_code == 0, res.output
    (tmp_path / "junk.tar").write_bytes(b"junk")
    res = runner.invoke(app, ["import", str(tmp_path / "junk.tar"), str(other), "--force"])
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("Error: ") and "Traceback" not in res.output


def test_import_of_unchanged_checkout_loads_no_model(exported, tmp_path):
    """What keeps an import within seconds: no content changed, so neither torch nor a
    model is loaded; and the run reads no file (the import's check of each file against
    the export recorded the stat of what it read)."""
    import os
    import sys

    repo, file, _ = exported
    other = clone(repo, tmp_path / "checkout")
    code = (
        "import sys; from codesearch.api import import_index; "
        f"s = import_index({str(file)!r}, {str(other)!r}); "
        "print(s.run.files_unchanged, s.run.files_read, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert out.stdout.split() == ["5", "0", "False"], out.stderr


def test_lexical_run_without_changes_says_nothing_of_missing_vectors(exported):
    repo, _, _ = exported
    with CodeSearch(repo) as cs:
        summary = cs.index(lexical_only=True)
    assert summary.files_indexed == 0 and summary.notices == []


def test_folders_of_killed_imports_are_removed(exported, tmp_path):
    repo, file, _ = exported
    other = clone(repo, tmp_path / "checkout")
    dead = other / ".codesearch.import-99999999"  # no such process
    dead.mkdir()
    (dead / "store.sqlite").write_bytes(b"half")
    import_index(file, other, device="cpu")
    assert not dead.exists() and git(other, "status", "--porcelain") == ""


@pytest.mark.parametrize("dest", ["missing/index.tar", "folder", "repo/.codesearch/x.tar"])
def test_export_to_a_bad_place_is_one_line(exported, tmp_path, dest):
    repo, _, _ = exported
    (tmp_path / "folder").mkdir()
    where = repo / ".codesearch" / "x.tar" if dest.startswith("repo/") else tmp_path / dest
    res = CliRunner().invoke(app, ["export", str(where), "-p", str(repo)])
    assert res.exit_code == 1 and res.stderr.startswith("Error: ") and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output and not where.is_file()


def test_kill_9_during_an_import_leaves_the_index_that_was_there(exported, tmp_path):
    """Killed after the unpack, inside the index run (the longest step): the old index is
    untouched, and the next import removes the dead one's folder and succeeds."""
    import os
    import signal
    import sys
    import time

    repo, file, models = exported
    other = clone(repo, tmp_path / "checkout")
    before = _existing_index(other)
    marker = tmp_path / "in-run"
    code = (
        "import time, pathlib; from codesearch.api import import_index\n"
        "def progress(event):\n"
        f"    pathlib.Path({str(marker)!r}).touch(); time.sleep(120)\n"
        f"import_index({str(file)!r}, {str(other)!r}, force=True, progress=progress)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the import never reached its index run"
        assert list(other.glob(".codesearch.import-*"))  # unpacked, not yet in place
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (other / ".codesearch" / STORE_FILE).read_bytes() == before
    import_index(file, other, force=True, device="cpu")
    assert not list(other.glob(".codesearch.*-*"))
    assert results(other, models) == results(repo, models)


def test_a_full_disk_during_an_import_is_one_line_and_keeps_nothing(exported, tmp_path):
    repo, file, _ = exported
    with tmpfs(tmp_path / "disk", size="8m") as disk:
        other = clone(repo, disk / "checkout")
        filler = fill(disk, free_kb=64)  # the export's members do not fit
        with pytest.raises(ExportError) as err:
            import_index(file, other, device="cpu")
        message = str(err.value)
        assert "\n" not in message and "nothing was imported" in message, message
        assert not (other / ".codesearch").exists()
        assert not list(other.glob(".*import*"))
        filler.unlink()


def test_a_member_changed_in_place_after_its_hash_is_one_line_and_no_file(tmp_path, monkeypatch):
    """Only an index run writes into a file in place, and the export holds its lock; should
    one do it anyway, the export fails in one line and leaves no file (never an archive
    whose checksums lie)."""
    from codesearch.indexing import export as export_mod

    repo = make_repo(tmp_path / "repo")
    with CodeSearch(repo, model=None, multi_model=None) as cs:
        cs.index()
    real = export_mod._manifest

    def then_append(members, *args):
        manifest = real(members, *args)
        with open(members[STORE_FILE].name, "r+b") as fh:
            fh.seek(200)
            fh.write(b"written after the hash")  # same size, other bytes
        return manifest

    monkeypatch.setattr(export_mod, "_manifest", then_append)
    with pytest.raises(ExportError, match=r"'store.sqlite' changed while it was exported.*export' again"):
        export_mod.write_export(repo / ".codesearch", repo, tmp_path / "e.tar")
    assert not (tmp_path / "e.tar").exists() and not list(tmp_path.glob(".e.tar*"))
