"""From a strategy and a worker count to the processes to start (pure data).

What each strategy starts is its module's (:mod:`ddlkit.strategies`); this module holds
what every launch shares: the checked config and the dispatch.

`LaunchConfig` is what a user asks for (`ddlkit launch` flags or the notebook
call); `plan()` turns it, with a cluster spec and the machine's devices, into a
`JobSpec`: one `WorkerSpec` per process with its argv, TF_CONFIG or Horovod
arguments, Keras choice, metrics address, cores and threads. Nothing here
starts a process; `ddlkit.launch.run` does.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit import backend, contract, strategies
from ddlkit._tables import html_table
from ddlkit.cluster import ClusterSpec, Host, format_hosts, parse_hostfile, parse_hosts
from ddlkit.contract import REPLICAS_VAR as REPLICAS_VAR  # re-exported
from ddlkit.contract import STRATEGY_VAR
from ddlkit.errors import ConfigError
from ddlkit.hosts.ssh import SshOptions
from ddlkit.launch.spec import JobSpec, check_env, redact
from ddlkit.strategies.base import Planner, merge_checked
from ddlkit.strategies.base import remote_ports as remote_ports  # re-exported
from ddlkit.strategies.horovod import START_TIMEOUT as HOROVOD_START_TIMEOUT  # noqa: F401
from ddlkit.strategies.horovod import TRANSPORTS
from ddlkit.strategies.horovod import find_horovodrun as find_horovodrun
from ddlkit.strategies.horovod import horovodrun_argv as horovodrun_argv
from ddlkit.strategies.horovod import mpi_unavailable as mpi_unavailable
from ddlkit.where import BASE_PORT as BASE_PORT  # re-exported

STRATEGIES = strategies.BUILTIN  # ddlkit.strategies.names(): the registered ones
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# What the launcher sets in a worker itself: LaunchConfig.env may not set these.
LAUNCHER_VARS = frozenset({*contract.ENV_VARS, contract.TF_CONFIG_VAR, "PYTHONUNBUFFERED"})


@dataclass(frozen=True)
class LaunchConfig:
    """What to run and how: checked on creation, shown as a table in a notebook.

    ``hosts`` other than this machine (``localhost``) are reached over SSH with ``ssh``
    (default: OpenSSH's own keys and known hosts, in BatchMode). TensorFlow tasks are put on
    host slots in order (chief, ps, worker), each host's tasks on ports ``base_port``,
    ``base_port + 1``, ...; Horovod gets the hosts as ``horovodrun -H`` and, if given,
    ``--network-interface``. ``hostfile`` (``host slots=N`` lines, ``#`` comments) is parsed
    here and passed on as ``-H`` too: horovodrun's own ``-hostfile`` reader fails on
    comments, blank lines and lines without ``slots=``.

    ``cores``: the cores of this machine the run may use (default: all this process may
    use). Given explicitly, every process of the run is confined to them: compute workers
    each to their own slice of them (``pin_cores``), processes without a slice (the PS
    chief and ps tasks, horovodrun, or every worker with ``pin_cores=False``) to all of
    them. ``env``: extra environment variables for every worker (e.g. HOROVOD_TIMELINE);
    the variables the launcher sets itself cannot be overridden (ConfigError).
    """

    script: Path
    strategy: str = "multi_worker"
    workers: int = 2
    args: tuple[str, ...] = ()
    hosts: tuple[Host, ...] | str | None = None
    ps: int = 1
    python: str = sys.executable
    pin_cores: bool = True
    label: str = ""
    keras: str = field(default_factory=backend.wanted_flavour)
    ssh: SshOptions | None = None
    base_port: int = BASE_PORT
    distinct_ports: bool = False  # hosts share one network stack: ports distinct across them
    network_interface: str | None = None
    hostfile: Path | None = None
    cores: tuple[int, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    horovod_transport: str = "auto"

    def __post_init__(self) -> None:
        strategy = strategies.get(self.strategy)  # ConfigError naming the known ones
        if self.horovod_transport not in TRANSPORTS:
            raise ConfigError(
                f"horovod_transport={self.horovod_transport!r} is not one of "
                f"{', '.join(TRANSPORTS)}. Fix: pass 'auto' (MPI where this Horovod has it), "
                f"'gloo' or 'mpi'."
            )
        if self.horovod_transport != "auto" and not strategy.needs_horovodrun:
            raise ConfigError(
                f"horovod_transport={self.horovod_transport!r} with strategy "
                f"{self.strategy!r}: only the horovod strategy has a transport to choose. "
                f"Fix: drop horovod_transport, or use strategy='horovod'."
            )
        if type(self.workers) is not int or self.workers < 1:
            raise ConfigError(
                f"workers={self.workers!r}: a job needs at least one worker. "
                f"Fix: pass -n 1 or more."
            )
        script = Path(self.script).expanduser()
        if not script.is_file():
            raise ConfigError(
                f"script {str(self.script)!r} not found (looked for {script.resolve()}). "
                f"Fix: pass the path of a Python file, e.g. launch/train_multi_worker.py."
            )
        object.__setattr__(self, "script", script.resolve())
        if isinstance(self.args, str):
            raise ConfigError(
                f"args must be a list of arguments, not the string {self.args!r}. "
                f"Fix: pass e.g. ['--epochs', '2']."
            )
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        if self.hostfile is not None:
            if self.hosts is not None:
                raise ConfigError(
                    "hosts and hostfile were both given. Fix: pass one of them "
                    "(-H h1:1,h2:1 or --hostfile FILE)."
                )
            hostfile = Path(self.hostfile).expanduser().resolve()
            object.__setattr__(self, "hostfile", hostfile)
            object.__setattr__(self, "hosts", parse_hostfile(hostfile))
        hosts = parse_hosts(self.hosts) if isinstance(self.hosts, str) else self.hosts
        if hosts is not None:
            hosts = tuple(hosts)
            remote = [h.name for h in hosts if h.name not in LOCAL_NAMES]
            local = [h.name for h in hosts if h.name in LOCAL_NAMES]
            if remote and local:
                raise ConfigError(
                    f"hosts {format_hosts(hosts)!r} mix this machine ({', '.join(local)}) with "
                    f"other hosts, which cannot reach 'localhost' here. Fix: list this "
                    f"machine by an address the other hosts reach, or leave it out."
                )
        object.__setattr__(self, "hosts", hosts)
        if self.ssh is not None and not isinstance(self.ssh, SshOptions):
            raise ConfigError(
                f"ssh={self.ssh!r} is not SshOptions. "
                f"Fix: pass dk.hosts.SshOptions(identity=..., known_hosts=...)."
            )
        if type(self.base_port) is not int or not 1024 <= self.base_port <= 65535 - 64:
            raise ConfigError(
                f"base_port={self.base_port!r}: TensorFlow servers need unprivileged ports. "
                f"Fix: pass a port from 1024 to {65535 - 64}, e.g. {BASE_PORT}."
            )
        strategy.check(self)
        if self.hosts is not None:
            slots = sum(h.slots for h in self.hosts)
            need = self.processes
            if need > slots:
                raise ConfigError(
                    f"{self.strategy} with {self.workers} workers needs {need} processes but "
                    f"hosts {format_hosts(self.hosts)!r} give {slots} slots. Fix: add slots "
                    f"(e.g. -H localhost:{need}) or ask for fewer workers."
                )
        self._check_cores()
        self._check_env()
        backend.keras_env(self.keras)

    def _check_cores(self) -> None:
        if self.cores is None:
            return
        if isinstance(self.cores, str | bytes):
            raise ConfigError(
                f"cores={self.cores!r} is a string. Fix: pass a list of core numbers, e.g. "
                f"cores=(0, 1)."
            )
        cores = tuple(self.cores)
        if (
            not cores
            or any(type(c) is not int or c < 0 for c in cores)
            or len(set(cores)) != len(cores)
        ):
            raise ConfigError(
                f"cores={self.cores!r} is not a list of distinct core numbers. Fix: pass e.g. "
                f"cores=(0, 1), or cores=None for all the cores this process may use."
            )
        if self.remote:
            raise ConfigError(
                f"cores={cores!r} with hosts {format_hosts(self.hosts)!r}: ddlkit pins cores "
                f"only on this machine. Fix: pass cores=None for other hosts."
            )
        object.__setattr__(self, "cores", cores)

    def _check_env(self) -> None:
        if not isinstance(self.env, Mapping):
            raise ConfigError(
                f"env={self.env!r} is not a mapping. Fix: pass a dict of variable names to "
                f"string values, e.g. env={{'HOROVOD_TIMELINE': '/tmp/t.json'}}."
            )
        env = check_env(self.env, "env")
        owned = sorted(k for k in env if k in LAUNCHER_VARS)
        if owned:
            raise ConfigError(
                f"env sets {', '.join(owned)}, which the launcher sets itself for each worker. "
                f"Fix: drop {', '.join(owned)} from env (use cores=, pin_cores=, workers=, "
                f"strategy= to change what they say)."
            )
        object.__setattr__(self, "env", types.MappingProxyType(env))

    @property
    def processes(self) -> int:
        """How many processes the strategy starts (horovodrun's ranks counted)."""
        return self.strategy_impl.processes(self)

    @property
    def strategy_impl(self) -> strategies.Strategy:
        """The registered strategy that plans this config (ddlkit.strategies)."""
        return strategies.get(self.strategy)

    @property
    def remote(self) -> bool:
        """Whether the job runs on other hosts (over SSH) rather than on this machine."""
        return bool(self.hosts) and all(h.name not in LOCAL_NAMES for h in self.hosts)

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            ("strategy", self.strategy),
            ("workers", str(self.workers)),
            *self.strategy_impl.rows(self),
            ("processes", str(self.processes)),
            ("script", str(self.script)),
            ("args", " ".join(self.args) or "(none)"),
            ("hosts", format_hosts(self.hosts) if self.hosts else "localhost"),
            *([("hostfile", str(self.hostfile))] if self.hostfile else []),
            ("Keras", self.keras),
            *([("cores", ",".join(map(str, self.cores)))] if self.cores is not None else []),
            *(
                [("extra env", ", ".join(f"{k}={v}" for k, v in redact(self.env).items()))]
                if self.env
                else []
            ),
        ]
        if self.remote:
            ssh = self.ssh or SshOptions()
            rows += [
                ("reached by", f"ssh (BatchMode), key {ssh.identity or '~/.ssh default'}"),
                ("cores", "not pinned on other hosts (TensorFlow sizes its thread pools)"),
            ]
            rows += self.strategy_impl.remote_rows(self)
        return rows

    def _repr_html_(self) -> str:
        return html_table(("setting", "value"), self.rows())


def cluster_for(config: LaunchConfig, host: str = "127.0.0.1") -> ClusterSpec | None:
    """The TF cluster the strategy needs; None if it needs none.

    On this machine: free local ports. On other hosts: tasks fill host slots in order, on
    ports ``config.base_port`` and up (preflight checks they are free there).
    """
    return config.strategy_impl.cluster(config, host)


def common_env(config: LaunchConfig, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every process of a run gets (pure): the user's ``env``, the Keras choice, the
    strategy's name and ``extra_env`` (the collector's address); a clash is a ConfigError."""
    planned = {**backend.keras_env(config.keras), STRATEGY_VAR: config.strategy}
    return {
        **config.env,
        **merge_checked(config.env, planned),
        **merge_checked(config.env, extra_env or {}),
    }


def plan(
    config: LaunchConfig,
    cluster: ClusterSpec | None,
    *,
    run_id: str,
    run_dir: Path,
    extra_env: dict[str, str] | None = None,
    cores: tuple[int, ...] = (),
    gpus: tuple[str, ...] = (),
    horovodrun: str | None = None,
    mpi_unavailable: str | None = "not checked",
) -> JobSpec:
    """The JobSpec for `config` (pure: every input is given): the strategy's workers.

    ``cores`` are this machine's; ``config.cores``, when given, replaces them and confines
    every local process of the run to them (see `LaunchConfig`). ``mpi_unavailable``: None
    when Horovod can run over MPI here, else why not (`mpi_unavailable`).
    """
    run_dir = Path(run_dir)
    planner = Planner(
        config=config,
        run_dir=run_dir,
        common=common_env(config, extra_env),
        cores=tuple(cores if config.cores is None else config.cores),
        gpus=tuple(gpus),
        horovodrun=horovodrun,
        mpi_unavailable=mpi_unavailable,
        confine=config.cores is not None and not gpus,
    )
    workers = config.strategy_impl.workers(config, cluster, planner)
    return JobSpec(run_id=run_id, run_dir=run_dir, workers=tuple(workers))
