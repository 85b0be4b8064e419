"""One file that carries an index to another checkout: `write_export` and `unpack_export`.

The file is a plain tar (standard library, no pickle, readable with ``tar -tf``):

``manifest.json``    what the export is: format, schema version, models, repository, and
                     every member's size and SHA-256
``manifest.sha256``  the SHA-256 of ``manifest.json``'s bytes
then every file of the index folder as it is: ``store.sqlite`` (a consistent snapshot taken
with SQLite's backup API), the vector segments, the derived indexes (lexical, FAISS, PLAID).

Why the manifest first: a file from another model, schema or repository is refused after
reading a few kilobytes, before anything is written. Why a checksum per member: a file
cut short or damaged in transit (an artifact upload, a copy) is refused whole; the
checksums detect damage, they do not prove who made the file.

Why the repository is known by its root commits (``git rev-list --max-parents=0 HEAD``):
every clone, worktree and branch of a repository shares them, whatever commit is checked
out, and two unrelated repositories never do. A shallow clone (CI checks out depth 1)
records its cut-off commit as a root, so when either side is shallow or has no git the
checkout is the same repository when it knows the exported commit, or, failing that, when
it holds at least half of the exported files' paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from codesearch.errors import ExportError, NotIndexedError
from codesearch.store import IndexLock, Store
from codesearch.store.schema import SCHEMA_VERSION
from codesearch.types import LOCK_FILE, STORE_FILE

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Manifest",
    "Repository",
    "check_repository",
    "read_manifest",
    "repository_of",
    "unpack_export",
    "write_export",
]

FORMAT = "codesearch-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.sha256"
#: Files of an index folder never exported: the lock, the live store (a snapshot goes
#: instead) and its journals.
_LEFT_OUT = {LOCK_FILE, STORE_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm", STORE_FILE + "-journal"}
_TEMP = re.compile(r"^\..*\.tmp-\d+$")  # `atomic_write`'s temp files
_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
_BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class Repository:
    """Who a checkout is: the root commits of its git history, the commit checked out, and
    whether the clone is shallow (its roots are then cut-off points, not the real roots)."""

    root_commits: tuple[str, ...] = ()
    commit: str | None = None
    shallow: bool = False

    def to_dict(self) -> dict:
        return {"root_commits": list(self.root_commits), "commit": self.commit, "shallow": self.shallow}


@dataclass(frozen=True, slots=True)
class Manifest:
    """What ``manifest.json`` says (`members`: name -> (size, sha256))."""

    schema_version: int
    codesearch_version: str
    created: str
    repository: Repository
    models: dict[str, dict]
    files: int
    chunks: int
    members: dict[str, tuple[int, str]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **{k: v for k, v in asdict(self).items() if k not in ("repository", "members")},
            "repository": self.repository.to_dict(),
            "members": [{"name": n, "size": s, "sha256": h} for n, (s, h) in self.members.items()],
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()


# -- the repository ----------------------------------------------------------------------


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def repository_of(root: Path) -> Repository:
    """The git identity of the checkout at ``root`` (empty outside git or before a commit)."""
    commit = _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    if not commit:
        return Repository()
    roots = _git(root, "rev-list", "--max-parents=0", "HEAD") or ""
    shallow = _git(root, "rev-parse", "--is-shallow-repository") == "true"
    return Repository(tuple(sorted(roots.split())), commit, shallow)


def check_repository(manifest: Manifest, exported_paths: list[str], root: Path, file: Path) -> None:
    """Raise :class:`ExportError` when the checkout at ``root`` is another repository than
    the one ``manifest`` was exported from (see the module's note for the rule)."""
    theirs, ours = manifest.repository, repository_of(root)
    if theirs.root_commits and ours.root_commits and not (theirs.shallow or ours.shallow):
        if set(theirs.root_commits) & set(ours.root_commits):
            return
        raise ExportError(
            f"{file} is an export of another repository (root commit {theirs.root_commits[0][:12]}, "
            f"here {ours.root_commits[0][:12]}) (import it into a checkout of that repository, or run "
            f"'codesearch index {root}' to index this one)"
        )
    if theirs.commit and ours.commit and _git(root, "cat-file", "-e", f"{theirs.commit}^{{commit}}") is not None:
        return
    present = sum(1 for p in exported_paths if os.path.lexists(root / p))
    if exported_paths and present * 2 >= len(exported_paths):
        return
    raise ExportError(
        f"{file} looks like an export of another repository: {present} of its {len(exported_paths)} files "
        f"exist in {root} (import it into a checkout of that repository, or run 'codesearch index {root}')"
    )


# -- export ------------------------------------------------------------------------------


def _members(index_dir: Path) -> list[str]:
    """The index folder's files to export, as posix paths relative to it (sorted)."""
    out = []
    for path in sorted(index_dir.rglob("*")):
        rel = path.relative_to(index_dir)
        if not path.is_file() or path.is_symlink() or _TEMP.match(path.name):
            continue
        if len(rel.parts) == 1 and rel.name in _LEFT_OUT:
            continue
        out.append(rel.as_posix())
    return out


def _sha256(fh: io.BufferedReader) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    while block := fh.read(_BLOCK):
        h.update(block)
        size += len(block)
    return size, h.hexdigest()


def _snapshot_store(index_dir: Path, dest: Path) -> None:
    """A consistent copy of the store (committed state, WAL included) at ``dest``."""
    src = sqlite3.connect((index_dir / STORE_FILE).resolve().as_uri() + "?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = DELETE")  # one file, no -wal beside it
        finally:
            dst.close()
    finally:
        src.close()


def write_export(index_dir: Path, root: Path, dest: Path) -> Manifest:
    """Write the index at ``index_dir`` (of the checkout ``root``) to the file ``dest``.

    Holds the index's write lock while it reads, so no index run changes a file under it;
    ``dest`` is written to a temp name and renamed, so it is whole or absent.

    Raises
    ------
    NotIndexedError, IndexLockedError, ExportError
    """
    if not (index_dir / STORE_FILE).is_file():
        raise NotIndexedError(f"{str(root)!r} is not indexed yet (run 'codesearch index {root}' first)")
    dest = Path(dest).expanduser().resolve()
    if dest.is_dir():
        raise ExportError(f"{str(dest)!r} is a folder (pass a file name, e.g. {dest / 'index.codesearch.tar'})")
    if not dest.parent.is_dir():
        raise ExportError(f"folder {str(dest.parent)!r} does not exist (create it, or write the export elsewhere)")
    if dest.is_relative_to(index_dir):
        raise ExportError(f"{str(dest)!r} is inside the index folder (write the export somewhere else)")
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    snap = dest.with_name(f".{dest.name}.store-{os.getpid()}")
    try:
        with IndexLock(index_dir):
            _snapshot_store(index_dir, snap)
            with Store(snap, readonly=True) as store:
                models = {role: {"name": m.name, "identity": m.identity, "dim": m.dim}
                          for role, m in store.models().items()}
                files, chunks = store.count("files"), store.count("chunks")
                schema_version = store.schema_version
            sources = {STORE_FILE: snap, **{name: index_dir / name for name in _members(index_dir)}}
            # Each member is opened once and both hashed and written from that open file:
            # a file replaced by rename meanwhile (a searcher's centrality cache needs no
            # lock) then leaves this export on the version it hashed.
            opened = contextlib.ExitStack()
            with opened:
                members = {name: opened.enter_context(open(path, "rb")) for name, path in sources.items()}
                manifest = _manifest(members, root, models, files, chunks, schema_version)
                _write_tar(tmp, manifest, members)
        os.replace(tmp, dest)
    except (OSError, sqlite3.Error) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ExportError(
            f"cannot write the export {str(dest)!r}: {why} (check the folder and free disk space)"
        ) from exc
    finally:
        for path in (tmp, snap):
            with contextlib.suppress(OSError):
                path.unlink()
    return manifest


def _manifest(members: dict[str, io.BufferedReader], root: Path, models: dict[str, dict], files: int, chunks: int,
              schema_version: int) -> Manifest:
    return Manifest(
        schema_version=schema_version,
        codesearch_version=_version(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        repository=repository_of(root),
        models=models,
        files=files,
        chunks=chunks,
        members={name: _sha256(fh) for name, fh in members.items()},
    )


def _write_tar(tmp: Path, manifest: Manifest, members: dict[str, io.BufferedReader]) -> None:
    """The manifest, its checksum, then each member from its open file, checked again as
    it is copied: a file changed in place since it was hashed (only an index run writes
    so, and the export holds its lock) is an error, never an archive that import refuses."""
    body = manifest.to_json()
    with open(tmp, "wb") as fh:
        with tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, MANIFEST, body)
            _add_bytes(tar, MANIFEST_SUM, hashlib.sha256(body).hexdigest().encode() + b"\n")
            for name, src in members.items():
                size, digest = manifest.members[name]
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = size, int(time.time()), 0o644
                src.seek(0)
                reader = _Hashing(src)
                tar.addfile(info, reader)
                if reader.hash.hexdigest() != digest or src.read(1):
                    raise ExportError(f"the index file {name!r} changed while it was exported; nothing was "
                                      "written (run 'codesearch export' again)")
        fh.flush()
        os.fsync(fh.fileno())


class _Hashing:
    """A reader that hashes what is read through it (all `tarfile.TarFile.addfile` calls)."""

    def __init__(self, src: io.BufferedReader):
        self._src, self.hash = src, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        block = self._src.read(n)
        self.hash.update(block)
        return block


def _version() -> str:
    # (Not `codesearch.__version__`: the package root reaches up to the API, a circle.)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codesearch")
    except PackageNotFoundError:
        return "unknown"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


# -- import ------------------------------------------------------------------------------


def _not_export(file: Path, why: str) -> ExportError:
    return ExportError(f"{file} is not a codesearch export ({why}; make one with 'codesearch export FILE')")


def _damaged(file: Path, why: str) -> ExportError:
    return ExportError(
        f"{file} is damaged: {why}; nothing was imported (copy or download the export again, "
        "or run 'codesearch index' to build the index here)"
    )


def _safe_name(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return bool(parts) and not name.startswith("/") and all(_SAFE.match(p) and p not in (".", "..") for p in parts)


def _parse_manifest(file: Path, body: bytes) -> Manifest:
    try:
        doc = json.loads(body)
        if doc.get("format") != FORMAT:
            raise _not_export(file, "its manifest names another format")
        if doc.get("format_version") != FORMAT_VERSION:
            raise ExportError(
                f"{file} is export format {doc.get('format_version')}; this codesearch reads format "
                f"{FORMAT_VERSION} (export it again with this version, or upgrade codesearch)"
            )
        members = {}
        for m in doc["members"]:
            if not _safe_name(m["name"]) or m["name"] in members:
                raise _damaged(file, f"the manifest names an unsafe or repeated member {m['name']!r}")
            members[m["name"]] = (int(m["size"]), str(m["sha256"]))
        repo = doc["repository"]
        return Manifest(
            schema_version=int(doc["schema_version"]),
            codesearch_version=str(doc["codesearch_version"]),
            created=str(doc["created"]),
            repository=Repository(tuple(repo["root_commits"]), repo["commit"], bool(repo["shallow"])),
            models={str(k): dict(v) for k, v in doc["models"].items()},
            files=int(doc["files"]),
            chunks=int(doc["chunks"]),
            members=members,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _damaged(file, f"its manifest cannot be read ({exc})") from exc


def _open(file: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(file, mode="r:")
    except FileNotFoundError:
        raise ExportError(
            f"export file {str(file)!r} does not exist (pass the path of a 'codesearch export' file)"
        ) from None
    except IsADirectoryError:
        raise ExportError(f"{str(file)!r} is a folder (pass the path of a 'codesearch export' file)") from None
    except (tarfile.TarError, EOFError) as exc:
        raise _not_export(file, f"not a tar file: {exc}") from None
    except OSError as exc:
        raise ExportError(
            f"cannot read {str(file)!r}: {exc.strerror or exc} (check the path and permissions)"
        ) from None


def _read_manifest(file: Path, tar: tarfile.TarFile) -> Manifest:
    def member_bytes(name: str, limit: int) -> bytes:
        m = tar.next()
        if m is None or m.name != name or not m.isreg() or m.size > limit:
            raise _not_export(file, f"its first members are not {MANIFEST} and {MANIFEST_SUM}")
        data = tar.extractfile(m).read()
        if len(data) != m.size:
            raise _damaged(file, f"{name} is cut short")
        return data

    try:
        body = member_bytes(MANIFEST, 64 << 20)
        digest = member_bytes(MANIFEST_SUM, 1024).decode(errors="replace").strip()
    except (tarfile.TarError, EOFError) as exc:
        raise _damaged(file, f"cannot read its manifest ({exc})") from exc
    if hashlib.sha256(body).hexdigest() != digest:
        raise _damaged(file, f"{MANIFEST} does not match its checksum")
    return _parse_manifest(file, body)


def read_manifest(file: str | os.PathLike[str]) -> Manifest:
    """The manifest of the export ``file`` (checked against its checksum); reads only the
    head of the file."""
    file = Path(file)
    with _open(file) as tar:
        return _read_manifest(file, tar)


def check_compatible(manifest: Manifest, file: Path) -> None:
    """Raise :class:`ExportError` for an export this codesearch's store cannot adopt."""
    if manifest.schema_version != SCHEMA_VERSION:
        newer = manifest.schema_version > SCHEMA_VERSION
        raise ExportError(
            f"{file} holds an index of schema version {manifest.schema_version}, this codesearch writes "
            f"{SCHEMA_VERSION} ({'upgrade codesearch' if newer else 'export it again with this version'}, "
            "or run 'codesearch index' to build the index here)"
        )


def unpack_export(file: str | os.PathLike[str], folder: Path, *, check=None) -> Manifest:
    """Verify the export ``file`` and write its members into the new folder ``folder``.

    ``check(manifest)`` runs after the manifest is read and before any member is written
    (models, repository). Every member's size and SHA-256 are checked as it is written and
    every member the manifest names must be there: on any failure ``folder`` is removed
    and :class:`ExportError` says why.
    """
    file = Path(file)
    folder.mkdir(parents=True)
    try:
        # First, so a folder left by a kill -9 is ignored by git and by every walk.
        (folder / ".gitignore").write_text("*\n")
        with _open(file) as tar:
            manifest = _read_manifest(file, tar)
            check_compatible(manifest, file)
            if check is not None:
                check(manifest)
            seen: set[str] = set()
            try:
                while (m := tar.next()) is not None:  # (iterating would start at the manifest again)
                    want = manifest.members.get(m.name)
                    # Plain files only: a GNU sparse member declares a size it does not carry
                    # (a 10 KB file could ask for 100 GB of zeros that match their checksum).
                    if want is None or m.name in seen or m.type not in _PLAIN or m.issparse():
                        raise _damaged(file, f"member {m.name!r} is not in its manifest")
                    if m.size != want[0]:
                        raise _damaged(file, f"member {m.name!r} has {m.size} bytes, the manifest says {want[0]}")
                    _write_member(file, tar, m, folder / m.name, want[1])
                    seen.add(m.name)
            except (tarfile.TarError, EOFError) as exc:
                raise _damaged(file, f"it ends early or is corrupt ({exc})") from exc
            missing = sorted(set(manifest.members) - seen)
            if missing:
                raise _damaged(file, f"it ends early: {len(missing)} member(s) missing, first {missing[0]!r}")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return manifest


_PLAIN = (tarfile.REGTYPE, tarfile.AREGTYPE)


def _write_member(file: Path, tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, sha256: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(m)
    h, size = hashlib.sha256(), 0
    with open(dest, "wb") as out:
        while block := src.read(_BLOCK):
            h.update(block)
            out.write(block)
            size += len(block)
        out.flush()
        os.fsync(out.fileno())
    if size != m.size:
        raise _damaged(file, f"member {m.name!r} is cut short")
    if h.hexdigest() != sha256:
        raise _damaged(file, f"member {m.name!r} does not match its checksum")
