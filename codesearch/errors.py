"""One exception hierarchy for every failure a user can cause or meet.

Each message names the offending value and the way out, on one line, so the CLI can print
``Error: <message>`` and exit 1 without a traceback.
"""

from __future__ import annotations

#: The name to install codesearch by (``pip install codesearch-local``): the import package
#: and the command stay ``codesearch``, but PyPI's ``codesearch`` is another project (a
#: Tantivy-based search), which an install line naming it would install instead.
DISTRIBUTION = "codesearch-local"


def install_line(extra: str | None = None) -> str:
    """The ``pip install`` command of this package, with an extra (``server``, ``ray``, ...):
    what an error about a missing optional dependency tells the user to run."""
    return f'pip install "{DISTRIBUTION}[{extra}]"' if extra else f"pip install {DISTRIBUTION}"


class CodeSearchError(Exception):
    """Base class of every error codesearch raises on purpose (user-facing, one line)."""


class PathError(CodeSearchError):
    """A path that does not exist, is not a directory, or lies outside a served root."""


class NotIndexedError(CodeSearchError):
    """A folder that has no index yet."""


class IndexCorruptError(CodeSearchError):
    """An index file or the store cannot be read; ``--rebuild`` recreates it."""


class IndexLockedError(CodeSearchError):
    """Another indexer holds the write lock."""


class ModelMismatchError(CodeSearchError):
    """The index was built with another model than the one requested."""


class ModelError(CodeSearchError):
    """A model that cannot be resolved, loaded, or whose checkpoint is malformed."""


class ModelUnavailableError(ModelError):
    """A hub model that is not cached while the hub cannot be reached."""


class CheckpointError(ModelError):
    """A checkpoint with a missing tensor, a tensor of the wrong shape, or a bad config."""


class BackendError(CodeSearchError):
    """An attention backend or device that was asked for explicitly and cannot run here."""


class MissingDependencyError(CodeSearchError):
    """An optional dependency is not installed; the message names the extra to install."""


class QueryError(CodeSearchError):
    """An empty or otherwise invalid query or filter."""


class NothingToIndexError(CodeSearchError):
    """A folder with no indexable file in it."""


class ServerError(CodeSearchError):
    """A server option that cannot be honoured (a non-loopback bind without a token, a busy
    port), or a request the server refuses to queue or could not answer in time."""


class IndexWriteError(CodeSearchError):
    """The index folder cannot be created or written: a file in the way, no permission, a
    full disk."""


class ClusterError(CodeSearchError):
    """The Ray cluster of an ``index --ray`` run cannot be reached, was lost, or has no
    worker left; the vectors committed before are kept and the next run resumes."""


class ExportError(CodeSearchError):
    """An export file that cannot be written, or cannot be adopted here: not an export, cut
    short or damaged, of another model, schema or repository, or an index already in place."""
