"""What a job and its workers look like from outside: statuses, results, a live table."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError
from ddlkit.launch import runs

if TYPE_CHECKING:
    from ddlkit.launch.job import Job

STATES = ("starting", "running", "finished", "failed", "stopped")


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """One worker's state at one moment.

    ``exit_code`` is the process's return code (negative: killed by ``signal``).
    ``current_step`` comes from the job's ``progress_fn`` (the metrics layer).
    """

    name: str
    state: str
    pid: int | None
    exit_code: int | None = None
    signal: str | None = None
    current_step: int | None = None
    started_at: float | None = None
    ended_at: float | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ConfigError(f"worker state {self.state!r} is not one of {STATES}.")

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "current_step": self.current_step,
            "started_at": runs.iso(self.started_at),
            "ended_at": runs.iso(self.ended_at),
        }

    def _row(self, now: float) -> list[object]:
        end = self.ended_at if self.ended_at is not None else now
        seconds = None if self.started_at is None else f"{end - self.started_at:.1f}"
        code = self.signal or self.exit_code
        return [self.name, self.state, self.pid, self.current_step, code, seconds]


_STATUS_HEADERS = ("worker", "state", "pid", "step", "exit", "seconds")


def _status_rows(statuses: Mapping[str, WorkerStatus]) -> list[list[object]]:
    now = time.time()
    return [s._row(now) for s in statuses.values()]


@dataclasses.dataclass(frozen=True)
class JobResult:
    """How a job ended: ``state`` is finished, failed or stopped; one status per worker."""

    run_id: str
    run_dir: Path
    state: str
    workers: Mapping[str, WorkerStatus]
    started_at: float
    ended_at: float

    @property
    def ok(self) -> bool:
        return self.state == "finished"

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {name: s.exit_code for name, s in self.workers.items()}

    @property
    def duration(self) -> float:
        return self.ended_at - self.started_at

    def _repr_html_(self) -> str:
        caption = f"run {self.run_id}: {self.state} after {self.duration:.1f} s"
        return html_table(_STATUS_HEADERS, _status_rows(self.workers), caption)


class StatusTable:
    """The job's worker table, read afresh every time it is shown.

    In a notebook, ``h = display(job.status_table(), display_id=True)`` and later
    ``h.update(job.status_table())`` (or re-running the cell) shows the current states.
    """

    def __init__(self, job: Job) -> None:
        self.job = job

    def _repr_html_(self) -> str:
        caption = f"run {self.job.run_id}: {self.job.state}"
        return html_table(_STATUS_HEADERS, _status_rows(self.job.status()), caption)

    def __repr__(self) -> str:
        return text_table(_STATUS_HEADERS, _status_rows(self.job.status()))
