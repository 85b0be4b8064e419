"""What each served root holds in the daemon's memory (``codesearch daemon status``).

One process holds every root, so no figure of the operating system is per root. Two
figures are, and status shows both:

- **heap**: the anonymous resident memory (``RssAnon``) the root's opens added, less what
  they freed. Each open of a generation (`ServedRepo` swapping its searcher) is measured
  alone: opens take one lock, the heap is trimmed before and after (glibc keeps freed pages
  otherwise), and a model the open loaded is left out (it is the daemon's, shared by every
  root that names it, and shown with the models). Searches and index runs that allocate at
  the same moment blur it: it is an estimate, good to a few MiB.
- **mapped**: the resident pages of the files under the root's index folder that the
  process has mapped (``/proc/self/smaps``): exact, at the moment asked.

Linux only (``/proc``); elsewhere both are None.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from codesearch.workers import trim_heap


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def rss_bytes() -> int | None:
    """This process's resident memory (``VmRSS``), None where ``/proc`` is absent."""
    return _status_kib("VmRSS:")


def anon_bytes() -> int | None:
    """This process's anonymous resident memory (``RssAnon``: heap and private arrays)."""
    return _status_kib("RssAnon:")


class Meter:
    """Measures the heap that opens add (see the module's notes); one per daemon.

    ``models_bytes`` counts what model loads added (`model_load`), so that an open that
    loaded a model leaves that out of the root's figure.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.models_bytes = 0

    @contextmanager
    def measure(self) -> Iterator[list[int]]:
        """Measure the block; the list it yields gets one number when the block ends: the
        anonymous memory it added (negative when it freed more), models left out."""
        out: list[int] = []
        with self._lock:
            trim_heap()
            before, models = anon_bytes(), self.models_bytes
            try:
                yield out
            finally:
                trim_heap()
                after = anon_bytes()
                if before is not None and after is not None:
                    out.append(after - before - (self.models_bytes - models))

    @contextmanager
    def model_load(self) -> Iterator[list[int]]:
        """Measure a model load: the list it yields gets the heap it added, also counted in
        `models_bytes`. Without the lock: a load runs under the locks of whoever asked for
        it (a run's models, the pool), which an open that holds the lock may be waiting for."""
        out: list[int] = []
        before = anon_bytes()
        try:
            yield out
        finally:
            after = anon_bytes()
            if before is not None and after is not None:
                out.append(max(0, after - before))
                self.models_bytes += out[0]


def mapped_bytes(folders: Iterable[Path]) -> dict[Path, int] | None:
    """Resident bytes of the files under each folder that this process maps, from
    ``/proc/self/smaps`` (None where it cannot be read)."""
    wanted = [(folder, str(folder).rstrip("/") + "/") for folder in folders]
    totals = {folder: 0 for folder, _ in wanted}
    current: Path | None = None
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                first = line.split(None, 1)[0]
                if not first.endswith(":"):  # a mapping's header: address range, perms, ..., path
                    parts = line.split(None, 5)
                    path = parts[5].strip() if len(parts) == 6 else ""
                    current = next((folder for folder, prefix in wanted if path.startswith(prefix)), None)
                elif current is not None and first == "Rss:":
                    totals[current] += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return totals
