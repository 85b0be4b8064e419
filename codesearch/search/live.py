"""The searcher of one index folder as index runs change it: one generation open at a time,
swapped for a newer one, leased by each search, given its query encoders once.

`CodeSearch` and the server both search through a `LiveSearcher`; they differ only in when
a generation is replaced:

- following (``pinned=False``, `CodeSearch`): the first search opens the current
  generation; each search first checks the store's generation (one meta read) and moves
  to a newer one another process committed;
- pinned (``pinned=True``, the server): a generation is opened, pinned (a read
  transaction: every record a search returns comes from that generation, while runs
  commit newer ones), given its encoders and warmed up by `swap`, which the server calls
  after each stage of its index runs, and when the store file was replaced (`replaced`);
  searches never wait for a run.

Either way a search leases the generation it started on, and a replaced generation is
closed when its last lease ends, so a swap never closes an index under a running search.
A lexical search never attaches (so never loads) an encoder.

Example
-------
>>> live = LiveSearcher("repo/.codesearch", encoders=lambda: (Encoders(), []))   # doctest: +SKIP
>>> with live.lease(lexical=True) as (searcher, notices):                           # doctest: +SKIP
...     searcher.search("parse the config", 5)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from codesearch.encoder.base import Encoder, Encoders
from codesearch.errors import NotIndexedError
from codesearch.search.searcher import Searcher

__all__ = ["LiveSearcher", "open_pinned"]

#: Loads (or returns) the query encoders, with the notices resolving them said.
EncoderSource = Callable[[], tuple[Encoders, list[str]]]
_ANY = object()


@dataclass(eq=False)
class _Generation:
    """One open generation and who is using it."""

    searcher: Searcher
    users: int = 0
    retired: bool = False
    #: What attaching the encoders said; None until they are attached.
    notices: list[str] | None = field(default=None)


def open_pinned(index_dir: Path) -> Searcher:
    """A searcher pinned on the generation committed now (see `Searcher.pin`).

    Raises
    ------
    NotIndexedError
        The folder has no index (yet).
    """
    searcher = Searcher(index_dir)
    try:
        while not searcher.pin():  # another process committed in between: open again
            searcher.close()
            searcher = Searcher(index_dir)
    except BaseException:
        searcher.close()
        raise
    return searcher


class LiveSearcher:
    """The current generation of an index folder, for concurrent searches.

    Parameters
    ----------
    index_dir : path
        The ``.codesearch`` folder.
    encoders : callable
        ``() -> (Encoders, notices)``, called (at most once per generation, never for a
        lexical search) to attach the query encoders.
    pinned : bool
        Generations come only from `swap` and are pinned; else the first search opens one
        and every search follows the store to a newer one.
    wrap : callable, optional
        Applied to each query encoder before it is attached (the server's query batcher).
    missing : callable, optional
        The error to raise when a pinned searcher has no generation yet.
    """

    def __init__(
        self,
        index_dir: str | Path,
        *,
        encoders: EncoderSource,
        pinned: bool = False,
        wrap: Callable[[Encoder], Encoder] | None = None,
        missing: Callable[[], NotIndexedError] | None = None,
    ) -> None:
        self.index_dir = Path(index_dir)
        self.pinned = pinned
        self._encoders = encoders
        self._wrap = wrap
        self._missing = missing or (lambda: NotIndexedError(f"no index in {str(self.index_dir)!r} yet"))
        self._current: _Generation | None = None
        self._open: list[_Generation] = []  # every generation not closed yet, current included
        self._lock = threading.Lock()  # the current generation, the leases, the list
        self._attach_lock = threading.Lock()  # one thread loads and attaches the encoders

    # -- searching --------------------------------------------------------------------------

    @contextmanager
    def lease(self, *, lexical: bool) -> Iterator[tuple[Searcher, list[str]]]:
        """The current generation's searcher, held until the block ends, and the notices of
        its encoders (attached first unless ``lexical``).

        Raises
        ------
        NotIndexedError
            No generation can be opened (no index yet).
        """
        gen = self._acquire()
        try:
            notices = [] if lexical else self._attach(gen)
            yield gen.searcher, notices
        finally:
            self._release(gen)

    @property
    def ready(self) -> bool:
        """True when a generation is open."""
        with self._lock:
            return self._current is not None

    @property
    def generation(self) -> int | None:
        """The store generation the current searcher opened; None when none is open."""
        with self._lock:
            return None if self._current is None else self._current.searcher.generation

    @property
    def replaced(self) -> bool:
        """True when the current generation's store file is no longer the one at the index's
        path (a ``codesearch import --force``): a pinned owner then swaps (`swap`); a
        following one moves by itself."""
        with self._lock:
            gen = self._current
        return gen is not None and gen.searcher.is_replaced()

    # -- replacing generations ----------------------------------------------------------------

    def swap(self, *, warm: bool = True) -> None:
        """Open the generation committed now (pinned, encoders attached, warmed up with one
        lexical and one hybrid query unless ``warm`` is False) and make it the current one;
        the one it replaces closes when its last search returns.

        Raises
        ------
        NotIndexedError
            The folder has no index (yet).
        """
        gen = _Generation(open_pinned(self.index_dir))
        try:
            self._attach(gen)
            if warm:  # the first request after the swap pays nothing
                gen.searcher.search("warm up", 1, mode="lexical")
                gen.searcher.search("warm up", 1, mode="hybrid")
        except BaseException:
            gen.searcher.close()
            raise
        self._install(gen)

    def reset(self) -> None:
        """Let go of the current generation (the next search opens a new one); it closes
        when its last search returns."""
        with self._lock:
            old, self._current = self._current, None
            closing = self._retire(old)
        _close(closing)

    def close(self) -> None:
        """Close every generation now (the caller makes sure no search runs). Idempotent."""
        with self._lock:
            gens, self._open, self._current = self._open, [], None
        _close(gens)

    # -- internals ------------------------------------------------------------------------------

    def _acquire(self) -> _Generation:
        while True:
            with self._lock:
                gen = self._current
                if gen is not None:
                    gen.users += 1  # leased first: a swap cannot close it under the check below
            if gen is not None and (self.pinned or gen.searcher.is_current()):
                return gen
            if gen is not None:
                self._release(gen)
            elif self.pinned:
                raise self._missing()
            # None open yet, or another process committed (an index run publishes files
            # first, then vectors as they come): open its generation, unless another
            # thread did meanwhile.
            self._install(_Generation(Searcher(self.index_dir)), only_if=gen)

    def _install(self, gen: _Generation, *, only_if: object = _ANY) -> None:
        """Make ``gen`` current; with ``only_if``, only while the current one is still that
        (else another thread replaced it first, and ``gen`` closes)."""
        with self._lock:
            if only_if is not _ANY and self._current is not only_if:
                closing = [gen]
            else:
                old, self._current = self._current, gen
                self._open.append(gen)
                closing = self._retire(old)
        _close(closing)

    def _retire(self, old: _Generation | None) -> list[_Generation]:
        """Mark ``old`` replaced; what can close now (held: ``self._lock``)."""
        if old is None:
            return []
        old.retired = True
        if old.users:
            return []
        self._open.remove(old)
        return [old]

    def _release(self, gen: _Generation) -> None:
        with self._lock:
            gen.users -= 1
            closing = gen.retired and gen.users == 0 and gen in self._open
            if closing:
                self._open.remove(gen)
        if closing:
            gen.searcher.close()

    def _attach(self, gen: _Generation) -> list[str]:
        if gen.notices is None:
            with self._attach_lock:
                if gen.notices is None:
                    encoders, notices = self._encoders()
                    if self._wrap is not None:
                        encoders = encoders.map(self._wrap)
                    gen.searcher.set_encoders(encoders)
                    gen.notices = list(notices)
        return gen.notices


def _close(gens: list[_Generation]) -> None:
    for gen in gens:
        gen.searcher.close()
