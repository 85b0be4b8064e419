"""The commands the CLI answers before importing typer, rich, numpy or torch.

``codesearch --help`` costs about 0.4 s in imports; a query to the warm daemon costs a few
milliseconds. So `run` looks at the arguments first and answers, with the standard library,
what it fully understands:

- ``query`` (every option): sent to the per-user daemon (started when the query needs a
  model and none runs), printed as the Typer path prints it (rich only on a terminal); a
  lexical query with no daemon running is searched here (no model: `CodeSearch` without
  typer, rich or torch);
- ``index`` when nothing changed: a stat-only check against the store (no model, no torch);
  with work to do and a daemon running, the daemon's run (it is the root's one writer);
- ``serve ... --mcp stdio``: the thin client of the daemon (`codesearch.server.mcp_proxy`).

Anything else, any doubt (an option spelled in a way this parser does not take, a folder
without an index, a daemon that cannot answer) returns None and the Typer app runs the
command as it always did, in this process. Options are parsed as click parses them: long
options with ``--name value`` or ``--name=value``, short ones with ``-k 5`` or ``-k5``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

_MODES = ("hybrid", "lexical", "dense", "colbert")
_DEVICES = ("auto", "cpu", "cuda")
SEARCH_TIMEOUT_S = 120.0  # the daemon's refresh (30 s at most) and search (10 s)


def run(argv: list[str]) -> int | None:
    """Answer ``argv`` (the arguments after ``codesearch``) here; None: leave it to Typer."""
    if not argv:
        return None
    try:
        handler = {"query": _query, "index": _index, "serve": _serve}.get(argv[0])
        return None if handler is None else handler(argv[1:])
    except KeyboardInterrupt:
        from codesearch.cli import interrupts

        return interrupts.say_and_exit()  # the one line, 130 (143 for SIGTERM)
    except ModuleNotFoundError as exc:
        if exc.name != "fcntl":
            raise  # a real bug, not a platform: said, not hidden behind the slow path
        return None  # a platform without fcntl (the daemon's locks): the app does it all here
    except BrokenPipeError:
        # `codesearch query ... | head -1`: the reader is gone; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# -- parsing --------------------------------------------------------------------------------


def parse(argv: list[str], flags: dict[str, str], values: dict[str, str],
          multi: frozenset[str] = frozenset()) -> tuple[dict[str, object], list[str]] | None:
    """``argv`` -> (options by name, positional arguments); None for anything not understood.

    ``flags`` and ``values`` map each spelling (``--json``, ``-l``) to an option name; a
    name in ``multi`` collects a list, any other keeps its last value (as click does).
    """
    options: dict[str, object] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or arg in ("-h", "--help"):
            return None
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in flags and not eq:
                options[flags[name]] = True
            elif name in values:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        return None
                    value = argv[i]
                _put(options, values[name], value, multi)
            else:
                return None
        elif arg.startswith("-") and len(arg) > 1:
            name, rest = arg[:2], arg[2:]
            if name in flags and not rest:
                options[flags[name]] = True
            elif name in values:
                if not rest:
                    i += 1
                    if i >= len(argv):
                        return None
                    rest = argv[i]
                _put(options, values[name], rest, multi)
            else:
                return None
        else:
            positional.append(arg)
        i += 1
    return options, positional


def _put(options: dict[str, object], name: str, value: str, multi: frozenset[str]) -> None:
    if name in multi:
        options.setdefault(name, [])
        options[name].append(value)  # type: ignore[union-attr]
    else:
        options[name] = value


def _int(value: object, minimum: int) -> int | None:
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number >= minimum else None


# -- query ----------------------------------------------------------------------------------

_QUERY_FLAGS = {"--json": "json", "--jsonl": "jsonl", "--files-only": "files_only", "-l": "files_only",
                "--no-snippet": "no_snippet", "--no-refresh": "no_refresh", "--no-server": "no_server",
                "--no-daemon": "no_daemon"}
_QUERY_VALUES = {"--path": "path", "-p": "path", "--top-k": "k", "-k": "k", "--mode": "mode", "--lang": "lang",
                 "--glob": "glob", "-g": "glob", "--context": "context", "-C": "context", "--max-lines": "max_lines",
                 "--min-score": "min_score", "--budget": "budget", "--index-dir": "index_dir"}


def _query(argv: list[str]) -> int | None:
    parsed = parse(argv, _QUERY_FLAGS, _QUERY_VALUES, frozenset({"lang", "glob"}))
    if parsed is None:
        return None
    opts, positional = parsed
    if len(positional) != 1 or (opts.get("json") and opts.get("jsonl")) or opts.get("no_server"):
        return None
    request = _search_request(positional[0], opts)
    if request is None:
        return None
    from codesearch.server import daemon_client

    policy = daemon_client.policy(bool(opts.get("no_daemon")))
    found = _locate(opts.get("path"), opts.get("index_dir"))
    if found is None and policy != daemon_client.OFF:
        found = _indexing(opts.get("path"), opts.get("index_dir"))
    if found is None:
        return None  # no index yet: the Typer path indexes it first, lexically, here
    root, index_dir = found
    # What this process answers without torch: a lexical query, or a hybrid one (the default)
    # of an index that records no model, which BM25 alone ranks (the searcher says so).
    models = None if request["mode"] == "lexical" else _records_models(index_dir)  # (read once)
    lexical = request["mode"] == "lexical" or (request["mode"] == "hybrid" and not models)
    if policy == daemon_client.OFF and not lexical:
        return None
    from codesearch.server.discovery import read_discovery

    if read_discovery(index_dir) is not None:
        return None  # a `codesearch serve` of this index answers (the Typer path asks it)
    info = None if policy == daemon_client.OFF else daemon_client.find()
    if info is not None and not daemon_client.responsive(info):
        _notice(daemon_client.STUCK.format(pid=info.pid, s=daemon_client.PROBE_S) + "; searching in this process")
        if not lexical:
            return None
        info = None
    big = lexical and info is None and policy == daemon_client.START and _is_big(index_dir)
    if info is None and lexical and not big:
        return _query_here(root, index_dir, request, opts)
    if info is None:
        if policy != daemon_client.START or not (big or models):
            return None  # needs no model: this process answers without torch
        try:
            info = daemon_client.ensure(start=True, say=_notice)
        except Exception as exc:  # noqa: BLE001 - any failure to start: search here, and say why
            _notice(f"{exc}; searching in this process")
            return None
        if info is None:
            return None
    body = {"root": str(root), "index_dir": str(index_dir) if opts.get("index_dir") else None,
            "refresh": not opts.get("no_refresh"), "request": request}
    try:
        status, doc = daemon_client.call(info, "POST", "/daemon/search", body, timeout=SEARCH_TIMEOUT_S)
    except (OSError, ValueError):  # no daemon after all, or a broken exchange
        return None
    if status in (400, USER_ERROR) and doc.get("detail"):
        return _error(str(doc["detail"]))  # the one line this process would say (a bad glob, a model)
    if status != 200 or doc.get("schema_version") != 1 or not isinstance(doc.get("results"), list):
        return None  # the Typer path searches here and says what it finds
    _print_result(doc, root, as_json=bool(opts.get("json")), as_jsonl=bool(opts.get("jsonl")),
                  files_only=bool(opts.get("files_only")))
    return 0


def _query_here(root: Path, index_dir: Path, request: dict[str, object], opts: dict[str, object]) -> int | None:
    """A lexical query with no daemon running (or a hybrid one of an index with no model):
    searched in this process, as the Typer path searches it (refresh included; no model, no
    torch), without importing typer or rich.
    An error (a bad glob, ...): None, and the Typer path says it in its words."""
    if not opts.get("no_refresh"):
        from codesearch.indexing import gitlist

        gitlist.prefetch(root)  # git lists the tree while the imports below run (the refresh's check)
        gitlist.prefetch(root, gitlist.GIT_CHANGES)  # (and its stat cache: `gitstat`)
    from codesearch.api import CodeSearch
    from codesearch.errors import CodeSearchError
    from codesearch.types import SearchRequest, result_document

    try:
        req = SearchRequest(
            str(request["query"]), int(request["k"]), str(request["mode"]), tuple(request["lang"] or ()),  # type: ignore[arg-type]
            tuple(request["glob"] or ()), bool(request["files_only"]), context=int(request["context"]),  # type: ignore[arg-type]
            max_lines=request["max_lines"], no_snippet=bool(request["no_snippet"]),  # type: ignore[arg-type]
            min_score=request["min_score"], budget=request["budget"],  # type: ignore[arg-type]
        )
        with CodeSearch(root, index_dir=index_dir if opts.get("index_dir") else None) as cs:
            result = cs.query(req, refresh=not opts.get("no_refresh"))
    except CodeSearchError:
        return None
    for line in result.notices:
        _notice(line)
    _print_result(result_document(result), root, as_json=bool(opts.get("json")), as_jsonl=bool(opts.get("jsonl")),
                  files_only=bool(opts.get("files_only")), result=result)
    return 0


def _search_request(query: str, opts: dict[str, object]) -> dict[str, object] | None:
    """The ``POST /search`` body of the options; None when one is out of range (Typer then
    gives the usage error)."""
    k = _int(opts.get("k", 10), 1)
    context = _int(opts.get("context", 0), 0)
    max_lines = None if opts.get("max_lines") is None else _int(opts["max_lines"], 1)
    budget = None if opts.get("budget") is None else _int(opts["budget"], 1)
    mode = str(opts.get("mode", "hybrid"))
    try:
        min_score = None if opts.get("min_score") is None else float(str(opts["min_score"]))
    except ValueError:
        return None
    if None in (k, context) or mode not in _MODES or (opts.get("max_lines") is not None and max_lines is None) or (
            opts.get("budget") is not None and budget is None):
        return None
    return {"query": query, "k": k, "mode": mode, "lang": opts.get("lang") or None, "glob": opts.get("glob") or None,
            "files_only": bool(opts.get("files_only")), "context": context, "max_lines": max_lines,
            "no_snippet": bool(opts.get("no_snippet")), "min_score": min_score, "budget": budget}


def _locate(path: object, index_dir: object) -> tuple[Path, Path] | None:
    """(root, index folder) of an indexed repository, found as the Typer path finds it;
    None when there is no index there (yet)."""
    if path is None and index_dir is None:
        here = Path.cwd().resolve()
        for folder in (here, *here.parents):
            if (folder / ".codesearch" / "store.sqlite").is_file():
                return folder, folder / ".codesearch"
        return None
    root = Path(str(path) if path is not None else ".").expanduser()
    if not root.is_dir():
        return None
    root = root.resolve()
    idir = Path(str(index_dir)).expanduser().resolve() if index_dir is not None else root / ".codesearch"
    return (root, idir) if (idir / "store.sqlite").is_file() else None


def _indexing(path: object, index_dir: object) -> tuple[Path, Path] | None:
    """(root, index folder) of a ``--path`` folder with no index yet whose first index the
    running daemon is making: the query goes to the daemon, which answers at once with
    where the run is (indexing it here too would race that run for the index lock)."""
    if path is None or index_dir is not None or not Path(str(path)).is_dir():
        return None
    from codesearch.server import daemon_client

    root = Path(str(path)).expanduser().resolve()
    info = daemon_client.find()
    if info is None:
        return None
    try:
        status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={_quote(str(root))}",
                                         timeout=daemon_client.PROBE_S)
    except (OSError, ValueError):
        return None
    running = status == 200 and (doc.get("indexing") or {}).get("state") != "idle"
    return (root, root / ".codesearch") if running else None


#: A lexical query of an index this big goes to the daemon (started when none runs), which
#: keeps the index open: opening it costs every new process time and memory that grow with
#: the repository, and a warm daemon answers in a round trip. Below it, the query is
#: searched here (no daemon started for it), as fast as the round trip plus the start.
#: ``CODESEARCH_LEXICAL_DAEMON_CHUNKS`` sets another count (0: never).
LEXICAL_DAEMON_CHUNKS = 20_000
LEXICAL_DAEMON_ENV = "CODESEARCH_LEXICAL_DAEMON_CHUNKS"
#: The HTTP status the daemon gives a user's error that a server would answer 500 to
#: (`codesearch.server.daemon_app.USER_ERROR`; not imported: this module stays light).
USER_ERROR = 422


def _is_big(index_dir: Path) -> bool:
    """Whether the index holds `LEXICAL_DAEMON_CHUNKS` chunks or more (False when the store
    cannot tell: this process then searches it, as it always did)."""
    threshold = _int(os.environ.get(LEXICAL_DAEMON_ENV) or LEXICAL_DAEMON_CHUNKS, 0)
    count = _store_count(index_dir, "chunks") if threshold else None
    return count is not None and count >= threshold


def _records_models(index_dir: Path) -> bool:
    """Whether the index has vectors of a model (a semantic query must load it); True when
    the store cannot tell (the daemon then decides)."""
    count = _store_count(index_dir, "models")
    return count is None or count > 0


def _store_count(index_dir: Path, table: str) -> int | None:
    """The rows of ``table`` in the index's store, read-only; None when it cannot be read."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{index_dir / 'store.sqlite'}?mode=ro", uri=True, timeout=1.0)
        try:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def _notice(line: str) -> None:
    from codesearch.pathnames import escape_controls

    sys.stderr.write(f"Notice: {escape_controls(line)}\n")
    sys.stderr.flush()


