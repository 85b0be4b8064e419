"""JSON with comments (JSONC: ``//`` and ``/* */`` comments, trailing commas), as Zed's and
VS Code's settings files are written: read, and one member set in place.

Why not load and dump: that drops every comment and reorders nothing but reformats all.
Here the file's text is kept byte for byte except the one value that changes, so a user's
comments, order and layout survive ``codesearch agents --write``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_SPACE = re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/)*", re.S)
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*"', re.S)
_COMMA_TAIL = re.compile(r"[ \t]*,[ \t]*(?://[^\n]*)?(?=\n)")
_LITERAL = re.compile(r"-?[0-9][0-9eE.+-]*|-?Infinity|NaN|true|false|null")


class JSONCError(ValueError):
    """Not JSON with comments; ``line`` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"{message}, line {line}")
        self.msg = message
        self.line = line


@dataclass(frozen=True, slots=True)
class Member:
    """One ``"key": value`` of an object: where its key starts and its value's span."""

    key: str
    key_start: int
    value_start: int
    value_end: int
    value: Any
    members: tuple[Member, ...] | None  # the value's own members when it is an object


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str) -> JSONCError:
        return JSONCError(message, self.text.count("\n", 0, self.pos) + 1)

    def skip(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()
        if self.text.startswith("/*", self.pos):
            raise self.error("unterminated comment")

    def value(self) -> tuple[Any, tuple[Member, ...] | None]:
        """The value at ``pos`` (after blanks), and its members if an object."""
        self.skip()
        char = self.text[self.pos : self.pos + 1]
        if char == "{":
            return self.object()
        if char == "[":
            return self.array(), None
        match = (_STRING if char == '"' else _LITERAL).match(self.text, self.pos)
        if match is None:
            raise self.error("expected a value" if char else "unexpected end of file")
        self.pos = match.end()
        try:
            return json.loads(match.group()), None
        except json.JSONDecodeError:
            raise self.error(f"bad value {match.group()[:20]!r}") from None

    def object(self) -> tuple[dict[str, Any], tuple[Member, ...]]:
        self.pos += 1
        data: dict[str, Any] = {}
        members: list[Member] = []
        while True:
            self.skip()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return data, tuple(members)
            match = _STRING.match(self.text, self.pos)
            if match is None:
                raise self.error("expected a key in quotes or '}'")
            key, key_start = json.loads(match.group()), self.pos
            self.pos = match.end()
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.error("expected ':'")
            self.pos += 1
            self.skip()
            start = self.pos
            value, inner = self.value()
            data[key] = value
            members.append(Member(key, key_start, start, self.pos, value, inner))
            if not self.comma("}"):
                raise self.error("expected ',' or '}'")

    def array(self) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        while True:
            self.skip()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return items
            items.append(self.value()[0])
            if not self.comma("]"):
                raise self.error("expected ',' or ']'")

    def comma(self, close: str) -> bool:
        """After an item: a comma (then maybe the close, a trailing comma), or the close
        itself, left for the caller; False for anything else."""
        self.skip()
        if self.text.startswith(",", self.pos):
            self.pos += 1
            return True
        return self.text.startswith(close, self.pos)


def parse(text: str) -> tuple[Any, tuple[Member, ...] | None]:
    """The value of a JSONC document and, for an object, its members with their spans.

    Raises
    ------
    JSONCError
        Not JSON with comments (the message names the line).
    """
    parser = _Parser(text)
    value, members = parser.value()
    parser.skip()
    if parser.pos != len(text):
        raise parser.error("extra text after the value")
    return value, members


def loads(text: str) -> Any:
    """``json.loads`` that also reads comments and trailing commas."""
    return parse(text)[0]


def set_member(text: str, path: tuple[str, str], value: Any) -> str:
    """``text`` with ``doc[path[0]][path[1]] = value``, everything else as it was.

    The outer key is added to the top object when missing (or replaced when it is null);
    the inner member is replaced where it stands, else added after the last member.

    Raises
    ------
    JSONCError
        ``text`` is not a JSONC object, or ``path[0]`` holds something but an object.
    """
    if not text.strip():
        return json.dumps({path[0]: {path[1]: value}}, indent=2) + "\n"
    doc, members = parse(text)
    if not isinstance(doc, dict) or members is None:
        raise JSONCError("the file is not a JSON object", 1)
    outer = _find(members, path[0])
    if outer is None or outer.value is None:
        new = {path[1]: value}
        if outer is not None:
            return _splice(text, outer.value_start, outer.value_end, _dump(new, _indent_of(text, outer.key_start)))
        return _add(text, members, _top_end(text), path[0], new)
    if not isinstance(outer.value, dict) or outer.members is None:
        raise JSONCError(f"'{path[0]}' is not an object", text.count("\n", 0, outer.key_start) + 1)
    inner = _find(outer.members, path[1])
    if inner is not None:
        return _splice(text, inner.value_start, inner.value_end, _dump(value, _indent_of(text, inner.key_start)))
    return _add(text, outer.members, _close_of(text, outer), path[1], value, parent_indent=_indent_of(
        text, outer.key_start))


def _find(members: tuple[Member, ...], key: str) -> Member | None:
    # The last one wins in JSON readers (and in json.loads), so that is the one to change.
    return next((m for m in reversed(members) if m.key == key), None)


def _splice(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _indent_of(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    return re.match(r"[ \t]*", text[line_start:pos]).group()


def _dump(value: Any, indent: str) -> str:
    """``value`` as indented JSON, its lines after the first indented under ``indent``."""
    return json.dumps(value, indent=2).replace("\n", "\n" + indent)


def _top_end(text: str) -> int:
    """Where the top object's closing brace is (comments may follow it)."""
    parser = _Parser(text)
    parser.value()
    return parser.pos - 1


def _close_of(text: str, member: Member) -> int:
    return member.value_end - 1  # an object value ends with its '}'


def _add(text: str, members: tuple[Member, ...], close: int, key: str, value: Any, *, parent_indent: str = "") -> str:
    """Insert ``"key": value`` as the last member of the object whose '}' is at ``close``."""
    if members:
        last = members[-1]
        indent = _indent_of(text, last.key_start)
        # One member a line (the usual layout) or all on one line, as the file has it.
        on_own_line = not text[text.rfind("\n", 0, last.key_start) + 1 : last.key_start].strip()
        member = f"{json.dumps(key)}: {_dump(value, indent)}"
        # After the last member's own comma and a comment on its line, when it has them.
        tail = _COMMA_TAIL.match(text, last.value_end)
        if on_own_line and tail:
            return text[: tail.end()] + "\n" + indent + member + text[tail.end() :]
        sep = ",\n" + indent if on_own_line else ", "
        return text[: last.value_end] + sep + member + text[last.value_end :]
    indent = parent_indent + "  "
    member = f"{json.dumps(key)}: {_dump(value, indent)}"
    return text[:close] + "\n" + indent + member + "\n" + parent_indent + text[close:]
