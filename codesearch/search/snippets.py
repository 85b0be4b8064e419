"""What a search returns of each hit: context lines, cut snippets, a score floor and a
token budget for the whole answer (``SearchRequest``'s output controls).

Why a step of its own, after ranking: an agent or a RAG app pays for every token it
reads, and a terminal shows a screen at a time; the ranking is the same whatever is shown.
Pure Python on `SearchResult`s: used by `CodeSearch.query` and by the server alike.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from pathlib import Path

from codesearch.store.files import decode_source, hash_bytes, read_inside, split_lines
from codesearch.textregex import TextRegex, compile_regex
from codesearch.types import STORE_FILE, SearchHit, SearchRequest, SearchResult, default_index_dir

__all__ = ["CHARS_PER_TOKEN", "HIT_TOKENS", "approx_tokens", "fit", "hit_tokens", "shape", "with_context"]

#: Characters per token of the estimate. LLM tokenizers split source code finer than prose
#: (symbols, indentation), so 3.5 errs toward fitting rather than overflowing a budget.
CHARS_PER_TOKEN = 3.5
#: Tokens charged per hit besides its snippet: path, lines, score, language, symbol, kind.
HIT_TOKENS = 12
#: A hit that does not fit is cut to the budget left, if at least this many tokens of its
#: snippet fit (a line or two of code); else it is left out.
MIN_CUT_TOKENS = 16


def approx_tokens(text: str) -> int:
    """An estimate of the tokens `text` costs an LLM (characters / `CHARS_PER_TOKEN`)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def hit_tokens(hit: SearchHit) -> int:
    """Estimated tokens of one hit in an answer: its snippet, its path and `HIT_TOKENS`."""
    return approx_tokens(hit.text) + approx_tokens(hit.path) + HIT_TOKENS


def with_context(
    result: SearchResult, root: Path, lines: int, *, index_dir: str | Path | None = None
) -> SearchResult:
    """Widen each hit by `lines` lines above and below, read from the current files.

    A hit is widened only from the file the index holds: a regular file inside ``root``
    (never through a symlink that leads out of it, never a FIFO or a device), whose
    content hash is the one the store in ``index_dir`` (default ``root/.codesearch``)
    records, and whose lines at the hit are the hit's text. Any other hit (its file gone,
    edited since the index run, or swapped for something else) is left as it is.
    """
    if lines <= 0:
        return result
    root = Path(root)
    hashes = _indexed_hashes(Path(index_dir) if index_dir is not None else default_index_dir(root),
                             {hit.path for hit in result.hits})
    return dataclasses.replace(result, hits=[_widen(hit, root, lines, hashes) for hit in result.hits])


def _indexed_hashes(index_dir: Path, paths: set[str]) -> dict[str, str] | None:
    """Path -> content hash the store records, for ``paths``; None when no store can be read
    (the lines at each hit are still checked)."""
    from codesearch.errors import CodeSearchError
    from codesearch.store import Store

    if not paths or not (index_dir / STORE_FILE).is_file():
        return None
    try:
        with Store(index_dir / STORE_FILE, readonly=True) as store:
            return store.file_hashes(sorted(paths))
    except (CodeSearchError, sqlite3.Error, OSError):
        return None


def _widen(hit: SearchHit, root: Path, lines: int, hashes: dict[str, str] | None) -> SearchHit:
    try:
        data, _ = read_inside(root, hit.path)
    except OSError:
        return hit
    if hashes is not None and hashes.get(hit.path) != hash_bytes(data):
        return hit  # not the file the index holds: its lines would not be the hit's
    source = split_lines(decode_source(data))
    if hit.end_line > len(source) or hit.start_line < 1:
        return hit
    if "".join(source[hit.start_line - 1 : hit.end_line]).removesuffix("\n") != hit.text:
        return hit  # a newer generation's file under an older hit: the lines moved
    start = max(1, hit.start_line - lines)
    end = min(len(source), hit.end_line + lines)
    text = "".join(source[start - 1 : end])
    if not hit.text.endswith("\n"):  # keep the chunker's convention for the last newline
        text = text.removesuffix("\n")
    return dataclasses.replace(hit, start_line=start, end_line=end, text=text)


def _cut(hit: SearchHit, n_lines: int) -> SearchHit:
    """The hit shortened to its first `n_lines` lines: ``text`` stays the exact source of
    ``start_line..end_line`` (the range shrinks with it) and ``more_lines`` counts the rest.

    Why not a marker line inside ``text`` (what this did once): the JSON schema promises
    that ``text`` is those lines' source, and a terminal showed the marker as a numbered
    line of code. The renderers print the marker from ``more_lines``.
    """
    lines = split_lines(hit.text)
    if len(lines) <= n_lines:
        return hit
    kept = "".join(lines[:n_lines])
    if not hit.text.endswith("\n"):  # keep the chunker's convention for the last newline
        kept = kept.removesuffix("\n")
    cut = len(lines) - n_lines
    return dataclasses.replace(hit, text=kept, end_line=hit.end_line - cut, more_lines=hit.more_lines + cut)


