"""Run a strategy: plan it, start the collector and the workers, watch them.

This is the one place that puts the pieces together; the notebook call and
``ddlkit launch`` both come here::

    run = dk.launch.start("../launch/train_multi_worker.py", strategy="multi_worker",
                          workers=2, args=["--epochs", "1"])
    run.dashboard()        # live curves of every worker
    result = run.wait()    # raises WorkerFailedError if a worker fails

Across hosts (over SSH, checked first by `ddlkit.hosts.check_hosts`)::

    where = dk.where.Hosts("node1:1,node2:1", ssh=dk.hosts.SshOptions(identity=...),
                           collector_host="auto")
    run = dk.launch.start(script, strategy="multi_worker", workers=2, where=where)

Where the workers run is one `ddlkit.where.Where` (this machine, hosts, Slurm, Spark); the
keywords that said it before (``hosts=``, ``ssh=``, ``cores=``, ``engine=``, ...) still work
for one release and warn with the ``where=`` that replaces them. `prepare` is the part
``dk.workers`` shares: the checked config, its cluster, collector and planned job.
"""

from __future__ import annotations

import os
import secrets
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlkit import settings, strategies
from ddlkit import where as places
from ddlkit.cluster import ClusterSpec
from ddlkit.environments import for_worker
from ddlkit.errors import ConfigError
from ddlkit.hosts.preflight import Preflight, check_hosts
from ddlkit.hosts.ssh import SshOptions, write_ssh_shim
from ddlkit.launch import devices, plan, script_check
from ddlkit.launch.collect import WILDCARDS as WILDCARDS  # re-exported
from ddlkit.launch.collect import collector_address
from ddlkit.launch.handle import Run as Run  # re-exported: what start() returns
from ddlkit.launch.job import Job
from ddlkit.launch.runs import new_run_id
from ddlkit.launch.spec import JobSpec
from ddlkit.metrics import Collector
from ddlkit.metrics.protocol import is_loopback


def start(
    script: str | Path,
    *,
    strategy: str = "multi_worker",
    workers: int = 2,
    args: Sequence[str] = (),
    where: places.Where | None = None,
    ps: int = 1,
    label: str = "",
    live: bool = True,
    runs_dir: str | Path | None = None,
    collector_port: int = 0,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    horovod_transport: str = "auto",
    **old: Any,
) -> Run:
    """Start `script` under `strategy` with `workers` workers ``where`` asked; returns at once.

    ``where``: a `ddlkit.where.Where`, default ``ThisMachine()``. Everything is checked
    before anything starts: a bad argument raises one ConfigError and leaves nothing
    running. On `Hosts`, every host is checked first over SSH (`ddlkit.hosts.check_hosts`:
    reachable, Python and TensorFlow (and Horovod) at the kit's Python path, the script
    there, the TF server ports free); a failure raises one `HostError` naming each host and
    its fix. Live metrics from other hosts need ``Hosts(collector_host=...)``: ``"auto"``
    (this machine's address on the hosts' network) or an address they reach; a token is
    then made with ``secrets`` unless ``token`` is given.

    ``ThisMachine(cores=...)``: the cores of this machine the run may use; every process
    of the run is confined to them, each compute worker to its own slice (``pin_cores``).
    ``env``: extra environment for every worker. Both are plain data in the `LaunchConfig`
    and each `WorkerSpec`; this process's affinity and ``os.environ`` are left alone::

        run = dk.launch.start(script, workers=2, where=dk.where.ThisMachine(cores=(2, 3)),
                              env={"MY_FLAG": "1"})

    ``horovod_transport``: ``"auto"`` (MPI for the ranks of this machine when Horovod was
    built with it, else Gloo), ``"gloo"`` or ``"mpi"`` (`ddlkit.strategies.horovod`).

    ``where=dk.where.Spark(master)`` (``spark://HOST:PORT``, ``local[N]``, ``yarn``): the
    workers run as Spark tasks (multi_worker: a barrier stage; horovod:
    ``horovod.spark.run``); the run's one process is the driver (:mod:`ddlkit.spark`).

    ``where=dk.where.Ray(address)``: the workers run as Ray actors of one placement group
    (multi_worker; horovod: ``horovod.ray.RayExecutor``); the run's one process is the
    driver (:mod:`ddlkit.ray`).
    """
    where = resolve_where(where, old, stacklevel=3)
    config = configure(script, strategy, workers, args, where, ps, label, env, horovod_transport)
    script_check.check(config.script, strategy)  # parses, and fits the strategy? else ConfigError
    collector_host = getattr(where, "collector_host", None)
    if isinstance(where, places.Spark):
        if horovod_transport == "mpi":
            raise ConfigError(
                "horovod_transport='mpi' on Spark: horovod.spark.run starts the ranks as Spark "
                "tasks over Gloo. Fix: drop horovod_transport (or pass 'gloo')."
            )
        from ddlkit.spark.submit import start as spark_start

        return spark_start(
            config, where.master, live, runs_dir, collector_host, collector_port, token
        )
    if isinstance(where, places.Ray):
        if horovod_transport != "auto":
            raise ConfigError(
                f"horovod_transport={horovod_transport!r} on Ray: horovod.ray.RayExecutor runs "
                f"the ranks over Gloo. Fix: drop horovod_transport."
            )
        from ddlkit.ray.submit import start as ray_start

        return ray_start(config, where, live, runs_dir, collector_port, token)
    if isinstance(where, places.Slurm):
        raise ConfigError(
            "dk.launch.start runs scripts here or over SSH; in a Slurm allocation the tasks are "
            "started by srun. Fix: sbatch launch/slurm/multi_worker.sbatch (or "
            "`srun python -m ddlkit.slurm exec -- SCRIPT`), see ddlkit.slurm."
        )
    prepared = prepare(config, where, live=live, runs_dir=runs_dir, label=label,
                       collector_port=collector_port, token=token)  # fmt: skip
    try:
        progress = _progress(prepared.collector, config.strategy_impl)
        job = Job.start(prepared.spec, progress_fn=progress if prepared.collector else None)
    except BaseException:
        prepared.close()
        raise
    return Run(config, prepared.cluster, job, prepared.collector, prepared.preflight)


