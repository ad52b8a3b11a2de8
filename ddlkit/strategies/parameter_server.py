"""ParameterServerStrategy: a chief (coordinator), ``ps`` parameter servers and workers.

The ps and worker tasks are servers that never exit by themselves: the job ends them
once the chief has finished. The coordinator reschedules a lost worker's steps, so
workers are expendable; losing a ps or the chief ends training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlkit import contract
from ddlkit.errors import ConfigError
from ddlkit.strategies.base import TaskStrategy

if TYPE_CHECKING:
    from ddlkit.strategies.base import RunConfig


class ParameterServer(TaskStrategy):
    name = "parameter_server"
    title = "ParameterServerStrategy"
    chief = True
    speakers = (contract.task_name("chief", 0),)
    api_classes = ("ParameterServerStrategy", "ParameterServerStrategyV2")
    written_with = "tf.distribute.ParameterServerStrategy(cluster_resolver)"

    def check(self, config: RunConfig) -> None:
        if type(config.ps) is not int or config.ps < 1:
            raise ConfigError(
                f"ps={config.ps!r}: ParameterServerStrategy needs at least one parameter "
                f"server. Fix: pass --ps 1 or more."
            )

    def ps(self, config: RunConfig) -> int:
        return config.ps

    def processes(self, config: RunConfig) -> int:
        return config.workers + config.ps + 1

    def service(self, role: str) -> bool:
        return role != "chief"

    def expendable(self, role: str) -> bool:
        return role == "worker"

    def rows(self, config: RunConfig) -> list[tuple[str, str]]:
        return [("parameter servers", str(config.ps))]
