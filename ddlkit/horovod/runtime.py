"""Starting Horovod in a worker: :func:`init` does what every ddlkit rank needs.

::

    import ddlkit.horovod as dkh
    hvd = dkh.init()          # names the rank, ties it to horovodrun, hvd.init(), its GPU

Under ``horovodrun`` every rank gets ``DDLKIT_WORKER=rank-N`` (its metrics file, its
dashboard row, its ``report()`` file) and dies with the launcher
(:mod:`ddlkit.horovod.ranks`). When the launcher gave one core list per local rank
(``DDLKIT_RANK_CPUS``), the rank pins itself to its own and sizes TensorFlow's thread
pools to match, and the threads ``hvd.init()`` starts run at idle priority on that core
(:mod:`ddlkit.horovod.pinning`). On a host with GPUs each rank sees only
``gpus[hvd.local_rank()]``, with memory growth (:mod:`ddlkit.horovod.gpus`): without it
every rank would put its work on GPU 0. When no ddlkit launcher gave a run directory
(``horovodrun`` typed by hand), rank 0 picks one and broadcasts it, so all ranks
write one run.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from ddlkit.contract import RUN_DIR_VAR
from ddlkit.errors import DdlkitError
from ddlkit.horovod import gpus, pinning, ranks

INSTALL_FIX = (
    "Fix: build and install it with `scripts/build-horovod.sh .venv/bin/python` from the "
    "repository (or `make lab`); the first build takes a few minutes, later ones install "
    "the cached wheel in seconds."
)


class HorovodMissingError(DdlkitError, ImportError):
    """Horovod is not installed in this environment."""


def available() -> bool:
    """True when ``horovod.tensorflow`` can be found (does not import it)."""
    return importlib.util.find_spec("horovod") is not None


def require() -> None:
    """Raise :class:`HorovodMissingError` with the fix when Horovod is not installed."""
    if not available():
        raise HorovodMissingError(
            "Horovod is not installed in this environment, so this notebook or script "
            f"cannot run. {INSTALL_FIX}"
        )


def hvd() -> ModuleType:
    """``horovod.tensorflow``, with the install fix in the error when it is missing."""
    require()
    import horovod.tensorflow as module

    return module


def start() -> tuple[ModuleType, tuple[int, ...] | None]:
    """Pin this rank to its cores when ``DDLKIT_RANK_CPUS`` asks, then ``hvd.init()``.

    Call it before TensorFlow's first op. Returns ``horovod.tensorflow`` and the rank's
    cores (None: not pinned).
    """
    cpus = pinning.pin_rank()  # before hvd.init() and TensorFlow's first op
    module = hvd()
    before = pinning.thread_ids()
    module.init()
    if cpus is not None:
        # The threads hvd.init() started (Horovod's background thread, MPI's or Gloo's) share
        # this rank's core with its compute, and Horovod's wakes every cycle (1 ms) to
        # negotiate: each wake-up preempted the compute mid-kernel. At idle priority they run
        # when the compute waits for them: one rank a core trained faster this way, two
        # ranks within their spread (docs/design.md, engineering notes).
        pinning.idle_priority(pinning.thread_ids() - before)
    return module, cpus


def init(watch: bool = True, pin_gpu: bool = True) -> ModuleType:
    """Set up this rank (see the module docstring), ``hvd.init()``, return ``horovod.tensorflow``.

    ``watch=False`` leaves out tying the rank's life to ``horovodrun``; ``pin_gpu=False``
    leaves the visible GPUs alone (when each rank was already given its own).
    """
    ranks.setup_rank(watch=watch)
    module, _ = start()
    if pin_gpu:  # this rank sees only gpus[local_rank]; no GPUs: nothing changes
        gpus.pin_gpu(module.local_rank(), module.local_size())
    if ranks.rank_of() is not None and not os.environ.get(RUN_DIR_VAR) and module.size() > 1:
        from ddlkit.metrics.reporter import local_run_dir

        chosen = str(local_run_dir()) if module.rank() == 0 else None
        os.environ[RUN_DIR_VAR] = module.broadcast_object(chosen, root_rank=0)
    return module
