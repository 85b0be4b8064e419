"""The `codesearch` command line (Typer). See `codesearch --help`."""


def main() -> None:
    """Entry point of the `codesearch` console script."""
    from codesearch.cli.app import run

    run()
