"""Display helpers shared by the cluster objects: a text/HTML table mixin and plurals."""

from __future__ import annotations

from ddlkit._tables import html_table, text_table


def _plural(n: int, word: str) -> str:
    if n == 1 or word == "ps":
        return f"{n} {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


class _Table:
    """Mixin: ``__str__`` as a text table for the CLI, ``_repr_html_`` for notebooks."""

    def _table(self) -> tuple[str, tuple[str, ...], list[tuple[object, ...]]]:
        raise NotImplementedError

    def __str__(self) -> str:
        caption, headers, rows = self._table()
        return text_table(headers, rows, caption, rule=True)

    def _repr_html_(self) -> str:
        caption, headers, rows = self._table()
        return html_table(headers, rows, caption, left=False)
