"""``python -m codesearch.server [PATH...] [options]``: the ``codesearch serve`` command alone.

Handy where the console script is not on PATH (tests, IDE extensions using the venv's
python). Same options, same exit codes: 0 after a clean shutdown, 1 for a user error
(``Error: ...`` on one line), 2 for a usage error.
"""

from codesearch.server.command import main

if __name__ == "__main__":
    main()
