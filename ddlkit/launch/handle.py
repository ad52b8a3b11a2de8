"""A started run: its job, cluster, metrics collector and dashboard (what ``start()`` returns).

Every way of starting a run (:func:`ddlkit.launch.run.start` on this machine or over SSH,
:func:`ddlkit.spark.submit.start` on Spark, :func:`ddlkit.interactive.workers`) hands back
this one object; it imports none of them.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from ddlkit import contract
from ddlkit.cluster import ClusterSpec
from ddlkit.errors import DdlkitError
from ddlkit.hosts.preflight import Preflight
from ddlkit.launch import runs
from ddlkit.launch.job import Job, JobResult, WorkerStatus
from ddlkit.metrics import Collector, Record

if TYPE_CHECKING:
    from ddlkit.launch.plan import LaunchConfig


class Run:
    """A started job with its cluster, its metrics collector and (once asked) its dashboard."""

    def __init__(
        self,
        config: LaunchConfig,
        cluster: ClusterSpec | None,
        job: Job,
        collector: Collector | None,
        preflight: Preflight | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.job = job
        self.collector = collector
        self.preflight = preflight  # what the hosts answered before the job started
        self.metric_workers: list[str] | None = None  # set: the dashboard's workers (Spark)
        self._dashboard = None

    # -- reading --------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.job.run_id

    @property
    def run_dir(self) -> Path:
        return self.job.run_dir

    def status(self) -> dict[str, WorkerStatus]:
        return self.job.status()

    def status_table(self):
        return self.job.status_table()

    def tail(self, worker: str, n: int = 20) -> str:
        if worker not in self.job.spec.names:  # a worker a scheduler started (Spark)
            return runs.tail(contract.log_path(self.run_dir, worker), n)
        return self.job.tail(worker, n)

    def records(self, worker: str | None = None) -> list[Record]:
        return self.collector.records(worker) if self.collector else []

    def results(self) -> dict[str, dict]:
        """What each worker saved with its final report (launch/_common.py)."""
        return contract.read_results(self.run_dir)

    def _process_status(self) -> dict[str, dict[str, object]]:
        return {
            name: {"state": s.state, "exit_code": s.exit_code}
            for name, s in self.job.status().items()
        }

    # -- acting ---------------------------------------------------------------------------
    def dashboard(self, title: str | None = None, **kwargs):
        """Show the live dashboard of this run (one per run; later calls return it)."""
        if self.collector is None:
            raise DdlkitError(
                f"run {self.run_id} was started with live=False, so no metrics reach this "
                f"notebook. Fix: start it with live=True, or plot its files afterwards with "
                f"dk.metrics.plot_run({str(self.run_dir)!r})."
            )
        if self._dashboard is None:
            from ddlkit.metrics import Dashboard

            title = title or f"{self.config.strategy} x{self.config.workers}: {self.run_id}"
            workers = self.metric_workers or self.config.strategy_impl.dashboard_workers(
                self.job.spec.names
            )
            if workers is not None:  # fixed colours, task order
                kwargs.setdefault("workers", workers)
            self._dashboard = Dashboard(title, run_dir=self.run_dir, **kwargs)
            self._dashboard.follow(self.collector, self._process_status)
        return self._dashboard

    def wait(self, timeout: float | None = None) -> JobResult:
        """Wait for the job; a failing worker stops the others and raises."""
        try:
            return self.job.wait(timeout=timeout)
        finally:
            if self.job.done:
                self._finish()

    def kill(self, worker: str, sig: int | None = None) -> None:
        """Kill one worker as a crash would (SIGKILL by default): see :meth:`Job.kill`."""
        if sig is None:
            self.job.kill(worker)
        else:
            self.job.kill(worker, sig)

    def stop(self) -> JobResult:
        try:
            return self.job.stop()
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._dashboard is not None:
            self._dashboard.finish()
        if self.collector is not None:
            self.collector.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _repr_html_(self) -> str:
        parts = [
            f"<b>run {html.escape(self.run_id)}</b> in <code>{html.escape(str(self.run_dir))}"
            "</code>",
            self.config._repr_html_(),
        ]
        if self.preflight is not None:
            parts.append(self.preflight._repr_html_())
        if self.cluster is not None:
            parts.append(self.cluster._repr_html_())
        parts.append(self.job.status_table()._repr_html_())
        return "<br>".join(parts)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, strategy={self.config.strategy!r}, state={self.job.state!r})"
