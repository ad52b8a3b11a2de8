"""A run on Ray from ``dk.launch.start(..., where=dk.where.Ray(ADDRESS))``: checked first,
then one driver process (:mod:`ddlkit.ray.driver`) started as the run's job.

Checked before anything starts (one ConfigError each, naming the cause and the fix): Ray is
installed; the strategy is one the kit runs on Ray (multi_worker, horovod: then
``horovod.ray`` imports); something answers at the
address; this Ray can join that cluster (``ray.init`` refuses a cluster started by another
Ray or Python version: "Version mismatch", ``ray._private.utils.check_version_info``); the
cluster has a CPU for every worker. The last two are read by a short-lived driver
(``python -m ddlkit.ray check``), so this process never imports Ray nor joins the cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ddlkit import backend, contract, strategies
from ddlkit.contract import STRATEGY_VAR
from ddlkit.errors import ConfigError
from ddlkit.launch.spec import JobSpec, WorkerSpec
from ddlkit.ray import cluster as ray_cluster
from ddlkit.where import split_ray_address as split_address

STRATEGIES = ("multi_worker", "horovod")
CHECK_TIMEOUT = 60.0  # seconds for the check's `ray.init` (importing Ray takes a few)


def reachable(address: str, timeout: float = 2.0) -> None:
    """ConfigError unless something accepts a connection at ``address``."""
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"no Ray cluster at {address} ({exc.strerror or exc}). Fix: start one (`ray start "
            f"--head --port {port}` on {host}, or dk.ray.local_cluster()) or correct the address."
        ) from None


def cluster_state(address: str, env: dict[str, str], python: str = sys.executable) -> dict:
    """What ``python -m ddlkit.ray check`` reads of the cluster (see the module docstring)."""
    full = {**os.environ, **env, "RAY_USAGE_STATS_ENABLED": "0"}
    full.pop("RAY_ADDRESS", None)
    try:
        out = subprocess.run(
            [python, "-m", "ddlkit.ray", "check", address],
            env=full,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"the Ray cluster at {address} did not answer a driver within {CHECK_TIMEOUT:.0f} s. "
            f"Fix: check that its head is up (`ray status --address {address}`)."
        ) from None
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ConfigError(
            f"could not read the Ray cluster at {address}: {out.stderr.strip()[-800:]}. "
            f"Fix: check that Ray is installed here (make lab) and the head is up."
        )
    return json.loads(lines[-1])


def check_state(state: dict, address: str, workers: int) -> None:
    """One ConfigError for a cluster this run cannot use (pure, from :func:`cluster_state`)."""
    if "error" in state:
        if state.get("kind") == "version":
            import importlib.metadata

            mine = importlib.metadata.version("ray")
            raise ConfigError(
                f"the Ray cluster at {address} runs another Ray or Python version than this "
                f"kit's (Ray {mine}, Python {sys.version.split()[0]}); Ray refuses to mix them:\n"
                f"{state['error'].strip()}\nFix: start the cluster with this venv's Ray "
                f"({Path(sys.executable).parent / 'ray'} start ...), or install the cluster's "
                f"version here (pip install 'ray[train]==VERSION')."
            )
        text = state["error"].strip()
        more = ""
        if "auth" in text.lower() or "token" in text.lower():
            more = (
                " The cluster wants a token: pass dk.where.Ray(address, token_path=...) "
                "(a dk.ray.local_cluster() of this process is found by its address)."
            )
        raise ConfigError(
            f"could not join the Ray cluster at {address}: {text.splitlines()[-1]}.{more} "
            f"Fix: check the address and that the head is up (`ray status`)."
        )
    cpus = int(state.get("cpus", 0))
    free = int(state.get("free_cpus", 0))
    if workers > free:
        nodes = ", ".join(f"{n['ip']} ({n['cpus']:g})" for n in state.get("nodes", []))
        raise ConfigError(
            f"{workers} workers need {workers} CPUs at once (one placement group of {workers} "
            f"x 1 CPU, reserved all together or not at all), but the Ray cluster at {address} "
            f"has {free} of {cpus} CPUs free (nodes: {nodes}): the group would wait for CPUs "
            f"that do not come. Fix: ask for {free} workers or fewer, or add nodes "
            f"(`ray start --address {address} --num-cpus N`; "
            f"dk.ray.local_cluster(nodes={workers}))."
        )


def check(config, where) -> dict:
    """Everything a Ray run needs, before anything starts; the cluster's state."""
    if config.strategy not in STRATEGIES:
        raise ConfigError(
            f"strategy {config.strategy!r} does not run on dk.where.Ray. Fix: use "
            f"strategy='multi_worker' or 'horovod' on Ray, or run it here "
            f"(where=dk.where.ThisMachine())."
        )
    ray_cluster.ray_bin(config.python)
    if strategies.get(config.strategy).needs_horovodrun:  # Horovod: horovod.ray
        import importlib.util

        if importlib.util.find_spec("horovod") is None:
            raise ConfigError(
                "strategy='horovod' on Ray needs Horovod (horovod.ray). Fix: build it with "
                "make horovod (scripts/build-horovod.sh)."
            )
    reachable(where.address)
    state = cluster_state(where.address, auth(where), config.python)
    check_state(state, where.address, config.workers)
    return state


