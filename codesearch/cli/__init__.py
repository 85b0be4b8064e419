"""The `codesearch` command line (Typer). See `codesearch --help`."""


def main() -> None:
    """Entry point of the `codesearch` console script.

    A query for the warm daemon, a no-op ``index`` and ``serve --mcp stdio`` are answered by
    `codesearch.cli.lean` before typer and rich are imported; everything else by the app.
    """
    import sys

    from codesearch.cli.lean import run as lean

    status = lean(sys.argv[1:])
    if status is not None:
        sys.stdout.flush()
        raise SystemExit(status)
    from codesearch.cli.app import run

    run()
