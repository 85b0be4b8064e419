"""Prebuilt indexes: `export_index` writes an index to one file, `import_index` adopts such a
file for a checkout of the same repository (the file format: `codesearch.indexing.export`).

An export is someone else's file, so an import takes from it only what the checkout confirms
(`codesearch.indexing.adopt`): files and chunks whose text is the working tree's, vectors of
the working tree's texts, and derived indexes built here from that store. Why the adoption
runs an index run before anything is in place: the export is unpacked into a temp folder
beside the index folder, checked, then brought up to date with the checkout by an ordinary
incremental run (files the check left out are chunked from the working tree; changed texts
are re-embedded), and only then renamed into place. A damaged or crafted file, another
model, another repository or a failed run therefore leaves the index that was there (or
none) as it was, never half of an import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from codesearch.api.models import EncoderPool, Models
from codesearch.api.refresh import Recorded, stale_files
from codesearch.api.run import run_index
from codesearch.errors import ExportError, ModelMismatchError, PathError
from codesearch.indexing.adopt import Adoption, adopt_into
from codesearch.indexing.export import (
    Manifest,
    carried,
    repository_of,
    unpack_export,
    write_export,
)
from codesearch.store import IndexLock, Store
from codesearch.types import DEFAULT, STORE_FILE, IndexSummary, JSONDict, ProgressEvent, default_index_dir

__all__ = ["ImportSummary", "export_index", "import_index"]


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What an import did: the export it adopted and the index run that followed."""

    file: str
    index_dir: str
    exported_commit: str | None  # the commit the export was made at, if in git
    commit: str | None  # the commit checked out here
    files: int  # files and chunks in the export
    chunks: int
    seconds: float  # the whole import: unpack, check, index run, rename
    run: IndexSummary

    def to_dict(self) -> JSONDict:
        return {**{k: v for k, v in asdict(self).items() if k != "run"}, "run": self.run.to_dict()}


def export_index(root: Path, index_dir: Path, dest: str | os.PathLike[str]) -> Manifest:
    """Write the index of ``root`` to the file ``dest``; see `codesearch.indexing.export`."""
    return write_export(index_dir, root, Path(dest))


def _same_model(asked: str, recorded: str) -> bool:
    if asked == recorded:
        return True
    a, r = Path(asked).expanduser(), Path(recorded).expanduser()
    return a.exists() and r.exists() and a.resolve() == r.resolve()


def _check_models(file: Path, asked: tuple[str | None, str | None]) -> Callable[[Manifest], None]:
    """The check of an export's models against the ones asked for (before unpacking)."""

    def check(manifest: Manifest) -> None:
        for role, arg, flag in (("dense", asked[0], "--model"), ("colbert", asked[1], "--multi-model")):
            rec = manifest.models.get(role)
            if arg == DEFAULT or (arg is None and rec is None):
                continue
            if arg is not None and rec is not None and _same_model(arg, rec["name"]):
                continue
            built = f"{role} model {rec['name']} ({rec['identity']})" if rec else f"no {role} model"
            raise ExportError(
                f"{file} was built with {built}, not {arg or 'none'} (leave {flag} out to use the export's, "
                f"or run 'codesearch index' to build the index with {arg or 'none'})"
            )

    return check