# -- rendering: what codesearch.cli.render prints, without rich off a terminal -----------------

_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def _dumps(doc: object, indent: int | None = None) -> str:
    return json.dumps(doc, ensure_ascii=False, indent=indent).translate(_LINE_BREAKS)


def _rich_terminal() -> bool:
    """Whether rich would draw on stdout (a terminal, or forced by its environment)."""
    return sys.stdout.isatty() or any(os.environ.get(v) for v in ("FORCE_COLOR", "TTY_COMPATIBLE"))


def _print_result(doc: dict, root: Path, *, as_json: bool, as_jsonl: bool, files_only: bool,
                  result: object = None) -> None:
    """The daemon's document as ``codesearch query`` prints a result (notices on stderr);
    ``result``: the `SearchResult` itself, searched here (its notices said already)."""
    from codesearch.pathnames import escape_controls, quote_name

    for line in doc.get("notices", []) if result is None else ():
        sys.stderr.write(f"Notice: {escape_controls(line)}\n")
    hits = doc["results"]
    if as_json:
        sys.stdout.write(_dumps(doc, indent=2) + "\n")
        return
    if not hits and not as_jsonl:
        sys.stderr.write("No results.\n")
        return
    if as_jsonl:
        for hit in hits:
            sys.stdout.write(_dumps({"schema_version": doc["schema_version"], **hit}) + "\n")
        return
    if files_only:
        for hit in hits:
            sys.stdout.write(f"{quote_name(hit['path'])}\n")
        return
    if _rich_terminal():
        from codesearch.cli import render

        if result is None:
            from codesearch.server.client import result_from_document

            result = result_from_document(doc)
        render.search_result(result, root=root, as_json=False, as_jsonl=False, files_only=False)
        return
    out = sys.stdout
    for hit in hits:
        bits = [f"{hit['score']:.4f}"]
        if hit.get("symbol"):
            bits.append(f"{hit['symbol']} ({hit['kind']})" if hit.get("kind") else hit["symbol"])
        elif hit.get("kind"):
            bits.append(hit["kind"])
        out.write(f"{quote_name(hit['path'])}:{hit['start_line']}-{hit['end_line']}  "
                  f"{escape_controls('  '.join(bits))}\n")
        text = hit.get("text") or ""
        if not text:
            continue
        out.write(text if text.endswith("\n") else text + "\n")
        if hit.get("more_lines"):
            out.write(f"... ({hit['more_lines']} more lines)\n")  # as render's plain output says it
        out.write("\n")


