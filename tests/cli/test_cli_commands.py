"""Every command and option through Typer's CliRunner, on a real sample repository.

Results must be on stdout, summaries and notices on stderr; errors are one `Error:` line
on stderr with exit status 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fixtures.sample_repo import EXPECTED, FILES, write_sample_repo
from typer.testing import CliRunner

from codesearch.cli.app import app

LEXICAL = ["--model", "none", "--multi-model", "none"]


def run(*argv: str | Path, ok: bool = True):
    result = CliRunner().invoke(app, [str(a) for a in argv])
    if ok:
        assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def assert_user_error(result, *needles: str) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The sample repo with a lexical-only index built through the CLI (read-only in tests)."""
    root = write_sample_repo(tmp_path_factory.mktemp("cli_repo"))
    run("index", root, *LEXICAL, "--quiet")
    return root


@pytest.fixture()
def fresh_repo(tmp_path):
    return write_sample_repo(tmp_path / "repo")


# -- index ---------------------------------------------------------------------------------


def test_index_prints_the_summary_on_stderr_and_nothing_on_stdout(fresh_repo):
    result = run("index", fresh_repo, *LEXICAL)
    assert result.stdout == ""
    for label in ("files indexed", "files unchanged", "skipped", "binary", "chunks", "time", "models"):
        assert label in result.stderr
    again = run("index", fresh_repo, *LEXICAL)
    assert "files unchanged" in again.stderr


def test_index_quiet_prints_nothing(fresh_repo):
    result = run("index", fresh_repo, *LEXICAL, "--quiet")
    assert result.stdout == "" and result.stderr == ""
    assert (fresh_repo / ".codesearch" / "store.sqlite").is_file()


def test_index_include_exclude_and_max_file_size(fresh_repo):
    run("index", fresh_repo, *LEXICAL, "-q", "--include", "*.py", "--include", "*.go", "--exclude", "server/**")
    status = json.loads(run("status", fresh_repo, "--json").stdout)
    assert status["files"] == 1 and status["languages"] == {"python": 1}
    # The index remembers its globs: the files left out are not "stale", and a query's
    # refresh does not pull them in.
    assert status["is_stale"] is False
    query = run("query", "parseConfigFile", "-p", fresh_repo, "--mode", "lexical", "--files-only")
    assert "src/config.js" not in query.stdout and "refreshed" not in query.stderr
    result = run("index", fresh_repo, *LEXICAL, "--rebuild", "--max-file-size", "200")
    status = json.loads(run("status", fresh_repo, "--json").stdout)
    small = [p for p, text in FILES.items() if len(text.encode()) <= 200]
    assert status["files"] == len(small) and status["is_stale"] is False
    assert "too_large" in result.stderr


def test_index_dir_option_puts_the_index_elsewhere(fresh_repo, tmp_path):
    elsewhere = tmp_path / "idx"
    run("index", fresh_repo, *LEXICAL, "-q", "--index-dir", elsewhere)
    assert (elsewhere / "store.sqlite").is_file()
    assert not (fresh_repo / ".codesearch").exists()
    result = run(
        "query", "parseConfigFile", "-p", fresh_repo, "--index-dir", elsewhere, "--mode", "lexical", "--files-only"
    )
    assert result.stdout.splitlines()[0] == "src/config.js"


def test_index_with_tiny_models_then_hybrid_query(fresh_repo, single_vector_dir, colbert_dir):
    result = run("index", fresh_repo, "--model", single_vector_dir, "--multi-model", colbert_dir, "--device", "cpu")
    assert "dense" in result.stderr and "colbert" in result.stderr
    doc = json.loads(run("query", "openDatabaseConnection", "-p", fresh_repo, "--json", "-k", "5").stdout)
    assert {"lexical", "dense", "colbert"} <= set(doc["indexes_used"])
    assert "server/main.go" in [r["path"] for r in doc["results"][:3]]
    lexical = json.loads(run("query", "openDatabaseConnection", "-p", fresh_repo, "--json", "--mode", "lexical").stdout)
    assert lexical["results"][0]["path"] == "server/main.go" and lexical["indexes_used"] == ["lexical"]