def import_index(
    file: str | os.PathLike[str],
    path: str | os.PathLike[str] = ".",
    *,
    index_dir: str | os.PathLike[str] | None = None,
    model: str | None = DEFAULT,
    multi_model: str | None = DEFAULT,
    device: str = "auto",
    force: bool = False,
    replace_flag: str = "--force",
    progress: Callable[[ProgressEvent], None] | None = None,
) -> ImportSummary:
    """Adopt the export ``file`` as the index of the checkout at ``path``.

    Parameters
    ----------
    file
        A file written by ``codesearch export`` (or `CodeSearch.export`).
    path
        The checkout: the same repository as the export's, at any commit.
    index_dir
        Where the index goes (default ``<path>/.codesearch``).
    model, multi_model
        `DEFAULT`: the export's models. A model named here must be the export's.
    force
        Replace an index that is already there (kept as it is if the import fails).
    replace_flag
        The option named in the error when an index is there and ``force`` is not given.

    Returns
    -------
    ImportSummary

    Raises
    ------
    ExportError
        Not an export, cut short or damaged, another model, schema or repository, or an
        index already in place without ``force``.

    Example
    -------
    >>> summary = import_index("index.codesearch.tar", "path/to/checkout")   # doctest: +SKIP
    >>> summary.run.files_indexed   # files that differ from the export's
    3
    """
    t0 = time.perf_counter()
    file = Path(file).expanduser()
    root = Path(path).expanduser()
    if not root.is_dir():
        raise PathError(f"path {str(path)!r} is not a folder (pass the checkout to import the index into)")
    root = root.resolve()
    target = Path(index_dir).expanduser().resolve() if index_dir is not None else default_index_dir(root)
    if (target / STORE_FILE).exists():
        if not force:
            raise _already_there(target, file, replace_flag)
        IndexLock.check_free(target)
    _remove_left_over(target)
    tmp = _beside(target, "import")
    try:
        tmp.mkdir(parents=True)
        # First, so a folder left by a kill -9 is ignored by git and by every walk.
        (tmp / ".gitignore").write_text("*\n")
        manifest, adoption = _adopt(file, tmp, root, (model, multi_model))
        rec = Recorded.read(tmp, 1_000_000)
        # Nothing differs from the export but the files' stats: a run that loads no model
        # records them (seconds of torch and weights saved; they load when code changed).
        same = not stale_files(root, tmp, rec).stale
        models = Models(model, multi_model, device=device, index_dir=tmp, pool=EncoderPool())
        try:
            run = run_index(root, tmp, models, (None, None) if same else models.asked, walk=rec.walk,
                            progress=progress, defer_vectors=same)
        except ModelMismatchError as exc:
            raise ExportError(f"{file} cannot be adopted with the models here: {exc}") from exc
        with Store(tmp / STORE_FILE) as store:
            # Vectors of texts the index does not hold (the export's of files changed here,
            # or of no text at all) go: only arrays of the working tree's texts stay.
            store.prune_vectors(keep_unreferenced=0)
        _swap(tmp, target, force=force, file=file, replace_flag=replace_flag)
    except OSError as exc:  # a full disk, a read-only checkout: one line, the old index kept
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"cannot import {file} into {target}: {exc.strerror or exc}; nothing was imported "
                          "and any index there is unchanged (free some space or check the folder's permissions)"
                          ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # (Files of the export not in this checkout never entered the new store: the run did not
    # remove them, the import did.)
    run = dataclasses.replace(run, index_dir=str(target), files_removed=run.files_removed + adoption.gone)
    return ImportSummary(
        file=str(file),
        index_dir=str(target),
        exported_commit=manifest.repository.commit,
        commit=repository_of(root).commit,
        files=manifest.files,
        chunks=manifest.chunks,
        seconds=time.perf_counter() - t0,
        run=run,
    )


def _adopt(file: Path, tmp: Path, root: Path, asked: tuple[str | None, str | None]) -> tuple[Manifest, Adoption]:
    """Unpack the export ``file`` into ``tmp``, the new index folder, take what the checkout
    at ``root`` confirms into a new store there, and build every derived index from it
    (`codesearch.indexing.adopt`); the export's own files go once read."""
    unpacked = tmp / "export"
    manifest = unpack_export(file, unpacked, check=_check_models(file, asked), keep=carried)
    adoption = adopt_into(unpacked, tmp, root, manifest, file)
    shutil.rmtree(unpacked)
    return manifest, adoption


def _beside(target: Path, what: str) -> Path:
    """A temp folder beside ``target`` (``.codesearch.import-PID``): same file system, so
    the rename into place is atomic."""
    return target.with_name(f".{target.name.lstrip('.')}.{what}-{os.getpid()}")


def _already_there(target: Path, file: Path, replace_flag: str) -> ExportError:
    return ExportError(
        f"an index already exists at {target} (pass {replace_flag} to replace it with {file}, or remove it first)"
    )


def _remove_left_over(target: Path) -> None:
    """Remove the temp folders of imports and replacements killed before they ended (their
    process is gone)."""
    for path in target.parent.glob(f".{target.name.lstrip('.')}.*-*"):
        kind, _, pid = path.name.rpartition("-")
        if not kind.endswith((".import", ".replaced")) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running (another import)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue


def _swap(new: Path, target: Path, *, force: bool, file: Path, replace_flag: str) -> None:
    """Put the folder ``new`` at ``target``; an index already there is removed only once the
    new one is in place (and put back if the rename fails)."""
    if (target / STORE_FILE).exists() and not force:  # made by an index run during the import
        raise _already_there(target, file, replace_flag)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new, target)
        return
    old = _beside(target, "replaced")
    shutil.rmtree(old, ignore_errors=True)
    with IndexLock(target):  # no index run starts on the old index while it is swapped out
        os.replace(target, old)
        try:
            os.replace(new, target)
        except OSError:
            with contextlib.suppress(OSError):
                os.replace(old, target)
            raise
    shutil.rmtree(old, ignore_errors=True)
