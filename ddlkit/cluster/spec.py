"""TensorFlow cluster specs: :class:`Task`, :class:`ClusterSpec` and TF_CONFIG per task.

A :class:`ClusterSpec` holds :class:`Task` objects with TensorFlow's roles
(``chief``, ``ps``, ``worker``, ``evaluator``) and checks these rules:

- at least one chief or worker (someone must train);
- at most one chief and at most one evaluator;
- each role's indexes are exactly ``0 .. n-1`` (TF_CONFIG names tasks by index);
- every task has its own ``host:port`` (compared as written: ``localhost`` and
  ``127.0.0.1`` count as different hosts);
- ps tasks need a chief and at least one worker: the kit runs
  ParameterServerStrategy with the chief as its coordinator.

The evaluator is not part of the ``cluster`` in TF_CONFIG (as in TensorFlow);
it gets the cluster of the others and its own ``task`` entry. It still has a
host and a port in the spec, like every process the launcher starts.

Plain data, except that :meth:`ClusterSpec.local` and :meth:`ClusterSpec.from_hosts`
without ``base_port`` pick free ports (:mod:`ddlkit.cluster.ports`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ddlkit.cluster._table import _plural, _Table
from ddlkit.cluster.hosts import (
    Host,
    _as_hosts,
    _host_problem,
    _is_int,
    _with_more_slots,
    format_hosts,
)
from ddlkit.cluster.ports import _pick_ports
from ddlkit.contract import TF_CONFIG_VAR, WORKER_VAR
from ddlkit.contract import task_name as contract_task_name
from ddlkit.errors import ConfigError

ROLES: tuple[str, ...] = ("chief", "ps", "worker", "evaluator")
"""TensorFlow's task types, in the order :attr:`ClusterSpec.tasks` lists them."""

_ROLE_ORDER = {role: i for i, role in enumerate(ROLES)}


@dataclass(frozen=True)
class Task:
    """One process of a TensorFlow cluster: its role, index within the role, and address."""

    role: str
    index: int
    host: str
    port: int

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(
                f"unknown task role {self.role!r}. Fix: use one of {', '.join(ROLES)}."
            )
        if not _is_int(self.index) or self.index < 0:
            raise ConfigError(
                f"task {self.role} index {self.index!r} must be an integer >= 0. "
                f"Fix: number the {self.role} tasks 0, 1, 2, ..."
            )
        problem = _host_problem(self.host)
        if problem:
            raise ConfigError(
                f"task {self.role}-{self.index}: bad host {self.host!r}: {problem}. "
                "Fix: use a host name or IPv4 address, e.g. '127.0.0.1'."
            )
        if not _is_int(self.port) or not 1 <= self.port <= 65535:
            raise ConfigError(
                f"task {self.role}-{self.index}: port {self.port!r} is not a TCP port. "
                "Fix: use 1..65535, or let ClusterSpec.local() pick free ports."
            )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def name(self) -> str:
        return task_name(self)

    def __str__(self) -> str:
        return f"{self.name} at {self.address}"


def task_name(task: Task) -> str:
    """The worker name used in files and ``DDLKIT_WORKER``: ``chief-0``, ``worker-1``, ..."""
    return contract_task_name(task.role, task.index)


def _check_roles(pairs: list[tuple[str, int]]) -> None:
    """The role rules of a cluster, on (role, index) pairs (see the module docstring)."""
    indexes = {role: sorted(i for r, i in pairs if r == role) for role in ROLES}
    count = {role: len(found) for role, found in indexes.items()}
    listed = ", ".join(f"{r}-{i}" for r, i in pairs) or "no tasks"
    if not count["chief"] and not count["worker"]:
        raise ConfigError(
            f"the cluster ({listed}) has no chief and no worker, so nothing trains. "
            "Fix: add workers, e.g. ClusterSpec.local(workers=2)."
        )
    for role in ("chief", "evaluator"):
        if count[role] > 1:
            raise ConfigError(
                f"the cluster has {count[role]} {role} tasks but TensorFlow allows at most one. "
                f"Fix: keep one {role}"
                + (" and make the others workers." if role == "chief" else ".")
            )
    for role, found in indexes.items():
        if found != list(range(len(found))):
            raise ConfigError(
                f"{role} indexes are {found} but must be 0..{len(found) - 1}, each once "
                f"(TF_CONFIG names tasks by index). Fix: number the {role} tasks "
                f"{', '.join(map(str, range(len(found))))}."
            )
    if count["ps"] and (not count["chief"] or not count["worker"]):
        missing = " and ".join(
            what
            for what, absent in (
                ("no chief", not count["chief"]),
                ("no worker", not count["worker"]),
            )
            if absent
        )
        raise ConfigError(
            f"the cluster has {_plural(count['ps'], 'ps task')} but {missing}: "
            "ParameterServerStrategy needs a chief (its coordinator) and at least one worker. "
            f"Fix: e.g. ClusterSpec.local(workers=2, ps={count['ps']}, chief=True)."
        )


