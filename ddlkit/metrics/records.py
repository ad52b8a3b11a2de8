"""Metric records: one training measurement per JSON line (see docs/design.md).

A :class:`Record` is pure data that checks itself. It travels as one line of
JSON (never pickle): workers append it to their JSONL file and send it to the
collector; :meth:`Record.from_json` is the only way back, and it refuses
anything that is not exactly a version-1 record.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ddlkit import contract
from ddlkit.errors import RecordError

VERSION = 1
KINDS = ("step", "epoch", "event")
WORKER_PATTERN = contract.NAME_PATTERN  # the launcher's rule: a record is any worker's
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_ENTRIES = 64
MAX_TEXT = 1000

_OPTIONAL_FLOATS = ("loss", "accuracy", "examples_per_sec", "step_time")
_FIELDS = (
    "v",
    "kind",
    "worker",
    "step",
    "epoch",
    "loss",
    "accuracy",
    "examples_per_sec",
    "step_time",
    "wall_time",
    "seq",
    "metrics",
    "name",
    "info",
)
# Version-1 records written before `name` and `info` existed are still valid.
_REQUIRED = frozenset(_FIELDS) - {"name", "info"}

InfoValue = str | int | float | bool | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Record:
    """One measurement from one worker.

    - ``kind``: ``"step"`` (one or more training steps), ``"epoch"`` (end of an
      epoch) or ``"event"`` (``name`` says what happened, ``info`` holds details).
    - ``step``: training steps this worker has completed so far, across epochs
      (1 after the first step); ``epoch``: the 0-based epoch index.
    - ``loss``, ``accuracy``: as the training loop reports them (Keras: the
      running mean over the epoch so far), or None.
    - ``examples_per_sec``, ``step_time`` (seconds per step): throughput, or None.
    - ``wall_time``: the worker's ``time.time()`` when the record was made.
    - ``seq``: this worker's record counter, from 0, so the reader can detect
      lost records.
    - ``metrics``: any further numeric values (e.g. ``val_loss``).
    """

    kind: str
    worker: str
    step: int
    epoch: int
    wall_time: float
    seq: int
    loss: float | None = None
    accuracy: float | None = None
    examples_per_sec: float | None = None
    step_time: float | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    name: str | None = None
    info: Mapping[str, InfoValue] = dataclasses.field(default_factory=dict)
    v: int = VERSION

    def __post_init__(self) -> None:
        if self.v != VERSION:
            raise RecordError(
                f"record version {self.v!r} is not supported (this ddlkit reads version "
                f"{VERSION}). Fix: run the same ddlkit version on workers and in the notebook."
            )
        if self.kind not in KINDS:
            raise RecordError(
                f"record kind {self.kind!r} is unknown. Fix: use one of {', '.join(KINDS)}."
            )
        if not isinstance(self.worker, str) or not WORKER_PATTERN.fullmatch(self.worker):
            raise RecordError(
                f"worker name {self.worker!r} is not valid. Fix: use 1-64 letters, digits, "
                f"'_', '.' or '-' not starting with '.' or '-', e.g. 'worker-0'."
            )
        for field in ("step", "epoch", "seq"):
            value = getattr(self, field)
            if not _is_int(value) or value < 0:
                raise RecordError(
                    f"record field {field!r} must be an integer >= 0, got {value!r}. "
                    f"Fix: pass a plain non-negative int."
                )
        if not _is_number(self.wall_time) or not math.isfinite(self.wall_time):
            raise RecordError(
                f"record field 'wall_time' must be a finite number (time.time()), got "
                f"{self.wall_time!r}. Fix: pass time.time()."
            )
        object.__setattr__(self, "wall_time", float(self.wall_time))
        for field in _OPTIONAL_FLOATS:
            value = getattr(self, field)
            if value is not None and not _is_number(value):
                raise RecordError(
                    f"record field {field!r} must be a number or None, got {value!r}. "
                    f"Fix: convert it with float()."
                )
            object.__setattr__(self, field, None if value is None else float(value))
        object.__setattr__(self, "metrics", MappingProxyType(_check_metrics(self.metrics)))
        object.__setattr__(self, "info", MappingProxyType(_check_info(self.info)))
        if self.kind == "event":
            if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
                raise RecordError(
                    f"an event record needs a name of 1-64 letters, digits, '_', '.' or '-' "
                    f"starting with a letter or '_', got {self.name!r}. Fix: e.g. "
                    f"name='train_begin'."
                )
        elif self.name is not None:
            raise RecordError(
                f"only event records have a name; this {self.kind} record has "
                f"name={self.name!r}. Fix: leave name=None or use kind='event'."
            )

    def to_dict(self) -> dict[str, Any]:
        """The record as a plain JSON-ready dict, fields in the documented order."""
        out = {field: getattr(self, field) for field in _FIELDS}
        out["metrics"] = dict(self.metrics)
        out["info"] = dict(self.info)
        return out

    def to_json(self) -> str:
        """One line of JSON, no trailing newline. NaN and infinity stay as Python's
        ``NaN``/``Infinity`` literals (a diverged loss must stay visible)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """Check that ``data`` has exactly the record's fields, then build the record."""
        if not isinstance(data, Mapping):
            raise RecordError(
                f"a record must be a JSON object, got {type(data).__name__}. "
                f"Fix: send one object per line."
            )
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise RecordError(
                f"record has unknown field(s) {unknown}. Fix: send only the fields of "
                f"docs/design.md ('Metric record'), or upgrade ddlkit where it is read."
            )
        missing = sorted(_REQUIRED - set(data))
        if missing:
            raise RecordError(
                f"record is missing field(s) {missing}. Fix: build records with "
                f"ddlkit.metrics.Record and write them with Record.to_json()."
            )
        return cls(**{key: data[key] for key in data})

    @classmethod
    def from_json(cls, line: str | bytes) -> Record:
        """Parse one JSON line (bytes or str) into a checked record."""
        try:
            data = json.loads(line, object_pairs_hook=_no_duplicates)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordError(
                f"record line is not valid JSON ({exc}). Fix: write one JSON object per line "
                f"with Record.to_json()."
            ) from exc
        return cls.from_dict(data)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RecordError(f"record has the key {key!r} twice. Fix: write each field once.")
        out[key] = value
    return out