# -- index ----------------------------------------------------------------------------------

_INDEX_FLAGS = {"--quiet": "quiet", "-q": "quiet", "--rebuild": "rebuild", "--ray": "ray", "--no-daemon": "no_daemon"}
_INDEX_VALUES = {"--model": "model", "--multi-model": "multi_model", "--device": "device", "--index-dir": "index_dir",
                 "--include": "include", "--exclude": "exclude", "--max-file-size": "max_file_size",
                 "--ray-address": "ray_address"}
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _size(value: str) -> int | None:
    text = value.strip().lower()
    number = text.rstrip("kmgib")
    try:
        size = int(float(number) * _SIZE_UNITS[text[len(number):]])
    except (ValueError, KeyError):
        return None
    return size if size > 0 else None


def _model(value: object) -> str | None:
    """A ``--model`` value as the daemon must get it: DEFAULT, None for 'none', a local
    folder as an absolute path (the daemon works in a folder of its own), else as given."""
    from codesearch.types import DEFAULT

    if value is None:
        return DEFAULT
    text = str(value)
    if text.strip().lower() == "none":
        return None
    folder = Path(text).expanduser()
    return str(folder.resolve()) if folder.is_dir() else text


def _index(argv: list[str]) -> int | None:
    parsed = parse(argv, _INDEX_FLAGS, _INDEX_VALUES, frozenset({"include", "exclude"}))
    if parsed is None:
        return None
    opts, positional = parsed
    size = _size(str(opts.get("max_file_size", "1MB")))
    device = str(opts.get("device", "auto"))
    # --ray stays here: the run is a Ray driver, which joins the cluster that this shell's
    # RAY_ADDRESS (or a local `ray start`) names and lives as long as the run; the daemon
    # outlives the command and gets only the environment it needs.
    if len(positional) > 1 or size is None or device not in _DEVICES or opts.get("ray") or opts.get("ray_address"):
        return None
    path = Path(positional[0] if positional else ".")
    if not opts.get("rebuild"):
        watched_since = _watched_since(path, opts)
        if watched_since is None:  # git lists the tree while the imports below run (the check's)
            from codesearch.indexing import gitlist

            gitlist.prefetch(path)
            gitlist.prefetch(path, gitlist.GIT_CHANGES)
        from codesearch.indexing.unchanged import unchanged_run

        summary = unchanged_run(
            path, index_dir=opts.get("index_dir"), model=_model(opts.get("model")),
            multi_model=_model(opts.get("multi_model")), device=device, include=tuple(opts.get("include") or ()),
            exclude=tuple(opts.get("exclude") or ()), max_file_bytes=size, vouched_since=watched_since,
        )
        if summary is not None:
            if not opts.get("quiet"):
                from codesearch.cli import render

                render.index_summary(summary)
            return 0
        if watched_since is None:
            gitlist.drop(path, gitlist.GIT_LS)  # (a check that stopped before it read them)
            gitlist.drop(path, gitlist.GIT_CHANGES)
    return _index_in_daemon(path, opts, size, device)


