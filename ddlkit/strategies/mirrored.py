"""MirroredStrategy: one process, its replicas on this machine's devices (or one host's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlkit import contract
from ddlkit.errors import ConfigError
from ddlkit.launch import devices as dev
from ddlkit.strategies.base import Planner, Strategy

if TYPE_CHECKING:
    from ddlkit.cluster import ClusterSpec
    from ddlkit.launch.spec import WorkerSpec
    from ddlkit.strategies.base import RunConfig


class Mirrored(Strategy):
    name = "mirrored"
    title = "MirroredStrategy"
    speakers = (contract.MAIN,)
    api_classes = ("MirroredStrategy",)
    written_with = "tf.distribute.MirroredStrategy()"

    def check(self, config: RunConfig) -> None:
        hosts = config.hosts or ()
        if config.remote and len(hosts) > 1:
            raise ConfigError(
                f"mirrored runs one process, on one host, but the hosts name "
                f"{', '.join(h.name for h in hosts)}. Fix: give one host (e.g. "
                f"-H {hosts[0].name}:1), or use multi_worker (or horovod) to train across "
                f"hosts."
            )

    def processes(self, config: RunConfig) -> int:
        return 1

    def workers(
        self, config: RunConfig, cluster: ClusterSpec | None, planner: Planner
    ) -> list[WorkerSpec]:
        if config.remote:  # one process on that host; TF finds its devices there
            assert config.hosts is not None
            devices, host = dev.Devices(None, None, None), config.hosts[0].name
        else:
            gpus = planner.gpus[: config.workers] or None
            devices, host = dev.Devices(None, len(planner.cores) or None, gpus), None
        env = {contract.REPLICAS_VAR: str(config.workers)}
        return [planner.spec(contract.MAIN, env, devices, host=host)]

    def used_hosts(self, config: RunConfig, cluster: ClusterSpec | None) -> dict[str, list]:
        assert config.hosts is not None
        return {config.hosts[0].name: []}  # one process, no TF server

    def result_processes(self, config: RunConfig) -> int:
        """One process, whatever its replica count (``config.workers``)."""
        return 1
