"""``python -m codesearch.server [PATH...] [options]``: the ``codesearch serve`` command alone.

Handy where the console script is not on PATH (tests, IDE extensions using the venv's
python). Same options, same exit codes: 0 after a clean shutdown, 1 for a user error.
"""

from __future__ import annotations

import sys

import typer

from codesearch.cli.serve import SERVE_EPILOG, serve
from codesearch.errors import CodeSearchError


def main() -> None:
    """Run the serve command; a `CodeSearchError` becomes ``Error: ...`` and exit 1."""
    app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    app.command("serve", epilog=SERVE_EPILOG)(serve)
    try:
        app(prog_name="python -m codesearch.server", standalone_mode=False)
    except CodeSearchError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
