"""A run on Spark from ``dk.launch.start(..., where=dk.where.Spark(URL))``: checked first,
then one driver process (:mod:`ddlkit.spark.driver`) started as the run's job.

Checked before anything starts (one ConfigError each): Java and pyspark are here; the
strategy is one Spark runs (multi_worker, horovod); the master URL has a known form and,
for ``spark://``, answers; the cluster has a free task slot for every worker; live metrics
from executors on other machines go to a collector address they reach.

Every worker needs a slot at once. A barrier stage (multi_worker) starts all its tasks
together or none: without the slots Spark re-checks for them and fails the job once its
check gives up (``spark.scheduler.barrier.maxConcurrentTasksCheck.*``; the run's driver
allows about a minute). ``horovod.spark.run`` runs an ordinary stage: the tasks that fit
start and wait for the others until its ``start_timeout``, then it fails. Either way the
answer comes late, so the free slots are counted first. They are known for ``local[N]``
and for a standalone master whose web UI answers (a :func:`ddlkit.spark.local_cluster`
one, or one on port 8080); YARN and Kubernetes masters are passed on unchecked.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from ddlkit import backend, contract, strategies
from ddlkit.contract import STRATEGY_VAR
from ddlkit.errors import ConfigError
from ddlkit.launch.spec import JobSpec, WorkerSpec
from ddlkit.spark.cluster import find, find_java, free_slots, master_state, spark_home
from ddlkit.spark.driver import (
    BARRIER_CHECK_FAILURES,
    BARRIER_CHECK_INTERVAL,
    LOOPBACK_MASTER,
    SPARK_MASTER,
    START_TIMEOUT,
    remote_master_host,
)

STRATEGIES = ("multi_worker", "horovod")
STANDALONE_UI_PORT = 8080  # Spark standalone's default web UI port
_LOCAL = re.compile(r"^local(?:\[(\d+|\*)(?:,\d+)?\])?$")
FORMS = "spark://HOST:PORT, local[N], yarn or k8s://https://HOST:PORT"


def master_slots(master: str, timeout: float = 2.0) -> int | None:
    """Free task slots at ``master`` (None: not knowable from here); ConfigError when the
    URL is malformed or a standalone master does not answer."""
    if not isinstance(master, str) or not master:
        raise ConfigError(
            f"master={master!r}: a Spark run needs a master URL. Fix: pass one of {FORMS}, "
            f"e.g. dk.spark.local_cluster().master_url."
        )
    local = _LOCAL.match(master)
    if local:
        n = local.group(1)
        return 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)
    if master == "yarn" or master.startswith("k8s://"):
        return None
    found = SPARK_MASTER.match(master)
    if not found:
        raise ConfigError(f"master URL {master!r} is not one Spark knows. Fix: use {FORMS}.")
    host, port = found.group(1), int(found.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach the Spark master {master} ({exc.strerror or exc}). Fix: start it "
            f"(dk.spark.local_cluster(), or spark-class org.apache.spark.deploy.master.Master "
            f"on {host}) or correct the URL."
        ) from None
    cluster = find(master)
    ui = cluster.ui_url if cluster else f"http://{host}:{STANDALONE_UI_PORT}"
    try:
        state = master_state(ui, timeout)
    except (OSError, ValueError):
        return None  # its web UI is elsewhere: Spark's own barrier check remains
    if state.get("url") != master:
        return None
    return free_slots(state)


def check(config, master: str) -> None:
    """Everything a Spark run needs, before anything starts (see the module docstring)."""
    if config.strategy not in STRATEGIES:
        raise ConfigError(
            f"strategy {config.strategy!r} does not run on Spark. Fix: use one of "
            f"{', '.join(STRATEGIES)} on Spark, or run it here (where=dk.where.ThisMachine())."
        )
    if config.hosts is not None:
        raise ConfigError(
            "hosts were given for a Spark run: Spark places the workers. "
            "Fix: drop hosts (-H/--hostfile), or use where=dk.where.Hosts(...) without Spark."
        )
    find_java()
    spark_home()
    if strategies.get(config.strategy).needs_horovodrun:  # Horovod: horovod.spark.run
        try:
            import horovod.spark  # noqa: F401  (needs pyarrow)
        except ImportError as exc:
            raise ConfigError(
                f"horovod.spark cannot be imported ({exc}). Fix: pip install the kit's "
                f"dependencies (make lab: pyspark, pyarrow) and build Horovod "
                f"(scripts/build-horovod.sh)."
            ) from None
    slots = master_slots(master)
    if slots is not None and config.workers > slots:
        raise ConfigError(too_few_slots(config.strategy, config.workers, master, slots))


def too_few_slots(strategy: str, workers: int, master: str, slots: int) -> str:
    """Why ``workers`` cannot run on ``slots`` free task slots, and the fix (pure)."""
    if strategies.get(strategy).needs_horovodrun:  # horovod.spark.run: an ordinary stage
        what = (
            f"{workers} Horovod ranks need {workers} task slots at once, but {master} has "
            f"{slots} free: horovod.spark.run would start {slots} of its tasks, which would "
            f"wait for the others until its start_timeout ({START_TIMEOUT} s here) and fail"
        )
    else:
        wait = BARRIER_CHECK_INTERVAL * BARRIER_CHECK_FAILURES
        what = (
            f"{workers} workers need {workers} task slots at once (a barrier stage starts all "
            f"its tasks together), but {master} has {slots} free: Spark would re-check for "
            f"slots and fail the job after about {wait} s "
            f"(spark.scheduler.barrier.maxConcurrentTasksCheck.interval x maxFailures)"
        )
    if _LOCAL.match(master):
        more = f"use master='local[{workers}]'"
    elif find(master) is not None:
        more = f"start a cluster with {workers} slots (dk.spark.local_cluster(workers={workers}))"
    else:
        more = f"free {workers - slots} more slot(s) (more worker cores, or fewer applications)"
    return f"{what}. Fix: ask for {slots} workers or fewer, or {more}."


def collector_check(master: str, bind: str | None, advertise: str | None) -> None:
    """Executors on other machines cannot reach a collector on this machine's loopback."""
    from ddlkit.metrics.protocol import is_loopback

    told = advertise or bind
    if bind is None or LOOPBACK_MASTER.match(master) or not is_loopback(told):
        return
    raise ConfigError(
        f"the executors of {master} may run on other machines, which cannot send live metrics "
        f"to {told} on this one. Fix: pass collector_host= an address of this machine they "
        f"reach (ddlkit launch --collector-host ADDRESS; 'auto' finds the one towards a "
        f"spark://HOST master), or live=False (--no-live)."
    )


