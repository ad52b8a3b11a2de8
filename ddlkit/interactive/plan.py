"""Live workers as a job the launcher runs (pure data): the strategy's planned workers, each
process made an ipyparallel engine, plus the engines' controller.

``dk.workers`` plans exactly what ``dk.launch.start`` plans (the strategy's `WorkerSpec` s,
from `ddlkit.launch.plan.plan`: TF_CONFIG from `ddlkit.cluster.ClusterSpec`, the Keras
choice, thread counts, cores, the collector's address) with :data:`ENGINE` as the script:
each worker process is an engine instead of a training script. This module adds the one
process the launcher does not plan, the controller (:func:`controller_spec`), and, for a
parameter-server job, takes the chief out (the notebook is the coordinator) and makes the
ps and worker tasks plain TensorFlow servers (:data:`SERVER`).

In a Slurm allocation (:func:`srun_spec`) the job is the controller and one local process,
``srun``, whose tasks each run ``python -m ddlkit.slurm exec`` (TF_CONFIG, name and run
directory from ``SLURM_*``: `ddlkit.environments.slurm.Slurm`) and then the engine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ddlkit import contract, strategies
from ddlkit.cluster import ClusterSpec
from ddlkit.errors import ConfigError
from ddlkit.launch.spec import JobSpec, WorkerSpec

ENGINE = Path(__file__).with_name("engine.py")  # an engine that is one worker (see engine.py)
SERVER = Path(__file__).with_name("server.py")  # a ps or worker server of a PS job
CONTROLLER = Path(__file__).with_name("controller.py")  # ipcontroller, its children tied to it
PROFILE_DIR = "ipython"  # under the run dir: the controller's connection files (mode 0600)
ENGINE_FILE = "ipcontroller-engine.json"
CLIENT_FILE = "ipcontroller-client.json"
URL_WAIT = 120.0  # seconds an engine waits for the controller's connection file
CONTROLLER_PORTS = 20  # the controller listens on 16 (ipyparallel 9.2: "at least 14")
STRATEGIES = ("multi_worker", "horovod", "parameter_server")
SLURM_STRATEGIES = ("multi_worker",)  # what srun starts as live workers
CHIEF = contract.task_name("chief", 0)


def profile_dir(run_dir: Path) -> Path:
    return Path(run_dir) / PROFILE_DIR


def engine_file(run_dir: Path) -> Path:
    return profile_dir(run_dir) / "security" / ENGINE_FILE


def client_file(run_dir: Path) -> Path:
    return profile_dir(run_dir) / "security" / CLIENT_FILE


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"dk.workers(strategy={strategy!r}): live workers are for strategies of several "
            f"processes. Fix: use one of {', '.join(STRATEGIES)}; MirroredStrategy runs in this "
            f"notebook's own process (tf.distribute.MirroredStrategy(), notebook 01)."
        )


def engine_names(strategy: str, workers: int, cluster: ClusterSpec | None) -> tuple[str, ...]:
    """The workers' names in engine-id order: the cluster's worker tasks, or horovodrun's ranks."""
    if strategies.get(strategy).needs_horovodrun:
        return tuple(contract.rank_name(r) for r in range(workers))
    assert cluster is not None
    return tuple(t.name for t in cluster.tasks if t.role == "worker")


