"""A list of dataclass rows that shows as a table in a notebook and as text in a terminal."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ddlkit._tables import html_table, text_table


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


class Table(list):
    """A plain list of dataclass rows, one column per field."""

    def columns(self) -> list[str]:
        return [f.name for f in fields(self[0])] if self else []

    def cells(self) -> list[list[str]]:
        return [[_cell(getattr(row, c)) for c in self.columns()] for row in self]

    def __str__(self) -> str:
        return text_table(self.columns(), self.cells())

    def _repr_html_(self) -> str:
        return html_table(self.columns(), self.cells())
