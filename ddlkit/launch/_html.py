"""A tiny HTML table for the ``_repr_html_`` of launch objects (pure)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str = "") -> str:
    """An HTML table whose cells are escaped; ``None`` shows as an empty cell."""

    def cell(value: object) -> str:
        return "" if value is None else html.escape(str(value))

    head = "".join(f"<th style='text-align:left'>{cell(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left'>{cell(v)}</td>" for v in row) + "</tr>"
        for row in rows
    )
    cap = f"<caption style='text-align:left'>{cell(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def text_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """The same table as aligned plain text, for terminals and ``repr``."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
    lines = [[*headers], *cells]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
