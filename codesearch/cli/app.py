"""The `codesearch` Typer app: each command parses options, makes one call into
`codesearch.api`, and hands the result to `codesearch.cli.render`.

Nothing heavy is imported at module level: `codesearch --help` must start in a blink and a
lexical query must never import torch, so `codesearch.api` is imported inside the commands.
Results go to stdout; progress, notices and errors go to stderr.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from codesearch.errors import CodeSearchError
from codesearch.pathnames import escape_controls
from codesearch.types import Device, Mode, model_option


class _Group(TyperGroup):
    """The one place where a `CodeSearchError` becomes `Error: ...` and exit status 1.

    Sub-groups (`models`) run inside their parent's `invoke`, so catching here covers every
    command, under `CliRunner` as well as from the console script. Anything else is a bug
    and keeps its traceback.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            for param in command.params:
                _readable_list_type(param)

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except CodeSearchError as exc:
            # One line, whatever file name the message carries (a newline, an ESC).
            typer.echo(f"Error: {escape_controls(str(exc))}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            # Index writes are atomic: Ctrl-C leaves the previous index or a resumable one.
            # One line, 130 (SIGINT) or 143 (SIGTERM): codesearch.cli.interrupts.
            from codesearch.cli import interrupts

            raise typer.Exit(interrupts.say_and_exit()) from None


def _readable_list_type(param: Any) -> None:
    """Help names a repeatable value by one value's type (``<path>``, with ``PATH...`` or a
    repeated option beside it): Typer's own ``<list[Path]>`` reads as Python, not as a
    command line. A Typer without ``type_descriptor`` keeps its own text."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or not getattr(descriptor, "is_list", False):
        return
    typer_text = type(param).display_type

    def display_type(ctx: Any) -> str:
        text = typer_text(param, ctx)
        match = re.fullmatch(r"<list\[(.*)\]>", text)
        return f"<{match.group(1).lower()}>" if match else text

    param.display_type = display_type


app = typer.Typer(
    cls=_Group,
    name="codesearch",
    help="Semantic code search and RAG retrieval over whole repositories.",
    epilog="Example: codesearch index . && codesearch query 'where do we retry failed requests'",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Plain help, as click writes it: rich's option tables cut words at 80 columns
    # (`CODESEARCH_TOKE…`, `--no-index-on-…`) and show a `<bool>` type on flags.
    rich_markup_mode=None,
)
models_app = typer.Typer(
    cls=_Group,
    rich_markup_mode=None,
    help="List, download and inspect encoder models.",
    epilog="Example: codesearch models info lightonai/LateOn-Code-edge",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")


def _print_version(value: bool) -> None:
    if value:
        from codesearch import __version__

        typer.echo(f"codesearch {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


# Decimal units, so the default "1MB" is the API's max_file_bytes=1_000_000; KiB/MiB binary.
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _parse_size(value: str) -> int:
    """'1000000', '500k', '2MB', '1MiB' -> bytes; anything else is a usage error (exit 2)."""
    text = value.strip().lower()
    number = text.rstrip("kmgib")
    unit = text[len(number) :]
    try:
        size = int(float(number) * _SIZE_UNITS[unit])
    except (ValueError, KeyError):
        raise typer.BadParameter(f"{value!r} is not a size; use bytes or a suffix: 500k, 2MB") from None
    if size <= 0:
        raise typer.BadParameter(f"{value!r} must be positive")
    return size


#: The daemon itself is used before this app runs (`codesearch.cli.lean`); the option is
#: declared here so that help shows it and the app accepts it.
NO_DAEMON_HELP = "Work in this process; neither use nor start the per-user daemon (also: CODESEARCH_NO_DAEMON=1)."

PathArg = Annotated[Path, typer.Argument(help="Repository folder.", show_default=True)]
IndexDirOpt = Annotated[
    Path | None,
    typer.Option("--index-dir", help="Where the index lives (default: PATH/.codesearch)."),
]


@app.command(epilog="Example: codesearch index ./repo --model none --exclude 'tests/**'")
def index(
    path: PathArg = Path("."),
    model: Annotated[
        str | None,
        typer.Option(
            help="Dense model: hub id or local folder; 'none' disables.",
            show_default="the index's model, else gte-modernbert-base on a GPU, none on a CPU",
        ),
    ] = None,
    multi_model: Annotated[
        str | None,
        typer.Option(
            "--multi-model",
            help="ColBERT model: hub id or local folder; 'none' disables.",
            show_default="the index's model, else LateOn-Code-edge",
        ),
    ] = None,
    device: Annotated[Device, typer.Option(help="Where the encoder runs.")] = Device.auto,
    index_dir: IndexDirOpt = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Drop the index and build it again.")] = False,
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Only index files matching GLOB (repeatable).", metavar="GLOB")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Skip files matching GLOB (repeatable).", metavar="GLOB")
    ] = None,
    max_file_size: Annotated[
        str, typer.Option("--max-file-size", help="Skip files larger than this (bytes, or 500k, 2MB, 1MiB).")
    ] = "1MB",
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar, no summary (notices still show).")
    ] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Embed on a Ray cluster: RAY_ADDRESS, else one ray-started on this machine, else a new local one "
            "(needs codesearch-local[ray]).",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", metavar="ADDRESS", help="Embed on the Ray cluster at ADDRESS (implies --ray)."),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--from", metavar="FILE", help="Start from an index written by 'codesearch export' "
                     "(as 'codesearch import'; --rebuild replaces an index already there)."),
    ] = None,
    no_daemon: Annotated[bool, typer.Option("--no-daemon", help=NO_DAEMON_HELP)] = False,
) -> None:
    """Index a repository (incremental: unchanged files cost a stat)."""
    size = _parse_size(max_file_size)
    if from_file is not None:
        from codesearch.cli.export import index_from

        return index_from(from_file, path, rebuild=rebuild, model=model, multi_model=multi_model, quiet=quiet,
                          index_dir=index_dir, device=device.value)
    from codesearch.api import CodeSearch
    from codesearch.cli import interrupts, render

    with CodeSearch(
        path,
        index_dir=index_dir,
        model=model_option(model),
        multi_model=model_option(multi_model),
        device=device.value,
        include=tuple(include or ()),
        exclude=tuple(exclude or ()),
        max_file_bytes=size,
        ray=ray_address or ("auto" if ray else None),
    ) as cs:
        with render.IndexProgress(enabled=not quiet) as progress:
            # Ctrl-C's line says what the run kept (codesearch.cli.interrupts)
            summary = cs.index(rebuild=rebuild, progress=interrupts.noting(progress))
    if quiet:
        render.notices(summary.notices)
    else:
        render.index_summary(summary)


@app.command(
    "query",
    epilog="Example: codesearch query 'parse the config file' -p ./repo -k 5 --glob '!tests/**' --budget 2000 --json",
)
def query_command(
    query: Annotated[str, typer.Argument(help="What to look for, in words or code.")],
    path: Annotated[
        Path | None,
        typer.Option(
            "--path",
            "-p",
            help="Repository (default: nearest indexed parent of the current folder, else its git root). "
            "Indexed first if it has no index.",
        ),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="How many results.")] = 10,
    mode: Annotated[Mode, typer.Option(help="Which indexes rank the results.")] = Mode.hybrid,
    lang: Annotated[
        list[str] | None,
        typer.Option("--lang", help="Only this language (python, go, ...); repeat for any of several.", metavar="LANG"),
    ] = None,
    glob: Annotated[
        list[str] | None,
        typer.Option(
            "--glob",
            "-g",
            help="Only paths matching GLOB, as ripgrep's: '*.{rs,md}', '!tests/**' excludes; repeatable, "
            "last match wins.",
            metavar="GLOB",
        ),
    ] = None,
    regex: Annotated[
        str | None,
        typer.Option(
            "--regex",
            help="Only chunks whose text matches PATTERN (RE2: linear time; ^ $ per line, (?i) any case), "
            "ranked as usual.",
            metavar="PATTERN",
        ),
    ] = None,
    context: Annotated[int, typer.Option("--context", "-C", min=0, help="Extra lines around each snippet.")] = 0,
    max_lines: Annotated[
        int | None, typer.Option("--max-lines", min=1, help="Cut each snippet to N lines.", metavar="N")
    ] = None,
    no_snippet: Annotated[bool, typer.Option("--no-snippet", help="Locations and scores only, no code.")] = False,
    min_score: Annotated[
        float | None, typer.Option("--min-score", help="Leave out results scoring below X.", metavar="X")
    ] = None,
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget",
            min=1,
            help="Fit all snippets in about TOKENS tokens, best first (the JSON's left_out counts the rest).",
            metavar="TOKENS",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    jsonl_out: Annotated[bool, typer.Option("--jsonl", help="One JSON hit per line on stdout.")] = False,
    files_only: Annotated[
        bool, typer.Option("--files-only", "-l", help="Only the matching files, best first.")
    ] = False,
    no_refresh: Annotated[bool, typer.Option("--no-refresh", help="Do not update a stale index first.")] = False,
    no_server: Annotated[
        bool,
        typer.Option(
            "--no-server", help="Search in this process even when 'codesearch serve' runs for the repository."
        ),
    ] = False,
    index_dir: IndexDirOpt = None,
    no_daemon: Annotated[bool, typer.Option("--no-daemon", help=NO_DAEMON_HELP)] = False,
) -> None:
    """Search a repository (indexing it first, lexical only, if it has no index yet)."""
    if json_out and jsonl_out:
        raise typer.BadParameter("use --json or --jsonl, not both", param_hint="--json/--jsonl")
    from codesearch.api import CodeSearch
    from codesearch.cli import render
    from codesearch.server.client import request_body, try_server_result
    from codesearch.types import SearchRequest

    request = SearchRequest(
        query,
        top_k,
        mode,
        tuple(lang or ()),
        tuple(glob or ()),
        files_only,
        context=context,
        max_lines=max_lines,
        no_snippet=no_snippet,
        min_score=min_score,
        budget=budget,
        regex=regex,
    )
    root = path if path is not None or index_dir is not None else _query_root(Path.cwd())
    with CodeSearch(root or Path("."), index_dir=index_dir) as cs:
        if not cs.indexed:
            # As ck, ColGREP and semble do: build it rather than refuse. Lexical only, so
            # the answer comes in seconds; an index run with a model adds the vectors.
            render.notices(
                [
                    f"no index yet: indexing {cs.root} first (lexical only; to add semantic vectors: online, "
                    f"'codesearch index {cs.root}'; offline, 'codesearch index {cs.root} --model PATH', PATH a "
                    "local model folder)"
                ]
            )
            render.notices(cs.index(lexical_only=True).notices)
        result = None if no_server else try_server_result(cs.root, request_body(request), index_dir=cs.index_dir)
        if result is None:
            result = cs.query(request, refresh=not no_refresh)
    render.notices(result.notices)
    render.search_result(result, root=cs.root, as_json=json_out, as_jsonl=jsonl_out, files_only=files_only)


def _query_root(cwd: Path) -> Path:
    """The nearest indexed folder at or above ``cwd``, else the nearest git work tree root
    (indexed by the query); else the `NotIndexedError` (a query never indexes a folder
    that is neither, such as a home directory)."""
    from codesearch.api import find_index_root
    from codesearch.errors import NotIndexedError

    try:
        return find_index_root(cwd)
    except NotIndexedError:
        here = cwd.resolve()
        for folder in (here, *here.parents):
            if (folder / ".git").exists():
                return folder
        raise


@app.command(epilog="Example: codesearch status ./repo --json")
def status(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="Repository folder (default: nearest indexed parent of the current folder, else the current folder).",
            show_default=False,
        ),
    ] = None,
    index_dir: IndexDirOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Show what is indexed, with which models, how stale it is and its size on disk."""
    from codesearch.api import CodeSearch, find_index_root
    from codesearch.cli import render
    from codesearch.errors import NotIndexedError

    if path is None and index_dir is None:
        try:
            path = find_index_root(Path.cwd())
        except NotIndexedError:
            path = Path(".")  # reported as "not indexed" below, not as an error
    with CodeSearch(path or Path("."), index_dir=index_dir) as cs:
        info = cs.status()
    render.index_status(info, as_json=json_out)


@models_app.command("list", epilog="Example: codesearch models list --json")
def models_list(
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """List the models in the local cache (and the defaults)."""
    from codesearch import api
    from codesearch.cli import render

    render.model_list(api.list_models(), as_json=json_out)


@models_app.command("pull", epilog="Example: codesearch models pull lightonai/LateOn-Code-edge")
def models_pull(
    name: Annotated[str, typer.Argument(help="Hugging Face hub id.")],
) -> None:
    """Download a model into the local cache (needs the network once)."""
    from codesearch import api

    path = api.pull_model(name)
    typer.echo(str(path))


@models_app.command("info", epilog="Example: codesearch models info ./my-checkpoint --json")
def models_info(
    name: Annotated[str, typer.Argument(help="Hub id or local checkpoint folder.")],
    device: Annotated[Device, typer.Option(help="Where to load it.")] = Device.cpu,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Load a model and show its details: dims, multivector, max length, identity."""
    from codesearch import api
    from codesearch.cli import render

    render.model_info(api.model_info(name, device=device.value), as_json=json_out)


# `codesearch serve` lives with the server (codesearch/server/command.py, which imports
# only typer at module level, so --help stays fast); it adds itself to this app.
from codesearch.server.command import register as _register_serve  # noqa: E402

_register_serve(app)
from codesearch.cli.agents import register as _register_agents  # noqa: E402

_register_agents(app)
from codesearch.cli.export import register as _register_export  # noqa: E402

_register_export(app)
from codesearch.cli.cache import register as _register_cache  # noqa: E402

_register_cache(app, _Group)
from codesearch.cli.daemon import register as _register_daemon  # noqa: E402

_register_daemon(app)


def run() -> None:
    """Run the app as the console script does (exit status: 0 ok, 1 user error, 2 usage)."""
    app(prog_name="codesearch")
