"""What a strategy is to the launcher: one small base class, plus the builder it plans with.

A strategy module (``mirrored.py``, ``multi_worker.py``, ``parameter_server.py``,
``horovod.py``) subclasses :class:`Strategy` and says, as pure functions of a
a :class:`RunConfig` (what they read of ``ddlkit.launch.plan.LaunchConfig``, which
imports this package; strategies never import it back):

- what it checks (:meth:`Strategy.check`) and how many processes it starts;
- its TF cluster, if it has one (:meth:`Strategy.cluster`), and the hosts and ports
  a preflight checks (:meth:`Strategy.used_hosts`);
- its worker specs (:meth:`Strategy.workers`), built with :class:`Planner`, which holds
  what every worker shares (environment, cores, GPUs, where it runs);
- its progress and result conventions: which worker speaks for the run
  (:attr:`Strategy.speakers`), how many processes a result counts, which metric
  workers make a launched process's progress, which workers the dashboard lists.

Registering it (:func:`ddlkit.strategies.register`) makes it a ``strategy=`` of
``dk.launch.start`` and ``ddlkit launch``: a new strategy is one module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from ddlkit import contract
from ddlkit.errors import ConfigError
from ddlkit.launch import devices as dev
from ddlkit.launch.spec import WorkerSpec

if TYPE_CHECKING:
    from ddlkit.cluster import ClusterSpec, Host
    from ddlkit.environments import Environment
    from ddlkit.hosts.ssh import SshOptions


class RunConfig(Protocol):
    """What a strategy reads of a run's checked config (``ddlkit.launch.plan.LaunchConfig``
    is the one the launcher builds). A protocol, so strategies depend on the fields and not
    on the launcher's module: ``launch.plan`` imports the strategies, never the reverse."""

    strategy: str
    workers: int
    ps: int
    script: Path
    args: tuple[str, ...]
    python: str
    hosts: tuple[Host, ...] | None
    pin_cores: bool
    ssh: SshOptions | None
    base_port: int
    distinct_ports: bool
    network_interface: str | None
    env: Mapping[str, str]
    horovod_transport: str

    @property
    def remote(self) -> bool: ...


@dataclass(frozen=True)
class Planner:
    """What every worker of one plan shares; :meth:`spec` makes one WorkerSpec (pure).

    ``cores`` are the cores the run may use; ``confine`` (cores given explicitly, no GPUs)
    puts every local process without a slice of its own on all of them.
    ``mpi_unavailable`` is None when this machine's Horovod can run over MPI, else why not.
    """

    config: RunConfig
    run_dir: Path
    common: Mapping[str, str]
    cores: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()
    horovodrun: str | None = None
    mpi_unavailable: str | None = "not checked"  # None: Horovod can run over MPI here
    confine: bool = False

    @property
    def argv(self) -> tuple[str, ...]:
        """The script's command: the kit's Python, the script, its arguments."""
        return (self.config.python, str(self.config.script), *self.config.args)

    def spec(
        self,
        name: str,
        env: Mapping[str, str],
        devices: dev.Devices,
        *,
        service: bool = False,
        expendable: bool = False,
        command: Sequence[str] | None = None,
        host: str | None = None,
    ) -> WorkerSpec:
        # pin_cores=False leaves cores and thread pools to the OS and TensorFlow; so does
        # another host (this machine's cores say nothing about its cores).
        here = placement(host, self.config.ssh).pins_cores
        pin = self.config.pin_cores and here
        cpus = devices.cpus if pin else None
        threads = devices.threads if pin else None
        if self.confine and here and cpus is None:  # no slice of its own: the run's cores
            cpus = tuple(self.cores)
        added = merge_checked(self.config.env, {**devices.env(), **env})
        return WorkerSpec(
            name=name,
            argv=tuple(self.argv if command is None else command),
            env={**self.common, **added},
            cwd=contract.work_dir(self.run_dir, name),
            log_path=contract.log_path(self.run_dir, name),
            cpus=cpus,
            threads=threads,
            service=service,
            expendable=expendable,
            host=host,
            ssh=None if here else self.config.ssh,
        )


