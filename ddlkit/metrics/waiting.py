"""Waiting on a running job for something its records show: the one polling loop.

    wait_for(run, lambda records: ... or None, timeout=300, ended=..., late=...)

Used by :func:`ddlkit.lessons.ps.wait_for_step` (a step reached) and
:func:`ddlkit.lessons.faults.wait_for_backup` (an epoch backed up). Every waiter gets the same
failure handling: the job's state is read before its records (so records written before
the end are all in), a job that ended raises its worker's failure first
(:meth:`Run.wait`), then a :class:`DdlkitError` saying it ended without the thing; after
`timeout` seconds a :class:`JobTimeoutError` (the workers keep running).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ddlkit.errors import DdlkitError, JobTimeoutError
from ddlkit.metrics.store import load_run

T = TypeVar("T")


def records_of(run: Any, worker: str | None = None) -> list:
    """A run's records (of `worker`, or all): from its collector while it runs, else from
    its JSONL files.

    Once the run has ended the files are the complete account: a worker writes each
    record to its file before sending it, and a killed worker's last ones may never
    have reached the collector.
    """
    if getattr(run, "collector", None) is not None and not run.job.done:
        return run.records(worker) if worker else run.records()
    records = load_run(run.run_dir)
    return [r for r in records if r.worker == worker] if worker else records


def wait_for(
    run: Any,
    found: Callable[[Sequence], T | None],
    *,
    timeout: float,
    ended: Callable[[Sequence], str],
    late: Callable[[Sequence], str],
    worker: str | None = None,
    poll: float = 0.2,
) -> T:
    """Poll `run`'s records (of `worker`, or all) until ``found(records)`` is not None;
    return it.

    A job that ended first: its failure is raised if a worker failed, else
    ``DdlkitError(ended(records))``; after `timeout` s: ``JobTimeoutError(late(records))``.
    The messages say the cause and the fix.
    """
    deadline = time.monotonic() + timeout
    while True:
        done = run.job.done  # read first: records written before the end are then all in
        records = records_of(run, worker)
        value = found(records)
        if value is not None:
            return value
        if done:
            run.wait()  # raises the failure, if there was one
            raise DdlkitError(ended(records))
        if time.monotonic() >= deadline:
            raise JobTimeoutError(late(records))
        time.sleep(poll)
