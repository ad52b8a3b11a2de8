"""Tables for notebooks (HTML) and terminals (text): the one place the kit draws them.

Rows are sequences of plain values; ``None`` shows as an empty cell. Every
cell and header is HTML-escaped, so user strings (paths, host names) cannot
inject markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

_LEFT = " style='text-align:left'"


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def html_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    caption: str = "",
    *,
    left: bool = True,
) -> str:
    """An HTML table, cells escaped; ``left`` overrides JupyterLab's right-aligned cells."""
    style = _LEFT if left else ""
    head = "".join(f"<th{style}>{html.escape(_cell(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{style}>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
        for row in rows
    )
    cap = f"<caption{style}>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def text_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    caption: str = "",
    *,
    rule: bool = False,
) -> str:
    """The same table as aligned plain text; ``rule`` underlines the headers."""
    cells = [[_cell(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([caption, *lines] if caption else lines)
