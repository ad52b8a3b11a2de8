"""How much of a run's cores other processes used while it ran (Linux ``/proc/stat``).

A benchmark on a shared machine is only fair when its cores are its own. This measures
it instead of assuming it::

    watch = CpuWatch.start((0, 1))
    ...  # start the case's processes pinned to cores 0 and 1, wait for them
    watch.foreign_share()   # e.g. 0.31: others used 31% of cores 0-1 meanwhile

Busy time of the cores (``/proc/stat``) minus the CPU time of this process and of its
finished children (``getrusage``: the workers, and their children once reaped; workers
forked by a warm-start template are counted from what it reports), over the
cores' total time. This process's own threads count as the run's wherever they ran, so
the share is, if anything, too low. Only meaningful when the run's processes were
pinned to those cores and have all exited.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from ddlkit.launch.warm_pool import forked_cpu_seconds

_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (not idle, iowait)


def parse_proc_stat(text: str, cpus: tuple[int, ...]) -> tuple[int, int]:
    """(busy, total) jiffies of `cpus` from the text of ``/proc/stat`` (pure)."""
    busy = total = 0
    wanted = {f"cpu{c}" for c in cpus}
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in wanted:
            values = [int(v) for v in fields[1:9]]
            busy += sum(values[i] for i in _BUSY)
            total += sum(values)
    return busy, total


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its ended children (user + system): those it reaped,
    and the workers its warm-start templates reaped (:func:`warm_pool.forked_cpu_seconds`)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + forked_cpu_seconds()


@dataclass(frozen=True)
class CpuWatch:
    cpus: tuple[int, ...]
    busy: int
    total: int
    own: float

    @classmethod
    def start(cls, cpus: tuple[int, ...]) -> CpuWatch:
        busy, total = parse_proc_stat(Path("/proc/stat").read_text(), cpus)
        return cls(tuple(cpus), busy, total, own_cpu_seconds())

    def foreign_share(self) -> float | None:
        """Share (0..1) of the cores' time used by other processes since :meth:`start`;
        None where ``/proc/stat`` does not list the cores."""
        busy, total = parse_proc_stat(Path("/proc/stat").read_text(), self.cpus)
        return foreign_share(busy - self.busy, total - self.total, own_cpu_seconds() - self.own)


def foreign_share(busy: int, total: int, own_seconds: float) -> float | None:
    """(busy jiffies - own CPU) / total jiffies, clipped to 0..1 (pure)."""
    if total <= 0:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return min(1.0, max(0.0, (busy - own_seconds * tick) / total))
