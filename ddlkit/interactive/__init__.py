"""Live workers for a notebook (``dk.workers``): cells that run on every worker.

Modules: :mod:`.plan` (the job: engines and their controller, or srun's tasks; pure),
:mod:`.start` (the checks, the job started, the wait for the engines), :mod:`.engine` and
:mod:`.server` (a worker process's program), :mod:`.session` (`Workers`: run a cell, kill,
restart, close), :mod:`.cells` (one cell's run and bounded wait),
:mod:`.output` (labelled output and the failure messages), :mod:`.magics` (``%%px``),
:mod:`.script` (the cells as one script). Names load on first use.
"""

from __future__ import annotations

from ddlkit._lazy import lazy_attributes

_LAZY = {
    "Workers": "ddlkit.interactive.session",
    "workers": "ddlkit.interactive.session",
    "Transcript": "ddlkit.interactive.script",
    "CellError": "ddlkit.interactive.output",
    "CollectiveWaitError": "ddlkit.interactive.output",
    "WorkerDiedError": "ddlkit.interactive.output",
}
__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)
