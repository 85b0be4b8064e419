"""A source file as the chunkers see it: lines with byte offsets and token costs (`Doc`),
pieces of it (`Piece`), and the two moves every chunker makes: merge small neighbours,
cut long runs of lines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["BYTES_PER_TOKEN", "Doc", "Piece", "estimate_tokens", "line_pieces", "merge"]

# Code runs at about 3.3-4 characters per BPE token; 3 bytes per token errs on the side of
# chunks a little smaller than the budget rather than chunks the encoder truncates.
BYTES_PER_TOKEN = 3.0
# Bytes of a file tokenized to scale byte counts to a caller's own tokenizer.
SAMPLE_BYTES = 8192


def estimate_tokens(text: str) -> int:
    """Fast, conservative token count: UTF-8 bytes / 3, rounded up.

    Real BPE tokenizers give fewer tokens for typical code, so a chunk sized with this
    estimate fits the model's window.

    >>> estimate_tokens("def f(x):\\n    return x\\n")
    8
    """
    return -(-len(text.encode("utf-8", errors="surrogatepass")) // 3)


class Doc:
    """The source split into lines, with byte offsets and a token cost for any line range.

    Costs come from byte counts (O(1) per range) scaled to the caller's tokenizer: with a
    real `count_tokens`, the scale is measured once per file on a sample. Chunks built from
    these costs are then checked with the real count, and only a chunk that is over budget
    is cut again, line by line, in `counting` mode (real counts of each candidate run).
    """

    __slots__ = (
        "_count",
        "_memo",
        "_overhead",
        "counting",
        "data",
        "last",
        "line_bytes",
        "lines",
        "scale",
    )

    def __init__(self, text: str, count_tokens: Callable[[str], int] | None):
        self.lines = text.split("\n")
        self.data = text.encode("utf-8", errors="surrogatepass")
        # line i spans bytes [line_bytes[i], line_bytes[i + 1] - 1)
        self.line_bytes = [0, *accumulate(len(raw) + 1 for raw in self.data.split(b"\n"))]
        self._count = count_tokens
        self._memo: dict[tuple[int, int], int] = {}
        self._overhead = 0
        self.scale = 1.0 / BYTES_PER_TOKEN
        self.counting = False
        self.last = len(self.lines) - 1
        if count_tokens is not None:
            self._overhead = count_tokens("")  # special tokens the counter adds
            sample = self.data[:SAMPLE_BYTES].decode("utf-8", errors="ignore")
            real = count_tokens(sample) - self._overhead
            # A file denser than its sample (a license header, then code) makes some chunks
            # too big for the real count: the check after chunking cuts those again.
            self.scale = max(real, 1) / max(len(sample.encode("utf-8", "surrogatepass")), 1)

    def grow(self, total: int, lo: int, row: int) -> int:
        """Cost of lines lo..row given `total`, the cost of lo..row-1.

        In `counting` mode this sums per-line counts (each line tokenized once) instead of
        re-tokenizing the growing run; the caller checks the final run exactly.
        """
        if not self.counting:
            return self.cost(lo, row)
        return total + self.cost(row, row) - self._overhead + 1  # + the newline

    def cost(self, lo: int, hi: int) -> int:
        """Tokens of lines lo..hi (0-based, inclusive)."""
        if not self.counting:
            return int(-(-(self.line_bytes[hi + 1] - self.line_bytes[lo]) * self.scale // 1))
        key = (lo, hi)
        if key not in self._memo:
            self._memo[key] = self._count("\n".join(self.lines[lo : hi + 1]))
        return self._memo[key]

    def blank(self, row: int) -> bool:
        return not self.lines[row].strip()

    def node_text(self, node) -> str:
        return self.data[node.start_byte : node.end_byte].decode("utf-8", errors="replace")


@dataclass(slots=True)
class Piece:
    start: int  # 0-based row, inclusive
    end: int  # 0-based row, inclusive
    cost: int
    scope: tuple  # ((kind, signature), ...) outermost first
    defs: list  # [(kind, name)] of the definitions inside
    base: str = "block"  # kind when it defines nothing
    primary: tuple | None = None  # the definition whose header this piece holds
    # Name of the innermost definition this piece was cut from: the label of a piece that
    # defines nothing itself (the middle of a long function), so a hit says what it is
    # part of instead of `symbol: null`.
    owner: str | None = None

    def label(self) -> tuple[str, str | None]:
        if self.primary is not None and len(self.defs) <= 1:
            return self.primary
        if len(set(self.defs)) == 1:  # one definition (Haskell: several equations of it)
            return self.defs[0]
        if self.defs:
            names = dict.fromkeys(name for _, name in self.defs if name)
            return "block", ", ".join(names) or self.owner
        return self.base, self.owner


def merge(
    pieces: list[Piece], budget: Callable[[tuple], int], nested: bool = False
) -> list[Piece]:
    """Greedily join neighbours of the same scope while the sum stays within budget.

    With `nested`, a piece also joins a previous one whose scope encloses its own (a
    Markdown section followed by its subsections); the group keeps the outer scope.
    """
    out: list[Piece] = []
    for p in pieces:
        prev = out[-1] if out else None
        same = prev is not None and (
            prev.scope == p.scope or (nested and p.scope[: len(prev.scope)] == prev.scope)
        )
        if same and prev.cost + p.cost <= budget(prev.scope):
            primary = None
            if prev.primary is not None and not p.defs:
                primary = prev.primary
            elif p.primary is not None and not prev.defs:
                primary = p.primary
            # In place: pieces handed to merge belong to it (fewer objects on big files).
            prev.end = p.end
            prev.cost += p.cost
            prev.defs = prev.defs + p.defs
            prev.base = prev.base if prev.base == p.base else "block"
            prev.primary = primary
            prev.owner = prev.owner or p.owner
        else:
            out.append(p)
    return out


def line_pieces(doc: Doc, lo: int, hi: int, budget: int, scope: tuple, base: str) -> list[Piece]:
    """Cut lines lo..hi into runs within budget, preferring to cut at blank lines."""
    pieces: list[Piece] = []
    start = lo
    while start <= hi:
        end = start
        total = doc.cost(start, start)
        last_blank = -1
        while end < hi:
            grown = doc.grow(total, start, end + 1)
            if grown > budget:
                break
            end, total = end + 1, grown
            if doc.blank(end):
                last_blank = end
        # A cut at a paragraph break in the second half of the run reads better than a cut
        # in the middle of a paragraph.
        if end < hi and last_blank > start + (end - start) // 2:
            end = last_blank
        while end > start and doc.counting and doc.cost(start, end) > budget:
            end -= 1  # the per-line sum underestimated a real tokenizer's count
        pieces.append(Piece(start, end, doc.cost(start, end), scope, [], base))
        start = end + 1
    return pieces
