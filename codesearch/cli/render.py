"""How CLI results look: rich tables and syntax highlighting on a terminal, plain text or
JSON otherwise. Results go to stdout; progress, summaries and notices go to stderr.

Consoles are created per call (not at import time) so that CliRunner's captured streams and
a changed `sys.stdout` are honoured.

File names are printed as git prints them (`codesearch.pathnames.quote_name`): a name with
a newline, an ESC or a byte that is not UTF-8 is quoted and escaped, so one hit stays one
line and no name drives the terminal. JSON keeps each name (as valid Unicode).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from codesearch.pathnames import escape_controls, quote_name, valid_text


def stdout() -> Console:
    # soft_wrap: long paths and JSON are printed as they are, never folded at 80 columns.
    return Console(file=sys.stdout, soft_wrap=True, highlight=False)


def stderr() -> Console:
    return Console(file=sys.stderr, soft_wrap=True, highlight=False)


def write_json(doc: Any) -> None:
    sys.stdout.write(_dumps(doc, indent=2) + "\n")


# Characters json.dumps leaves raw (ensure_ascii=False) that line readers split at
# (str.splitlines, editors): escaped, a JSON line stays one line. They can only be inside
# strings, where the escape means the same character.
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def _dumps(doc: Any, indent: int | None = None) -> str:
    return json.dumps(_valid_unicode(doc), ensure_ascii=False, indent=indent).translate(_LINE_BREAKS)


def _valid_unicode(doc: Any) -> Any:
    """``doc`` with every string valid Unicode (a root or path whose name is not UTF-8 has
    its bytes written ``\\xNN``): JSON is UTF-8 text, which a surrogate escape is not."""
    if isinstance(doc, str):
        return valid_text(doc)
    if isinstance(doc, dict):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_valid_unicode(v) for v in doc]
    return doc


def notices(lines: list[str]) -> None:
    """Notices (index refreshed, lexical-only fallback, ...) as one stderr line each."""
    for line in lines:
        sys.stderr.write(f"Notice: {escape_controls(line)}\n")


# -- query -------------------------------------------------------------------------------


def search_result(result: Any, *, root: Path, as_json: bool, as_jsonl: bool, files_only: bool) -> None:
    """Print a `SearchResult` as JSON, JSON lines, file names, or hits with snippets."""
    from codesearch.types import SCHEMA_VERSION, hit_document, result_document

    if as_json:
        write_json(result_document(result))
        return
    if not result.hits and not as_jsonl:
        # Said on stderr, so a pipe sees no output at all (like grep), a person sees why.
        sys.stderr.write("No results.\n")
        return
    if as_jsonl:
        for hit in result.hits:
            line = {"schema_version": SCHEMA_VERSION, **hit_document(hit)}
            sys.stdout.write(_dumps(line) + "\n")
        return
    if files_only:
        for hit in result.hits:
            sys.stdout.write(f"{quote_name(hit.path)}\n")
        return
    console = stdout()
    if not console.is_terminal:
        _plain_hits(result.hits)
        return
    for hit in result.hits:
        _rich_hit(console, hit, root)


def _location(hit: Any) -> str:
    return f"{quote_name(hit.path)}:{hit.start_line}-{hit.end_line}"


def _describe(hit: Any) -> str:
    bits = [f"{hit.score:.4f}"]
    if hit.symbol:
        bits.append(f"{hit.symbol} ({hit.kind})" if hit.kind else hit.symbol)
    elif hit.kind:
        bits.append(hit.kind)
    return escape_controls("  ".join(bits))  # a Markdown heading's symbol is the file's text


def _plain_hits(hits: list[Any]) -> None:
    # Pipes and files get grep-like text: a location line, then the snippet, then a blank.
    out = sys.stdout
    for hit in hits:
        out.write(f"{_location(hit)}  {_describe(hit)}\n")
        if not hit.text:  # --no-snippet: one line per hit, like grep -n without the text
            continue
        text = hit.text if hit.text.endswith("\n") else hit.text + "\n"
        out.write(text)
        if hit.more_lines:  # after the snippet, never inside it: the lines above are the file's
            out.write(f"{_more(hit)}\n")
        out.write("\n")


def _rich_hit(console: Console, hit: Any, root: Path) -> None:
    from rich.syntax import Syntax

    # `path:start-end` is a terminal hyperlink to the file (most terminals open it on click).
    location = escape(_location(hit))
    link = f"[link={(root / hit.path).resolve().as_uri()}]{location}[/link]"
    console.print(f"[bold cyan]{link}[/]  [green]{escape(_describe(hit))}[/]")
    if not hit.text:
        return
    lexer = hit.language if hit.language and hit.language != "text" else "text"
    # On a terminal, code is shown, not obeyed: an ESC sequence, a lone CR or a
    # bidirectional override in a file is written as an escape (pipes get the bytes, as grep's).
    shown = escape_controls(hit.text.rstrip("\n").replace("\r\n", "\n"), keep="\n\t")
    console.print(
        Syntax(
            shown,
            lexer,
            line_numbers=True,
            start_line=hit.start_line,
            highlight_lines=set(getattr(hit, "match_lines", ())),  # the lines a --regex matches
            word_wrap=False,
            background_color="default",
        )
    )
    if hit.more_lines:  # a note under the code, not a numbered, highlighted line of it
        console.print(f"[dim]{_more(hit)}[/]")
    console.print()


def _more(hit: Any) -> str:
    """The marker of a snippet cut by --max-lines or --budget."""
    return f"... ({hit.more_lines} more lines)"


# -- index -------------------------------------------------------------------------------


class IndexProgress:
    """A rich progress bar on stderr fed with the pipeline's `ProgressEvent`s.

    One bar per stage (walk, chunk, write, sync, encode), and a line when the index becomes
    searchable (lexical, before the vectors): ``done/total`` in the stage's
    unit, then files and chunks so far, encoder tokens/s and the ETA. Silent when disabled
    (``--quiet``) or when stderr is not a terminal. Use as a context manager and pass the
    object itself as the ``progress`` callback.
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> IndexProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description:>6}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[files]:,} files  {task.fields[chunks]:,} chunks  {task.fields[rate]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=stderr(),
                transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def __call__(self, event: Any) -> None:
        if self._progress is None:
            return
        if event.stage == "published":
            return  # more vectors searchable: the encode bar already shows the progress
        if event.stage == "searchable":
            # The first phase is over: queries answer from here on, while vectors come.
            self._progress.console.print(f"[green]{escape(event.message)}[/]; queries answer now, embedding continues")
            return
        task = self._tasks.get(event.stage)
        if task is None:
            task = self._progress.add_task(event.stage, total=None, files=0, chunks=0, rate="")
            self._tasks[event.stage] = task
        self._progress.update(
            task,
            completed=event.done,
            total=event.total or None,
            files=event.files,
            chunks=event.chunks,
            # on Ray the message holds the cluster's and each worker's rate
            rate=event.message
            if event.message.startswith("ray ")
            else f"{event.tokens_per_s:,.0f} tok/s"
            if event.tokens_per_s
            else "",
        )


_SUMMARY_ROWS = [
    ("files_indexed", "files indexed"),
    ("files_unchanged", "files unchanged"),
    ("files_removed", "files removed"),
    ("files_renamed", "files renamed"),
    ("skipped", "skipped"),
    ("chunks_total", "chunks"),
    ("chunks_encoded", "texts encoded"),
    ("tokens_encoded", "tokens encoded"),
    ("seconds", "time (s)"),
    ("stage_seconds", "time by stage (s)"),
    ("models", "models"),
]


def index_summary(summary: Any) -> None:
    """The summary of an index run, on stderr (stdout stays free for results): a table on a
    terminal, else one ``label: value`` line per row (no box characters, no value folded
    across lines), as a log or ``grep`` reads it."""
    d = summary.to_dict()
    root = quote_name(str(d.get("root", "")))
    rows = []
    for key, label in _SUMMARY_ROWS:
        if key in d:
            rows.append((label, d[key] if key != "models" else (d[key] or "none (lexical only)")))
        if key == "chunks_encoded" and d.get("texts_reused"):
            # Another worktree, branch or clone embedded these: "12,340 of 12,402 texts".
            reused = d["texts_reused"]
            rows.append(("reused from the cache", f"{reused:,} of {reused + d.get('chunks_encoded', 0):,} texts"))
    console = stderr()
    if console.is_terminal:
        table = Table(title=escape(f"codesearch index {root}"), show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column(overflow="fold")  # long model paths wrap, never get cut
        for label, value in rows:
            table.add_row(label, _cell(value))
        console.print(table)
    else:
        sys.stderr.write(f"codesearch index {root}\n")
        for label, value in rows:
            sys.stderr.write(f"{label}: {_cell(value, markup=False)}\n")
    notices(list(d.get("notices", [])))


def _cell(value: Any, *, markup: bool = True) -> str:
    """One value as text; ``markup``: escaped for rich (a table), else as it reads."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_cell(v, markup=markup)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    text = escape_controls("-" if value is None else str(value))
    return escape(text) if markup else text


# -- status ------------------------------------------------------------------------------


def index_status(info: Any, *, as_json: bool) -> None:
    """`codesearch status`: a two-column table, or the JSON document."""
    doc = info.to_dict()
    if as_json:
        write_json(doc)
        return
    if not info.indexed:
        root = quote_name(info.root)
        sys.stdout.write(f"{root}: not indexed (run 'codesearch index {root}')\n")
        return
    rows = [
        ("root", quote_name(info.root)),
        ("index", quote_name(info.index_dir)),
        ("files", _cell(info.files)),
        ("chunks", _cell(info.chunks)),
        ("languages", _cell(info.languages)),
        ("dense model", info.models.get("dense") or "none"),
        ("multi-vector model", info.models.get("multi") or "none"),
        ("vectors", _vectors_cell(info.vectors)),
        ("embedded", _cell(info.embedded)),
        ("stale", _cell(info.stale) if info.is_stale else "up to date"),
        ("health", _health_cell(info.health)),
        ("size on disk", ", ".join(f"{k}: {_bytes(v)}" for k, v in info.disk_bytes.items())),
    ]
    _key_values(rows)


def _health_cell(health: dict) -> str:
    """``complete``, or the state, what is wrong and the next action."""
    if not health or health.get("state") == "complete":
        return health.get("state", "-") if health else "-"
    parts = [health["state"], *health.get("problems", [])]
    return f"{'; '.join(parts)} (next: {health['next_action']})"


def _vectors_cell(vectors: dict[str, float]) -> str:
    """``colbert: 100%``; a share below 100% (a run stopped, or one still going) says how to
    finish it."""
    if not vectors:
        return "none (lexical only)"
    cell = ", ".join(f"{k}: {v:.0%}" if v >= 1 or v < 0.995 else f"{k}: 99%" for k, v in vectors.items())
    return cell if all(v >= 1 for v in vectors.values()) else f"{cell} (run 'codesearch index' to finish)"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _key_values(rows: list[tuple[str, str]]) -> None:
    console = stdout()
    if console.is_terminal:
        table = Table(show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for key, value in rows:
            table.add_row(key, escape(str(value)))
        console.print(table)
    else:
        for key, value in rows:
            sys.stdout.write(f"{key}: {value}\n")


# -- models ------------------------------------------------------------------------------


def model_list(rows: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        write_json({"schema_version": 1, "models": rows})
        return
    console = stdout()
    columns = ["name", "role", "cached", "size_bytes", "path"]
    if console.is_terminal:
        table = Table()
        for column in columns:
            # Ids and paths are what a user copies: never cut with an ellipsis (rich's
            # default). Ids keep one line, the other columns wrap to make room.
            table.add_column(column, overflow="fold", no_wrap=column == "name")
        for row in rows:
            table.add_row(*(escape(_model_cell(row, c)) for c in columns))
        console.print(table)
    else:
        # Tab-separated with a header line, as `cut`, `sort -t` and spreadsheets read it.
        sys.stdout.write("\t".join(columns) + "\n")
        for row in rows:
            sys.stdout.write("\t".join(_model_cell(row, c) for c in columns) + "\n")


def _model_cell(row: dict[str, Any], column: str) -> str:
    value = row.get(column, "")
    if column == "size_bytes" and isinstance(value, int) and row.get("cached"):
        return _bytes(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None or column == "size_bytes" else str(value)


def model_info(info: Any, *, as_json: bool) -> None:
    doc = info.to_dict()
    if as_json:
        write_json({"schema_version": 1, **doc})
        return
    _key_values([(k.replace("_", " "), str(v)) for k, v in doc.items()])