#: How long a no-op check waits for the daemon's word before it stats every file itself.
WATCHED_PROBE_S = 1.0


def _watched_since(path: Path, opts: dict[str, object]) -> float | None:
    """When (``time.time()``) a check found ``path``'s index current, where the running
    daemon serves and watches it and its watcher vouches that no file changed since: a no-op
    check then stats no file of the work tree (at 114k files that is most of a second or
    more). None at any doubt: no daemon (or not by policy), another index folder, a run
    going, no answer in time."""
    from codesearch.server import daemon_client

    if daemon_client.policy(bool(opts.get("no_daemon"))) == daemon_client.OFF or not path.is_dir():
        return None
    info = daemon_client.find()
    if info is None:
        return None
    root = path.expanduser().resolve()
    index_dir = opts.get("index_dir")
    want = Path(str(index_dir)).expanduser().resolve() if index_dir is not None else root / ".codesearch"
    try:
        status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={_quote(str(root))}",
                                         timeout=WATCHED_PROBE_S)
    except (OSError, ValueError):
        return None
    since = doc.get("current_since") if status == 200 else None
    ok = doc.get("current") is True and doc.get("index_dir") == str(want) and isinstance(since, (int, float))
    return float(since) if ok else None  # type: ignore[arg-type]


INDEX_POLL_S = 0.1
INDEX_CALL_S = 120.0  # adding a root opens its index and loads its query models
CANCEL_S = 0.5  # Ctrl-C: the interrupt guard ends this process 0.8 s after the signal


