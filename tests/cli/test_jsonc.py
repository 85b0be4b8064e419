"""`codesearch.cli.jsonc`: JSON with comments read as JSON readers do, and one member set
with the rest of the text kept as it was."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesearch.cli import jsonc

ENTRY = {"command": "/x/codesearch", "args": ["serve", "."]}
PATH = ("servers", "codesearch")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.sampled_from([None, 2]))
def test_plain_json_reads_as_json_loads_reads_it(value, indent):
    text = json.dumps(value, indent=indent)
    assert jsonc.loads(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "// head\n{\n  // c\n  \"a\": 1, /* inline */\n  \"b\": [1, 2,],\n}\n",
        '{\n  "servers": {\n    "other": {"command": "y"}, // keep\n  },\n}\n',
        '{"servers": {}}',
        '{"servers": null, "a": [1, 2,],}',
        '{\n  "servers": {\n    "codesearch": {"command": "old"}\n  }\n}\n// end\n',
        "{}",
        "",
        '/* c */ {"a": "x // not a comment", "b": "/* nor this */"} // tail',
    ],
)
def test_set_member_sets_it_and_keeps_every_comment(text):
    out = jsonc.set_member(text, PATH, ENTRY)
    data = jsonc.loads(out)
    assert data["servers"]["codesearch"] == ENTRY
    before = jsonc.loads(text) if text.strip() else {}
    assert {k: v for k, v in data.items() if k != "servers"} == {k: v for k, v in before.items() if k != "servers"}
    if isinstance(before.get("servers"), dict):
        assert {k: v for k, v in data["servers"].items() if k != "codesearch"} == {
            k: v for k, v in before["servers"].items() if k != "codesearch"
        }
    for piece in ("// head", "// c", "/* inline */", "// keep", "// end", "/* c */", "// tail"):
        assert (piece in out) == (piece in text)
    assert jsonc.set_member(out, PATH, ENTRY) == out  # setting it again changes nothing


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"a": 1', "expected ',' or '}', line 1"),
        ('{\n"a" 1}', "expected ':', line 2"),
        ("[1]", "not a JSON object"),
        ('{"servers": 3}', "'servers' is not an object"),
        ('{"a": 1} x', "extra text after the value"),
        ("{/* open", "unterminated comment"),
        ('{"a": 1,, }', "expected a key in quotes or '}'"),
    ],
)
def test_what_is_not_jsonc_is_an_error_naming_the_line(text, message):
    with pytest.raises(jsonc.JSONCError, match=message.replace("(", r"\(").replace("[", r"\[")):
        jsonc.set_member(text, PATH, ENTRY)
