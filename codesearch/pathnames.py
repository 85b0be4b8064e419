"""File names as text that is safe to print, and as text that is valid Unicode.

A file name on Linux is any bytes but ``/`` and NUL: a newline, a tab, an ESC (which a
terminal obeys), a byte that is not UTF-8. Python holds such a name as a str whose
undecodable bytes are surrogate escapes (``'caf\\udce9.py'``, as ``os.listdir`` returns it);
the index keeps it whole (the store writes those bytes as they are), so the file can be
read again. Only where a name is shown does it change:

- `quote_name` for a terminal or a pipe, the way git shows such names (``core.quotePath``):
  a name with a control character, a byte that is not UTF-8, ``"`` or ``\\`` is put in
  double quotes with C escapes (``"a\\nb.py"``, ``"caf\\xe9.py"``, ``"\\x1b[31m.py"``); every
  other name is shown as it is. So one hit is one line, no name can drive the terminal,
  and an unquoted name is exactly the file's.
- `text_name` for JSON and for the texts an index stores (chunk headers, what the encoder
  reads): the name as valid Unicode, each byte that is not UTF-8 written ``\\xNN`` (and a
  backslash that would read as such an escape written ``\\x5c``, so no two names show the
  same); a control character stays itself (JSON escapes it).

>>> quote_name("src/a.py"), quote_name("a\\nb.py"), quote_name("caf\\udce9.py")
('src/a.py', '"a\\\\nb.py"', '"caf\\\\xe9.py"')
>>> text_name("caf\\udce9.py")
'caf\\\\xe9.py'
"""

from __future__ import annotations

import re

__all__ = ["escape_controls", "quote_name", "text_name", "valid_text"]

# Surrogate escapes of undecodable bytes (U+DC80-U+DCFF), and any other lone surrogate.
_SURROGATES = re.compile("[\ud800-\udfff]")
# ... and a backslash that reads as the start of the escape `text_name` writes for one.
_ESCAPE_LIKE = re.compile("[\ud800-\udfff]|\\\\(?=x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4})")
# What a terminal acts on or a line reader splits at: C0, DEL, C1, the Unicode line and
# paragraph separators, the bidirectional overrides that reorder what is shown (the
# "Trojan Source" characters), and the surrogates above.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_QUOTE_TRIGGER = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"\\\\]')
_C_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def _escape(ch: str) -> str:
    if ch in _C_ESCAPES:
        return _C_ESCAPES[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte: the byte itself
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def text_name(name: str) -> str:
    """``name`` as valid Unicode: each byte that is not UTF-8 as ``\\xNN``, and a backslash
    that would read as such an escape (``\\x`` or ``\\u`` and hex digits) as ``\\x5c``;
    nothing else changes. For JSON documents and the texts an index stores.

    Why the backslash: a file named ``caf\\xe9.py`` (those nine characters) and one named
    ``caf``, byte E9, ``.py`` were shown as the same name, so a hit in one could be read as
    a hit in the other. Every other name is itself, so a tool can open it by that name.
    """
    if not _ESCAPE_LIKE.search(name):
        return name
    return _ESCAPE_LIKE.sub(lambda m: "\\x5c" if m.group() == "\\" else _escape(m.group()), name)


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each byte that is not UTF-8 (a surrogate escape) as
    ``\\xNN``; nothing else changes. For any string of a JSON document; a name is
    `text_name`'d first, where it is made."""
    if not _SURROGATES.search(text):
        return text
    return _SURROGATES.sub(lambda m: _escape(m.group()), text)


def escape_controls(text: str, *, keep: str = "") -> str:
    """``text`` with every character a terminal would act on, and every byte that is not
    UTF-8, written as a C escape (``\\n``, ``\\x1b``, ``\\u2028``), except those in ``keep``.
    For one-line messages that may carry a file name (notices, errors, log lines), and
    (keeping ``"\\n\\t"``) code shown on a terminal; the text is not quoted."""
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m.group()), text)


def quote_name(name: str) -> str:
    """``name`` as it is when it is plain, else in double quotes with C escapes, as git
    shows file names: a control character, a byte that is not UTF-8, ``"`` or ``\\``
    quotes it. For names printed to a terminal or a pipe (not for JSON)."""
    if not _QUOTE_TRIGGER.search(name):
        return name
    return '"' + _QUOTE_TRIGGER.sub(lambda m: "\\" + m.group() if m.group() in '"\\' else _escape(m.group()),
                                    name) + '"'
