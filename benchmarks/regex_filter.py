"""What ``--regex`` costs a search, on an index you point it at.

    python benchmarks/regex_filter.py ROOT          # ROOT already indexed (lexical is enough)

Prints, per pattern: chunks kept, and the median seconds of a lexical query with and
without the filter (warm searcher, 5 runs), plus how long RE2 and Python's ``re`` take on
a catastrophic-backtracking input (``re`` is given a short one, and still the longer time).
"""

from __future__ import annotations

import re
import statistics
import sys
import time

from codesearch.api import CodeSearch
from codesearch.textregex import compile_regex

PATTERNS = [
    "Retry-After|backoff",
    r"(?i)^def \w*array\w*\(",
    r"\bnp\.(zeros|ones|empty)\(",
    r"(\w+\s*){90}x",  # a DFA-thrashing pattern just under the program limit
]


def _median(f, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(root: str) -> None:
    with CodeSearch(root, model=None, multi_model=None) as cs:
        chunks = cs.status().chunks
        query = "create an array filled with zeros"
        base = _median(lambda: cs.query(query, 10, mode="lexical"))
        print(f"{chunks:,} chunks; lexical query without a regex: {base * 1000:.0f} ms")
        for pattern in PATTERNS:
            kept = len(cs.query(query, 100_000, mode="lexical", regex=pattern).hits)
            took = _median(lambda p=pattern: cs.query(query, 10, mode="lexical", regex=p))
            print(f"  --regex {pattern!r}: {kept:,} chunks kept, {took * 1000:.0f} ms")
    text = "a" * 26 + "!"
    rx = compile_regex(r"(a+)+$")
    t = time.perf_counter()
    rx.match(text * 1000)
    re2_s = time.perf_counter() - t
    t = time.perf_counter()
    re.search(r"(a+)+$", text)
    re_s = time.perf_counter() - t
    print(f"(a+)+$: RE2 on 27,000 characters {re2_s * 1000:.2f} ms; Python re on 27 characters {re_s:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
