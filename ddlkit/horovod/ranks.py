"""Per-rank set-up for processes started by ``horovodrun`` (standard library only).

``horovodrun`` gives every rank the launcher's environment plus ``HOROVOD_RANK``
and friends (``OMPI_COMM_WORLD_RANK`` under ``--mpi``), so two things a ddlkit
worker needs are not there by themselves:

- its own name: ``DDLKIT_WORKER`` names the launcher (``horovodrun``) in every rank,
  so :func:`rank_env` gives ``rank-<HOROVOD_RANK>``, the name the metrics files, the
  dashboard rows and ``report()`` use;
- dying with the launcher: :func:`die_with_launcher` makes the rank end when the
  ``horovodrun`` that started it ends, however it ends (SIGKILL included). Horovod's
  own clean-up (a middleman process that SIGTERMs the rank when it sees the launcher's
  pipe close) does not cover a middleman killed with it, or a rank that ignores
  SIGTERM; this does: the kernel's parent-death signal for the rank's parent, and a
  daemon thread that watches the launcher's pid.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ddlkit import procs
from ddlkit.contract import WORKER_VAR
from ddlkit.contract import rank_name as rank_name  # re-exported: ddlkit.horovod.rank_name
from ddlkit.errors import ConfigError

RANK_VAR = "HOROVOD_RANK"
# horovodrun --gloo sets HOROVOD_RANK; under horovodrun --mpi the MPI launcher sets its own.
RANK_VARS = (RANK_VAR, "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LAUNCHER_NAME = "horovodrun"  # the program (its worker name is contract.HOROVODRUN)
WATCH_INTERVAL = 0.5
_PR_SET_PDEATHSIG = 1


def rank_of(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank: ``HOROVOD_RANK`` (Gloo), else OpenMPI's or MPICH's rank variable.

    None when no launcher set one (not started by horovodrun).
    """
    env = os.environ if environ is None else environ
    var = next((v for v in RANK_VARS if v in env), None)
    if var is None:
        return None
    value = env[var]
    if not value.isdigit():
        raise ConfigError(
            f"{var}={value!r} is not a rank. Fix: start ranks with horovodrun, which "
            f"sets it to 0, 1, ...; do not set it by hand."
        )
    return int(value)


def rank_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to set in a rank (pure): ``{"DDLKIT_WORKER": "rank-N"}``, or ``{}``."""
    rank = rank_of(environ)
    return {} if rank is None else {WORKER_VAR: rank_name(rank)}


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def is_launcher(argv: list[str]) -> bool:
    """True for the argv of ``horovodrun ...`` or ``python .../horovodrun ...``."""
    return any(Path(a).name == LAUNCHER_NAME for a in argv[:2])


def find_launcher(pid: int | None = None, max_depth: int = 8) -> int | None:
    """The pid of the nearest ``horovodrun`` among ``pid``'s ancestors (default: this process)."""
    pid = os.getpid() if pid is None else pid
    for _ in range(max_depth):
        pid = _parent(pid)
        if pid <= 1:
            return None
        if is_launcher(_cmdline(pid)):
            return pid
    return None


_alive = procs.alive  # one /proc check (ddlkit.procs)


def _set_parent_death_signal(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True


def die_with_launcher(
    launcher: int | None = None, interval: float = WATCH_INTERVAL
) -> threading.Thread | None:
    """End this rank with SIGKILL when its parent or its ``horovodrun`` ends.

    ``launcher``: the pid to watch (default: the nearest ``horovodrun`` ancestor).
    Returns the watching thread, or None when there is no launcher to watch (a rank
    started by hand); the parent-death signal is set either way.
    """
    parent = os.getppid()
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    launcher = find_launcher() if launcher is None else launcher
    if launcher is None:
        return None

    def watch() -> None:
        while _alive(launcher):
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="ddlkit-launcher-watch", daemon=True)
    thread.start()
    return thread


def setup_rank(watch: bool = True) -> str | None:
    """Name this rank (``DDLKIT_WORKER=rank-N``) and tie its life to the launcher's.

    Call it first thing in a worker script, before any reporter is created; outside
    horovodrun it does nothing and returns None. Returns the rank's worker name.
    """
    env = rank_env()
    if not env:
        return None
    os.environ.update(env)
    if watch:
        die_with_launcher()
    return env[WORKER_VAR]