def _check_key(key: Any, where: str) -> None:
    if not isinstance(key, str) or not NAME_PATTERN.fullmatch(key):
        raise RecordError(
            f"{where} key {key!r} is not valid. Fix: use 1-64 letters, digits, '_', '.' or '-' "
            f"starting with a letter or '_', e.g. 'val_loss'."
        )


def _check_metrics(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise RecordError(
            f"record field 'metrics' must be a mapping of names to numbers, got "
            f"{type(metrics).__name__}. Fix: pass e.g. {{'val_loss': 0.3}}."
        )
    if len(metrics) > MAX_ENTRIES:
        raise RecordError(
            f"record field 'metrics' has {len(metrics)} entries, more than {MAX_ENTRIES}. "
            f"Fix: report fewer metrics per record."
        )
    out: dict[str, float] = {}
    for key, value in metrics.items():
        _check_key(key, "metrics")
        if not _is_number(value):
            raise RecordError(
                f"metric {key!r} must be a number, got {value!r}. Fix: convert it with float()."
            )
        out[key] = float(value)
    return out


def _check_info(info: Any) -> dict[str, InfoValue]:
    if not isinstance(info, Mapping):
        raise RecordError(
            f"record field 'info' must be a mapping, got {type(info).__name__}. "
            f"Fix: pass keyword arguments of plain values (str, int, float, bool, None)."
        )
    if len(info) > MAX_ENTRIES:
        raise RecordError(
            f"record field 'info' has {len(info)} entries, more than {MAX_ENTRIES}. "
            f"Fix: pass fewer fields."
        )
    out: dict[str, InfoValue] = {}
    for key, value in info.items():
        _check_key(key, "info")
        if isinstance(value, str):
            if len(value) > MAX_TEXT:
                raise RecordError(
                    f"info field {key!r} is {len(value)} characters long, more than "
                    f"{MAX_TEXT}. Fix: shorten it (long text belongs in the worker's log)."
                )
        elif value is not None and not isinstance(value, int | float):
            raise RecordError(
                f"info field {key!r} must be a str, int, float, bool or None, got "
                f"{type(value).__name__}. Fix: convert it, e.g. with str()."
            )
        out[key] = value
    return out
