"""A pasted string finds its chunk first: a query that is a piece of the code itself (an
error message from a log, a line copied from a stack trace) ranks the chunks that hold it,
word for word, above those that only share its words, whatever the models of the index.

Why a step of its own, after ranking: BM25 scores a chunk's share of the query's words, so a
long chunk that holds the exact message can lose to shorter ones that repeat some of its
words. Chunks are sized in a single-vector model's tokens (`codesearch.indexing.encoders.
chunk_budget`: that scores better in hybrid search), so the chunk around a message differs
between indexes: "Negative chunk length not allowed", raised in werkzeug's ``serving.py``,
ranked first in the default index (a 20-line chunk) and third in a MiniLM one (60 lines).
No weight of a signal says "this text occurs here"; reading the text of the best candidates
does, in a millisecond.

The rule: a query of at least `MIN_WORDS` words (whitespace apart, once any quotes around
it are taken off) that occurs, whitespace aside and case kept, in at most `MAX_HOLDERS` of
the `CANDIDATES` best-ranked chunks of source files moves those chunks first, in their
ranked order, each scored a step above the best score (so scores still fall down the list).
Source files only (`codesearch.types.path_kind`): a README quoting a query is not where it
was pasted from, and a test that checks a message is not where it is raised. A phrase held
by more of them is a common phrase of the code ("return self.value"), which says nothing
about which chunk is meant: the ranking stays as it is. Only the best `CANDIDATES` are read,
whatever ``k`` asks, so the hits of ``-k 5`` stay the first five of ``-k 10``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from codesearch.types import path_kind

__all__ = ["CANDIDATES", "MAX_HOLDERS", "MIN_WORDS", "exact_first", "pasted_phrase"]

#: The best-ranked chunks whose text is read.
CANDIDATES = 50
#: A phrase held by more of the candidates than this is common, not a pointer to one chunk.
MAX_HOLDERS = 3
#: How far above the best score a moved hit goes (relative to it), one step per moved hit.
STEP = 1e-4
#: Fewer words are an identifier or a short description: the ranking's own signals (a
#: definition's name, BM25) already find those.
MIN_WORDS = 3

_QUOTES = "\"'`"


def pasted_phrase(query: str) -> str | None:
    """The query as the text to look for (whitespace runs made one space, quotes around it
    taken off), or None when it is too short to be a pasted piece of code."""
    text = " ".join(query.split()).strip(_QUOTES).strip()
    return text if len(text.split(" ")) >= MIN_WORDS else None


def exact_first(
    picked: Sequence[tuple[int, float]], phrase: str, texts: Callable[[list[int]], Sequence[tuple[str, str]]]
) -> list[tuple[int, float]]:
    """``picked`` (rows and scores, best first) with the rows among the first `CANDIDATES`
    whose text holds ``phrase`` moved first (see the module's rule). ``texts`` reads the
    path and the text of rows, in order."""
    head = list(picked[:CANDIDATES])
    if not head:
        return list(picked)
    holders = [i for i, (path, text) in enumerate(texts([row for row, _ in head]))
               if path_kind(path) == 0 and phrase in " ".join(text.split())]
    if not holders or len(holders) > MAX_HOLDERS or holders == list(range(len(holders))):
        return list(picked)
    held = set(holders)
    rest = [hit for i, hit in enumerate(head) if i not in held]
    # Scores above the best one, a step apart, so the list still falls and a --min-score
    # that keeps the best hit keeps these: the others keep theirs.
    top = head[0][1]
    step = STEP * max(abs(top), 1.0)
    lifted = [(head[i][0], top + step * (len(holders) - n)) for n, i in enumerate(holders)]
    return [*lifted, *rest, *picked[CANDIDATES:]]