def engine_args(run_dir: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """The arguments of :data:`ENGINE` (the same for every worker: each finds its own id)."""
    return ("--names", ",".join(names), "--url-file", str(engine_file(run_dir)))


def controller_spec(
    run_dir: Path, python: str, ip: str, first_port: int, cpus: tuple[int, ...] | None = None
) -> WorkerSpec:
    """The ipyparallel controller: listens on ``ip`` (loopback unless workers are on other
    hosts) on the :data:`CONTROLLER_PORTS` ports from ``first_port``, writes its connection
    files (with their key, mode 0600) under the run dir. (Left to itself it picks each port
    by binding port 0 and binds it again later: two controllers started at once took the
    same one, and one died with "Address already in use".)"""
    name = contract.CONTROLLER
    argv = (
        python,
        str(CONTROLLER),
        f"--profile-dir={profile_dir(run_dir)}",
        f"--ip={ip}",
        f"--IPController.ports={first_port}-{first_port + CONTROLLER_PORTS - 1}",
        "--log-level=WARN",
        # ms between the hub's heartbeats (ipyparallel's default: 3000); it drops an engine
        # silent for 10 of them, ~10 s (the job sees a process end sooner)
        "--HeartMonitor.period=1000",
        # Its schedulers as threads, not 6 forked processes (controller.py ties the one
        # child left, its heart monitor, to the controller's life).
        "--IPController.use_threads=True",
    )
    return WorkerSpec(
        name=name,
        argv=argv,
        env={},
        cwd=contract.work_dir(run_dir, name),
        log_path=contract.log_path(run_dir, name),
        cpus=cpus,
        threads=1,
        service=True,
    )


def engines_job(spec: JobSpec, controller: WorkerSpec) -> JobSpec:
    """The planned job with the controller first (it never exits by itself: a service)."""
    return JobSpec(spec.run_id, spec.run_dir, (controller, *spec.workers))


def servers_job(spec: JobSpec, python: str) -> JobSpec:
    """A parameter-server job without its chief (this notebook coordinates), each ps and
    worker task a TensorFlow server (:data:`SERVER`) with its planned environment."""
    servers = tuple(
        dataclasses.replace(w, argv=(python, str(SERVER)), service=True)
        for w in spec.workers
        if w.name != CHIEF
    )
    return JobSpec(spec.run_id, spec.run_dir, servers)


def coordinator_env(cluster: ClusterSpec) -> dict[str, str]:
    """The TF_CONFIG of the chief: what this notebook sets to coordinate the servers."""
    return {contract.TF_CONFIG_VAR: cluster.tf_config_json(CHIEF)}


def check_slurm(strategy: str, workers: int, nodes: tuple[tuple[str, int], ...]) -> None:
    """ConfigError unless ``workers`` live workers of ``strategy`` fit the allocation's
    ``nodes`` (node, tasks) as srun tasks (pure)."""
    if strategy not in SLURM_STRATEGIES:
        by_hand = {"horovod": "horovod.sbatch", "parameter_server": "parameter_server.sbatch"}
        raise ConfigError(
            f"dk.workers(strategy={strategy!r}) in a Slurm allocation: only "
            f"{', '.join(SLURM_STRATEGIES)} workers are started as srun tasks. Fix: try it "
            f"with dk.where.ThisMachine(), then sbatch launch/slurm/{by_hand[strategy]}."
        )
    tasks = sum(n for _, n in nodes)
    if workers > tasks:
        raise ConfigError(
            f"dk.workers({workers}) in a Slurm allocation of {tasks} task(s) on "
            f"{', '.join(h for h, _ in nodes)}: srun cannot start more tasks than it holds. "
            f"Fix: dk.workers({tasks}, ...), or an allocation of {workers} (salloc -n {workers})."
        )


def srun_spec(
    run_dir: Path,
    python: str,
    names: tuple[str, ...],
    env: dict[str, str],
    port_base: int | None = None,
    srun_args: tuple[str, ...] = (),
) -> WorkerSpec:
    """``srun`` starting one task per worker of ``names`` (block layout, all ended when one
    fails), each becoming its worker (``ddlkit.slurm exec``) and then its engine."""
    name = contract.SRUN
    ports = ("--port-base", str(port_base)) if port_base is not None else ()
    argv = (
        "srun",
        f"--ntasks={len(names)}",
        "--kill-on-bad-exit=1",
        "--distribution=block",
        *srun_args,
        python,
        "-m",
        "ddlkit.slurm",
        "exec",
        *ports,
        "--run-dir",
        str(run_dir),
        "--",
        str(ENGINE),
        *engine_args(run_dir, names),
    )
    return WorkerSpec(
        name=name,
        argv=argv,
        env=env,
        cwd=contract.work_dir(run_dir, name),
        log_path=contract.log_path(run_dir, name),
    )
