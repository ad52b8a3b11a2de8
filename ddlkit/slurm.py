"""Slurm: a kit worker's TF_CONFIG, name and run directory from its Slurm job step.

Each task of ``srun`` runs ``python -m ddlkit.slurm exec -- SCRIPT ARGS...``, which
sets ``TF_CONFIG``, ``DDLKIT_WORKER`` and ``DDLKIT_RUN_DIR`` (the worker environment
contract of docs/design.md) from the ``SLURM_*`` variables and then replaces itself
with ``python SCRIPT ARGS...`` (``os.execv``, no shell). The templates in
``launch/slurm/`` do this for you::

    sbatch launch/slurm/multi_worker.sbatch --epochs 1      # MultiWorkerMirroredStrategy
    sbatch launch/slurm/parameter_server.sbatch --epochs 1  # ParameterServerStrategy
    sbatch launch/slurm/horovod.sbatch --epochs 1           # Horovod (Gloo) via horovodrun

With ``exec --ps N`` task 0 is the chief, the next N are parameter servers and the rest
workers; the ps and worker servers never end by themselves, so the wrapper runs them as
its children and ends them once the chief has written its result
(:func:`serve_until_chief_reports`).

The cluster is the one ``tf.distribute.cluster_resolver.SlurmClusterResolver``
builds (every task ``host:port_base+i`` for its i-th task on that host, task
index = ``SLURM_PROCID``, roles in the order chief, ps, worker), computed here
without TensorFlow and with two differences, both checked in tests/test_slurm.py:

- hosts keep Slurm's node order (``n9`` before ``n10``); TensorFlow sorts them as
  strings, which hands task 0 the address of a node it does not run on;
- no GPU count is needed: TensorFlow's resolver calls ``nvidia-smi`` and fails on a
  CPU node (``FileNotFoundError``), or with ``gpus_per_node=0`` (``range() arg 3
  must not be zero``). :func:`resolver` gives TensorFlow's resolver with arguments
  that work on CPU nodes, for scripts that want it directly.

Tasks must be laid out in blocks (Slurm's default ``--distribution=block``); a task
whose ``SLURM_LOCALID`` or ``SLURMD_NODENAME`` disagrees with that layout is refused
with the fix. Pure functions of an environment mapping, except :func:`resolver`,
:func:`serve_until_chief_reports` and :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlkit._tables import html_table
from ddlkit.contract import RUN_DIR_VAR, TF_CONFIG_VAR, WORKER_VAR, result_path, task_name
from ddlkit.errors import ConfigError

STEP_VARS = (
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)
JOB_VARS = ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE")
# Ports: 20000 + 20 per job id (mod 2000), so jobs sharing a node rarely collide.
PORT_FLOOR = 20000
PORTS_PER_JOB = 20
PORT_SLOTS = 2000
INSIDE_FIX = (
    "Fix: run it as a task of a Slurm job step, e.g. `srun python -m ddlkit.slurm exec -- "
    "launch/train_multi_worker.py` inside launch/slurm/multi_worker.sbatch "
    "(`sbatch launch/slurm/multi_worker.sbatch`)."
)
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_PART_RE = re.compile(r"([^,\[\]]*)(?:\[([^\]]+)\])?")
_TPN_RE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
CHIEF = task_name("chief", 0)  # the ParameterServerStrategy coordinator: task 0


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list in order: ``"n[1-2],m5"`` -> ``["n1", "n2", "m5"]``.

    Zero padding is kept (``"n[08-10]"`` -> ``n08, n09, n10``). One bracket per name.
    """
    hosts: list[str] = []
    parts, depth, current = [], 0, ""
    fix = "Fix: pass Slurm's own SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, e.g. 'node[1-2],gpu5'."
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ConfigError(f"bad Slurm host list {text!r}: unbalanced '[' and ']'. {fix}")
    parts.append(current)
    for part in parts:
        match = _PART_RE.fullmatch(part)
        if not part or match is None or not (match.group(1) or match.group(2)):
            raise ConfigError(f"bad Slurm host list {text!r} (at {part!r}). {fix}")
        prefix, ranges = match.group(1), match.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for item in ranges.split(","):
            numbers = _RANGE_RE.fullmatch(item)
            if numbers is None or int(numbers.group(2) or numbers.group(1)) < int(numbers.group(1)):
                raise ConfigError(
                    f"bad range {item!r} in Slurm host list {text!r}. Fix: ranges are "
                    f"'first-last' with first <= last, e.g. 'node[1-4,7]'."
                )
            first, last = numbers.group(1), numbers.group(2) or numbers.group(1)
            numbered = range(int(first), int(last) + 1)
            hosts.extend(prefix + str(i).zfill(len(first)) for i in numbered)
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list: ``"3(x2),1"`` -> ``[3, 3, 1]``."""
    counts: list[int] = []
    for part in text.split(","):
        match = _TPN_RE.fullmatch(part)
        if match is None or int(match.group(1)) < 1:
            raise ConfigError(
                f"bad Slurm tasks-per-node list {text!r} (at {part!r}). Fix: pass Slurm's "
                f"own SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE, e.g. '2(x3),1'."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _int_var(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    if not value.isdigit():
        raise ConfigError(f"{name}={value!r} is not a number. {INSIDE_FIX}")
    return int(value)


def _node_tasks(
    environ: Mapping[str, str], nodelist_var: str, counts_var: str
) -> tuple[tuple[str, int], ...]:
    """(host, tasks on it) pairs from a node list and a tasks-per-node variable."""
    hosts = expand_hostlist(environ[nodelist_var])
    counts = expand_tasks_per_node(environ[counts_var])
    what = f"{nodelist_var} / {counts_var}"
    if len(hosts) != len(counts):
        raise ConfigError(f"{what}: {len(hosts)} hosts but {len(counts)} task counts. {INSIDE_FIX}")
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"{what}: a host appears twice in {hosts}. {INSIDE_FIX}")
    return tuple(zip(hosts, counts, strict=True))


@dataclass(frozen=True)
class SlurmStep:
    """One task's view of its Slurm job step (from ``SLURM_*`` variables)."""

    job_id: int
    procid: int
    nodes: tuple[tuple[str, int], ...]  # (host, tasks on it) in Slurm's node order
    local_id: int | None = None  # SLURM_LOCALID, when set
    node_name: str | None = None  # SLURMD_NODENAME, when set

    @property
    def num_tasks(self) -> int:
        return sum(n for _, n in self.nodes)

    def addresses(self, port_base: int) -> list[str]:
        """``host:port`` of every task in ``SLURM_PROCID`` order (block layout)."""
        return [f"{host}:{port_base + i}" for host, count in self.nodes for i in range(count)]

    def _repr_html_(self) -> str:
        rows = [(host, count) for host, count in self.nodes]
        caption = f"Slurm job {self.job_id}: task {self.procid} of {self.num_tasks}"
        return html_table(("node", "tasks"), rows, caption)


