"""What :func:`ddlkit.data.load` returns: the arrays plus where they came from."""

from __future__ import annotations

import html
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ddlkit.data.catalog import NAMES, SOURCES
from ddlkit.errors import ConfigError

STANDIN_NOTICE = (
    "synthetic stand-in: these are NOT CIFAR-10 images; "
    "never report results on them as CIFAR-10 results"
)


@dataclass(frozen=True)
class DatasetInfo:
    """Where a loaded data set came from and what its labels mean."""

    name: str
    display_name: str
    source: str
    synthetic: bool
    num_classes: int
    class_names: tuple[str, ...]
    image_shape: tuple[int, ...]
    path: Path | None

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ConfigError(f"DatasetInfo.name={self.name!r}: must be one of {', '.join(NAMES)}.")
        if self.source not in SOURCES:
            raise ConfigError(
                f"DatasetInfo.source={self.source!r}: must be one of {', '.join(SOURCES)}."
            )
        if self.synthetic != (self.source == "synthetic"):
            raise ConfigError(
                f"DatasetInfo.synthetic={self.synthetic} contradicts source={self.source!r}: "
                "synthetic must be True exactly when the source is 'synthetic'."
            )
        if self.num_classes != len(self.class_names):
            raise ConfigError(
                f"DatasetInfo.num_classes={self.num_classes} but {len(self.class_names)} "
                "class names were given: they must agree."
            )
        if not self.image_shape or any(int(d) <= 0 for d in self.image_shape):
            raise ConfigError(f"DatasetInfo.image_shape={self.image_shape!r}: need positive sizes.")
        if self.path is not None and not isinstance(self.path, Path):
            object.__setattr__(self, "path", Path(self.path))

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs as shown in a notebook."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "class_names":
                value = ", ".join(value)
            out.append((f.name, "-" if value is None else str(value)))
        if self.synthetic:
            out.append(("warning", STANDIN_NOTICE))
        return out

    def _repr_html_(self) -> str:
        warn = "text-align:left;color:#b00;font-weight:bold"
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='{warn if k == 'warning' else 'text-align:left'}'>"
            f"{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        return f"<table><caption>{html.escape(self.display_name)}</caption>{body}</table>"


def _shape_line(arr: np.ndarray) -> str:
    return f"{arr.dtype}{list(arr.shape)}"


class Loaded(tuple):
    """``((x_train, y_train), (x_test, y_test))`` with an ``info`` attribute.

    It unpacks exactly like ``keras.datasets.<name>.load_data()``.
    """

    info: DatasetInfo

    def __new__(cls, train, test, info: DatasetInfo) -> Loaded:
        train, test = tuple(train), tuple(test)
        if len(train) != 2 or len(test) != 2:
            raise ConfigError("Loaded needs (x_train, y_train) and (x_test, y_test) pairs.")
        if not isinstance(info, DatasetInfo):
            raise ConfigError(f"Loaded.info must be a DatasetInfo, not {type(info).__name__}.")
        obj = super().__new__(cls, (train, test))
        obj.info = info
        return obj

    def __getnewargs__(self):
        return (self[0], self[1], self.info)

    @property
    def train(self) -> tuple[np.ndarray, np.ndarray]:
        return self[0]

    @property
    def test(self) -> tuple[np.ndarray, np.ndarray]:
        return self[1]

    def __repr__(self) -> str:
        (xtr, ytr), (xte, yte) = self
        return (
            f"Loaded({self.info.display_name} from {self.info.source}: "
            f"x_train {_shape_line(xtr)}, y_train {_shape_line(ytr)}, "
            f"x_test {_shape_line(xte)}, y_test {_shape_line(yte)})"
        )

    def _repr_html_(self) -> str:
        (xtr, ytr), (xte, yte) = self
        arrays = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td>{html.escape(_shape_line(a))}</td></tr>"
            for k, a in (("x_train", xtr), ("y_train", ytr), ("x_test", xte), ("y_test", yte))
        )
        return self.info._repr_html_() + f"<table>{arrays}</table>"
