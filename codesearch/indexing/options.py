"""An index run's options and the state its stages hand on: what a run was asked to do
(`RunOptions`, fixed), and what each stage found for the next (`Run`: the walk's `Changes`,
the chunking `ChunkPlan`, the counters the summary reports).

The stages, in order: walk; read, chunk and write a batch of changed files at a time
(`codesearch.indexing.run`, into the one transaction of `codesearch.indexing.commit`); sync
the derived indexes; encode and publish (`codesearch.indexing.encode`,
`codesearch.indexing.publish`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from codesearch import _stagehook
from codesearch.encoder.base import Encoders, TokenCounter
from codesearch.store import FileRecord, ModelRecord, Store
from codesearch.types import Chunk, ProgressEvent

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.indexing.walk import SourceFile, WalkStamp

__all__ = ["Changes", "ChunkPlan", "Progress", "Run", "RunOptions", "Work"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What one run was asked to do (see `codesearch.indexing.run.build_index`)."""

    root: Path
    idir: Path
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_file_bytes: int = 1_000_000
    chunk_tokens: int | None = None  # None: from the encoders (`chunk_budget`)
    rebuild: bool = False
    defer_vectors: bool = False  # a run without models leaves the recorded ones' vectors for later


@dataclass
class Work:
    """A file that is (re-)chunked this run."""

    path: str
    language: str
    size: int
    mtime_ns: int
    hash: str
    text: str
    chunks: list[Chunk] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    old_id: int | None = None


@dataclass
class Changes:
    """What the walk found (files whose stat changed, files gone), and what reading them
    found: files (re-)chunked, files only touched."""

    skipped: dict[str, int] = field(default_factory=dict)  # reason -> files
    all_old: dict[str, FileRecord] = field(default_factory=dict)  # the store's files before the run
    seen: set[str] = field(default_factory=set)
    # Files to read: new, or whose size or mtime differ from the store's (or all, to re-chunk).
    changed: list[tuple[SourceFile, FileRecord | None]] = field(default_factory=list)
    removed: list[FileRecord] = field(default_factory=list)
    indexed: int = 0  # files (re-)chunked and written
    renamed: int = 0  # of those, new paths whose content was a removed file's
    unchanged: int = 0
    files_read: int = 0
    # What the walk's verdicts rested on, recorded with the files for a no-op check that
    # needs no walk (`walk.unchanged_since`); None: not recordable (listed without git, or a
    # file the walk kept could not be read).
    stamp: WalkStamp | None = None
    walk_started: float = 0.0  # time.time() as the walk began (what git's stat cache vouches for: `gitstat`)


@dataclass
class ChunkPlan:
    """How chunks are sized this run, and whether every file is chunked again."""

    budget: int = 0  # tokens per chunk
    counter: TokenCounter | None = None  # None: the byte estimate
    counter_id: str = "approx"  # the counter's identity, recorded with the chunks
    rechunk_all: bool = False


class Progress:
    """Reports `ProgressEvent` s to an optional callback."""

    def __init__(self, callback: Callable[[ProgressEvent], None] | None):
        self.callback = callback

    def __call__(self, stage: str, done: int, total: int, *, files: int = 0, chunks: int = 0, tokens: int = 0,
                 tokens_per_s: float = 0.0, message: str = "") -> None:
        event = ProgressEvent(stage, done, total, files, chunks, tokens, tokens_per_s, message)
        if _stagehook.VARIABLE in os.environ:  # tests hold a run at an event here (codesearch._stagehook)
            _stagehook.reached(event)
        if self.callback is not None:
            self.callback(event)


@dataclass
class Run:
    """One index run: its options and encoders, and what its stages found (filled in stage
    order)."""

    opts: RunOptions
    store: Store
    encoders: Encoders
    report: Progress
    t0: float
    notices: list[str] = field(default_factory=list)
    prev_gen: int = 0
    recorded: dict[str, ModelRecord] = field(default_factory=dict)
    changes: Changes = field(default_factory=Changes)
    plan: ChunkPlan = field(default_factory=ChunkPlan)
    chunks_made: int = 0
    texts_encoded: int = 0
    tokens_encoded: int = 0
    texts_reused: int = 0  # vectors copied from the user's vector cache instead of encoded
    codes_reused: int = 0  # texts whose PLAID codes came from the user's vector cache
    files_chunks_reused: int = 0  # files whose chunks came from the user's cache