def step_from_env(environ: Mapping[str, str]) -> SlurmStep:
    """The job step this task belongs to; ConfigError naming every missing variable."""
    missing = [v for v in STEP_VARS if not environ.get(v)]
    if missing:
        raise ConfigError(
            f"not inside a Slurm job step: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. {INSIDE_FIX}"
        )
    nodes = _node_tasks(environ, "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
    step = SlurmStep(
        job_id=_int_var(environ, "SLURM_JOB_ID"),
        procid=_int_var(environ, "SLURM_PROCID"),
        nodes=nodes,
        local_id=_int_var(environ, "SLURM_LOCALID") if environ.get("SLURM_LOCALID") else None,
        node_name=environ.get("SLURMD_NODENAME") or None,
    )
    total = _int_var(environ, "SLURM_STEP_NUM_TASKS")
    if total != step.num_tasks or step.procid >= total:
        raise ConfigError(
            f"SLURM_STEP_NUM_TASKS={total}, SLURM_PROCID={step.procid} and "
            f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']!r} disagree. "
            f"{INSIDE_FIX}"
        )
    _check_block_layout(step)
    return step


def _check_block_layout(step: SlurmStep) -> None:
    first = 0
    for host, count in step.nodes:
        if first <= step.procid < first + count:
            where, local = host, step.procid - first
            break
        first += count
    clash = []
    if step.local_id is not None and step.local_id != local:
        clash.append(f"SLURM_LOCALID={step.local_id}, not {local}")
    if step.node_name is not None and step.node_name != where:
        clash.append(f"SLURMD_NODENAME={step.node_name!r}, not {where!r}")
    if clash:
        raise ConfigError(
            f"task {step.procid} is not where a block layout puts it ({'; '.join(clash)}), so "
            f"the workers would not agree on the cluster. Fix: lay tasks out in blocks, "
            f"`srun --distribution=block` (Slurm's default), not cyclic or arbitrary."
        )


def default_port_base(job_id: int) -> int:
    """The first port of a job's workers on each node: ``20000 + 20 * (job_id % 2000)``."""
    return PORT_FLOOR + PORTS_PER_JOB * (job_id % PORT_SLOTS)


def _port_base(step: SlurmStep, port_base: int | None) -> int:
    most = max(n for _, n in step.nodes)
    if port_base is None:
        if most > PORTS_PER_JOB:
            raise ConfigError(
                f"{most} tasks on one node, more than the {PORTS_PER_JOB} ports a job gets by "
                f"default. Fix: pass --port-base N with N..N+{most - 1} free on every node."
            )
        return default_port_base(step.job_id)
    if not 1024 <= port_base <= 65535 - most:
        raise ConfigError(
            f"port base {port_base} with {most} tasks per node is outside 1024-65535. "
            f"Fix: pick a port base between 1024 and {65535 - most}."
        )
    return port_base


def ps_roles(num_tasks: int, ps: int) -> dict[str, int]:
    """Tasks per role for ParameterServerStrategy: task 0 the chief (coordinator), the
    next ``ps`` parameter servers, the rest workers."""
    if ps < 1 or num_tasks - 1 - ps < 1:
        raise ConfigError(
            f"{num_tasks} tasks cannot hold a chief, {ps} parameter server(s) and at least "
            f"one worker. Fix: ask Slurm for at least {max(ps, 1) + 2} tasks (--ntasks) or "
            f"use fewer parameter servers (at least 1)."
        )
    return {"chief": 1, "ps": ps, "worker": num_tasks - 1 - ps}


def tf_config_from_slurm(
    environ: Mapping[str, str], port_base: int | None = None, ps: int = 0
) -> dict:
    """This task's TF_CONFIG from its Slurm job step.

    ``ps=0``: every task a ``worker``, index ``SLURM_PROCID`` (MultiWorkerMirroredStrategy;
    worker 0 is its chief). ``ps=N``: task 0 the ``chief``, then N ``ps``, the rest
    ``worker`` (ParameterServerStrategy; :func:`ps_roles`), as TensorFlow's resolver with
    ``jobs={"chief": 1, "ps": N, "worker": rest}``. ``port_base`` defaults to
    :func:`default_port_base` of the job id, the same on every task.
    """
    step = step_from_env(environ)
    addresses = step.addresses(_port_base(step, port_base))
    if not ps:
        return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": step.procid}}
    cluster, task, first = {}, {}, 0
    for role, count in ps_roles(step.num_tasks, ps).items():
        cluster[role] = addresses[first : first + count]
        if first <= step.procid < first + count:
            task = {"type": role, "index": step.procid - first}
        first += count
    return {"cluster": cluster, "task": task}


def default_run_dir(environ: Mapping[str, str]) -> Path:
    """``<runs>/slurm-<job id>`` (``ddlkit.settings.runs_dir()``): one run per job."""
    from ddlkit import settings

    if not environ.get("SLURM_JOB_ID", "").isdigit():
        raise ConfigError(f"SLURM_JOB_ID is not set or not a number. {INSIDE_FIX}")
    return settings.runs_dir() / f"slurm-{environ['SLURM_JOB_ID']}"


def worker_env(
    environ: Mapping[str, str],
    port_base: int | None = None,
    run_dir: str | os.PathLike | None = None,
    ps: int = 0,
) -> dict[str, str]:
    """The variables to add for this task (pure): TF_CONFIG, worker name, run dir, Keras.

    The worker name is the task's, e.g. ``worker-1`` or (with ``ps``) ``chief-0``, ``ps-0``.

    The run directory is ``run_dir``, else ``DDLKIT_RUN_DIR`` if already set (e.g. by
    the batch script), else :func:`default_run_dir`. It must be on a file system every
    node sees for one run to hold all workers' metrics and results.
    """
    from ddlkit.backend import keras_env

    config = tf_config_from_slurm(environ, port_base, ps)
    directory = run_dir or environ.get(RUN_DIR_VAR) or default_run_dir(environ)
    return {
        **keras_env(),
        TF_CONFIG_VAR: json.dumps(config, sort_keys=True),
        WORKER_VAR: task_name(config["task"]["type"], config["task"]["index"]),
        RUN_DIR_VAR: str(Path(directory).absolute()),
    }


def horovod_hosts(environ: Mapping[str, str]) -> str:
    """horovodrun's ``-H`` for the job's allocation, e.g. ``"n1:2,n2:2"`` (batch step)."""
    missing = [v for v in JOB_VARS if not environ.get(v)]
    if missing:
        raise ConfigError(
            f"not inside a Slurm job: {', '.join(missing)} not set. Fix: run it in the batch "
            f"script, e.g. launch/slurm/horovod.sbatch (`sbatch launch/slurm/horovod.sbatch`)."
        )
    nodes = _node_tasks(environ, "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE")
    return ",".join(f"{host}:{count}" for host, count in nodes)


def resolver(port_base: int | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """TensorFlow's ``SlurmClusterResolver`` for this task, set up to work on CPU nodes.

    TensorFlow reads ``os.environ`` itself; ``environ`` (default ``os.environ``) is only
    used here for the node layout and port base. Without GPUs (no
    ``CUDA_VISIBLE_DEVICES``) it passes one pretend GPU per task and does not touch
    ``CUDA_VISIBLE_DEVICES``: the only way its port enumeration works there.
    """
    import tensorflow as tf

    env = os.environ if environ is None else environ
    step = step_from_env(env)
    base = _port_base(step, port_base)
    most = max(n for _, n in step.nodes)
    if env.get("CUDA_VISIBLE_DEVICES"):
        return tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=base)
    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=base, gpus_per_node=most, gpus_per_task=1, auto_set_gpu=False
    )


