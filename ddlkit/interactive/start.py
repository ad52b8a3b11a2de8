"""Starting live workers: the job the launcher runs, and this notebook's wait for its engines.

:func:`start` plans the job through `ddlkit.launch.run.prepare` (the checked config, preflight
of other hosts, the collector, the strategy's planned workers with `ddlkit.interactive.plan`'s
engine as their script) and starts it with `ddlkit.launch.job.Job` (one fork place, children
that die with this kernel). In a Slurm allocation the planned workers are replaced by one
``srun`` (`ddlkit.interactive.plan.srun_spec`), checked against the allocation first.
:func:`wait_for_engines` waits, boundedly, for the controller's file and every engine.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import time
from pathlib import Path
from typing import Any

from ddlkit import contract, strategies
from ddlkit import where as places
from ddlkit.cluster import ClusterSpec
from ddlkit.cluster.ports import free_port_block
from ddlkit.environments.slurm import allocation
from ddlkit.errors import ConfigError
from ddlkit.interactive import plan
from ddlkit.launch import remote
from ddlkit.launch.handle import Run
from ddlkit.launch.job import Job
from ddlkit.launch.plan import LaunchConfig, common_env
from ddlkit.launch.plan import cluster_for as plan_cluster
from ddlkit.launch.run import Prepared, prepare
from ddlkit.launch.spec import JobSpec, WorkerSpec

LOOPBACK = "127.0.0.1"
CONNECT_TRY = 5.0  # seconds one connection attempt to the controller waits for its answer


def check(config: LaunchConfig, where: places.Where) -> places.Where:
    """What must hold before anything starts (ConfigError); ``where`` with its addresses
    settled (a Slurm allocation's: loopback, or this machine's towards its nodes)."""
    if isinstance(where, places.Spark):
        raise ConfigError(
            "dk.workers runs live workers on this machine, on hosts or in a Slurm "
            "allocation; Spark runs scripts as tasks. Fix: try it with dk.workers here, "
            "write it out with workers.script(path), then dk.launch.start(path, "
            "where=dk.where.Spark(master))."
        )
    if isinstance(where, places.Ray):
        raise ConfigError(
            "dk.workers runs live workers on this machine, on hosts or in a Slurm "
            "allocation; Ray runs scripts as actors. Fix: try it with dk.workers here, "
            "write it out with workers.script(path), then dk.launch.start(path, "
            "where=dk.where.Ray(address))."
        )
    if not isinstance(where, places.Slurm):
        return where
    nodes = allocation(os.environ)
    plan.check_slurm(config.strategy, config.workers, nodes)
    if where.collector_host is not None and where.collector_host != "auto":
        return where
    here = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost"}
    names = [h for h, _ in nodes]
    at_home = all(h in here for h in names) and where.collector_host is None
    address = LOOPBACK if at_home else remote.address_towards(names)
    return dataclasses.replace(where, collector_host=address)


def start(
    config: LaunchConfig, where: places.Where, *, live: bool, label: str
) -> tuple[tuple[str, ...], Run]:
    """Start the job of live workers ``where`` says (checked by :func:`check` first): the
    engines' worker names in engine-id order, and the started `Run`."""
    ip = controller_ip(config, where)
    planned = None if config.remote or isinstance(where, places.Slurm) else plan_cluster(config)
    # one block of ports free now, below the ephemeral range: this machine's TF servers
    # (if any) first, then the controller's (see server_ports and plan.controller_spec)
    tasks = len(planned.tasks) if planned is not None else 0
    first = free_port_block(tasks + plan.CONTROLLER_PORTS, ip)
    cluster = server_ports(planned, first)
    prepared = prepare(config, where, live=live, label=label, cluster=cluster)
    try:
        names, spec = _job(prepared, where, ip, first + tasks)
        job = Job.start(spec)
    except BaseException:
        prepared.close()
        raise
    cluster = None if isinstance(where, places.Slurm) else prepared.cluster  # the tasks' own
    run = Run(config, cluster, job, prepared.collector, prepared.preflight)
    run.metric_workers = list(names)
    return names, run


def controller_ip(config: LaunchConfig, where: places.Where) -> str:
    """Where the controller listens: loopback, or this machine's address that the hosts
    (or the allocation's nodes, as :func:`check` settled) reach."""
    if isinstance(where, places.Slurm):
        return where.collector_host or LOOPBACK
    if config.remote:
        return remote.address_towards([h.name for h in config.hosts or ()])
    return LOOPBACK