# -- query ---------------------------------------------------------------------------------


@pytest.mark.parametrize("query,path", sorted(EXPECTED.items()))
def test_query_plain_output_lists_location_score_and_snippet(repo, query, path):
    result = run("query", query, "-p", repo, "--mode", "lexical", "-k", "2")
    first = result.stdout.splitlines()[0]
    location, score = first.split()[:2]
    assert location.startswith(f"{path}:")
    start, end = map(int, location.rsplit(":", 1)[1].split("-"))
    assert 1 <= start <= end
    float(score)
    body = (repo / path).read_text().splitlines()[start - 1]
    assert body in result.stdout
    assert "\x1b[" not in result.stdout  # no colour codes when stdout is not a terminal


def test_query_json_round_trips_the_schema(repo):
    result = run("query", "retry_with_backoff", "-p", repo, "--mode", "lexical", "-k", "3", "--json")
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert (doc["query"], doc["mode"], doc["indexes_used"]) == ("retry_with_backoff", "lexical", ["lexical"])
    assert isinstance(doc["notices"], list) and 1 <= len(doc["results"]) <= 3
    top = doc["results"][0]
    assert set(top) == {"path", "start_line", "end_line", "score", "language", "symbol", "kind", "text"}
    assert top["path"] == "src/http_client.py" and top["language"] == "python"
    assert "retry_with_backoff" in top["text"]
    lines = (repo / top["path"]).read_text().splitlines(keepends=True)
    assert top["text"].rstrip("\n") == "".join(lines[top["start_line"] - 1 : top["end_line"]]).rstrip("\n")
    assert json.loads(json.dumps(doc)) == doc


def test_query_jsonl_is_one_hit_per_line(repo):
    result = run("query", "database", "-p", repo, "--mode", "lexical", "-k", "3", "--jsonl")
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert docs and all(d["schema_version"] == 1 and "path" in d and "text" in d for d in docs)
    as_json = json.loads(run("query", "database", "-p", repo, "--mode", "lexical", "-k", "3", "--json").stdout)
    assert [{k: v for k, v in d.items() if k != "schema_version"} for d in docs] == as_json["results"]


def test_query_files_only_lang_glob_and_top_k(repo):
    files = run("query", "the", "-p", repo, "--mode", "lexical", "--files-only", "-k", "10").stdout.splitlines()
    assert files and len(files) == len(set(files)) and all(f in FILES for f in files)
    go = json.loads(run("query", "server", "-p", repo, "--mode", "lexical", "--lang", "go", "--json").stdout)
    assert go["results"] and {r["language"] for r in go["results"]} == {"go"}
    src = json.loads(run("query", "config retry", "-p", repo, "--mode", "lexical", "--glob", "src/**", "--json").stdout)
    assert src["results"] and all(r["path"].startswith("src/") for r in src["results"])
    one = json.loads(run("query", "the", "-p", repo, "--mode", "lexical", "--top-k", "1", "--json").stdout)
    assert len(one["results"]) == 1


def test_query_context_widens_the_snippet_from_the_file(repo):
    plain = json.loads(run("query", "parseConfigFile", "-p", repo, "--mode", "lexical", "-k", "1", "--json").stdout)
    wide = json.loads(
        run("query", "parseConfigFile", "-p", repo, "--mode", "lexical", "-k", "1", "--json", "--context", "3").stdout
    )
    hit, whit = plain["results"][0], wide["results"][0]
    n_lines = len((repo / hit["path"]).read_text().splitlines())
    assert whit["start_line"] == max(1, hit["start_line"] - 3)
    assert whit["end_line"] == min(n_lines, hit["end_line"] + 3)


def test_query_finds_the_index_from_a_subfolder(repo, monkeypatch):
    monkeypatch.chdir(repo / "server")
    result = run("query", "openDatabaseConnection", "--mode", "lexical", "--files-only")
    assert result.stdout.splitlines()[0] == "server/main.go"


