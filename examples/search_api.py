"""Index a repository and search it from Python.

Usage: python examples/search_api.py PATH [QUERY] [--lexical]

--lexical builds a lexical-only index (no model, no torch): useful offline or in CI.
"""

from __future__ import annotations

import sys

from codesearch import CodeSearch


def main(argv: list[str]) -> None:
    lexical = "--lexical" in argv
    args = [a for a in argv if a != "--lexical"]
    path = args[0] if args else "."
    query = args[1] if len(args) > 1 else "where do we retry failed requests"

    models = {"model": None, "multi_model": None} if lexical else {}
    with CodeSearch(path, **models) as cs:
        summary = cs.index()  # incremental: a second run only looks at changed files
        print(f"indexed {summary.files_indexed} files, {summary.chunks_total} chunks", file=sys.stderr)

        result = cs.query(query, k=5, mode="lexical" if lexical else "hybrid")
        print(f"mode={result.mode} indexes={','.join(result.indexes_used)}", file=sys.stderr)
        for hit in result.hits:
            where = f"{hit.path}:{hit.start_line}-{hit.end_line}"
            print(f"{hit.score:8.4f}  {where}  {hit.symbol or ''}")

        status = cs.status()
        print(f"{status.files} files, languages: {status.languages}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