def _needs_models(index_dir: Path, model: str | None, multi_model: str | None) -> bool:
    """Whether an index run with these model choices loads a model: a named one, or the
    index's own (an index without one, or a first index with both set to 'none', does not)."""
    from codesearch.types import DEFAULT

    if any(m not in (None, DEFAULT) for m in (model, multi_model)):
        return True
    if model is None and multi_model is None:
        return False
    if (index_dir / "store.sqlite").is_file():
        return _records_models(index_dir)
    return True  # a first index with a default model (LateOn-Code-edge, and a dense one on a GPU)


def _index_in_daemon(path: Path, opts: dict[str, object], size: int, device: str) -> int | None:
    """An index run that loads a model, made by the daemon (started when none runs): the
    models stay loaded for the next command, and the daemon is the root's one writer (a run
    here would contend with its watcher for the index lock). Its progress shows here; Ctrl-C
    here cancels it. None: this process runs it (no daemon by policy or failure, a
    lexical-only index)."""
    from codesearch.server import daemon_client
    from codesearch.types import DEFAULT

    policy = daemon_client.policy(bool(opts.get("no_daemon")))
    if policy == daemon_client.OFF or not path.is_dir():
        return None
    root = path.resolve()
    index_dir = Path(str(opts["index_dir"])).expanduser().resolve() if opts.get("index_dir") else None
    model, multi_model = _model(opts.get("model")), _model(opts.get("multi_model"))
    if not _needs_models(index_dir or root / ".codesearch", model, multi_model):
        return None  # no model to keep warm: this process indexes without torch
    try:
        info = daemon_client.ensure(start=policy == daemon_client.START, say=_notice)
    except Exception as exc:  # noqa: BLE001 - any failure to start or a stuck daemon: index here, say why
        _notice(f"{exc}; indexing in this process")
        return None
    if info is None:
        return None
    options: dict[str, object] = {"device": device, "include": list(opts.get("include") or ()),  # type: ignore[call-overload]
                                  "exclude": list(opts.get("exclude") or ()),  # type: ignore[call-overload]
                                  "index_dir": str(index_dir) if index_dir else None, "max_file_bytes": size}
    for name, value in (("model", model), ("multi_model", multi_model)):
        if value != DEFAULT:
            options[name] = value
    body = {"root": str(root), "options": options, "rebuild": bool(opts.get("rebuild"))}
    try:
        status, doc = daemon_client.call(info, "POST", "/daemon/index", body, timeout=INDEX_CALL_S)
    except KeyboardInterrupt:  # the daemon may have taken the run already: it is cancelled too
        return _cancel(info, root, taken=False)
    except (OSError, ValueError) as exc:
        _notice(f"the codesearch daemon (pid {info.pid}) did not take the run ({exc}); indexing in this process")
        return None
    if status != 200:
        if 400 <= status < 500 and doc.get("detail"):
            return _error(str(doc["detail"]))
        _notice(f"the codesearch daemon (pid {info.pid}) answered {status}; indexing in this process "
                "(see 'codesearch daemon logs')")
        return None
    try:
        return _follow_run(info, root, int(doc["target_runs"]), quiet=bool(opts.get("quiet")))
    except KeyboardInterrupt:  # the run is the daemon's: before the polling began or after it ended
        return _cancel(info, root)


