"""Text users control (tags, notes, dataset, class, model and op names), made safe to show.

    st.caption(f"Tags: {escape_markdown(tag)}")     # shown as typed, never as Markdown

Streamlit renders Markdown (and its own ``:color[...]``, ``:material/...:`` and ``$...$``) in
st.markdown, st.caption, st.info and friends, and in widget labels; a tag ``[click](https://x)``
would become a link. CSV downloads are made safe where they are built (``reports.spreadsheet``), Plotly labels by
``contract.printable.plotly_text``.
"""

from __future__ import annotations

import re

# Characters that start Markdown (or Streamlit's LaTeX) anywhere in a line. Escaped, they are text;
# the rest of ASCII punctuation is left alone so that ordinary messages read the same.
_ALWAYS = re.compile(r"([\\`*~\[<$&])")
# "_" emphasises only next to a space or punctuation ("test_resnet" is safe, "_x_" is not).
_LOOSE_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
# Block markers count only at the start of a line: a heading, quote, list item, rule or table.
_LEADING_MARK = re.compile(r"^([#>+=|-])")
_LEADING_NUMBER = re.compile(r"^(\d+)([.)])")  # "1. " or "1) " starts a numbered list
# Streamlit's shortcodes (":smile:", ":material/home:", ":red[...]") and GitHub-flavoured Markdown's
# bare links (https://x, www.x, a@x) are found after escapes are undone, so a backslash does not stop
# them; an invisible word joiner after the ":", "@" or "www" does. "Error: text" is left as it is.
_WORD_JOINER = "\u2060"
_SHORTCODE_OR_LINK = re.compile(r"(?i)(:(?=[a-z_+/-]|[0-9]+:)|@|\bwww(?=\.))")  # not "host:8501"


def escape_markdown(text: object) -> str:
    """``text`` shown literally inside Markdown: what the user typed is what is shown, on one line."""
    escaped = " ".join(str(text).split())  # a line break would start a new block
    # ESC, bidi overrides and other invisible controls (from file names) are shown as their escapes
    escaped = escaped if escaped.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in escaped)
    escaped = _ALWAYS.sub(r"\\\1", escaped)
    escaped = _LOOSE_UNDERSCORE.sub(r"\\_", escaped)
    escaped = _LEADING_MARK.sub(r"\\\1", escaped)
    escaped = _LEADING_NUMBER.sub(r"\1\\\2", escaped)
    return _SHORTCODE_OR_LINK.sub(lambda m: m.group(1) + _WORD_JOINER, escaped)
