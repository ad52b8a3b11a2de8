"""Slurm as an environment: ``srun`` starts the tasks, each reads who it is from ``SLURM_*``.

What :mod:`ddlkit.slurm` (``python -m ddlkit.slurm exec``) and the templates in
``launch/slurm/`` build on: the job step's layout parsed from Slurm's variables
(:func:`step_from_env`, pure), and :class:`Slurm`, the environment a task runs in
(``creates_processes_externally``): its world size and rank, its TF cluster as a
`ddlkit.cluster.ClusterSpec` (the same builder every launch path uses), its worker name
and environment (the worker contract of :mod:`ddlkit.contract`).

The cluster is the one ``tf.distribute.cluster_resolver.SlurmClusterResolver`` builds
(every task ``host:port_base+i`` for its i-th task on that host, task index =
``SLURM_PROCID``, roles in the order chief, ps, worker), with Slurm's node order kept
and no GPU count needed (see ddlkit.slurm). Tasks must be laid out in blocks (Slurm's
default ``--distribution=block``); a task whose ``SLURM_LOCALID`` or ``SLURMD_NODENAME``
disagrees with that layout is refused with the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddlkit._tables import html_table
from ddlkit.cluster import ClusterSpec, Host
from ddlkit.environments.base import Environment
from ddlkit.errors import ConfigError

STEP_VARS = (
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)
JOB_VARS = ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE")
# Ports: 20000 + 20 per job id (mod 638), so jobs sharing a node rarely collide, all below
# 32768 where Linux's ephemeral ports start (net.ipv4.ip_local_port_range, 32768-60999 by
# default): the kernel hands those to outgoing connections, so a fixed server port there
# can be taken by any client on the node (seen: job 1069's chief on 41380, "Could not start
# gRPC server"). The base must be computed the same on every node, so it is a constant,
# not read from this node's /proc.
PORT_FLOOR = 20000
PORTS_PER_JOB = 20
EPHEMERAL_FLOOR = 32768
PORT_SLOTS = (EPHEMERAL_FLOOR - PORT_FLOOR) // PORTS_PER_JOB  # 638
INSIDE_FIX = (
    "Fix: run it as a task of a Slurm job step, e.g. `srun python -m ddlkit.slurm exec -- "
    "launch/train_multi_worker.py` inside launch/slurm/multi_worker.sbatch "
    "(`sbatch launch/slurm/multi_worker.sbatch`)."
)
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_PART_RE = re.compile(r"([^,\[\]]*)(?:\[([^\]]+)\])?")
_TPN_RE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


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


ALLOCATION_FIX = (
    "Fix: start Python or JupyterLab inside an allocation, e.g. `salloc -n 2` then `jupyter "
    "lab` in the shell it opens (or in a batch script), or use dk.where.ThisMachine() here."
)


def allocation(environ: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """The (node, tasks) of the Slurm allocation this process runs in (``salloc``, a batch
    script), in Slurm's node order; ConfigError naming what is missing outside one."""
    missing = [v for v in ("SLURM_JOB_ID", *JOB_VARS) if not environ.get(v)]
    if missing:
        raise ConfigError(
            f"not inside a Slurm allocation: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. {ALLOCATION_FIX}"
        )
    return _node_tasks(environ, "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE")


def default_port_base(job_id: int) -> int:
    """The first port of a job's workers on each node: ``20000 + 20 * (job_id % 638)``,
    so every job's ports lie below Linux's ephemeral range (:data:`EPHEMERAL_FLOOR`)."""
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


class Slurm(Environment):
    """This task of a Slurm job step (``srun`` started it): who it is, its cluster, its env.

    ``ps=0``: every task a ``worker``, index ``SLURM_PROCID`` (MultiWorkerMirroredStrategy;
    worker 0 is its chief). ``ps=N``: task 0 the ``chief``, then N ``ps``, the rest
    ``worker`` (ParameterServerStrategy; :func:`ps_roles`). ``port_base`` defaults to
    :func:`default_port_base` of the job id, the same on every task.
    """

    name = "slurm"
    creates_processes_externally = True

    def __init__(self, step: SlurmStep, port_base: int | None = None, ps: int = 0) -> None:
        self.step = step
        self.port_base = _port_base(step, port_base)
        self.ps = ps
        self.host = dict(enumerate(h for h, n in step.nodes for _ in range(n)))[step.procid]

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return all(environ.get(v) for v in STEP_VARS)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], port_base: int | None = None, ps: int = 0
    ) -> Slurm:
        """This task's environment; ConfigError naming what is missing or inconsistent."""
        return cls(step_from_env(environ), port_base, ps)

    def world_size(self) -> int:
        return self.step.num_tasks

    def global_rank(self) -> int:
        return self.step.procid

    def roles(self) -> dict[str, int]:
        if not self.ps:
            return {"worker": self.step.num_tasks}
        return ps_roles(self.step.num_tasks, self.ps)

    def cluster(self) -> ClusterSpec:
        """The job step's TF cluster: tasks fill each node's slots on ``port_base`` and up."""
        roles = self.roles()
        return ClusterSpec.from_hosts(
            tuple(Host(host, count) for host, count in self.step.nodes),
            workers=roles["worker"],
            ps=roles.get("ps", 0),
            chief="chief" in roles,
            base_port=self.port_base,
        )
