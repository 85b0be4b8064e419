"""A served index replaced on disk (``codesearch import --force``, or any rename of a new
``.codesearch`` into place) is searched from the next request on, without a restart.

The old store file stays open in the server after the rename (an unlinked inode), and the
new one can carry the same generation number, so only the file's identity tells them apart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from serverkit import LEXICAL, server_env, start_server

OLD = "def alpha_function(x):\n    return x + 1\n"
NEW = "def quokka_function(x):\n    return x + 1\n"


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "codesearch.cli", *args], check=True, capture_output=True,
                   env=server_env(), timeout=240)


def paths(http, query: str) -> list[str]:
    response = http.post("/search", json={"query": query, "k": 5, "mode": "lexical"})
    assert response.status_code == 200, response.text
    return [hit["path"] for hit in response.json()["results"]]


def checkout(root: Path, a: str) -> Path:
    root.mkdir(parents=True)
    (root / "a.py").write_text(a)
    (root / "b.py").write_text("def beta_function(y):\n    return y * 2\n")
    return root


def test_import_force_is_served_without_a_restart(tmp_path):
    served = checkout(tmp_path / "served", OLD)
    cli("index", str(served), *LEXICAL, "-q")
    # The export: the same files with a.py edited, indexed where it was edited.
    source = checkout(tmp_path / "source", NEW)
    cli("index", str(source), *LEXICAL, "-q")
    cli("export", str(tmp_path / "new.tar"), "-p", str(source))
    server = start_server([str(served), *LEXICAL, "--no-watch"], tmp_path / "logs")
    try:
        server.wait_idle()
        with server.client() as http:
            assert paths(http, "alpha") == ["a.py"]
            assert paths(http, "quokka") == []
            # The checkout gets the edit (no watcher: nothing re-indexes it) and the export.
            (served / "a.py").write_text(NEW)
            cli("import", str(tmp_path / "new.tar"), str(served), "--force", "-q")
            assert paths(http, "quokka") == ["a.py"]
            assert paths(http, "alpha") == []
            status = http.get("/status").json()["roots"][0]
            assert status["ready"] and status["indexing"]["runs"] == 1, status  # swapped, not re-indexed
    finally:
        server.stop()


def test_import_force_is_followed_by_an_open_codesearch(tmp_path):
    # The library's following searcher: the same replaced file, seen on its next search.
    from codesearch.api import CodeSearch, import_index

    served = checkout(tmp_path / "served", OLD)
    source = checkout(tmp_path / "source", NEW)
    with CodeSearch(source, model=None, multi_model=None) as cs:
        cs.index()
        cs.export(tmp_path / "new.tar")
    with CodeSearch(served, model=None, multi_model=None) as cs:
        cs.index()
        assert [h.path for h in cs.search("alpha", k=5, mode="lexical")] == ["a.py"]
        (served / "a.py").write_text(NEW)
        import_index(tmp_path / "new.tar", served, force=True)
        assert [h.path for h in cs.search("quokka", k=5, mode="lexical")] == ["a.py"]
