"""Horovod: one ``horovodrun`` process that starts the ranks and names them.

``horovodrun`` starts the ranks itself, so the launcher cannot pin them: each local rank
pins itself in ``ddlkit.horovod.init()`` to its share of the cores passed in
``DDLKIT_RANK_CPUS`` (CPU-only, on this machine only). Each rank renames itself
``rank-N`` (:func:`ddlkit.contract.rank_name`), so its metrics and report carry that name;
the launcher's progress for ``horovodrun`` is its slowest rank's step.

Transport (``RunConfig.horovod_transport``): ``auto`` runs the ranks of this machine over
MPI when this Horovod was built with it and ``mpirun`` is on PATH (``horovodrun --mpi``,
Horovod's own choice when neither flag is given), else over Gloo; other hosts always get
Gloo (``horovodrun`` reaches them over SSH itself). ``gloo`` and ``mpi`` ask for one.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ddlkit import contract
from ddlkit.cluster import format_hosts, horovod_slots
from ddlkit.errors import ConfigError
from ddlkit.horovod import pinning
from ddlkit.launch import devices as dev
from ddlkit.strategies.base import Planner, Strategy

if TYPE_CHECKING:
    from ddlkit.cluster import ClusterSpec
    from ddlkit.launch.spec import WorkerSpec
    from ddlkit.strategies.base import RunConfig

START_TIMEOUT = 60  # seconds horovodrun waits for every host to start its ranks
NOT_FOUND = (
    "horovodrun was not found on PATH, so the horovod strategy cannot start. "
    "Fix: build and install it with scripts/build-horovod.sh .venv/bin/python "
    "(make lab does it; docs/horovod.md)."
)


TRANSPORTS = ("auto", "gloo", "mpi")
# Open MPI's progress engine polls while a rank waits: Horovod's background thread, waiting
# in MPI for the other rank, spins on the core the rank's TensorFlow computes on (one core a
# rank here). With mpi_yield_when_idle the progress loop calls sched_yield() after every poll
# that found nothing (Open MPI 4.1, opal/runtime/opal_progress.c): it still polls, but a
# runnable thread of the same core (the rank's TensorFlow) goes first. Open MPI turns it on
# by itself only on an oversubscribed node, which -np 2 on 2 slots is not.
MPI_ARGS = "--mca mpi_yield_when_idle 1"
# The launcher sets PYTHONUNBUFFERED=1 for its workers, and horovodrun exports it to the
# ranks. Unbuffered, print() writes its text and its newline apart, and Open MPI tags each
# piece (--tag-output): "[1,0]<stdout>:line[1,0]<stdout>: 0". The ranks run buffered
# instead, as under a hand-typed mpirun: print(..., flush=True) shows a line at once.
RANK_MPI_ARGS = f"{MPI_ARGS} -x PYTHONUNBUFFERED="
NO_MPI = (
    "horovod_transport='mpi', but {why}. Fix: install Open MPI (apt-get install openmpi-bin "
    "libopenmpi-dev; system-packages.txt) and rebuild Horovod with it "
    "(scripts/build-horovod.sh --mpi .venv/bin/python), or use horovod_transport='gloo'."
)


def transport(config: RunConfig, mpi: str | None) -> str:
    """'mpi' or 'gloo' for this config; `mpi` is None when MPI can be used, else why not."""
    if config.horovod_transport == "mpi":
        if mpi is not None:
            raise ConfigError(NO_MPI.format(why=mpi))
        return "mpi"
    if config.horovod_transport == "auto" and mpi is None and not config.remote:
        return "mpi"
    return "gloo"


def horovodrun_argv(config: RunConfig, horovodrun: str, via: str = "gloo") -> list[str]:
    """horovodrun's command for `config`; `via` is the transport ('gloo' or 'mpi')."""
    hosts = format_hosts(config.hosts) if config.hosts else f"localhost:{config.workers}"
    flags = ["--mpi", f"--mpi-args={RANK_MPI_ARGS}"] if via == "mpi" else ["--gloo"]
    remote = []
    if config.remote:
        remote = ["--start-timeout", str(START_TIMEOUT)]
        if config.network_interface:
            remote += ["--network-interface", config.network_interface]
    return [
        horovodrun,
        "-np",
        str(config.workers),
        "-H",
        hosts,
        *flags,
        *remote,
        config.python,
        str(config.script),
        *config.args,
    ]