def test_query_refreshes_a_stale_index_and_says_so(fresh_repo):
    run("index", fresh_repo, *LEXICAL, "-q")
    (fresh_repo / "src" / "billing.py").write_text("def charge_card_qx42(card):\n    return card\n")
    stale = run("query", "charge_card_qx42", "-p", fresh_repo, "--mode", "lexical", "--files-only", "--no-refresh")
    assert "src/billing.py" not in stale.stdout and "refreshed" not in stale.stderr
    fresh = run("query", "charge_card_qx42", "-p", fresh_repo, "--mode", "lexical", "--files-only")
    assert fresh.stdout.splitlines()[0] == "src/billing.py"
    assert "Notice: index refreshed" in fresh.stderr


def test_hybrid_query_on_a_lexical_index_says_it_in_indexes_used_not_in_a_notice(repo):
    # Regression: "Notice: lexical index only" came with every query, even when lexical-only
    # was chosen; the index run says it once (its models row), a query only what is new.
    result = run("query", "parseConfigFile", "-p", repo, "--json")
    doc = json.loads(result.stdout)
    assert doc["indexes_used"] == ["lexical"] and doc["notices"] == []
    assert result.stderr == ""
    assert "none (lexical only)" in run("index", repo, *LEXICAL).stderr


def test_hybrid_query_on_an_index_lexical_without_being_asked_says_so_once(fresh_repo):
    # Regression: a hybrid query on a lexical-only index (here: the one a query builds)
    # answered with indexes_used ["lexical"] and no word of it
    first = run("query", "parseConfigFile", "-p", fresh_repo, "--json")
    assert "no index yet" in first.stderr
    result = run("query", "parseConfigFile", "-p", fresh_repo, "--json")
    doc = json.loads(result.stdout)
    assert doc["indexes_used"] == ["lexical"] and doc["results"]
    said = [n for n in doc["notices"] if "lexical index only" in n]
    assert len(said) == 1 and "codesearch index" in said[0]
    lines = result.stderr.splitlines()
    assert lines == [f"Notice: {said[0]}"]  # once on stderr, one line
    quiet = run("query", "parseConfigFile", "-p", fresh_repo, "--json", "--mode", "lexical")
    assert json.loads(quiet.stdout)["notices"] == [] and quiet.stderr == ""


def test_an_unreadable_file_is_reported_by_the_index_run_only(fresh_repo, caplog):
    import os

    def skipping() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skipping unreadable")]

    os.mkfifo(fresh_repo / "src" / "pipe.py")  # listed, but not a regular file: unreadable
    run("index", fresh_repo, *LEXICAL, "-q")
    assert skipping() == ["Skipping unreadable file src/pipe.py: not a regular file"]
    caplog.clear()
    (fresh_repo / "src" / "new.py").write_text("def fresh_name_qz():\n    return 1\n")
    for _ in range(2):  # the first query refreshes the index, the second finds it fresh
        result = run("query", "fresh_name_qz", "-p", fresh_repo, "--mode", "lexical", "-l")
        assert result.stdout.splitlines()[0] == "src/new.py"
    assert skipping() == []


# -- filters (ripgrep-style) and output controls ---------------------------------------------


def _paths(*argv: str) -> set[str]:
    doc = json.loads(run("query", *argv, "--mode", "lexical", "-k", "50", "-l", "--json").stdout)
    return {r["path"] for r in doc["results"]}


EVERYTHING = "retry config database server the connection parse"


def test_glob_negation_braces_and_repetition(repo):
    every = _paths(EVERYTHING, "-p", str(repo))
    assert len(every) > 2
    assert _paths(EVERYTHING, "-p", str(repo), "--glob", "!src/**") == {p for p in every if not p.startswith("src/")}
    braces = _paths(EVERYTHING, "-p", str(repo), "--glob", "*.{go,js}")
    assert braces and braces == {p for p in every if p.endswith((".go", ".js"))}
    both = _paths(EVERYTHING, "-p", str(repo), "--glob", "*.go", "-g", "*.js")
    assert both == braces  # repeated --glob: any of them, not only the last
    assert _paths(EVERYTHING, "-p", str(repo), "-g", "*.{go,js}", "-g", "!server/**") == {
        p for p in braces if not p.startswith("server/")
    }
    assert _paths(EVERYTHING, "-p", str(repo), "--glob", "*.zig") == set()  # valid, matches nothing


