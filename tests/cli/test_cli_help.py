"""Every command's --help carries one example that names the command; usage errors exit 2."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from codesearch.cli.app import app


def _walk(command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    # Typer vendors its own click, so test for a group by shape, not by class.
    for name, sub in getattr(command, "commands", {}).items():
        paths.extend(_walk(sub, (*path, name)))
    return paths


COMMANDS = _walk(typer.main.get_command(app))


def test_every_documented_command_is_there():
    names = {" ".join(p) for p in COMMANDS}
    assert {
        "",
        "index",
        "query",
        "status",
        "serve",
        "agents",
        "models",
        "models list",
        "models pull",
        "models info",
    } <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "codesearch")
def test_help_has_one_example_naming_the_command(path):
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    examples = [line for line in result.output.splitlines() if "Example: " in line]
    assert len(examples) == 1, result.output
    example = examples[0].split("Example: ", 1)[1]
    assert example.startswith(" ".join(("codesearch", *path))), example


@pytest.mark.parametrize(
    "argv",
    [
        ["query", "x", "--mode", "fuzzy"],
        ["query", "x", "-k", "0"],
        ["query", "x", "--json", "--jsonl"],
        ["query"],
        ["index", ".", "--max-file-size", "lots"],
        ["index", ".", "--device", "tpu"],
        ["no-such-command"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors_exit_2(argv):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_version():
    from codesearch import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"codesearch {__version__}"


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "codesearch")
def test_help_fits_80_columns_without_cutting_words_or_typing_flags(path):
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output and "<bool>" not in result.output, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output


def test_serve_help_shows_the_token_variable_and_every_flag_whole():
    result = CliRunner().invoke(app, ["serve", "--help"], terminal_width=80, env={"COLUMNS": "80"})
    for text in (
        "CODESEARCH_TOKEN]",
        "--index-on-start / --no-index-on-start",
        "--watch / --no-watch",
        "--query-batching / --no-query-batching",
    ):
        assert text in result.output, text
