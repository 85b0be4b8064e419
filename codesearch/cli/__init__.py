"""The `codesearch` command line (Typer). See `codesearch --help`."""


def main() -> None:
    """Entry point of the `codesearch` console script.

    A query for the warm daemon, a no-op ``index`` and ``serve --mcp stdio`` are answered by
    `codesearch.cli.lean` before typer and rich are imported; everything else by the app.
    """
    import contextlib
    import os
    import sys

    from codesearch.cli import interrupts

    interrupts.install()  # before the imports below: Ctrl-C while they run is one line too
    try:
        from codesearch.cli.lean import run as lean

        status = lean(sys.argv[1:])
        if status is not None and not interrupts.signalled():
            sys.stdout.flush()
            raise SystemExit(status)
        if status is None:
            from codesearch.cli.app import run

            run()
    except KeyboardInterrupt:  # before the app's own handler runs (while importing it)
        pass
    except SystemExit:
        if not interrupts.signalled():
            raise
    else:
        if not interrupts.signalled():
            return
    code = interrupts.say_and_exit()  # the line, unless the command said it already
    # Interrupted, the command's clean-up done (the writer lock released): end now, not
    # after the interpreter's teardown (seconds with torch loaded, or an atexit join).
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
