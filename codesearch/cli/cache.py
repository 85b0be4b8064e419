"""``codesearch cache status | prune``: the user's vector cache (`codesearch.store.cache`).

Every index of a user looks in this cache before it encodes and adds what it encodes, so a
second worktree, a branch or a fresh clone embeds only the text that is new. Nothing depends
on the cache: pruning or deleting it never breaks a search, it only makes the next index of
new copies slower.
"""

from __future__ import annotations

import datetime
from typing import Annotated

import typer

EPILOG = "Example: codesearch cache status; codesearch cache prune --max-size 1G"

cache_app = typer.Typer(
    rich_markup_mode=None,
    help="Show or shrink the vector cache that worktrees, branches and clones share.",
    epilog=EPILOG,
    no_args_is_help=True,
)


def _open():
    from codesearch.errors import CodeSearchError
    from codesearch.store.cache import UserCache, cache_folder, cache_limit

    cache = UserCache.open()
    if cache is None and cache_limit() <= 0:
        raise CodeSearchError("the vector cache is off (CODESEARCH_CACHE_SIZE=0; unset it to turn the cache on)")
    if cache is None:
        raise CodeSearchError(
            f"the vector cache at {cache_folder()} cannot be opened (set CODESEARCH_CACHE_DIR to a writable folder)"
        )
    return cache


@cache_app.command("status", epilog="Example: codesearch cache status --json")
def cache_status(
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Where the cache is, its size and cap, the vectors it holds per model, and the files whose chunks it holds."""
    from codesearch.cli import render

    with _open() as cache:
        info = cache.status()
    if json_out:
        render.write_json(info.to_dict())
        return
    rows = [
        ("path", info.path),
        ("size on disk", f"{render._bytes(info.disk_bytes)} of {render._bytes(info.limit_bytes)} (the cap)"),
        ("vectors", f"{render._bytes(info.live_bytes)}"),
    ]
    for model, kinds in sorted(info.entries.items()):
        rows.append((model, ", ".join(f"{kind}: {n:,}" for kind, n in sorted(kinds.items()))))
    if info.chunked_files:
        rows.append(("chunked files", f"{info.chunked_files:,}"))
    if info.oldest_use is not None:
        rows.append(("last used", f"{_day(info.oldest_use)} .. {_day(info.newest_use)}"))
    render._key_values(rows)


@cache_app.command("prune", epilog="Example: codesearch cache prune --max-size 1G")
def cache_prune(
    max_size: Annotated[
        str | None,
        typer.Option("--max-size", metavar="SIZE", help="Evict least recently used vectors down to SIZE (500M, 2G)."),
    ] = None,
    everything: Annotated[bool, typer.Option("--all", help="Empty the cache.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Evict the least recently used vectors (down to the cap, or --max-size) and drop damaged ones."""
    from codesearch.cli import render
    from codesearch.store.cache import parse_size

    limit = None
    if max_size is not None:
        try:
            limit = parse_size(max_size)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--max-size") from None
    with _open() as cache:
        damaged = cache.repair()
        evicted, freed = cache.prune(limit, everything=everything)
        left = cache.disk_bytes()
    doc = {"evicted": evicted, "damaged": damaged, "freed_bytes": freed, "disk_bytes": left}
    if json_out:
        render.write_json(doc)
    else:
        render._key_values([
            ("evicted", f"{evicted:,} vectors"), ("damaged, dropped", f"{damaged:,}"),
            ("freed", render._bytes(freed)), ("size on disk", render._bytes(left)),
        ])


def _day(ts: int | None) -> str:
    return "-" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def register(app: typer.Typer, group: type) -> None:
    """Add the ``cache`` command group to ``app`` (``group`` turns errors into one line)."""
    cache_app.info.cls = group
    app.add_typer(cache_app, name="cache")
