"""The installed `codesearch` console script in real subprocesses: exit codes, streams, an
end-to-end run with the tiny models, and the cold-start rule (no torch for --help or a
lexical query)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.console import SCRIPT, cli
from fixtures.sample_repo import EXPECTED, write_sample_repo


def test_the_console_script_is_installed():
    assert SCRIPT.is_file(), f"{SCRIPT} missing: pip install -e ."


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, single_vector_dir, colbert_dir):
    """The sample repo indexed by the console script with the tiny dense + ColBERT models."""
    root = write_sample_repo(tmp_path_factory.mktemp("subprocess_repo"))
    done = cli("index", root, "--model", single_vector_dir, "--multi-model", colbert_dir, "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "files indexed" in done.stderr
    return root


@pytest.mark.parametrize("query,path", sorted(EXPECTED.items()))
def test_end_to_end_lexical_query_ranks_the_chunk_first(indexed, query, path):
    done = cli("query", query, "-p", indexed, "--mode", "lexical", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["path"] == path


def test_end_to_end_hybrid_query_keeps_it_in_the_top_results(indexed):
    # One process only: each loads torch and the models (the API and CliRunner tests cover
    # every query in-process).
    query, path = "openDatabaseConnection", EXPECTED["openDatabaseConnection"]
    done = cli("query", query, "--jsonl", "-k", "5", cwd=indexed / "src")  # index found from a subfolder
    assert done.returncode == 0, done.stderr
    hits = [json.loads(line) for line in done.stdout.splitlines()]
    assert path in [h["path"] for h in hits[:3]]
    assert "Notice" not in done.stderr  # dense + ColBERT were used, no lexical-only fallback


def test_plain_output_when_piped(indexed):
    done = cli("query", "parseConfigFile", "-p", indexed, "--mode", "lexical", "-k", "1")
    assert done.returncode == 0
    assert done.stdout.startswith("src/config.js:") and "\x1b[" not in done.stdout
    assert "function parseConfigFile(path)" in done.stdout


@pytest.mark.parametrize(
    "argv,code,needle",
    [
        (["query", "x", "-p", "/no/such/folder"], 1, "Error: path '/no/such/folder' does not exist"),
        (["query", "", "-p", "."], 1, "Error: the query is empty"),
        (["query", "x", "--mode", "fuzzy"], 2, "fuzzy"),
        (["index", "--max-file-size", "huge"], 2, "huge"),
    ],
)
def test_exit_codes_and_one_line_errors(tmp_path, argv, code, needle):
    done = cli(*argv, cwd=tmp_path)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""
    if code == 1:
        assert len(done.stderr.strip().splitlines()) == 1


def test_not_indexed_from_cwd(tmp_path):
    done = cli("query", "retry", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: ") and "codesearch index" in done.stderr


_PROBE = """
import sys
from codesearch.cli import main
sys.argv = ["codesearch", *{argv!r}]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = sorted(m for m in ("torch", "transformers", "faiss", "scipy") if m in sys.modules)
print("PROBE", code, ",".join(heavy), file=sys.stderr)
"""


def _probe(argv: list[str], cwd: Path | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("PROBE")][-1]
    _, code, heavy = ([*line.split(" "), ""])[:3]
    return int(code or 0), heavy


@pytest.mark.parametrize("argv", [["--help"], ["query", "--help"], ["index", "--help"]])
def test_help_imports_no_torch(argv):
    code, heavy = _probe(argv)
    assert code == 0 and "torch" not in heavy and "transformers" not in heavy


def test_lexical_query_imports_no_torch(indexed):
    # The index has dense and ColBERT vectors; a lexical query must still not load a model,
    # nor scipy (the lexical index is read with numpy alone: importing scipy.sparse alone
    # cost a cold query 0.1-0.2 s).
    code, heavy = _probe(["query", "parseConfigFile", "-p", str(indexed), "--mode", "lexical"])
    assert code == 0
    assert "torch" not in heavy and "transformers" not in heavy and "scipy" not in heavy


def test_query_uses_a_running_server_and_falls_back_without_it(tmp_path):
    root = write_sample_repo(tmp_path / "served")
    assert cli("index", root, "--model", "none", "--multi-model", "none", "-q").returncode == 0
    server = subprocess.Popen(
        [str(SCRIPT), "serve", str(root), "--port", "0", "--mcp", "off", "--no-watch", "--no-index-on-start"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = server.stdout.readline()  # the bound address, one JSON line, once listening
        assert json.loads(first)["port"] > 0, server.stderr.read()
        served = cli("query", "parseConfigFile", "-p", root, "--mode", "lexical", "--json")
        assert served.returncode == 0, served.stderr
        doc = json.loads(served.stdout)
        assert doc["results"][0]["path"] == "src/config.js"
        assert any("codesearch serve" in n for n in doc["notices"])
        local = cli("query", "parseConfigFile", "-p", root, "--mode", "lexical", "--json", "--no-server")
        local_doc = json.loads(local.stdout)
        assert not any("codesearch serve" in n for n in local_doc["notices"])
        assert local_doc["results"] == doc["results"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    after = cli("query", "parseConfigFile", "-p", root, "--mode", "lexical", "--json")
    assert after.returncode == 0 and not any("codesearch serve" in n for n in json.loads(after.stdout)["notices"])


def test_lexical_only_index_imports_no_torch(tmp_path):
    root = write_sample_repo(tmp_path / "repo")
    code, heavy = _probe(["index", str(root), "--model", "none", "--multi-model", "none", "-q"])
    assert code == 0 and (root / ".codesearch" / "store.sqlite").is_file()
    assert "torch" not in heavy and "transformers" not in heavy and "scipy" not in heavy