def test_an_invalid_glob_is_a_user_error(repo):
    assert_user_error(run("query", "x", "-p", repo, "--glob", "*.{rs,md", ok=False), "invalid glob", "never closed")


def test_repeated_lang_means_any_of_them(repo):
    doc = json.loads(
        run(
            "query",
            EVERYTHING,
            "-p",
            repo,
            "--mode",
            "lexical",
            "-k",
            "50",
            "--lang",
            "go",
            "--lang",
            "javascript",
            "--json",
        ).stdout
    )
    assert {r["language"] for r in doc["results"]} == {"go", "javascript"}


@pytest.mark.parametrize("fmt", ["--json", "--jsonl"])
def test_files_only_json_has_no_text(repo, fmt):
    # Regression: --files-only --json shipped each hit's code
    out = run("query", EVERYTHING, "-p", repo, "--mode", "lexical", "-k", "5", "--files-only", fmt).stdout
    hits = json.loads(out)["results"] if fmt == "--json" else [json.loads(line) for line in out.splitlines()]
    assert len(hits) > 1 and {h["text"] for h in hits} == {""}
    assert len({h["path"] for h in hits}) == len(hits)


def _source(repo: Path, hit: dict) -> str:
    lines = (repo / hit["path"]).read_text(encoding="utf-8").split("\n")
    return "\n".join(lines[hit["start_line"] - 1 : hit["end_line"]])


@pytest.mark.parametrize("cut", [["--max-lines", "3"], ["--budget", "60"], ["--budget", "150", "--max-lines", "4"]])
def test_json_text_is_the_exact_source_of_its_lines_when_cut(repo, cut):
    # Regression: `--max-lines 3 --json` gave end_line 100 with 3 lines of text and
    # "... (27 more lines)" in it
    base = ["query", EVERYTHING, "-p", repo, "--mode", "lexical", "-k", "5"]
    full = {(r["path"], r["start_line"]): r for r in json.loads(run(*base, "--json").stdout)["results"]}
    doc = json.loads(run(*base, *cut, "--json").stdout)
    assert doc["results"] and any(r.get("more_lines") for r in doc["results"])
    for hit in doc["results"]:
        assert hit["text"] == _source(repo, hit) and "more lines" not in hit["text"]
        assert hit["end_line"] + hit.get("more_lines", 0) == full[hit["path"], hit["start_line"]]["end_line"]
    lines = [json.loads(line) for line in run(*base, *cut, "--jsonl").stdout.splitlines()]
    assert [{k: v for k, v in h.items() if k != "schema_version"} for h in lines] == doc["results"]
    # Plain output: the location names the lines shown, the marker follows the snippet.
    plain = run(*base, *cut).stdout
    for hit in doc["results"]:
        block = f"{hit['path']}:{hit['start_line']}-{hit['end_line']}"
        assert block in plain
        if hit.get("more_lines"):
            shown = hit["text"] if hit["text"].endswith("\n") else hit["text"] + "\n"
            assert f"{block}  {hit['score']:.4f}" in plain and f"{shown}... ({hit['more_lines']} more lines)\n" in plain


def test_max_lines_no_snippet_and_min_score(repo):
    base = ["query", EVERYTHING, "-p", repo, "--mode", "lexical", "-k", "5", "--json"]
    full = json.loads(run(*base).stdout)["results"]
    cut = json.loads(run(*base, "--max-lines", "2").stdout)["results"]
    assert [r["path"] for r in cut] == [r["path"] for r in full]
    for whole, short in zip(full, cut):
        n = whole["end_line"] - whole["start_line"] + 1
        assert short["text"] == "\n".join(whole["text"].split("\n")[:2])
        assert short["end_line"] == min(whole["end_line"], whole["start_line"] + 1)
        assert short.get("more_lines", 0) == max(n - 2, 0) and ("more_lines" in short) == (n > 2)
    bare = json.loads(run(*base, "--no-snippet").stdout)["results"]
    assert [r["text"] for r in bare] == [""] * len(full)
    plain = run("query", EVERYTHING, "-p", repo, "--mode", "lexical", "-k", "3", "--no-snippet").stdout
    assert len(plain.splitlines()) == 3  # one location line per hit, nothing else
    floor = (full[1]["score"] + full[2]["score"]) / 2
    above = json.loads(run(*base, "--min-score", str(floor)).stdout)
    assert [r["path"] for r in above["results"]] == [r["path"] for r in full[:2]]
    assert above["left_out"] == len(full) - 2
    assert "left_out" not in json.loads(run(*base).stdout)  # only when a limit was asked for


