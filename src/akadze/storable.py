"""What PostgreSQL can store of a Python string, and of a JSON text.

Python strings hold things PostgreSQL text cannot: the NUL character, and surrogate
code points (U+D800 to U+DFFF), which are no characters at all. They are common in
what tasks produce: ``os.listdir`` gives an undecodable byte of a file name as a
lone surrogate (``"report-\\udcff.txt"``, the ``surrogateescape`` error handler), a C
library's message may hold a NUL. Sent as text, such a string fails the whole
statement that carries it; inside JSON, ``\\u0000`` and a lone surrogate escape are
refused by ``jsonb`` (while an escaped surrogate *pair* is one character and fine).

- :func:`storable_text` makes any string storable by writing what cannot be stored
  as its Python escape: for the texts akadze writes of its own accord (error
  messages and tracebacks), which must reach the job's history whatever they hold.
- :func:`json_text_problem` says what ``jsonb`` would refuse in a JSON text, for
  values that must be stored exactly or not at all (a task's result).

Pure (the standard library only), property-tested against PostgreSQL itself.
"""

from __future__ import annotations

import re

__all__ = ["json_text_problem", "storable_text"]

# NUL, or any surrogate code point.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

# In a JSON text: an escaped backslash (consumed first, so that "\\\\u0000" is a
# backslash and the letters u0000), or a \uXXXX escape.
_JSON_ESCAPE = re.compile(r"\\\\|\\u([0-9a-fA-F]{4})")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: the NUL character written as ``\\x00`` and
    each lone surrogate as its escape (``\\udcff``); a surrogate pair becomes the
    character it encodes. Text that holds neither is returned unchanged."""
    if _UNSTORABLE.search(text) is None:
        return text
    # Join surrogate pairs into their characters; lone surrogates stay as they are.
    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return _UNSTORABLE.sub(_escape, text)


def json_text_problem(text: str) -> str | None:
    """What ``jsonb`` refuses in the JSON text ``text`` (as ``json.dumps`` writes it,
    escapes and all), or None when PostgreSQL stores it: a NUL character
    (``\\u0000``), or a surrogate escape that is not the high half of a pair followed
    at once by its low half. The text itself must be valid Unicode (``json.dumps``
    with its default ``ensure_ascii`` always is)."""
    if "\\u" not in text:
        return None
    pending_high = -1  # where the escape after an unpaired high surrogate would start
    for match in _JSON_ESCAPE.finditer(text):
        code = match.group(1)
        if pending_high >= 0 and (code is None or match.start() != pending_high
                                  or not 0xDC00 <= int(code, 16) <= 0xDFFF):
            return _LONE
        if code is None:
            continue
        value = int(code, 16)
        if pending_high >= 0:  # the low half of a pair
            pending_high = -1
        elif value == 0:
            return "a NUL character (\\u0000), which PostgreSQL cannot store"
        elif 0xD800 <= value <= 0xDBFF:
            pending_high = match.end()
        elif 0xDC00 <= value <= 0xDFFF:
            return _LONE
    return _LONE if pending_high >= 0 else None


_LONE = ("a lone surrogate (such as the \\udcff of an undecodable byte in a file name "
         "from os.listdir), which is not Unicode text and PostgreSQL cannot store")
