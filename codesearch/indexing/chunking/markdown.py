"""Markdown: sections by heading (fences respected), subsections merged into their section
while the budget allows."""

from __future__ import annotations

import re
from collections.abc import Callable

from codesearch.indexing.chunking.document import Doc, Piece, line_pieces, merge

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*#*[ \t]*\r?$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def markdown_pieces(doc: Doc, budget: Callable[[tuple], int]) -> list[Piece]:
    """Sections by ATX heading (not inside fenced code), cut further by paragraphs."""
    sections = []  # (first row, level, title)
    fence = None
    for row, line in enumerate(doc.lines):
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)[0] * 3
            if fence is None:
                fence = mark
            elif mark == fence:
                fence = None
            continue
        if fence is None:
            h = _HEADING.match(line)
            if h:
                sections.append((row, len(h.group(1)), (h.group(2) or "").strip()))
    pieces: list[Piece] = []
    if not sections or sections[0][0] > 0:
        end = sections[0][0] - 1 if sections else doc.last
        pieces.extend(line_pieces(doc, 0, end, budget(()), (), "text"))
    stack: list[tuple[int, str]] = []  # (level, "## Title") of the enclosing headings
    for i, (row, level, title) in enumerate(sections):
        end = sections[i + 1][0] - 1 if i + 1 < len(sections) else doc.last
        while stack and stack[-1][0] >= level:
            stack.pop()
        scope = tuple(("section", sig) for _, sig in stack)
        stack.append((level, "#" * level + " " + title))
        inner = (*scope, ("section", stack[-1][1]))
        # Like a split definition: the heading's piece sits in the outer scope, the rest of
        # a long section carries the heading as its scope.
        part = line_pieces(doc, row, end, budget(inner), inner, "text")
        part[0].defs = [("section", title or None)]
        part[0].primary = ("section", title or None)
        part[0].scope = scope
        pieces.extend(part)
    return merge(pieces, budget, nested=True)
