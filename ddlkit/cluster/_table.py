"""Display helpers shared by the cluster objects: a text/HTML table mixin and plurals."""

from __future__ import annotations

import html


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
        cells = [list(headers)] + [[str(c) for c in row] for row in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([caption, *lines])

    def _repr_html_(self) -> str:
        caption, headers, rows = self._table()
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows
        )
        return (
            f"<table><caption>{esc(caption)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
