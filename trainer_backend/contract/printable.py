"""Text from the outside world (file and folder names, paths, driver messages) made safe to print.

    print(f"error: {one_line(exc)}")            # a newline or ESC in a file name cannot forge a line
    f"cannot read image {shown_name(path)}"     # as it is when printable, else quoted and escaped

A file name may hold any byte but "/" and NUL: a newline would start a second ``error:`` line, an
ANSI escape would recolour or clear the user's terminal, a bidi override would reorder the text.
Each such character is written as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``) instead.
"""

from __future__ import annotations


def _escaped(char: str) -> str:
    return char if char.isprintable() else repr(char)[1:-1]


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
    return text if text.isprintable() else repr(text)