def test_budget_fits_the_answer_and_says_what_was_left_out(repo):
    from codesearch.search.snippets import hit_tokens
    from codesearch.types import SearchHit

    def cost(r: dict) -> int:
        return hit_tokens(
            SearchHit(
                path=r["path"],
                start_line=0,
                end_line=0,
                score=0,
                language="",
                symbol=None,
                kind="",
                scope=None,
                text=r["text"],
                chunk_id=0,
            )
        )

    base = ["query", EVERYTHING, "-p", repo, "--mode", "lexical", "-k", "5", "--json"]
    full = json.loads(run(*base).stdout)["results"]
    budget = cost(full[0]) + cost(full[1]) // 2 + 20
    result = run(*base, "--budget", str(budget))
    doc = json.loads(result.stdout)
    assert sum(cost(r) for r in doc["results"]) <= budget
    assert doc["results"][0] == full[0] and doc["left_out"] == len(full) - len(doc["results"]) > 0
    assert "token budget" in result.stderr
    assert run(*base, "--budget", "0", ok=False).exit_code == 2  # a usage error (min 1)


# -- status and models ---------------------------------------------------------------------


def test_status_text_and_json(repo):
    text = run("status", repo).stdout
    for label in ("files: 5", "chunks:", "languages:", "python", "dense model: none", "up to date", "size on disk"):
        assert label in text
    doc = json.loads(run("status", repo, "--json").stdout)
    assert doc["schema_version"] == 1 and doc["indexed"] is True and doc["files"] == 5
    assert doc["models"] == {"dense": None, "multi": None}
    assert doc["stale"] == {"added": 0, "changed": 0, "removed": 0} and doc["is_stale"] is False
    assert doc["disk_bytes"]["total"] > 0


def test_status_finds_the_index_from_a_subfolder(repo, monkeypatch):
    monkeypatch.chdir(repo / "src")
    doc = json.loads(run("status", "--json").stdout)
    assert doc["indexed"] is True and doc["root"] == str(repo.resolve())


