"""Horovod placement: which host and ranks each process gets, as horovodrun assigns them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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
from ddlkit.contract import WORKER_VAR, rank_name
from ddlkit.errors import ConfigError


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
        return rank_name(self.rank)

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
            WORKER_VAR: self.name,
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
