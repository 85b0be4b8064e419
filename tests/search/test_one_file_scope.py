"""A glob naming one file lists that file's chunks, as many as ``k`` asks: no per-file cap
(a per-file cap once gave 3 hits at most per file, even with k=1000; README: "Hits from
one file are not capped")."""

from __future__ import annotations

from codesearch.api import CodeSearch


def test_a_glob_naming_one_file_returns_all_its_matching_chunks(tmp_path):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    # Functions long enough to be one chunk each (small ones are grouped into one chunk).
    body = "".join(f"    step_{j} = prepare(request, {j})\n" for j in range(30))
    functions = [f"def handle_retry_{i}(request):\n{body}    return retry(request, attempt={i})\n" for i in range(12)]
    (root / "src" / "handlers.py").write_text("\n\n".join(functions))
    (root / "src" / "other.py").write_text("def retry(request, attempt):\n    return request\n")
    with CodeSearch(root, model=None, multi_model=None) as cs:
        cs.index()
        hits = cs.search("retry request", k=1000, mode="lexical", glob="src/handlers.py")
        assert len(hits) == 12 and {h.path for h in hits} == {"src/handlers.py"}
        assert len({h.symbol for h in hits}) == 12  # twelve chunks, one definition each
        # Unscoped, the same file still brings more than three hits when k allows.
        everything = cs.search("retry request", k=1000, mode="lexical")
        assert sum(h.path == "src/handlers.py" for h in everything) == 12
