"""``python -m codesearch.server [PATH...] [options]``: the ``codesearch serve`` command alone.

Handy where the console script is not on PATH (tests, IDE extensions using the venv's
python). Same options, same exit codes: 0 after a clean shutdown, 1 for a user error
(``Error: ...`` on one line), 2 for a usage error.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import typer

from codesearch.cli.serve import SERVE_EPILOG, serve
from codesearch.errors import CodeSearchError


@functools.wraps(serve)
def _serve(*args: Any, **kwargs: Any) -> None:
    try:
        serve(*args, **kwargs)
    except CodeSearchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


def main() -> None:
    """Run the serve command as its own program."""
    app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False, rich_markup_mode=None)
    app.command("serve", epilog=SERVE_EPILOG)(_serve)
    app(prog_name="python -m codesearch.server")


if __name__ == "__main__":
    main()
