"""The ranker reads its signals from the on-disk, segmented lexical index, only for the rows a
query touches. Checked against a brute-force oracle written from the definitions (every
chunk of the store tokenized and scored in float64, per-file sums, path words compared one
by one, centrality from sets of names), on random corpora, after files are added, removed
and written again, and after segments are merged."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
from fixtures.lexical import chunk, file_ids, store_of, write_lexical

from codesearch.indexes import lexical_writer
from codesearch.indexes.features import (
    defined_terms,
    exact_names,
    labels_owner,
    norm_ident,
    path_tokens,
    stem_and_parent,
    symbol_names,
)
from codesearch.indexes.lexical import LexicalIndex, query_tokens, tokenize
from codesearch.search.query import analyse
from codesearch.search.ranking import Ranker, RankingParams
from codesearch.store import Store
from codesearch.types import path_kind

WORDS = ["engine", "plans", "planning", "store", "PlanStore", "plan_store", "parseConfig", "config", "configs",
         "http", "HttpClient", "client", "retry", "retries", "session", "Session", "cache", "the", "of", "and",
         "tokens", "tokenize", "router", "routes", "import", "json", "JsonArray", "array", "value", "values"]
SYMBOLS = ["Engine", "PlanStore", "parse_config", "HttpClient", "retry", "Session", "Router, route", "json_array",
           "Cache", "tokenize", "cache::Cache", None, None]
FOLDERS = ["src", "src/engine", "core", "lib/http", "tests", "docs", "bench", "examples", "config"]
NAMES = ["engine", "plan_store", "config", "http_client", "retry", "session", "router", "cache", "json", "test_engine",
         "tokenizer", "routes", "values", "guide"]
QUERIES = ["engine plan", "PlanStore", "plan_store", "parse config", "http client retries", "Session", "session",
           "router routes", "tests for the engine", "docs of the cache", "import json", "JsonArray", "conf",
           "tokenization", "values of the array", "benchmark of the router", "Cache", "cache::Cache", "zzz nothing"]


def _random_file(rng: random.Random, path: str) -> list:
    chunks, line = [], 1
    for _ in range(rng.randint(1, 5)):
        start = line - rng.randint(1, 2) if line > 3 and rng.random() < 0.1 else line  # some overlap
        end = start + rng.randint(0, 12)
        symbol = rng.choice(SYMBOLS)
        kind = rng.choice(["function", "class", "block", "block", "test", "imports"])
        scope = f"class {symbol} {{" if symbol and "," not in symbol and rng.random() < 0.3 else None  # a piece
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))
        if symbol and rng.random() < 0.7:
            text = f"def {symbol.split(',')[0]}(): {text}"
        chunks.append(chunk(path, start, end, text, symbol=symbol, kind=kind, scope=scope))
        line = end + 1
    return chunks


def _random_paths(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        path = f"{rng.choice(FOLDERS)}/{rng.choice(NAMES)}{rng.choice(['.py', '.rs', '.md', '_test.go', '.py'])}"
        if path not in taken:
            taken.add(path)
            out.append(path)
    return out


def _oracle(store: Store, query: str, p: RankingParams) -> dict[int, float]:
    """Chunk id -> fused score, by the definitions, over every chunk of ``store``."""
    rows = list(store.iter_file_chunks())
    q = analyse(query)
    counts = [Counter(tokenize(r[9] + "\n" + r[10])) for r in rows]
    paths = sorted({r[2] for r in rows})
    n, nf = len(rows), len(paths)
    df = Counter(t for c in counts for t in c)
    avgdl = sum(sum(c.values()) for c in counts) / n
    file_tf: dict[str, Counter] = {f: Counter() for f in paths}
    for r, c in zip(rows, counts):
        file_tf[r[2]].update(c)
    fdf = Counter(t for c in file_tf.values() for t in c)
    favgdl = sum(sum(c.values()) for c in file_tf.values()) / nf

    def bm25(tf: int, dl: int, avg: float, n_docs: int, d: int, b: float) -> float:
        return math.log(1 + (n_docs - d + 0.5) / (d + 0.5)) * tf * 2.2 / (tf + 1.2 * (1 - b + b * dl / avg))

    lex = [sum(bm25(c[t], sum(c.values()), avgdl, n, df[t], 0.75) for t in q.tokens if c[t]) for c in counts]
    flex = {f: sum(bm25(c[t], sum(c.values()), favgdl, nf, fdf[t], p.file_b) for t in q.tokens if c[t])
            for f, c in file_tf.items()}
    top_lex, top_flex = max(lex) or 1.0, max(flex.values()) or 1.0
    w = {t: math.log(1 + (nf - fdf[t] + 0.5) / (fdf[t] + 0.5)) if fdf[t] else 0.0 for t in q.tokens}
    share = {}
    for f in paths:
        words = path_tokens(f)
        hit = sum(wt for t, wt in w.items() if any(
            pw == t or (min(len(pw), len(t)) >= p.path_prefix and (pw.startswith(t) or t.startswith(pw)))
            for pw in words))
        share[f] = hit / sum(w.values()) if sum(w.values()) > 0 else 0.0
    names = {norm_ident(i) for i in q.identifiers}
    names |= {x[:-1] for x in names if x.endswith("s")} | {x + "s" for x in names}
    owner = [labels_owner(r[6], r[8]) for r in rows]
    sym = [0.0 if o else 0.5 * bool(set(q.identifiers) & symbol_names(r[6])) + 0.5 * bool(q.exact & exact_names(r[6]))
           for r, o in zip(rows, owner)]
    # Centrality: the other files whose code holds a name the file defines.
    uses = {f: set(c) - set(tokenize(f)) for f, c in file_tf.items()}
    defined = {f: set() for f in paths}
    for r, o in zip(rows, owner):
        if not o:
            defined[r[2]] |= set(symbol_names(r[6]))
    defined = {f: defined_terms(d, f) for f, d in defined.items()}
    udf = Counter(t for u in uses.values() for t in u)
    cap = max(5.0, 0.25 * nf)
    users = {f: sum(1 for g in paths if g != f and any(t in uses[g] and udf[t] <= cap for t in defined[f]))
             for f in paths}
    top_users = max(math.log1p(u) for u in users.values())
    cent = {f: math.log1p(u) / top_users if top_users > 0 else 0.0 for f, u in users.items()}
    factor = [1.0, 1.0 if q.wants_tests else p.demote, 1.0 if q.wants_docs else p.demote,
              1.0 if q.wants_bench else p.demote]
    row_factor = []
    for r in rows:
        fk = path_kind(r[2])
        x = factor[fk]
        if not q.wants_tests and r[7] == "test" and fk == 0:
            x *= p.demote
        row_factor.append(x)
    if q.is_symbol:
        defs = [i for i, (r, o) in enumerate(zip(rows, owner)) if not o and q.exact & exact_names(r[6])]
        if defs and all(row_factor[i] < 1.0 for i in defs):
            for i in defs:
                row_factor[i] = 1.0
    out = {}
    stems = {f: norm_ident(stem_and_parent(f)[0]) for f in paths}
    for i, r in enumerate(rows):
        f = r[2]
        total = p.w_lexical * lex[i] / top_lex + p.w_file_lexical * flex[f] / top_flex + p.w_path * share[f]
        if q.identifiers:
            total += p.w_symbol * sym[i] + p.w_stem * (stems[f] in names)
        total *= (1 + p.w_central * cent[f]) * row_factor[i]
        if r[7] == "imports" and not q.wants_imports:
            total *= p.demote_imports
        out[r[0]] = total
    return out


def _check(index: LexicalIndex, store: Store) -> None:
    ranker = Ranker(index)
    for query in QUERIES:
        expected = _oracle(store, query, ranker.params)
        scored = ranker.score(analyse(query), use_lexical=True)
        got = dict(zip(ranker.corpus.ids(scored.rows).tolist(), scored.total.tolist()))
        positive = {i for i, v in expected.items() if v > 1e-9}
        assert positive == {i for i, v in got.items() if v > 0}, query
        for i in positive:
            assert got[i] == pytest.approx(expected[i], rel=2e-5), (query, i)
        # What is selected holds only live chunks, best first.
        picked = ranker.select(scored, 10)
        ids = ranker.corpus.ids(np.array([r for r, _ in picked], dtype=np.int64)).tolist()
        assert set(ids) <= positive and [s for _, s in picked] == sorted((s for _, s in picked), reverse=True)


@pytest.mark.parametrize("seed", range(6))
def test_scores_equal_the_oracle_through_updates_and_merges(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    # Small segments, merged early, so a few updates exercise every path of the policy.
    monkeypatch.setattr(lexical_writer, "ROWS_PER_SEGMENT", 12)
    monkeypatch.setattr(lexical_writer, "MAX_SMALL", 2)
    merged = []
    real = lexical_writer.SegmentBuilder.add_from
    monkeypatch.setattr(lexical_writer.SegmentBuilder, "add_from", lambda *a: merged.append(1) or real(*a))
    taken: set[str] = set()
    paths = _random_paths(rng, 14, taken)
    store = store_of({p: _random_file(rng, p) for p in paths})
    folder = tmp_path / "lexical"
    index = write_lexical(store, folder)
    assert len(index.segments) > 1
    _check(index, store)
    for _round in range(3):
        removed = rng.sample(paths, 2)
        rewritten = rng.sample([p for p in paths if p not in removed], 3)
        added = _random_paths(rng, 2, taken)
        gone = file_ids(store, removed)
        store_of({p: _random_file(rng, p) for p in rewritten + added}, store, removed=tuple(removed))
        paths = [p for p in paths if p not in removed] + added
        index = lexical_writer.update(index, store, gone, file_ids(store, rewritten + added))
        index.save(folder)
        index = LexicalIndex.load(folder)
        assert len(index) == store.count("chunks")
        _check(index, store)
    assert merged, "no merge happened"
    # Whatever no manifest lists is gone.
    listed = {f"{e.name}.bin" for e in index.manifest.segments} | {f"{index.manifest.state}.bin", "manifest.json"}
    assert {p.name for p in folder.iterdir()} == listed


def test_centrality_of_unchanged_files_lags_until_enough_files_changed(tmp_path, monkeypatch):
    """Past `CENTRALITY_ALWAYS` files, a small update computes the changed files' counts
    exactly against the whole index and keeps the others'; once the files written since the
    last full computation reach `CENTRALITY_REFRESH` of the live files, all are computed."""
    monkeypatch.setattr(lexical_writer, "CENTRALITY_ALWAYS", 0)
    # File i defines unit<i>, and calls the units of the two files before it.
    paths = [f"pkg/mod{i}.py" for i in range(30)]
    store = store_of({
        p: [chunk(p, 1, 3, f"def unit{i}(): return unit{i - 1}() + unit{i - 2}()", symbol=f"unit{i}", kind="function")]
        for i, p in enumerate(paths)
    })
    folder = tmp_path / "lexical"
    index = write_lexical(store, folder)

    def users(idx: LexicalIndex) -> dict[str, float]:
        files = idx.live_files()
        return dict(zip(idx.paths(files), idx.users(files).tolist()))

    def exact(idx: LexicalIndex) -> dict[str, float]:
        files = idx.live_files()
        counts = lexical_writer.compute_users(idx, None, len(files))
        return dict(zip(idx.paths(files), counts[files].tolist()))

    before = users(index)
    assert before == exact(index) and before["pkg/mod3.py"] == 2
    new = "app/main.py"
    store_of({new: [chunk(new, 1, 3, "def main(): unit3() + unit7()", symbol="main", kind="function")]}, store)
    index = lexical_writer.update(index, store, [], file_ids(store, [new]))
    index.save(folder)
    after = users(index)
    assert index.manifest.stale_files == 1
    assert {f: v for f, v in after.items() if f != new} == before  # carried forward
    assert after[new] == exact(index)[new]  # computed against the whole index
    assert exact(index)["pkg/mod3.py"] == 3 and after["pkg/mod3.py"] == 2  # older files' counts lag
    store_of({p: [chunk(p, 1, 2, f"def unit{i}(): return 0", symbol=f"unit{i}")] for i, p in enumerate(paths[:2])},
             store)
    index = lexical_writer.update(index, store, [], file_ids(store, paths[:2]))
    index.save(folder)
    assert index.manifest.stale_files == 0 and users(index) == exact(index)


def test_a_query_reads_no_more_than_its_rows(tmp_path, monkeypatch):
    """A lexical query never lists every live file or row (only a regex filter or a
    centroid signal needs them all), and leaves the other files' arrays unread."""
    fruit = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel", "kiwi", "lemon"]
    store = store_of({f"pkg/mod{i}.py": [chunk(f"pkg/mod{i}.py", 1, 3, f"def {fruit[i]}(): return {fruit[i - 1]}()")]
                      for i in range(10)})
    index = write_lexical(store, tmp_path / "lexical")

    def refuse(*_a, **_k):
        raise AssertionError("a full pass over the index")

    monkeypatch.setattr(LexicalIndex, "live_files", refuse)
    ranker = Ranker(index)
    scored = ranker.score(analyse("cherry"), use_lexical=True)
    assert sorted(index.paths(scored.files)) == ["pkg/mod2.py", "pkg/mod3.py"] and ranker.select(scored, 5)
    empty = ranker.score(analyse("nothingmatchesthis"), use_lexical=True)
    assert len(empty.rows) == 0 and ranker.select(empty, 5) == []


def test_query_tokens_absent_from_live_files_weigh_nothing(tmp_path):
    """A term only a removed file held is no term of the index (as in one built afresh)."""
    store = store_of({"a/x.py": [chunk("a/x.py", 1, 2, "zebra engine")], "b/y.py": [chunk("b/y.py", 1, 2, "engine")]})
    index = write_lexical(store, tmp_path / "lexical")
    gone = file_ids(store, ["a/x.py"])
    store_of({}, store, removed=("a/x.py",))
    index = lexical_writer.update(index, store, gone, [])
    assert index.postings("zebra") is None and query_tokens("zebra") == ["zebra"]
    assert Ranker(index).score(analyse("zebra"), use_lexical=True).rows.tolist() == []
