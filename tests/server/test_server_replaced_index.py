"""A served index replaced on disk (``codesearch import --force``, or any rename of a new
``.codesearch`` into place) is searched from the next request on, without a restart.

The old store file stays open in the server after the rename (an unlinked inode), and the
new one can carry the same generation number, so only the file's identity tells them apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
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


def test_the_daemon_follows_an_import_force(tmp_path, single_vector_dir):
    # The per-user daemon refreshes before each query (`ServedRepo.catch_up`): it compared
    # generations only, and the imported store's may equal the served one's. Without a
    # watcher (a tree past the inotify limit is served so), nothing else would tell it.
    from daemonkit import daemon_env, daemon_pids, run_cli, stop_all

    from codesearch.api import CodeSearch, import_index
    from codesearch.server.runtime_dir import daemon_dir, read_info

    # Both indexes made the same way (an export of a checkout indexed once, imported), so
    # that their stores carry the same generation.
    for name, text in (("old", OLD), ("new", NEW)):
        with CodeSearch(checkout(tmp_path / name, text), model=str(single_vector_dir), multi_model=None) as cs:
            cs.index()
            cs.export(tmp_path / f"{name}.tar")
    served = checkout(tmp_path / "served", OLD)
    import_index(tmp_path / "old.tar", served)
    runtime = tmp_path / "run"
    env = daemon_env(runtime)

    def texts() -> str:
        done = run_cli(["query", "function", "-p", str(served), "-k", "10", "--json"], env)
        return " ".join(hit["text"] for hit in json.loads(done.stdout)["results"])

    daemon = subprocess.Popen([sys.executable, "-m", "codesearch.server.daemon", "--runtime-dir", str(runtime),
                               "--no-watch"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while read_info(daemon_dir(runtime)) is None and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert read_info(daemon_dir(runtime)) is not None, "the daemon did not start"
        before = texts()
        assert "alpha_function" in before and "quokka_function" not in before
        pids = daemon_pids(runtime)
        (served / "a.py").write_text(NEW)
        run_cli(["import", str(tmp_path / "new.tar"), str(served), "--force", "-q"], env)
        after = texts()
        assert "quokka_function" in after and "alpha_function" not in after
        assert daemon_pids(runtime) == pids == [daemon.pid]  # the same daemon, not a restart
    finally:
        stop_all(runtime)
        daemon.wait(30)