def _cut_to_tokens(hit: SearchHit, tokens: int) -> SearchHit | None:
    """The hit with as many whole lines of its snippet as fit in `tokens`; None if none do."""
    lines = split_lines(hit.text)
    fixed = approx_tokens(hit.path) + HIT_TOKENS + approx_tokens('"more_lines": 0000')
    room, used, n = tokens - fixed, 0, 0
    for line in lines:
        used += len(line)
        if math.ceil(used / CHARS_PER_TOKEN) > room:
            break
        n += 1
    if n == 0:
        return None
    return _cut(hit, n)


def fit(result: SearchResult, request: SearchRequest) -> SearchResult:
    """Apply ``request``'s output controls to a ranked `SearchResult`.

    In order: hits under ``min_score`` go; snippets are cut to ``max_lines``, from the
    first line a ``regex`` matches (or emptied by ``no_snippet`` or ``files_only``); then
    hits are taken best first while the estimated tokens of the answer fit ``budget``, the
    first one that does not fit cut to the budget left when a useful part of it fits. The
    result's ``left_out`` counts the ranked hits not returned (None when no ``min_score``
    or ``budget`` was asked for), and a notice says when the budget left hits out; with a
    ``regex``, each hit says which of its lines match (``match_lines``). Context lines
    (``request.context``) are added before this, by the caller that can read the files
    (`with_context`).
    """
    hits = list(result.hits)
    ranked = len(hits)
    regex = compile_regex(request.regex) if request.regex is not None else None
    if request.min_score is not None:
        hits = [h for h in hits if h.score >= request.min_score]
    if request.no_snippet or request.files_only:
        # File names only means no code: an agent pays for every character of it.
        hits = [dataclasses.replace(h, text="") for h in hits]
    elif request.max_lines is not None:
        if regex is not None:
            hits = [_from_first_match(h, regex, request.max_lines) for h in hits]
        hits = [_cut(h, request.max_lines) for h in hits]
    notices = list(result.notices)
    if request.budget is not None:
        kept, spent = [], 0
        for hit in hits:
            cost = hit_tokens(hit)
            if spent + cost <= request.budget:
                kept.append(hit)
                spent += cost
                continue
            left = request.budget - spent
            if hit.text and left - approx_tokens(hit.path) - HIT_TOKENS >= MIN_CUT_TOKENS:
                cut = _cut_to_tokens(hit, left)
                if cut is not None:
                    kept.append(cut)
            break
        if len(kept) < len(hits):
            notices.append(
                f"{len(hits) - len(kept)} of {len(hits)} hit(s) left out to fit the {request.budget}-token budget "
                "(raise the budget, or ask for fewer lines per hit)"
            )
        hits = kept
    if regex is not None:
        hits = [_mark_matches(h, regex) for h in hits]
    left_out = ranked - len(hits) if request.min_score is not None or request.budget is not None else None
    return dataclasses.replace(result, hits=hits, notices=notices, left_out=left_out)


def _from_first_match(hit: SearchHit, regex: TextRegex, n_lines: int) -> SearchHit:
    """With a regex, a snippet cut to ``n_lines`` shows the lines that match, as ripgrep
    does: when the first match lies below the first ``n_lines`` lines, the snippet starts
    at it (``start_line`` moves down with ``text``), else it is left for `_cut`."""
    matched = regex.match_lines(hit.text)
    if not matched or matched[0] < n_lines:
        return hit
    lines = split_lines(hit.text)
    return dataclasses.replace(hit, text="".join(lines[matched[0]:]), start_line=hit.start_line + matched[0])


def _mark_matches(hit: SearchHit, regex: TextRegex) -> SearchHit:
    """The hit with ``match_lines``: the file lines of its snippet the regex matches."""
    if not hit.text:
        return hit
    return dataclasses.replace(hit, match_lines=tuple(hit.start_line + i for i in regex.match_lines(hit.text)))


def shape(
    result: SearchResult, request: SearchRequest, root: Path, *, index_dir: str | Path | None = None
) -> SearchResult:
    """`with_context` (``request.context`` lines from the files under ``root`` that the index
    in ``index_dir`` holds), then `fit`."""
    if not request.shapes_output:
        return result
    return fit(with_context(result, root, request.context, index_dir=index_dir), request)