def resolve_where(
    where: places.Where | None, old: Mapping[str, Any], stacklevel: int = 2
) -> places.Where:
    """``where``, or the `Where` the old keywords say, with a DeprecationWarning naming the
    ``where=`` that replaces them; TypeError for a keyword that never existed."""
    unknown = sorted(set(old) - set(places.OLD_KEYWORDS))
    if unknown:
        raise TypeError(f"start() got an unexpected keyword argument {unknown[0]!r}")
    given = {k: v for k, v in old.items() if v is not None or k == "engine"}
    if where is not None:
        if old:
            raise ConfigError(
                f"where={where!r} and {', '.join(sorted(old))} were both given. Fix: say it all "
                f"in where (e.g. {places.replacement(given) if given else 'where=...'})."
            )
        if not isinstance(where, places.Where):
            raise ConfigError(
                f"where={where!r} is not a dk.where.Where. Fix: pass dk.where.ThisMachine(), "
                f"dk.where.Hosts('node1:1,node2:1', ...), dk.where.Slurm(), "
                f"dk.where.Spark(master) or dk.where.Ray(address)."
            )
        return where
    if not old:
        return places.ThisMachine()
    resolved = places.from_keywords(given)
    warnings.warn(
        f"{', '.join(f'{k}=' for k in sorted(old))} of dk.launch.start are deprecated and go in "
        f"the next release. Fix: pass {places.replacement(given)}.",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return resolved


def configure(
    script: str | Path,
    strategy: str,
    workers: int,
    args: Sequence[str],
    where: places.Where,
    ps: int = 1,
    label: str = "",
    env: Mapping[str, str] | None = None,
    horovod_transport: str = "auto",
) -> plan.LaunchConfig:
    """The checked `LaunchConfig` of a run ``where`` says (pure)."""
    return plan.LaunchConfig(
        script=Path(script),
        strategy=strategy,
        workers=workers,
        args=tuple(args),
        ps=ps,
        label=label,
        env=dict(env or {}),
        horovod_transport=horovod_transport,
        **where.config(),
    )


@dataclass
class Prepared:
    """A planned job not yet started: its config, cluster, collector (open) and spec, and
    ``env``: what the launcher adds for every process (the collector's address, ...)."""

    config: plan.LaunchConfig
    cluster: ClusterSpec | None
    collector: Collector | None
    spec: JobSpec
    preflight: Preflight | None
    env: dict[str, str]

    def close(self) -> None:
        """Close the collector (the job never started)."""
        if self.collector is not None:
            self.collector.close()


def prepare(
    config: plan.LaunchConfig,
    where: places.Where,
    *,
    live: bool = True,
    runs_dir: str | Path | None = None,
    label: str = "",
    collector_port: int = 0,
    token: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    cluster: ClusterSpec | None = None,
) -> Prepared:
    """Check the hosts (over SSH), open the collector and plan the job; nothing starts.
    ``cluster``: the TF cluster to plan with (default: the strategy's, `plan.cluster_for`)."""
    if config.cores is not None:
        devices.check_cores(config.cores, devices.local_cores())
    collector_host = getattr(where, "collector_host", None)
    bind, advertise = collector_address(config, collector_host) if live else (None, None)
    if bind is not None and not is_loopback(bind) and token is None:
        token = secrets.token_hex(16)
    run_id = new_run_id(label or config.label or f"{config.strategy}-{config.workers}")
    run_dir = Path(runs_dir or settings.runs_dir()) / run_id
    impl = config.strategy_impl
    horovodrun = plan.find_horovodrun(config.python) if impl.needs_horovodrun else None
    no_mpi = "not asked for"
    if horovodrun is not None and config.horovod_transport != "gloo" and not config.remote:
        no_mpi = plan.mpi_unavailable(config.python)
    cluster = plan.cluster_for(config) if cluster is None else cluster
    timeout = getattr(where, "preflight_timeout", None)
    checked = _preflight(config, cluster, timeout) if config.remote else None
    collector = (
        Collector(run_dir, host=bind, port=collector_port, token=token)
        if bind is not None
        else None
    )
    try:
        env = {**(collector.env(advertise) if collector else {}), **(extra_env or {})}
        if config.remote and impl.needs_horovodrun:  # horovodrun reaches the hosts itself
            env["PATH"] = _ssh_shim_path(config, run_dir)
        spec = plan.plan(
            config,
            cluster,
            run_id=run_id,
            run_dir=run_dir,
            extra_env=env,
            cores=devices.local_cores() if config.cores is None else config.cores,
            gpus=devices.local_gpus(),
            horovodrun=horovodrun,
            mpi_unavailable=no_mpi,
        )
        for worker in spec.workers:  # a local worker's cwd here; a remote one's on its host
            for_worker(worker).prepare(worker)
    except BaseException:
        if collector is not None:
            collector.close()
        raise
    return Prepared(config, cluster, collector, spec, checked, env)


def _used_hosts(config: plan.LaunchConfig, cluster: ClusterSpec | None) -> dict[str, list[int]]:
    """The hosts the job uses and the ports it needs free on each."""
    return config.strategy_impl.used_hosts(config, cluster)


def _preflight(
    config: plan.LaunchConfig, cluster: ClusterSpec | None, timeout: float | None
) -> Preflight:
    """Check every host the job uses (in parallel); raise one HostError for the failures."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for host, ports in _used_hosts(config, cluster).items():
        groups.setdefault(tuple(ports), []).append(host)
    rows = []
    for ports, hosts in groups.items():
        rows += check_hosts(
            hosts,
            config.ssh,
            python=config.python,
            ports=ports,
            timeout=timeout,
            files=[str(config.script)],
            horovod=config.strategy_impl.needs_horovodrun,
        ).rows
    checked = Preflight(tuple(rows))
    checked.raise_for_failures()
    return checked


def _ssh_shim_path(config: plan.LaunchConfig, run_dir: Path) -> str:
    """PATH for horovodrun: our ssh shim (BatchMode, the job's SshOptions) first."""
    shim_dir = run_dir / "ssh"
    shim_dir.mkdir(parents=True, exist_ok=True)
    write_ssh_shim(shim_dir, config.ssh or SshOptions())
    return os.pathsep.join([str(shim_dir), os.environ.get("PATH", os.defpath)])


def _progress(collector: Collector | None, strategy: strategies.Strategy):
    """A launched process's step: the slowest of the metric workers it stands for."""

    def step(worker: str) -> int | None:
        names = strategy.progress_workers(worker, collector.workers())
        steps = [collector.latest(w) for w in names]
        return min((r.step for r in steps if r is not None), default=None)

    return step