class Strategy:
    """One distribution strategy, as the launcher and results see it (subclass it)."""

    name: ClassVar[str]
    title: ClassVar[str] = ""  # e.g. "MultiWorkerMirroredStrategy"
    needs_horovodrun: ClassVar[bool] = False  # its launcher process is horovodrun
    chief: ClassVar[bool] = False  # a chief task of its own (a PS coordinator)
    # Whose report speaks for the run, in order of preference (the first one present).
    speakers: ClassVar[tuple[str, ...]] = (contract.task_name("worker", 0),)
    # What a script written for it calls (ddlkit.launch.script_check reads scripts for it):
    # TensorFlow strategy classes, modules whose init() it calls, and the call to write.
    api_classes: ClassVar[tuple[str, ...]] = ()
    api_modules: ClassVar[tuple[str, ...]] = ()
    written_with: ClassVar[str] = ""

    # -- what it checks and starts ---------------------------------------------------------
    def check(self, config: RunConfig) -> None:
        """Raise ConfigError for a config this strategy cannot run (hosts already parsed)."""

    def processes(self, config: RunConfig) -> int:
        """How many processes it starts (horovodrun's ranks counted)."""
        return config.workers

    def cluster(self, config: RunConfig, host: str = "127.0.0.1") -> ClusterSpec | None:
        """Its TF cluster; None if it has none."""
        return None

    def workers(
        self, config: RunConfig, cluster: ClusterSpec | None, planner: Planner
    ) -> list[WorkerSpec]:
        raise NotImplementedError

    def rows(self, config: RunConfig) -> list[tuple[str, str]]:
        """Extra rows of the config's table (after the common ones)."""
        return []

    def remote_rows(self, config: RunConfig) -> list[tuple[str, str]]:
        """Extra rows when the job runs on other hosts."""
        return []

    def used_hosts(self, config: RunConfig, cluster: ClusterSpec | None) -> dict[str, list[int]]:
        """The hosts the job uses and the ports it needs free on each (preflight)."""
        return {} if cluster is None else remote_ports(cluster)

    # -- progress and results ------------------------------------------------------------
    def speaker(self, reports: Sequence[str]) -> str:
        """The worker whose report speaks for the run: the first of :attr:`speakers`
        that reported, else the first worker by name."""
        return next((w for w in self.speakers if w in reports), sorted(reports)[0])

    def result_processes(self, config: RunConfig) -> int:
        """Compute processes a Result counts (one per worker unless said otherwise)."""
        return config.workers

    def progress_workers(self, worker: str, reporting: Sequence[str]) -> list[str]:
        """The metric workers whose slowest step is ``worker``'s progress."""
        return [worker]

    def dashboard_workers(self, names: Sequence[str]) -> list[str] | None:
        """The workers the dashboard lists from the start (fixed colours, task order);
        None: whoever reports."""
        return list(names)

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"


class TaskStrategy(Strategy):
    """A strategy of one process per TF task (TF_CONFIG each): the cluster's tasks on free
    local ports, or on the hosts' slots from ``config.base_port`` up."""

    def ps(self, config: RunConfig) -> int:
        return 0

    def cluster(self, config: RunConfig, host: str = "127.0.0.1") -> ClusterSpec:
        from ddlkit.cluster import ClusterSpec

        if config.remote:
            assert config.hosts is not None
            return ClusterSpec.from_hosts(
                config.hosts,
                workers=config.workers,
                ps=self.ps(config),
                chief=self.chief,
                base_port=config.base_port,
                distinct_ports=config.distinct_ports,
            )
        if self.chief or self.ps(config):
            return ClusterSpec.local(
                workers=config.workers, ps=self.ps(config), chief=self.chief, host=host
            )
        return ClusterSpec.local(workers=config.workers, host=host)

    def service(self, role: str) -> bool:
        """Whether a task of ``role`` is a server the job ends once the others finish."""
        return False

    def expendable(self, role: str) -> bool:
        """Whether the job survives losing a task of ``role``."""
        return False

    def workers(
        self, config: RunConfig, cluster: ClusterSpec | None, planner: Planner
    ) -> list[WorkerSpec]:
        if cluster is None:
            raise ConfigError(
                f"{config.strategy} needs a cluster spec; build it with cluster_for()"
            )
        compute = [t for t in cluster.tasks if t.role == "worker"]
        # Workers compute; a PS chief only coordinates and ps tasks only serve variables,
        # so they get one thread each and no cores of their own.
        shares = dev.assign(len(compute), planner.cores, planner.gpus)
        by_name = {t.name: d for t, d in zip(compute, shares, strict=True)}
        idle = dev.Devices(None, 1, () if planner.gpus else None)
        specs = []
        for task in cluster.tasks:
            host = task.host if config.remote else None
            devices = (
                by_name.get(task.name, idle) if host is None else dev.Devices(None, None, None)
            )
            specs.append(
                planner.spec(
                    task.name,
                    cluster.env(task),
                    devices,
                    service=self.service(task.role),
                    expendable=self.expendable(task.role),
                    host=host,
                )
            )
        return specs

    def remote_rows(self, config: RunConfig) -> list[tuple[str, str]]:
        where = "across all hosts (one network stack)" if config.distinct_ports else "on each host"
        return [("TF server ports", f"{config.base_port} and up {where}")]


def remote_ports(cluster: ClusterSpec) -> dict[str, list[int]]:
    """Each host's TF server ports in ``cluster`` (what preflight checks there)."""
    ports: dict[str, list[int]] = {}
    for task in cluster.tasks:
        ports.setdefault(task.host, []).append(task.port)
    return ports


def placement(host: str | None, ssh: object = None) -> Environment:
    """Where a planned worker runs: this machine (no host) or its host over SSH."""
    from ddlkit.environments import LOCAL, Ssh

    return LOCAL if host is None else Ssh(host, ssh)  # type: ignore[arg-type]


def merge_checked(user: Mapping[str, str], planned: Mapping[str, str]) -> dict[str, str]:
    """``planned``, after checking the user's extra env does not set any of it otherwise."""
    clash = {k: (user[k], v) for k, v in planned.items() if k in user and user[k] != v}
    if clash:
        said = "; ".join(f"{k}={u!r} (launcher: {v!r})" for k, (u, v) in clash.items())
        raise ConfigError(
            f"env sets {said}. Fix: drop {', '.join(clash)} from env, or change the setting "
            f"the launcher derives it from (cores=, pin_cores=, keras)."
        )
    return dict(planned)


def unknown(name: object, known: Sequence[str]) -> ConfigError:
    return ConfigError(f"unknown strategy {name!r}. Fix: use one of {', '.join(known)}.")
