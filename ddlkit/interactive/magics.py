"""``%px``, ``%%px`` and ``%autopx`` on live workers: ipyparallel's own magics, with the cell
run by :meth:`ddlkit.interactive.session.Workers.run_cell` (output labelled with each
worker's name, a dead worker or a lone collective reported), so a magic does nothing the
Python API cannot. Of ipyparallel's options, ``--targets`` chooses the workers (``--targets
1``, ``--targets 0,1``, ``--targets ::2``); a cell always runs to its end with its output
under it, so ``--noblock`` and ``--local`` are refused, naming the Python call instead.
"""

from __future__ import annotations

from typing import Any

from ipyparallel.client.magics import ParallelMagics

from ddlkit.errors import ConfigError


class WorkerMagics(ParallelMagics):
    """ipyparallel's ParallelMagics whose execution is the workers'."""

    def __init__(self, shell: Any, workers: Any, suffix: str = "") -> None:
        self.workers = workers
        super().__init__(shell, workers.client[:], suffix)

    def parallel_execute(self, cell: str, block: Any = None, *args: Any, **kwargs: Any) -> Any:
        if block is False:
            raise ConfigError(
                "%%px --noblock or --local: a cell on live workers runs to its end, its output "
                "under it. Fix: drop the option; for a run in the background use "
                "workers.client[:].execute(code, block=False) (ipyparallel's AsyncResult)."
            )
        view = self.workers.client[:] if self.view is None else self.view
        targets = view.targets
        ids = None if targets in (None, "all") else targets
        self.workers.run_cell(cell, ids)


def register(workers: Any, suffix: str = "") -> WorkerMagics:
    """Register the magics for ``workers`` in the running IPython (they replace earlier ones)."""
    from IPython import get_ipython

    shell = get_ipython()
    magics = WorkerMagics(shell, workers, suffix)
    shell.magics_manager.register(magics)
    return magics