def _follow_run(info: object, root: Path, target: int, *, quiet: bool) -> int | None:
    """Poll the daemon's run of ``root`` until run number ``target`` has finished, showing its
    progress as a run in this process does; the summary or the error as one line."""
    import time

    from codesearch.cli import render
    from codesearch.server import daemon_client
    from codesearch.types import IndexSummary, ProgressEvent

    state: dict = {}
    last = None
    try:
        with render.IndexProgress(enabled=not quiet) as progress:
            while True:
                status, doc = daemon_client.call(info, "GET", f"/daemon/run?root={_quote(str(root))}",  # type: ignore[arg-type]
                                                 timeout=30.0)
                state = doc.get("indexing") or {}
                if status != 200:
                    return _error(str(doc.get("detail") or f"the codesearch daemon answered {status}"))
                if state.get("runs", 0) >= target:
                    break
                event = state.get("progress")
                if state.get("state") == "running" and event and event != last:
                    last = event
                    progress(ProgressEvent(**event))
                time.sleep(INDEX_POLL_S)
    except KeyboardInterrupt:
        return _cancel(info, root)
    except (OSError, ValueError, TypeError) as exc:
        _notice(f"the codesearch daemon (pid {info.pid}) stopped answering during the run ({exc}); "  # type: ignore[attr-defined]
                "indexing in this process (what it committed is kept)")
        return None
    if state.get("last_error"):
        return _error(str(state["last_error"]))
    summary = IndexSummary(**state["last_summary"])
    if quiet:
        render.notices(summary.notices)
    else:
        render.index_summary(summary)
    return 0


