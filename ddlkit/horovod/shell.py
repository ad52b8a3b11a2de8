"""Metrics from a ``!horovodrun`` typed in a notebook cell.

``dk.launch.start(strategy="horovod")`` wires everything itself. When you type the
``horovodrun`` command yourself, the ranks need to know where to send their
metrics. :func:`shell_launch` starts a collector in this kernel and gives the
variables to put in front of the command::

    sh = dkh.shell_launch("cell")
    sh.dashboard()                       # live curves of every rank
    !env {sh.env} horovodrun -np 2 -H localhost:2 --gloo python train.py
    sh.finish()                          # close the collector; what arrived

``horovodrun`` passes its environment to every rank; each rank names itself
``rank-N`` (``ddlkit.horovod.init``), so the dashboard shows one row per rank.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit import contract, settings
from ddlkit._tables import html_table
from ddlkit.launch.runs import new_run_id
from ddlkit.metrics import Collector, CollectorStats


@dataclass
class ShellLaunch:
    """A run directory, a collector, and the env prefix for a hand-typed ``horovodrun``."""

    run_dir: Path
    collector: Collector
    _dashboard: object = field(default=None, repr=False)

    def variables(self) -> dict[str, str]:
        """The collector's variables, and PATH with this kernel's Python first.

        A kernel's PATH need not include its venv's ``bin``; with it first, ``horovodrun``
        and the ``python`` it starts are the kit's.
        """
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {**self.collector.env(), "PATH": path}

    @property
    def env(self) -> str:
        """``NAME=value ...`` for ``!env {sh.env} horovodrun ...`` (shell-quoted)."""
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in self.variables().items())

    @property
    def timeline(self) -> Path:
        """Where to ask for a timeline: ``--timeline-filename {sh.timeline}``."""
        return self.run_dir / "timeline.json"

    def dashboard(self, title: str | None = None):
        """The live dashboard of the ranks (one per launch; later calls return it)."""
        if self._dashboard is None:
            from ddlkit.metrics import Dashboard

            dashboard = Dashboard(title or f"horovodrun: {self.run_dir.name}", run_dir=self.run_dir)
            self._dashboard = dashboard.follow(self.collector)
        return self._dashboard

    def finish(self) -> CollectorStats:
        """Draw the final dashboard, close the collector, return what it received."""
        if self._dashboard is not None:
            self._dashboard.finish()
        self.collector.close()
        return self.collector.stats()

    def results(self) -> dict[str, dict]:
        """What each rank saved with ``report()`` (launch/_common.py), by rank name."""
        return contract.read_results(self.run_dir)

    def _repr_html_(self) -> str:
        rows = [
            ("run directory", str(self.run_dir)),
            *self.variables().items(),
            ("timeline", str(self.timeline)),
        ]
        return html_table(("setting", "value"), rows, caption="for !horovodrun")


def shell_launch(label: str = "horovodrun", runs_dir: str | Path | None = None) -> ShellLaunch:
    """A new run directory with a collector listening on loopback (see the module docstring)."""
    run_dir = Path(runs_dir or settings.runs_dir()) / new_run_id(label)
    run_dir.mkdir(parents=True, exist_ok=True)
    return ShellLaunch(run_dir=run_dir, collector=Collector(run_dir))
