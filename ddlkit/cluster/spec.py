"""Cluster configuration: host lists, free ports, TF_CONFIG per task, Horovod slots.

Everything here is plain data except :func:`free_ports` and :func:`port_is_free`,
which open and close sockets. Nothing imports TensorFlow.

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

Host lists use horovodrun's syntax, ``"h1:2,h2:2"`` (a host without ``:N`` has
one slot), and host files MPI's, one ``host slots=N`` per line.
"""

from __future__ import annotations

import contextlib
import errno
import html
import ipaddress
import json
import os
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError

ROLES: tuple[str, ...] = ("chief", "ps", "worker", "evaluator")
"""TensorFlow's task types, in the order :attr:`ClusterSpec.tasks` lists them."""

_ROLE_ORDER = {role: i for i, role in enumerate(ROLES)}
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_DIGITS_RE = re.compile(r"[0-9]+")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _plural(n: int, word: str) -> str:
    if n == 1 or word == "ps":
        return f"{n} {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


# ---------------------------------------------------------------- display


class _Table:
    """Mixin: ``__str__`` as a text table for the CLI, ``_repr_html_`` for notebooks."""

    def _table(self) -> tuple[str, tuple[str, ...], list[tuple[object, ...]]]:
        raise NotImplementedError

    def __str__(self) -> str:
        caption, headers, rows = self._table()
        cells = [list(headers)] + [[str(c) for c in row] for row in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([caption, *lines])

    def _repr_html_(self) -> str:
        caption, headers, rows = self._table()
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows
        )
        return (
            f"<table><caption>{esc(caption)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )


# ---------------------------------------------------------------- hosts


def _host_problem(name: object) -> str | None:
    """Why ``name`` is not a usable host name or IPv4 address, or None if it is."""
    if not isinstance(name, str):
        return f"the host name must be a string, not {type(name).__name__}"
    if not name:
        return "the host name is empty"
    if any(c.isspace() for c in name):
        return f"host name {name!r} contains whitespace"
    if ":" in name:
        return "IPv6 addresses are not supported in host lists"
    if len(name) > 253 or not _NAME_RE.fullmatch(name):
        return (
            f"{name!r} is not a host name or IPv4 address "
            "(letters, digits, '.', '-' and '_' only, not starting with '.' or '-')"
        )
    if re.fullmatch(r"[0-9.]+", name):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return f"{name!r} is not a valid IPv4 address"
    return None


@dataclass(frozen=True)
class Host:
    """A machine and how many processes (slots) it may run."""

    name: str
    slots: int = 1

    def __post_init__(self) -> None:
        problem = _host_problem(self.name)
        if problem:
            raise ConfigError(
                f"bad host {self.name!r}: {problem}. "
                "Fix: use a host name or IPv4 address, e.g. Host('localhost', 2)."
            )
        if not _is_int(self.slots) or self.slots < 1:
            raise ConfigError(
                f"bad slots {self.slots!r} for host {self.name!r}: slots must be a positive "
                f"integer. Fix: e.g. Host({self.name!r}, 2)."
            )

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def format_hosts(hosts: Iterable[Host]) -> str:
    """The horovodrun ``-H`` string for ``hosts``, e.g. ``"h1:2,h2:1"``."""
    return ",".join(str(h) for h in hosts)


def _check_unique(hosts: list[Host], where: str) -> None:
    seen: dict[str, Host] = {}
    for host in hosts:
        if host.name in seen:
            total = seen[host.name].slots + host.slots
            raise ConfigError(
                f"host {host.name!r} is listed twice {where} (with {seen[host.name].slots} "
                f"and {host.slots} slots). Fix: list each host once with all its slots, "
                f"e.g. {host.name}:{total}."
            )
        seen[host.name] = host


def _parse_entry(entry: str, text: str) -> Host:
    def bad(reason: str, example: str) -> ConfigError:
        return ConfigError(
            f"bad host entry {entry!r} in {text!r}: {reason}. "
            f"Fix: write it as host:slots, e.g. {example}."
        )

    if not entry:
        raise ConfigError(
            f"empty host entry in {text!r} (two commas in a row, or a comma at an end). "
            "Fix: remove the extra comma, e.g. 'h1:2,h2:2'."
        )
    if entry.count(":") > 1:
        raise bad("IPv6 addresses are not supported in host lists", "10.0.0.2:2")
    name, sep, slots = (part.strip() for part in entry.partition(":"))
    problem = _host_problem(name)
    if problem:
        raise bad(problem, "h1:2")
    if not sep:
        return Host(name, 1)
    if not _DIGITS_RE.fullmatch(slots) or int(slots) < 1:
        raise bad("slots must be a positive integer", f"{name}:2")
    return Host(name, int(slots))


def parse_hosts(text: str) -> tuple[Host, ...]:
    """Parse horovodrun's host list: ``"h1:2,h2:2"``, ``"localhost"`` (1 slot), IPv4 too.

    Whitespace around entries and around ``:`` is ignored.
    """
    if not isinstance(text, str):
        raise ConfigError(
            f"the host list must be a string like 'h1:2,h2:2', not {type(text).__name__}. "
            "Fix: pass e.g. 'localhost:2', or a list of Host objects where one is accepted."
        )
    if not text.strip():
        raise ConfigError(
            f"the host list {text!r} is empty. Fix: list hosts as host:slots separated by "
            "commas, e.g. 'localhost:2' or 'h1:2,h2:2'."
        )
    hosts = [_parse_entry(entry.strip(), text) for entry in text.split(",")]
    _check_unique(hosts, f"in {text!r}")
    return tuple(hosts)


def _parse_hostfile_line(line: str, where: str) -> Host:
    name, *rest = line.split()
    problem = _host_problem(name)
    if problem:
        raise ConfigError(f"{where}: bad entry {line!r}: {problem}. Fix: e.g. 'h1 slots=2'.")
    if not rest:
        return Host(name, 1)
    key, _, value = rest[0].partition("=")
    if len(rest) > 1 or key != "slots":
        raise ConfigError(
            f"{where}: bad entry {line!r}: expected 'host' or 'host slots=N' "
            f"(ddlkit reads no other keys). Fix: write it as '{name} slots=2'."
        )
    if not _DIGITS_RE.fullmatch(value) or int(value) < 1:
        raise ConfigError(
            f"{where}: bad entry {line!r}: slots must be a positive integer. "
            f"Fix: write it as '{name} slots=2'."
        )
    return Host(name, int(value))


def parse_hostfile(path: str | os.PathLike[str]) -> tuple[Host, ...]:
    """Parse an MPI/horovod host file: one ``host slots=N`` (or just ``host``) per line.

    ``#`` starts a comment; blank lines are skipped.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"hostfile {str(path)!r} does not exist. Fix: check the path, or pass the hosts "
            "directly as 'h1:2,h2:2'."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read hostfile {str(path)!r}: {exc}. Fix: make it a readable UTF-8 text "
            "file with one 'host slots=N' per line."
        ) from None
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.append(_parse_hostfile_line(line, f"hostfile {str(path)!r} line {lineno}"))
    if not hosts:
        raise ConfigError(
            f"hostfile {str(path)!r} lists no hosts (only blank lines and comments). "
            "Fix: add one line per host, e.g. 'h1 slots=2'."
        )
    _check_unique(hosts, f"in hostfile {str(path)!r}")
    return tuple(hosts)


def _with_more_slots(hosts: tuple[Host, ...], extra: int) -> str:
    """``hosts`` as a host list with ``extra`` more slots on the first: an example fix."""
    first = Host(hosts[0].name, hosts[0].slots + extra)
    return format_hosts((first, *hosts[1:]))


def _as_hosts(hosts: str | Host | Iterable[Host]) -> tuple[Host, ...]:
    if isinstance(hosts, str):
        return parse_hosts(hosts)
    if isinstance(hosts, Host):
        return (hosts,)
    result = list(hosts)
    for host in result:
        if not isinstance(host, Host):
            raise ConfigError(
                f"hosts must be Host objects or a string like 'h1:2,h2:2', got {host!r}. "
                "Fix: pass parse_hosts('h1:2,h2:2') or [Host('h1', 2), Host('h2', 2)]."
            )
    if not result:
        raise ConfigError("no hosts given. Fix: pass at least one, e.g. 'localhost:2'.")
    _check_unique(result, f"in {format_hosts(result)!r}")
    return tuple(result)


# ---------------------------------------------------------------- ports


def _sockaddr(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(
            f"cannot resolve host {host!r}: {exc.strerror}. Fix: use an address of this "
            "machine, e.g. 127.0.0.1."
        ) from None
    return family, sockaddr


def _pick_ports(counts: dict[str, int]) -> dict[str, list[int]]:
    """``counts[host]`` free ports per host, all held open together so none repeats."""
    picked: dict[str, list[int]] = {}
    with contextlib.ExitStack() as held:
        for host, n in counts.items():
            family, sockaddr = _sockaddr(host, 0)
            picked[host] = []
            for _ in range(n):
                sock = held.enter_context(socket.socket(family, socket.SOCK_STREAM))
                try:
                    sock.bind(sockaddr)
                except OSError as exc:
                    raise ConfigError(
                        f"cannot pick a free port on {host!r}: {exc.strerror}. Fix: use an "
                        "address of this machine (e.g. 127.0.0.1); for other machines give "
                        "fixed ports, e.g. ClusterSpec.from_hosts(..., base_port=2222)."
                    ) from None
                picked[host].append(sock.getsockname()[1])
    return picked


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that are free on ``host`` right now.

    Each comes from binding port 0 (the kernel's choice); all are held until
    the last is picked, then released. Another process may still take one
    before the caller binds it, so start servers soon after.
    """
    if not _is_int(n) or n < 0:
        raise ConfigError(f"free_ports(n={n!r}): n must be an integer >= 0. Fix: e.g. n=2.")
    return _pick_ports({host: n})[host]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind TCP ``host:port`` now (tested by binding it)."""
    if not _is_int(port) or not 1 <= port <= 65535:
        raise ConfigError(f"port {port!r} is not a TCP port. Fix: use 1..65535, e.g. 2222.")
    family, sockaddr = _sockaddr(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so a port left in TIME_WAIT is free for them too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise ConfigError(
                f"cannot test port {port} on {host!r}: {exc.strerror}. Fix: use an address "
                "of this machine (e.g. 127.0.0.1) and a port >= 1024."
            ) from None
    return True


# ---------------------------------------------------------------- tasks


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
    return f"{task.role}-{task.index}"


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
    ) -> ClusterSpec:
        """Place tasks onto host slots, filling each host before the next.

        Tasks go in the order chief, ps, worker, evaluator. With ``base_port``
        every host uses ports ``base_port, base_port + 1, ...`` for its slots
        (what remote machines need); without it, free ports are picked by
        binding on each host, which works only for addresses of this machine.
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
        return {"TF_CONFIG": self.tf_config_json(task), "DDLKIT_WORKER": task.name}

    def _table(self) -> tuple[str, tuple[str, ...], list[tuple[object, ...]]]:
        parts = [_plural(self.count(role), role) for role in ROLES if self.count(role)]
        caption = f"ClusterSpec: {', '.join(parts)}"
        rows = [
            (t.name, t.role, t.index, t.address, "no" if t.role == "evaluator" else "yes")
            for t in self.tasks
        ]
        return caption, ("task", "role", "index", "address", "in cluster"), rows


# ---------------------------------------------------------------- horovod


@dataclass(frozen=True)
class HorovodSlot:
    """Where one Horovod process runs and the ranks horovodrun would give it."""

    host: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def __post_init__(self) -> None:
        problem = _host_problem(self.host)
        if problem:
            raise ConfigError(f"bad host {self.host!r}: {problem}. Fix: e.g. 'localhost'.")
        for rank, size, label in (
            (self.rank, self.size, "rank"),
            (self.local_rank, self.local_size, "local_rank"),
            (self.cross_rank, self.cross_size, "cross_rank"),
        ):
            if not (_is_int(rank) and _is_int(size) and 0 <= rank < size <= self.size):
                raise ConfigError(
                    f"Horovod slot on {self.host!r}: {label}={rank!r} does not fit its size "
                    f"{size!r} (world size {self.size!r}). Fix: build slots with "
                    "horovod_slots(hosts, np)."
                )

    @property
    def name(self) -> str:
        """The worker name used in files and ``DDLKIT_WORKER``: ``rank-0``, ``rank-1``, ..."""
        return f"rank-{self.rank}"

    def env(self) -> dict[str, str]:
        """The per-process variables horovodrun sets, plus ``DDLKIT_WORKER``."""
        return {
            "HOROVOD_HOSTNAME": self.host,
            "HOROVOD_RANK": str(self.rank),
            "HOROVOD_SIZE": str(self.size),
            "HOROVOD_LOCAL_RANK": str(self.local_rank),
            "HOROVOD_LOCAL_SIZE": str(self.local_size),
            "HOROVOD_CROSS_RANK": str(self.cross_rank),
            "HOROVOD_CROSS_SIZE": str(self.cross_size),
            "DDLKIT_WORKER": self.name,
        }


@dataclass(frozen=True)
class HorovodPlan(_Table):
    """The slots of one Horovod job, indexed by rank."""

    slots: tuple[HorovodSlot, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", tuple(self.slots))
        ranks = [s.rank for s in self.slots]
        if not self.slots or ranks != list(range(len(ranks))):
            raise ConfigError(
                f"Horovod slots must be ranks 0..n-1 in order, got {ranks}. "
                "Fix: build them with horovod_slots(hosts, np)."
            )
        if any(s.size != len(self.slots) for s in self.slots):
            raise ConfigError(
                f"every Horovod slot must have size {len(self.slots)} (the number of slots), "
                f"got sizes {sorted({s.size for s in self.slots})}. "
                "Fix: build them with horovod_slots(hosts, np)."
            )

    @property
    def np(self) -> int:
        return len(self.slots)

    @property
    def hosts(self) -> tuple[Host, ...]:
        """The hosts in use and how many processes each runs."""
        used: dict[str, int] = {}
        for slot in self.slots:
            used[slot.host] = used.get(slot.host, 0) + 1
        return tuple(Host(name, n) for name, n in used.items())

    @property
    def hosts_arg(self) -> str:
        """The ``-H`` value for ``horovodrun -np N -H ...`` running exactly this plan."""
        return format_hosts(self.hosts)

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[HorovodSlot]:
        return iter(self.slots)

    def __getitem__(self, rank: int) -> HorovodSlot:
        return self.slots[rank]

    def _table(self) -> tuple[str, tuple[str, ...], list[tuple[object, ...]]]:
        caption = f"Horovod: {_plural(self.np, 'process')} on {self.hosts_arg}"
        rows = [
            (s.name, s.host, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
            for s in self.slots
        ]
        headers = ("worker", "host", "rank", "local_rank", "local_size", "cross_rank", "cross_size")
        return caption, headers, rows


def horovod_slots(hosts: str | Host | Iterable[Host], np: int) -> HorovodPlan:
    """Assign ``np`` ranks to host slots as horovodrun does: fill each host in turn.

    ``cross_rank`` numbers the hosts that run a process with the same local rank.
    """
    host_list = _as_hosts(hosts)
    if not _is_int(np) or np < 1:
        raise ConfigError(f"np={np!r} must be an integer >= 1. Fix: e.g. np=2.")
    total = sum(h.slots for h in host_list)
    if np > total:
        raise ConfigError(
            f"np={np} processes need {np} slots but hosts {format_hosts(host_list)!r} give "
            f"{total}. Fix: add slots (e.g. {_with_more_slots(host_list, np - total)!r}) "
            f"or use np={total}."
        )
    placed: list[tuple[str, int]] = []  # (host, local_rank) in rank order
    for host in host_list:
        for local in range(min(host.slots, np - len(placed))):
            placed.append((host.name, local))
    local_size = {name: sum(1 for h, _ in placed if h == name) for name, _ in placed}
    by_local: dict[int, list[str]] = {}
    for name, local in placed:
        by_local.setdefault(local, []).append(name)
    return HorovodPlan(
        slots=tuple(
            HorovodSlot(
                host=name,
                rank=rank,
                size=np,
                local_rank=local,
                local_size=local_size[name],
                cross_rank=by_local[local].index(name),
                cross_size=len(by_local[local]),
            )
            for rank, (name, local) in enumerate(placed)
        )
    )