def _cancel(info: object, root: Path, *, taken: bool = True) -> int:
    """Ctrl-C while the daemon runs our index: ask it to stop the run (what a user expects of
    Ctrl-C), then the one line and 130. ``taken``: the daemon had answered that it took the
    run (else it may still be taking it, and start the run after this cancel)."""
    from codesearch.cli import interrupts
    from codesearch.server import daemon_client

    try:
        status, doc = daemon_client.call(info, "POST", "/daemon/cancel", {"root": str(root)},  # type: ignore[arg-type]
                                         timeout=CANCEL_S)
    except (OSError, ValueError):
        status, doc = 0, {}
    what = "Terminated" if interrupts.exit_status() == 143 else "Interrupted"
    if status == 200 and doc.get("cancelled") is not False:
        line = f"{what}: the daemon stopped the index run (the index is intact; run the command again to resume)"
    elif status == 200 and taken:
        line = f"{what}: the daemon's index run had ended (run the command again to see what it left)"
    else:  # no answer, or the run not taken yet (the daemon still adding the root: its run may follow)
        line = (f"{what}; the daemon's index run may go on (it did not take the cancel; "
                "'codesearch daemon status' shows it, 'codesearch daemon stop' ends it)")
    return interrupts.say_and_exit(line)


def _error(detail: str) -> int:
    from codesearch.pathnames import escape_controls

    sys.stderr.write(f"Error: {escape_controls(detail)}\n")
    return 1


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


# -- serve --mcp stdio ------------------------------------------------------------------------

_SERVE_FLAGS = {"--watch": "watch", "--no-watch": "no_watch", "--index-on-start": "index_on_start",
                "--no-index-on-start": "no_index_on_start", "--no-daemon": "no_daemon",
                "--query-batching": "query_batching", "--no-query-batching": "no_query_batching"}
_SERVE_VALUES = {"--mcp": "mcp", "--model": "model", "--multi-model": "multi_model", "--device": "device",
                 "--index-dir": "index_dir", "--include": "include", "--exclude": "exclude"}


def _serve(argv: list[str]) -> int | None:
    parsed = parse(argv, _SERVE_FLAGS, _SERVE_VALUES, frozenset({"include", "exclude"}))
    if parsed is None:
        return None
    opts, paths = parsed
    if opts.get("mcp") != "stdio" or str(opts.get("device", "auto")) not in _DEVICES:
        return None
    if opts.get("no_watch") or opts.get("no_query_batching"):
        return None  # the daemon watches and batches: a session that asks otherwise runs here
    from codesearch.server import daemon_client, mcp_proxy

    policy = daemon_client.policy(bool(opts.get("no_daemon")))
    if policy == daemon_client.OFF or (opts.get("index_dir") and len(paths) > 1):
        return None
    roots = [Path(p) for p in paths] or [_default_root()]
    if not all(r.is_dir() for r in roots):
        return None
    served = mcp_proxy.proxy_stdio(roots, session_options(opts), start=policy == daemon_client.START,
                                   index_on_start=not opts.get("no_index_on_start"))
    return 0 if served else None


def session_options(opts: dict[str, object]) -> dict[str, object] | None:
    """The options a session names explicitly (none: the daemon uses what each index records)."""
    out: dict[str, object] = {}
    for name in ("model", "multi_model"):
        if opts.get(name) is not None:
            out[name] = _model(opts[name])
    if opts.get("device") not in (None, "auto"):
        out["device"] = opts["device"]
    for name in ("include", "exclude"):
        if opts.get(name):
            out[name] = list(opts[name])  # type: ignore[arg-type]
    if opts.get("index_dir"):
        out["index_dir"] = str(Path(str(opts["index_dir"])).expanduser().resolve())
    if not out:
        return None
    from codesearch.types import DEFAULT  # (only here: the relay of a session stays small)

    return {k: v for k, v in out.items() if v != DEFAULT}


def _default_root() -> Path:
    """The indexed folder at or above the current one, else the current one (as ``serve``)."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / ".codesearch" / "store.sqlite").is_file():
            return folder
    return here