def _wanted_tasks(workers: int, ps: int, chief: bool, evaluator: bool) -> list[tuple[str, int]]:
    for label, value in (("workers", workers), ("ps", ps)):
        if not _is_int(value) or value < 0:
            raise ConfigError(f"{label}={value!r} is not a count. Fix: pass {label}=0 or more.")
    for label, value in (("chief", chief), ("evaluator", evaluator)):
        if not isinstance(value, bool):
            raise ConfigError(f"{label}={value!r} must be True or False. Fix: {label}=True.")
    counts = {"chief": int(chief), "ps": ps, "worker": workers, "evaluator": int(evaluator)}
    pairs = [(role, i) for role in ROLES for i in range(counts[role])]
    _check_roles(pairs)
    return pairs


@dataclass(frozen=True)
class ClusterSpec(_Table):
    """The tasks of one TensorFlow job; builds each task's TF_CONFIG.

    ``tasks`` may be given in any order and is stored sorted: chief, ps,
    worker, evaluator, each by index. Use :meth:`local` or :meth:`from_hosts`
    to have ports picked and tasks placed for you.
    """

    tasks: tuple[Task, ...]

    def __post_init__(self) -> None:
        given = self.tasks
        if isinstance(given, (Task, str)) or not isinstance(given, Iterable):
            raise ConfigError(
                f"ClusterSpec(tasks=...) needs a sequence of Task objects, got {given!r}. "
                "Fix: ClusterSpec(tasks=[Task('worker', 0, '127.0.0.1', 2222), ...])."
            )
        tasks = tuple(given)
        for task in tasks:
            if not isinstance(task, Task):
                raise ConfigError(
                    f"ClusterSpec tasks must be Task objects, got {task!r}. "
                    "Fix: wrap it, e.g. Task('worker', 0, '127.0.0.1', 2222)."
                )
        tasks = tuple(sorted(tasks, key=lambda t: (_ROLE_ORDER[t.role], t.index)))
        object.__setattr__(self, "tasks", tasks)
        _check_roles([(t.role, t.index) for t in tasks])
        seen: dict[str, Task] = {}
        for task in tasks:
            if task.address in seen:
                raise ConfigError(
                    f"{seen[task.address].name} and {task.name} both use {task.address}. "
                    "Fix: give each task its own port, or let ClusterSpec.local() or "
                    "ClusterSpec.from_hosts() pick them."
                )
            seen[task.address] = task

    @classmethod
    def local(
        cls,
        workers: int = 2,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        host: str = "127.0.0.1",
    ) -> ClusterSpec:
        """All tasks on one address of this machine, on free ports."""
        total = len(_wanted_tasks(workers, ps, chief, evaluator))
        return cls.from_hosts(
            (Host(host, total),), workers=workers, ps=ps, chief=chief, evaluator=evaluator
        )

    @classmethod
    def from_hosts(
        cls,
        hosts: str | Host | Iterable[Host],
        workers: int,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        base_port: int | None = None,
        distinct_ports: bool = False,
    ) -> ClusterSpec:
        """Place tasks onto host slots, filling each host before the next.

        Tasks go in the order chief, ps, worker, evaluator. With ``base_port``
        every host uses ports ``base_port, base_port + 1, ...`` for its slots
        (what remote machines need); without it, free ports are picked by
        binding on each host, which works only for addresses of this machine.
        ``distinct_ports`` numbers the ports across all hosts instead (``base_port``
        up, one per task): for hosts sharing one network stack (user-mode demo hosts),
        where TensorFlow's servers, which bind every address, would clash.
        """
        host_list = _as_hosts(hosts)
        wanted = _wanted_tasks(workers, ps, chief, evaluator)
        slots = [(host.name, local) for host in host_list for local in range(host.slots)]
        if len(wanted) > len(slots):
            example = _with_more_slots(host_list, len(wanted) - len(slots))
            raise ConfigError(
                f"{_plural(len(wanted), 'task')} ({', '.join(f'{r}-{i}' for r, i in wanted)}) "
                f"need {len(wanted)} slots but hosts {format_hosts(host_list)!r} give "
                f"{len(slots)}. Fix: add slots (e.g. {example!r}) or ask for fewer tasks."
            )
        placed = list(zip(wanted, slots[: len(wanted)], strict=True))
        if base_port is None:
            counts: dict[str, int] = {}
            for _, (host, _) in placed:
                counts[host] = counts.get(host, 0) + 1
            ports = _pick_ports(counts)
            addresses = [(host, ports[host][local]) for _, (host, local) in placed]
        else:
            if distinct_ports:
                placed = [(task, (host, n)) for n, (task, (host, _)) in enumerate(placed)]
            highest = max(local for _, (_, local) in placed)
            if not _is_int(base_port) or base_port < 1 or base_port + highest > 65535:
                raise ConfigError(
                    f"base_port={base_port!r} with up to {highest + 1} tasks on a host gives "
                    f"ports outside 1..65535. Fix: e.g. base_port=2222."
                )
            addresses = [(host, base_port + local) for _, (host, local) in placed]
        return cls(
            tasks=tuple(
                Task(role, index, host, port)
                for (role, index), (host, port) in zip(wanted, addresses, strict=True)
            )
        )

    def __len__(self) -> int:
        return len(self.tasks)

    def count(self, role: str) -> int:
        """How many tasks have ``role``."""
        if role not in ROLES:
            raise ConfigError(f"unknown task role {role!r}. Fix: use one of {', '.join(ROLES)}.")
        return sum(1 for t in self.tasks if t.role == role)

    @property
    def num_workers(self) -> int:
        """Tasks with role ``worker`` (the chief is not counted)."""
        return self.count("worker")

    def task(self, name: str) -> Task:
        """The task called ``name``, e.g. ``"worker-1"``."""
        for task in self.tasks:
            if task.name == name:
                return task
        raise ConfigError(
            f"no task {name!r} in this cluster. Fix: use one of "
            f"{', '.join(t.name for t in self.tasks)}."
        )

    def _own(self, task: Task | str) -> Task:
        if isinstance(task, str):
            return self.task(task)
        if task not in self.tasks:
            raise ConfigError(
                f"task {task} is not part of this cluster. Fix: pass one of spec.tasks "
                f"({', '.join(str(t) for t in self.tasks)})."
            )
        return task

    def cluster_dict(self) -> dict[str, list[str]]:
        """TF_CONFIG's ``cluster``: ``{role: ["host:port", ...]}``, without the evaluator."""
        cluster: dict[str, list[str]] = {}
        for task in self.tasks:
            if task.role != "evaluator":
                cluster.setdefault(task.role, []).append(task.address)
        return cluster

    def tf_config(self, task: Task | str) -> dict:
        """The TF_CONFIG dict for ``task`` (a Task of this spec or its name)."""
        task = self._own(task)
        return {"cluster": self.cluster_dict(), "task": {"type": task.role, "index": task.index}}

    def tf_config_json(self, task: Task | str) -> str:
        """:meth:`tf_config` as the JSON string the ``TF_CONFIG`` variable holds."""
        return json.dumps(self.tf_config(task))

    def env(self, task: Task | str) -> dict[str, str]:
        """The cluster part of a worker's environment: ``TF_CONFIG`` and ``DDLKIT_WORKER``."""
        task = self._own(task)
        return {TF_CONFIG_VAR: self.tf_config_json(task), WORKER_VAR: task.name}

    def _table(self) -> tuple[str, tuple[str, ...], list[tuple[object, ...]]]:
        parts = [_plural(self.count(role), role) for role in ROLES if self.count(role)]
        caption = f"ClusterSpec: {', '.join(parts)}"
        rows = [
            (t.name, t.role, t.index, t.address, "no" if t.role == "evaluator" else "yes")
            for t in self.tasks
        ]
        return caption, ("task", "role", "index", "address", "in cluster"), rows