def collector_host_for(master: str, collector_host: str | None) -> str | None:
    """``collector_host='auto'`` for a ``spark://HOST`` master: this machine's address
    towards HOST (launch's own 'auto' knows only the hosts it was given)."""
    remote = remote_master_host(master)
    if collector_host != "auto" or remote is None:
        return collector_host
    from ddlkit.launch.remote import address_towards

    return address_towards([remote])


def driver_spec(config, master: str, run_id: str, run_dir: Path, extra_env: dict) -> JobSpec:
    """The run's one process: the driver, with the worker contract's shared variables (pure)."""
    name = contract.SPARK_DRIVER
    env = {
        **config.env,
        **backend.keras_env(config.keras),
        STRATEGY_VAR: config.strategy,
        **extra_env,
        "PYSPARK_PYTHON": config.python,  # the executors' Python: the kit's
        "PYSPARK_DRIVER_PYTHON": config.python,
    }
    forward = [a for k in sorted(config.env) for a in ("--forward", k)]
    argv = (
        config.python,
        "-m",
        "ddlkit.spark",
        "driver",
        "--master",
        master,
        "--strategy",
        config.strategy,
        "--workers",
        str(config.workers),
        "--python",
        config.python,
        "--app-name",
        run_id,
        *forward,
        str(config.script),
        "--",
        *config.args,
    )
    worker = WorkerSpec(
        name=name,
        argv=argv,
        env=env,
        cwd=contract.work_dir(run_dir, name),
        log_path=contract.log_path(run_dir, name),
    )
    return JobSpec(run_id=run_id, run_dir=run_dir, workers=(worker,))


def metric_workers(config) -> list[str] | None:
    """The workers the dashboard lists from the start (Horovod's ranks name themselves)."""
    if strategies.get(config.strategy).needs_horovodrun:
        return None
    return [contract.task_name("worker", i) for i in range(config.workers)]


def start(config, master, live, runs_dir, collector_host, collector_port, token):
    """A Spark run for `ddlkit.launch.start`: checks (nothing started on failure), then the
    driver as the run's job; returns its `ddlkit.launch.run.Run`."""
    import secrets

    from ddlkit import settings
    from ddlkit.environments import for_worker
    from ddlkit.launch.collect import collector_address as _collector_address
    from ddlkit.launch.handle import Run
    from ddlkit.launch.job import Job
    from ddlkit.launch.runs import new_run_id
    from ddlkit.metrics import Collector
    from ddlkit.metrics.protocol import is_loopback

    check(config, master)
    collector_host = collector_host_for(master, collector_host)
    bind, advertise = _collector_address(config, collector_host) if live else (None, None)
    collector_check(master, bind, advertise)
    if bind is not None and not is_loopback(bind) and token is None:
        token = secrets.token_hex(16)
    run_id = new_run_id(config.label or f"spark-{config.strategy}-{config.workers}")
    run_dir = Path(runs_dir or settings.runs_dir()) / run_id
    collector = Collector(run_dir, host=bind, port=collector_port, token=token) if bind else None
    try:
        extra_env = collector.env(advertise) if collector else {}
        spec = driver_spec(config, master, run_id, run_dir, extra_env)
        for worker in spec.workers:
            for_worker(worker).prepare(worker)
        job = Job.start(spec, progress_fn=_progress_all(collector) if collector else None)
    except BaseException:
        if collector is not None:
            collector.close()
        raise
    run = Run(config, None, job, collector)
    run.metric_workers = metric_workers(config)
    return run


def _progress_all(collector):
    """The driver's progress: the slowest step of every reporting worker."""

    def step(worker: str) -> int | None:
        steps = [collector.latest(w) for w in collector.workers()]
        return min((r.step for r in steps if r is not None), default=None)

    return step
