"""A list of dataclass rows that shows as a table in a notebook and as text in a terminal."""

from __future__ import annotations

import html
from dataclasses import fields
from typing import Any


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


class Table(list):
    """A plain list of dataclass rows, one column per field."""

    def columns(self) -> list[str]:
        return [f.name for f in fields(self[0])] if self else []

    def cells(self) -> list[list[str]]:
        return [[_cell(getattr(row, c)) for c in self.columns()] for row in self]

    def __str__(self) -> str:
        cols = self.columns()
        rows = self.cells()
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
        lines += [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.columns())
        body = "".join(
            "<tr>"
            + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>" for v in r)
            + "</tr>"
            for r in self.cells()
        )
        return f"<table><tr>{head}</tr>{body}</table>"