def exec_argv(script: str, args: Sequence[str], python: str | None = None) -> list[str]:
    """``[python, script, *args]`` for ``os.execv``; ConfigError if the script is missing."""
    if not Path(script).is_file():
        raise ConfigError(
            f"worker script {script!r} not found (working directory {os.getcwd()}). Fix: "
            f"run from the repository root or pass the script's full path."
        )
    return [python or sys.executable, script, *args]


def _parser() -> argparse.ArgumentParser:
    about = "Run kit worker scripts as Slurm tasks."
    parser = argparse.ArgumentParser(prog="python -m ddlkit.slurm", description=about)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("exec", help="run SCRIPT ARGS... as this Slurm task's worker")
    run.add_argument("--port-base", type=int, default=None, help="default: from the job id")
    ps_help = "ParameterServerStrategy: task 0 the chief, N ps, the rest workers"
    run.add_argument("--ps", type=int, default=0, help=ps_help)
    run.add_argument("--run-dir", help="default: DDLKIT_RUN_DIR, else runs/slurm-<job id>")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("hosts", help="print horovodrun's -H for this job (in the batch script)")
    sub.add_parser("run-dir", help="print this job's default run directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``exec``: set the worker env and exec the script; ``hosts``; ``run-dir``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "hosts":
            print(horovod_hosts(os.environ))
            return 0
        if args.command == "run-dir":
            print(default_run_dir(os.environ).absolute())
            return 0
        script_args = args.args[1:] if args.args[:1] == ["--"] else args.args
        argv_list = exec_argv(args.script, script_args)
        env = worker_env(os.environ, args.port_base, args.run_dir, args.ps)
    except ConfigError as exc:
        print(f"ddlkit.slurm: error: {exc}", file=sys.stderr)
        return 2
    name = env[WORKER_VAR]
    print(
        f"ddlkit.slurm: {name} TF_CONFIG={env[TF_CONFIG_VAR]} run_dir={env[RUN_DIR_VAR]}",
        file=sys.stderr,
        flush=True,
    )
    os.environ.update(env)
    if args.ps and name != CHIEF:
        chief_result = result_path(env[RUN_DIR_VAR], CHIEF)
        return serve_until_chief_reports(argv_list, chief_result, name)
    os.execv(argv_list[0], argv_list)
    return 0  # not reached


def serve_until_chief_reports(
    argv: list[str], chief_result: Path, name: str, poll: float = 0.5, grace: float = 10.0
) -> int:
    """Run a ps or worker server (which never exits by itself) until the chief reports.

    Returns the server's exit code if it ends first, else 0 once ``chief_result`` is
    written after this started (the server gets SIGTERM, then SIGKILL after ``grace``
    seconds). If the chief fails instead, ``srun --kill-on-bad-exit`` ends the job.
    """
    import signal
    import subprocess
    import time

    started = time.time()
    child = subprocess.Popen(argv)

    def stop(*_: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        while child.poll() is None:
            try:
                reported = chief_result.stat().st_mtime >= started - 1
            except OSError:
                reported = False
            if reported:
                print(f"ddlkit.slurm: {name}: the chief reported; ending this server", flush=True)
                child.terminate()
                try:
                    child.wait(grace)
                except subprocess.TimeoutExpired:
                    child.kill()
                return 0
            time.sleep(poll)
        return child.returncode
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


if __name__ == "__main__":
    raise SystemExit(main())
