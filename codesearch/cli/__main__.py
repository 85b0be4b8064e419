"""``python -m codesearch.cli``: the `codesearch` command, for an environment without its script on PATH."""

from codesearch.cli import main

main()