def server_ports(cluster: ClusterSpec | None, first: int) -> ClusterSpec | None:
    """``cluster`` (on this machine) moved to the ports from ``first`` (a block free now in
    `ddlkit.cluster.ports.SERVER_PORTS`): a live worker's TF server starts when a cell creates
    the strategy, maybe minutes later, and a port from the ephemeral range (where port 0's
    come from) may be taken by then by the engines' connections ("Could not start gRPC
    server", and the other worker waiting for it, were seen)."""
    if cluster is None:
        return None
    moved = (dataclasses.replace(t, port=first + i) for i, t in enumerate(cluster.tasks))
    return ClusterSpec(tuple(moved))


def _job(
    prepared: Prepared, where: places.Where, ip: str, first_port: int
) -> tuple[tuple[str, ...], JobSpec]:
    config, spec = prepared.config, prepared.spec
    if strategies.get(config.strategy).chief:  # the notebook is the coordinator
        names = tuple(w.name for w in spec.workers if w.name != plan.CHIEF)
        return names, plan.servers_job(spec, config.python)
    run_dir = spec.run_dir
    plan.profile_dir(run_dir).mkdir(parents=True, exist_ok=True)
    if isinstance(where, places.Slurm):
        names = tuple(contract.task_name("worker", i) for i in range(config.workers))
        env = common_env(config, prepared.env)
        srun = plan.srun_spec(run_dir, config.python, names, env, where.port_base, where.srun_args)
        workers: tuple[WorkerSpec, ...] = (srun,)
    else:
        names = plan.engine_names(config.strategy, config.workers, prepared.cluster)
        args = plan.engine_args(run_dir, names)
        workers = tuple(_with_args(w, config.script, args) for w in spec.workers)
    for worker in workers:
        worker.cwd.mkdir(parents=True, exist_ok=True)
    controller = plan.controller_spec(run_dir, config.python, ip, first_port)
    controller.cwd.mkdir(parents=True, exist_ok=True)
    return names, plan.engines_job(JobSpec(spec.run_id, run_dir, workers), controller)


def _with_args(worker: WorkerSpec, script: Path, args: tuple[str, ...]) -> WorkerSpec:
    """``worker`` whose command runs the engine script with ``args`` after it."""
    argv = list(worker.argv)
    at = argv.index(str(script))
    return dataclasses.replace(worker, argv=(*argv[: at + 1], *args, *argv[at + 1 :]))


def tail_of(run: Run, name: str, n: int = 10) -> str:
    """The last lines of worker ``name``'s log, or of the process that started it (a
    Horovod rank's horovodrun, a Slurm task's srun), saying whose."""
    started_by = [w for w in run.job.spec.names if w != contract.CONTROLLER]
    own = name if name in run.job.spec.names else started_by[0]
    return f"(last lines of {own}'s log)\n{run.tail(own, n)}"


def wait_for_engines(run: Run, names: tuple[str, ...], timeout: float) -> Any:
    """The ipyparallel Client once every engine has connected (``timeout`` s at most); a
    dead worker (WorkerDiedError) or the timeout (ConfigError with every log's tail)."""
    import ipyparallel as ipp

    from ddlkit.interactive.output import WorkerDiedError, death_message

    deadline = time.monotonic() + timeout

    def check(what: str) -> None:
        if run.job.done:
            tail = functools.partial(tail_of, run)
            raise WorkerDiedError(death_message(names, [], {}, run.job.failure, tail))
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n} ---\n{run.tail(n, 5)}" for n in run.job.spec.names)
            raise ConfigError(
                f"waited {timeout:.0f} s for {what}. Fix: read the logs below (whole logs in "
                f"{run.run_dir}/logs), then dk.workers(...) again.\n{logs}"
            )

    url = plan.client_file(run.run_dir)
    while not url.exists():
        check("the controller to write its connection file")
        time.sleep(0.05)
    while True:  # a controller that died after writing its file does not answer: ask again
        try:
            client = ipp.Client(str(url), timeout=CONNECT_TRY)
            break
        except TimeoutError:
            check("the controller to answer")
    try:
        while len(client.ids) < len(names):
            check("every worker to connect")
            time.sleep(0.05)
    except BaseException:
        client.close()
        raise
    return client
