"""Test-only: hold an index run at one of its progress events, so that a test can signal the
process at that stage boundary whatever the machine's speed (tests/cli/test_interrupts.py).

Inert unless ``CODESEARCH_STAGE_HOOK`` names a folder: then every
`ProgressEvent` of an index run (each goes through `codesearch.indexing.options.Progress`,
in this process or in the daemon) comes here first, on the run's own thread:

- it is appended to ``<folder>/events`` as ``<pid> <stage> <n> <done>/<total>``, ``n``
  counting that stage's events since the target last changed (the last line says where a
  run was when a signal came);
- the target, ``<folder>/at`` holding ``<stage> <n> [<any word>]``, holds the run at that
  event: ``<folder>/held`` is written (``<pid> <stage> <n>``) and the run waits while it
  exists, in a Python sleep, where a signal lands as it would at the report itself. A
  test deletes ``held`` to let a run go on (the daemon's, once its client is signalled).

Example::

    mkdir hook && echo "encode 2" > hook/at
    CODESEARCH_STAGE_HOOK=hook codesearch index . &     # held at its second encode batch
    while [ ! -e hook/held ]; do sleep 0.1; done; kill -INT %1
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from codesearch.types import ProgressEvent

__all__ = ["VARIABLE", "reached"]

#: The environment variable that names the hook's folder (read at each event, not at import:
#: a test may fork its processes from one that imported everything already).
VARIABLE = "CODESEARCH_STAGE_HOOK"

#: How long a run waits for ``held`` to go (a test that died does not hold a daemon forever).
HOLD_S = 600.0

_counts: dict[str, int] = {}
_target: list[str] = [""]  # the ``at`` file's text the counts belong to


def reached(event: ProgressEvent) -> None:
    """Record ``event``; hold the run here if it is the target."""
    if not os.environ.get(VARIABLE):
        return
    folder = Path(os.environ[VARIABLE])
    try:
        target = (folder / "at").read_text()
    except OSError:
        target = ""
    if target != _target[0]:  # a new target (a daemon's next run): count from the start again
        _target[0] = target
        _counts.clear()
    n = _counts[event.stage] = _counts.get(event.stage, 0) + 1
    with open(folder / "events", "a") as log:
        log.write(f"{os.getpid()} {event.stage} {n} {event.done}/{event.total}\n")
    words = target.split()
    if words[:2] != [event.stage, str(n)]:
        return
    held = folder / "held"
    tmp = folder / f"held.{os.getpid()}"
    tmp.write_text(f"{os.getpid()} {event.stage} {n}\n")
    os.replace(tmp, held)  # whole: a test that sees it reads all of it
    deadline = time.monotonic() + HOLD_S
    while held.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
