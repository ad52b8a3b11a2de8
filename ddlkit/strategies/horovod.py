"""Horovod (Gloo): one ``horovodrun`` process that starts the ranks and names them.

``horovodrun`` starts the ranks itself, so the launcher cannot pin them: each local rank
pins itself in ``ddlkit.horovod.init()`` to its share of the cores passed in
``DDLKIT_RANK_CPUS`` (CPU-only, on this machine only). Each rank renames itself
``rank-N`` (:func:`ddlkit.contract.rank_name`), so its metrics and report carry that name;
the launcher's progress for ``horovodrun`` is its slowest rank's step.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
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
    from ddlkit.launch.plan import LaunchConfig
    from ddlkit.launch.spec import WorkerSpec

START_TIMEOUT = 60  # seconds horovodrun waits for every host to start its ranks
NOT_FOUND = (
    "horovodrun was not found on PATH, so the horovod strategy cannot start. "
    "Fix: build and install it with scripts/build-horovod.sh .venv/bin/python "
    "(make lab does it; README, section Horovod)."
)


def horovodrun_argv(config: LaunchConfig, horovodrun: str) -> list[str]:
    hosts = format_hosts(config.hosts) if config.hosts else f"localhost:{config.workers}"
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
        "--gloo",
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


class Horovod(Strategy):
    name = "horovod"
    title = "Horovod (Gloo)"
    needs_horovodrun = True
    speakers = (contract.rank_name(0),)
    api_modules = ("horovod", "ddlkit.horovod")  # hvd.init(), dkh.init()
    written_with = "hvd.init() (import horovod.tensorflow.keras as hvd)"

    def workers(
        self, config: LaunchConfig, cluster: ClusterSpec | None, planner: Planner
    ) -> list[WorkerSpec]:
        if planner.horovodrun is None:
            raise ConfigError(NOT_FOUND)
        cores = planner.cores
        pin = config.pin_cores and not planner.gpus and not config.remote
        pin = pin and len(cores) >= config.workers
        env = pinning.rank_cpus_env(cores, config.workers) if pin else {}
        command = horovodrun_argv(config, planner.horovodrun)
        devices = dev.Devices(None, None, None)
        return [planner.spec(contract.HOROVODRUN, env, devices, command=command)]

    def used_hosts(self, config: LaunchConfig, cluster: ClusterSpec | None) -> dict[str, list]:
        assert config.hosts is not None
        return {h.name: [] for h in horovod_slots(config.hosts, config.workers).hosts}

    def remote_rows(self, config: LaunchConfig) -> list[tuple[str, str]]:
        return [("network interface", config.network_interface or "horovodrun's")]

    def progress_workers(self, worker: str, reporting: Sequence[str]) -> list[str]:
        if worker == contract.HOROVODRUN:  # one process for all ranks: the slowest rank's
            return [w for w in reporting if contract.is_rank_name(w)]
        return [worker]

    def dashboard_workers(self, names: Sequence[str]) -> list[str] | None:
        return None  # the ranks name themselves once they run
