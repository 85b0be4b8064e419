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
        ended: SystemExit | None = None
        try:
            from codesearch.cli.lean import run as lean

            status = lean(sys.argv[1:])
            if status is not None and not interrupts.signalled():
                try:
                    sys.stdout.flush()
                except BrokenPipeError:  # `codesearch query ... | head -1`: the reader is gone
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(status)
            if status is None:
                from codesearch.cli.app import run

                run()
        except SystemExit as exc:
            ended = exc
        if not interrupts.signalled():
            # Done: a signal from here on is ignored (the interpreter's teardown would put the
            # default action back and die of it, with no line); one before it is caught below.
            interrupts.finished()
            if ended is not None:
                raise ended
            return
    except KeyboardInterrupt:  # at any point, the app's own handler included or not
        pass
    try:
        code = interrupts.say_and_exit()  # the line, unless the command said it already
    except KeyboardInterrupt:  # an interrupt deferred from an import landed as the call began
        code = interrupts.say_and_exit()
    # Interrupted, the command's clean-up done (the writer lock released): end now, not
    # after the interpreter's teardown (seconds with torch loaded, or an atexit join).
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
