"""`codesearch export FILE` and `codesearch import FILE` (and `index --from FILE`): an index
built once (in CI, say) carried to another checkout in one file. The work is in
`codesearch.api.export`; here the options and the rendering.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from codesearch.types import Device, model_option

EXPORT_EPILOG = "Example: codesearch export index.codesearch.tar -p ./repo"
IMPORT_EPILOG = "Example: codesearch import index.codesearch.tar ./checkout"


def export(
    file: Annotated[Path, typer.Argument(help="The file to write (a tar archive).")],
    path: Annotated[Path, typer.Option("--path", "-p", help="Repository folder.")] = Path("."),
    index_dir: Annotated[
        Path | None, typer.Option("--index-dir", help="Where the index lives (default: PATH/.codesearch).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the export's manifest as JSON.")] = False,
) -> None:
    """Write the index (store, vectors, multi-vector codes, checksums, model identities) to one file."""
    from codesearch.api import CodeSearch
    from codesearch.cli import render
    from codesearch.indexing.export import read_manifest

    with CodeSearch(path, index_dir=index_dir) as cs:
        cs.export(file)
    manifest = read_manifest(file)
    if json_out:
        import json

        render.write_json(json.loads(manifest.to_json()))
        return
    size = sum(s for s, _ in manifest.members.values())
    commit = manifest.repository.commit
    typer.echo(
        f"Exported {manifest.files:,} files, {manifest.chunks:,} chunks ({size / 1e6:.1f} MB"
        f"{', commit ' + commit[:12] if commit else ''}) to {file}"
    )


def import_(
    file: Annotated[Path, typer.Argument(help="A file written by 'codesearch export'.")],
    path: Annotated[Path, typer.Argument(help="The checkout to index (the same repository, any commit).")] = Path("."),
    index_dir: Annotated[
        Path | None, typer.Option("--index-dir", help="Where the index goes (default: PATH/.codesearch).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an index that is already there.")] = False,
    device: Annotated[Device, typer.Option(help="Where the encoder runs (for changed files).")] = Device.auto,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no summary.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Adopt an exported index for this checkout: files the checkout confirms are taken as
    they are, the others re-chunked and re-embedded; derived indexes are built here."""
    adopt(file, path, index_dir=index_dir, force=force, replace_flag="--force", device=device.value,
          quiet=quiet, json_out=json_out)


def adopt(file: Path, path: Path, *, replace_flag: str, quiet: bool = False, json_out: bool = False,
          **options: Any) -> None:
    """`import_index` with a progress bar, then its summary (shared by `import` and `index --from`)."""
    from codesearch.api import import_index
    from codesearch.cli import render

    with render.IndexProgress(enabled=not quiet and not json_out) as progress:
        summary = import_index(file, path, replace_flag=replace_flag, progress=progress, **options)
    if json_out:
        render.write_json(summary.to_dict())
        return
    render.notices(summary.run.notices)
    if quiet:
        return
    run = summary.run
    at = ""
    if summary.exported_commit:
        here = f", here {summary.commit[:12]}" if summary.commit and summary.commit != summary.exported_commit else ""
        at = f" (exported at {summary.exported_commit[:12]}{here})"
    typer.echo(
        f"Imported {summary.files:,} files, {summary.chunks:,} chunks from {file}{at} into {summary.index_dir}; "
        f"{run.files_indexed:,} changed or new files re-indexed, {run.files_removed:,} removed, "
        f"{run.chunks_encoded:,} texts encoded, in {summary.seconds:.2f} s"
    )


def index_from(file: Path, path: Path, *, rebuild: bool, model: str | None, multi_model: str | None,
               quiet: bool, **options: Any) -> None:
    """`codesearch index PATH --from FILE`: the import, where ``--rebuild`` replaces an index."""
    adopt(file, path, force=rebuild, replace_flag="--rebuild", quiet=quiet,
          model=model_option(model), multi_model=model_option(multi_model), **options)


def register(app: typer.Typer) -> None:
    """Add the ``export`` and ``import`` commands to ``app``."""
    app.command("export", epilog=EXPORT_EPILOG)(export)
    app.command("import", epilog=IMPORT_EPILOG)(import_)