def auth(where) -> dict[str, str]:
    """The token variables for ``where``: its ``token_path``, else a local cluster's."""
    path = where.token_path
    if path is None:
        local = ray_cluster.find(where.address)
        path = local.token_path if local is not None else None
    return ray_cluster.auth_env(path)


def driver_spec(config, where, run_id: str, run_dir: Path, extra_env: dict) -> JobSpec:
    """The run's one process: the driver, with the worker contract's shared variables (pure
    but for ``auth``, which looks up a local cluster's token file)."""
    name = contract.RAY_DRIVER
    env = {
        **config.env,
        **backend.keras_env(config.keras),
        STRATEGY_VAR: config.strategy,
        **extra_env,
        **auth(where),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    forward = [a for k in sorted(config.env) for a in ("--forward", k)]
    argv = (
        config.python,
        "-m",
        "ddlkit.ray",
        "driver",
        "--address",
        where.address,
        "--strategy",
        config.strategy,
        "--workers",
        str(config.workers),
        "--placement",
        where.placement,
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


def collector_bind(where) -> str:
    """The address the run's collector listens on: ``where.collector_host``; ``"auto"``: this
    machine's address towards the head (its network is the nodes'); default loopback."""
    if where.collector_host is None:
        return "127.0.0.1"
    if where.collector_host == "auto":
        from ddlkit.launch.remote import address_towards

        return address_towards([split_address(where.address)[0]])
    return where.collector_host


def start(config, where, live, runs_dir, collector_port, token):
    """A Ray run for `ddlkit.launch.start`: checks (nothing started on failure), then the
    driver as the run's job; returns its `ddlkit.launch.run.Run`."""
    import secrets

    from ddlkit import settings
    from ddlkit.environments import for_worker
    from ddlkit.launch.handle import Run
    from ddlkit.launch.job import Job
    from ddlkit.launch.runs import new_run_id
    from ddlkit.metrics import Collector
    from ddlkit.metrics.protocol import is_loopback
    from ddlkit.spark.submit import _progress_all, metric_workers

    check(config, where)
    bind = collector_bind(where) if live else None
    if bind is not None and not is_loopback(bind) and token is None:
        token = secrets.token_hex(16)  # the actors send it in their hello, over the network
    run_id = new_run_id(config.label or f"ray-{config.strategy}-{config.workers}")
    run_dir = Path(runs_dir or settings.runs_dir()) / run_id
    collector = Collector(run_dir, host=bind, port=collector_port, token=token) if bind else None
    try:
        extra_env = collector.env(None) if collector else {}
        spec = driver_spec(config, where, run_id, run_dir, extra_env)
        for worker in spec.workers:
            for_worker(worker).prepare(worker)
        job = Job.start(spec, progress_fn=_progress_all(collector) if collector else None)
    except BaseException:
        if collector is not None:
            collector.close()
        raise
    run = Run(config, None, job, collector)
    run.metric_workers = metric_workers(config)  # Horovod's ranks name themselves
    return run