def find_horovodrun(python: str) -> str | None:
    """horovodrun next to `python` (the venv's), else on PATH."""
    beside = Path(python).parent / "horovodrun"
    if beside.is_file():
        return str(beside)
    return shutil.which("horovodrun")


@cache
def mpi_unavailable(python: str) -> str | None:
    """None when `python`'s Horovod was built with MPI and mpirun is on PATH, else why not.

    Asks Horovod's own check (``horovod.common.util.mpi_built``) in a child process of that
    Python: the kit's patched Horovod answers from the compiled library in about 0.4 s.
    """
    probe = "from horovod.common.util import mpi_built; print(bool(mpi_built()))"
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"Horovod's MPI check in {python} failed ({e})"
    if proc.returncode != 0:
        return f"{python} could not import Horovod ({proc.stderr.strip()[-200:]})"
    if proc.stdout.strip() != "True":
        return f"the Horovod of {python} was built without MPI"
    if shutil.which("mpirun") is None:
        return "mpirun is not on PATH"
    return None


class Horovod(Strategy):
    name = "horovod"
    title = "Horovod"
    needs_horovodrun = True
    speakers = (contract.rank_name(0),)
    api_modules = ("horovod", "ddlkit.horovod")  # hvd.init(), dkh.init()
    written_with = "hvd.init() (import horovod.tensorflow.keras as hvd)"

    def workers(
        self, config: RunConfig, cluster: ClusterSpec | None, planner: Planner
    ) -> list[WorkerSpec]:
        if planner.horovodrun is None:
            raise ConfigError(NOT_FOUND)
        cores = planner.cores
        pin = config.pin_cores and not planner.gpus and not config.remote
        pin = pin and len(cores) >= config.workers
        env = pinning.rank_cpus_env(cores, config.workers) if pin else {}
        via = transport(config, planner.mpi_unavailable)
        command = horovodrun_argv(config, planner.horovodrun, via)
        devices = dev.Devices(None, None, None)
        return [planner.spec(contract.HOROVODRUN, env, devices, command=command)]

    def used_hosts(self, config: RunConfig, cluster: ClusterSpec | None) -> dict[str, list]:
        assert config.hosts is not None
        return {h.name: [] for h in horovod_slots(config.hosts, config.workers).hosts}

    def check(self, config: RunConfig) -> None:
        if config.horovod_transport == "mpi" and config.remote:
            raise ConfigError(
                "horovod_transport='mpi' with other hosts: ddlkit runs Horovod on other hosts "
                "over Gloo only. Fix: use horovod_transport='auto' or 'gloo'."
            )

    def rows(self, config: RunConfig) -> list[tuple[str, str]]:
        meaning = {
            "auto": "MPI here when Horovod has it, else Gloo",
            "gloo": "Gloo",
            "mpi": "MPI",
        }
        return [("transport", f"{config.horovod_transport} ({meaning[config.horovod_transport]})")]

    def remote_rows(self, config: RunConfig) -> list[tuple[str, str]]:
        return [("network interface", config.network_interface or "horovodrun's")]

    def progress_workers(self, worker: str, reporting: Sequence[str]) -> list[str]:
        if worker == contract.HOROVODRUN:  # one process for all ranks: the slowest rank's
            return [w for w in reporting if contract.is_rank_name(w)]
        return [worker]

    def dashboard_workers(self, names: Sequence[str]) -> list[str] | None:
        return None  # the ranks name themselves once they run
