"""Output controls on a ranked result (codesearch.search.snippets): score floor, cut snippets,
no snippets, and a token budget for the whole answer, best hits first."""

from __future__ import annotations

import pytest

from codesearch.search.snippets import approx_tokens, fit, hit_tokens
from codesearch.types import SearchHit, SearchRequest, SearchResult


def hit(i: int, lines: int, score: float) -> SearchHit:
    text = "".join(f"    value_{i}_{n} = compute({n})\n" for n in range(lines))
    return SearchHit(path=f"src/m{i}.py", start_line=1, end_line=lines, score=score, language="python",
                     symbol=None, kind="block", scope=None, text=text, chunk_id=i)


RESULT = SearchResult(query="q", mode="lexical", hits=[hit(0, 40, 0.9), hit(1, 30, 0.7), hit(2, 20, 0.5),
                                                        hit(3, 10, 0.2)], indexes_used=("lexical",))


def test_nothing_asked_changes_nothing():
    out = fit(RESULT, SearchRequest("q"))
    assert out.hits == RESULT.hits and out.left_out is None and out.notices == []


def test_max_lines_shrinks_the_range_to_the_text_and_counts_the_cut_lines():
    # Regression: text is the exact source of start_line..end_line, never a marker
    out = fit(RESULT, SearchRequest("q", max_lines=5))
    for before, after in zip(RESULT.hits, out.hits):
        assert after.text == "".join(before.text.splitlines(keepends=True)[:5])
        assert (after.start_line, after.end_line) == (before.start_line, before.start_line + 4)
        assert after.end_line + after.more_lines == before.end_line
        assert "more lines" not in after.text
    short = fit(RESULT, SearchRequest("q", max_lines=100))
    assert short.hits == RESULT.hits  # nothing to cut: no marker


def test_no_snippet_keeps_locations_only():
    out = fit(RESULT, SearchRequest("q", no_snippet=True))
    assert [h.text for h in out.hits] == ["", "", "", ""]
    assert [h.path for h in out.hits] == [h.path for h in RESULT.hits]


def test_min_score_leaves_out_weaker_hits_and_counts_them():
    out = fit(RESULT, SearchRequest("q", min_score=0.5))
    assert [h.score for h in out.hits] == [0.9, 0.7, 0.5] and out.left_out == 1


@pytest.mark.parametrize("budget", [50, 200, 400, 600, 10_000])
def test_the_budget_holds_best_hits_first_and_cuts_the_last(budget):
    out = fit(RESULT, SearchRequest("q", budget=budget))
    spent = sum(hit_tokens(h) for h in out.hits)
    assert spent <= budget
    n = len(out.hits)
    assert [h.chunk_id for h in out.hits] == list(range(n))  # a prefix of the ranking
    assert out.left_out == len(RESULT.hits) - n
    whole = [h.text == RESULT.hits[i].text for i, h in enumerate(out.hits)]
    assert all(whole[:-1])  # only the last hit may be cut ...
    if n and not whole[-1]:
        last, before = out.hits[-1], RESULT.hits[n - 1]
        assert last.more_lines > 0 and last.end_line + last.more_lines == before.end_line  # ... and says so
        assert before.text.startswith(last.text) and last.text.count("\n") == last.end_line - last.start_line + 1
    if out.left_out:
        assert any("token budget" in notice for notice in out.notices)
    else:
        assert out.notices == []


def test_a_budget_too_small_for_any_code_returns_nothing_rather_than_a_header():
    out = fit(RESULT, SearchRequest("q", budget=10))
    assert out.hits == [] and out.left_out == 4


def test_token_estimate():
    assert approx_tokens("") == 0 and approx_tokens("x" * 35) == 10


def test_the_hit_that_does_not_fit_is_cut_rather_than_dropped():
    out = fit(RESULT, SearchRequest("q", budget=400))  # hit 0 costs 341, hit 1 does not fit whole
    assert out.hits[0] == RESULT.hits[0]
    cut = out.hits[1]
    assert 1 < len(cut.text.splitlines()) < 30 and cut.more_lines == 30 - len(cut.text.splitlines())
    assert cut.end_line == len(cut.text.splitlines())
    assert out.left_out == 2
