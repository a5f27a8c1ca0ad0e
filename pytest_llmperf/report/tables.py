"""Markdown tables as the seeds print them: padded columns, every cell escaped; and text that markdown shows as is."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

#: ASCII punctuation that opens or closes inline markdown where a test id may hold it: a link or image (`[x](y)`),
#: raw HTML (`<b>`), emphasis, code, an entity (`&amp;`), GFM's strikethrough and table cell, GitHub's math.
#: CommonMark lets a backslash escape any ASCII punctuation, so escaping these never shows a backslash.
_INLINE = frozenset("\\`*[]<>&~$|")


def cell(value: Any) -> str:
    """Text for one cell of the terminal's table: a `|` (a test id may hold one) would end the cell, a newline the
    row. The terminal shows it as it is: nothing else is escaped."""
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def markdown_text(value: Any) -> str:
    """`value` as markdown that GitHub shows as the same text (a test id `t[[x](y)]` not as a link, `<b>` not as
    bold), one line: every character of _INLINE escaped, and `_` where it could delimit emphasis (not inside a
    word, as in test_decode); a newline becomes a space."""
    text = str(value).replace("\r", " ").replace("\n", " ")
    out = []
    for i, char in enumerate(text):
        inside_word = 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        out.append("\\" + char if char in _INLINE or (char == "_" and not inside_word) else char)
    return "".join(out)


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *, markdown: bool = True) -> str:
    """A table with padded columns, like the seeds'; every cell escaped: as markdown text (`markdown_text`), or
    for the terminal only its `|` (`cell`)."""
    escape = markdown_text if markdown else cell
    header = [escape(h) for h in header]
    rows = [[escape(c) for c in r] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
