"""Metric records for pure tests, built one way."""

from __future__ import annotations

import time

from ddlkit.metrics import Record


def step_record(
    worker: str,
    step: int,
    rate: float | None = None,
    *,
    seq: int | None = None,
    step_time: float | None = None,
) -> Record:
    """A step record of ``worker`` at ``step`` (its ``seq`` is the step unless given)."""
    return Record(
        kind="step",
        worker=worker,
        step=step,
        epoch=0,
        wall_time=time.time(),
        seq=step if seq is None else seq,
        examples_per_sec=rate,
        step_time=step_time,
    )
