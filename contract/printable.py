"""Text from the outside world (file and folder names, paths, driver messages) made safe to print.

    print(f"error: {one_line(exc)}")            # a newline or ESC in a file name cannot forge a line
    f"cannot read image {shown_name(path)}"     # as it is when printable, else quoted and escaped

A file name may hold any byte but "/" and NUL: a newline would start a second ``error:`` line, an
ANSI escape would recolour or clear the user's terminal, a bidi override would reorder the text.
Each such character is written as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``) instead.
A name that is not UTF-8 (Latin-1 bytes, say) reaches Python with each such byte as a lone
surrogate (``os.fsdecode``'s surrogateescape), which no UTF-8 text can hold: it is written as the
byte's escape (``caf\\xe9``), which is also what ``utf8_name`` makes of it.
"""

from __future__ import annotations

import html
import re

# A byte os.fsdecode could not decode, written as its escape (repr would write \udce9).
_UNDECODED = re.compile(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])")


def _is_undecoded_byte(char: str) -> bool:
    return "\udc80" <= char <= "\udcff"


def _escaped(char: str) -> str:
    if _is_undecoded_byte(char):
        return f"\\x{ord(char) - 0xdc00:02x}"
    return char if char.isprintable() else repr(char)[1:-1]


def is_utf8(name: str) -> bool:
    """Whether ``name`` (a path or file name as Python read it) was valid UTF-8 on disk."""
    return not any(map(_is_undecoded_byte, name))


def utf8_name(name: str) -> str:
    """``name`` with each byte that was not UTF-8 written as its escape (``caf\\xe9``): text that
    a database, a page and a JSON file can hold. Every other character is kept as it is."""
    return name if is_utf8(name) else "".join(_escaped(c) if _is_undecoded_byte(c) else c for c in name)


def storable_text(text: str) -> str:
    """``text`` as a database column and a JSON file can hold it: each byte that was not UTF-8 (a lone
    surrogate, as ``sys.argv`` and ``os.fsdecode`` give it) written as ``utf8_name`` writes it, any other
    lone surrogate and each NUL (which PostgreSQL refuses) as its escape; other text unchanged."""
    text = utf8_name(text)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate that stands for no byte (U+D800): its escape
        text = "".join(c if not "\ud800" <= c <= "\udfff" else f"\\u{ord(c):04x}" for c in text)
    return text


def one_line(text: object) -> str:
    """``text`` on one line: every character that is not printable (newline, tab and ESC included)
    written as its escape; ordinary text is unchanged."""
    text = str(text)
    return text if text.isprintable() else "".join(map(_escaped, text))


def printable_lines(text: object) -> str:
    """Like ``one_line``, but keeps real line breaks: for a message with a traceback under it."""
    return "\n".join(one_line(line) for line in str(text).split("\n"))


def shown_name(name: object) -> str:
    """A name from the outside world: as it is when every character is printable, else quoted with
    its odd characters escaped (``'x\\nerror: forged'``), so that it reads as one name."""
    text = str(name)
    return text if text.isprintable() else _UNDECODED.sub(r"\1\\x\2", repr(text))


def plotly_text(text: object) -> str:
    """``text`` shown literally in a Plotly label (an axis tick, a legend entry): Plotly reads tags
    such as ``<a href>`` and ``<br>`` in them, so ``<``, ``>`` and ``&`` become entities, and
    invisible controls (a newline, ESC from a file name) their escapes."""
    line = str(text)
    line = line if line.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    return html.escape(line, quote=False)