def test_status_of_a_folder_without_index(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "not indexed" in run("status").stdout
    assert "not indexed" in run("status", tmp_path).stdout
    assert json.loads(run("status", tmp_path, "--json").stdout)["indexed"] is False


def test_models_list_shows_the_defaults_in_an_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    doc = json.loads(run("models", "list", "--json").stdout)
    roles = {m["name"]: (m["role"], m["cached"]) for m in doc["models"]}
    assert roles["Alibaba-NLP/gte-modernbert-base"] == ("default dense", False)
    assert roles["lightonai/LateOn-Code-edge"] == ("default multi-vector", False)
    assert "gte-modernbert-base" in run("models", "list").stdout


@pytest.mark.parametrize("fixture,multivector", [("single_vector_dir", False), ("colbert_dir", True)])
def test_models_info_of_a_local_checkpoint(request, fixture, multivector):
    path = request.getfixturevalue(fixture)
    doc = json.loads(run("models", "info", path, "--json").stdout)
    assert doc["multivector"] is multivector and doc["dim"] > 0 and doc["max_length"] > 0
    assert doc["identity"]
    assert "dim" in run("models", "info", path).stdout


def test_models_pull_offline_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert_user_error(run("models", "pull", "nobody/no-such-model", ok=False), "nobody/no-such-model")


# -- errors: one line, exit 1 ------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["index", "{missing}"], ["query", "x", "-p", "{missing}"], ["status", "{missing}"]])
def test_path_does_not_exist(tmp_path, argv):
    missing = str(tmp_path / "missing")
    assert_user_error(run(*[a.format(missing=missing) for a in argv], ok=False), "missing", "does not exist")


def test_a_query_in_a_folder_without_index_indexes_it_first(fresh_repo):
    # As ck, ColGREP and semble do: build it with a notice instead of an error.
    first = run("query", "parseConfigFile", "-p", fresh_repo, "-l")
    assert first.stdout.splitlines()[0] == "src/config.js"
    assert first.stderr.startswith(f"Notice: no index yet: indexing {fresh_repo.resolve()} first")
    assert len([line for line in first.stderr.splitlines() if "no index yet" in line]) == 1
    second = run("query", "parseConfigFile", "-p", fresh_repo, "-l")
    assert second.stdout == first.stdout and "no index yet" not in second.stderr
    # Lexical now, without switching the models off: a later plain 'index' adds vectors.
    from codesearch.store import Store

    with Store(fresh_repo / ".codesearch" / "store.sqlite", readonly=True) as store:
        assert store.get_meta("models.disabled") in (None, "[]")  # nothing switched off


def test_a_query_without_path_indexes_the_git_work_tree_it_is_in(fresh_repo, monkeypatch):
    (fresh_repo / ".git").mkdir()  # the walk falls back to the file system; the root is found
    monkeypatch.chdir(fresh_repo / "server")
    result = run("query", "openDatabaseConnection", "--mode", "lexical", "-l")
    assert result.stdout.splitlines()[0] == "server/main.go" and "no index yet" in result.stderr
    assert (fresh_repo / ".codesearch" / "store.sqlite").is_file()


def test_a_query_outside_any_index_or_repository_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "notes.py").write_text("def f():\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    assert_user_error(run("query", "retry", ok=False), "codesearch index")
    assert not (tmp_path / ".codesearch").exists()


def test_model_unavailable_offline(fresh_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    result = run("index", fresh_repo, "--model", "nobody/no-such-model", "--multi-model", "none", ok=False)
    assert_user_error(result, "nobody/no-such-model", "--model")


def test_default_models_unavailable_offline_degrade_to_lexical_with_a_notice(fresh_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    quiet = run("index", fresh_repo, "--quiet")  # no summary, but the notice still shows
    assert quiet.stderr.startswith("Notice:") and "lexical" in quiet.stderr
    # Said once per index, not on every run: the next run has nothing to say.
    (fresh_repo / "later.py").write_text("def later():\n    return 2\n")
    again = run("index", fresh_repo)
    assert "Notice:" not in again.stderr, again.stderr


def test_index_locked_by_another_indexer(fresh_repo):
    from codesearch.store import IndexLock

    run("index", fresh_repo, *LEXICAL, "-q")
    with IndexLock(fresh_repo / ".codesearch"):
        assert_user_error(run("index", fresh_repo, *LEXICAL, ok=False), "another")


# A corrupt store (exit 1 naming --rebuild, then --rebuild fixes it): tests/test_user_errors.py,
# through the console script.


@pytest.mark.parametrize("query", ["", "   "])
def test_empty_query(repo, query):
    assert_user_error(run("query", query, "-p", repo, ok=False), "empty")


def test_nothing_indexable_in_the_folder(tmp_path):
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 8)
    assert_user_error(run("index", tmp_path, *LEXICAL, ok=False))


def test_dense_mode_on_a_lexical_index_is_a_user_error(repo):
    assert_user_error(run("query", "retry", "-p", repo, "--mode", "dense", ok=False), "--model")


def test_a_copied_repo_keeps_working(repo, tmp_path):
    # The index stores relative paths: a moved repository still answers (after a refresh).
    copy = Path(shutil.copytree(repo, tmp_path / "moved"))
    result = run("query", "parseConfigFile", "-p", copy, "--mode", "lexical", "--files-only")
    assert result.stdout.splitlines()[0] == "src/config.js"


def test_cuda_requested_without_a_gpu_is_a_user_error(fresh_repo, single_vector_dir):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run(
        "index", fresh_repo, "--model", single_vector_dir, "--multi-model", "none", "--device", "cuda", ok=False
    )
    assert_user_error(result, "cuda")


def test_a_colbert_checkpoint_as_the_dense_model_is_a_user_error(fresh_repo, colbert_dir):
    result = run("index", fresh_repo, "--model", colbert_dir, "--multi-model", "none", ok=False)
    assert_user_error(result, str(colbert_dir), "--multi-model")


def test_models_info_of_a_missing_folder(tmp_path):
    assert_user_error(run("models", "info", tmp_path / "nope", ok=False), "nope")


def test_no_results_is_said_on_stderr_only(repo):
    result = run("query", "zzqqxxj", "-p", repo, "--mode", "lexical")
    assert result.stdout == "" and result.stderr.strip() == "No results."
    doc = json.loads(run("query", "zzqqxxj", "-p", repo, "--mode", "lexical", "--json").stdout)
    assert doc["results"] == []


def test_another_model_for_an_existing_index_needs_rebuild(fresh_repo, single_vector_dir, tmp_path):
    from fixtures import models

    other = models.make_single_vector(tmp_path / "other_model", seed=7)
    run("index", fresh_repo, "--model", single_vector_dir, "--multi-model", "none", "-q")
    result = run("index", fresh_repo, "--model", other, "--multi-model", "none", ok=False)
    assert_user_error(result, "--rebuild")
    run("index", fresh_repo, "--model", other, "--multi-model", "none", "-q", "--rebuild")
    assert json.loads(run("status", fresh_repo, "--json").stdout)["models"]["dense"] == str(other)


# -- models switched off, model listing ---------------------------------------------------------


def test_models_switched_off_stay_off_on_a_later_plain_index(fresh_repo, single_vector_dir, tmp_path, monkeypatch):
    # Regression: after '--multi-model none' a plain 'index' warned that the default ColBERT
    # model is not cached; the same after '--model none --multi-model none'.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    run("index", fresh_repo, "--model", single_vector_dir, "--multi-model", "none", "--device", "cpu", "-q")
    (fresh_repo / "src" / "more.py").write_text("def more_code():\n    return 2\n")
    assert run("index", fresh_repo, "--device", "cpu", "-q").stderr == ""
    assert json.loads(run("status", fresh_repo, "--json").stdout)["models"]["dense"] == str(single_vector_dir)
    lexical = write_sample_repo(tmp_path / "lexical")
    run("index", lexical, *LEXICAL, "-q")
    assert run("index", lexical, "-q").stderr == ""


def test_models_list_on_a_terminal_keeps_ids_whole(monkeypatch):
    import io

    from rich.console import Console

    from codesearch.cli import render

    buf = io.StringIO()
    monkeypatch.setattr(render, "stdout", lambda: Console(file=buf, force_terminal=True, width=80, color_system=None))
    long_path = "/home/someone/.cache/huggingface/hub/models--Alibaba-NLP--gte-modernbert-base/snapshots/abc"
    rows = [
        {
            "name": "Alibaba-NLP/gte-modernbert-base",
            "role": "default dense",
            "cached": True,
            "size_bytes": 600_000_000,
            "path": long_path,
        },
        {
            "name": "lightonai/LateOn-Code-edge",
            "role": "default multi-vector",
            "cached": False,
            "size_bytes": 0,
            "path": None,
        },
    ]
    render.model_list(rows, as_json=False)
    out = buf.getvalue()
    assert "Alibaba-NLP/gte-modernbert-base" in out and "lightonai/LateOn-Code-edge" in out
    assert "…" not in out
    cells = "".join(line.split("│")[-2].strip() for line in out.splitlines() if line.count("│") == 6)
    assert long_path in cells  # folded over lines, but all of it


def test_models_info_error_names_no_flag_it_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    line = assert_user_error(run("models", "info", "nobody/no-such-model", ok=False), "nobody/no-such-model")
    assert "--model" not in line and "codesearch models pull nobody/no-such-model" in line
