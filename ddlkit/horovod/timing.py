"""How long one allreduce takes, by tensor size: measured in real ranks, fitted, drawn.

::

    timing = ddlkit.horovod.allreduce_timing([2**k for k in range(10, 23, 2)], np=2)
    timing            # a table: bytes, median seconds, GB/s
    timing.plot()     # time against size, log-log, with the fitted a + n/B

An allreduce of ``n`` bytes over ``p`` ranks takes about ``a + n / B``: a fixed latency
``a`` (the message start-ups) plus the bytes over an effective bandwidth ``B``. Horovod
hands the allreduce to a library: Gloo runs a ring, which sends ``2 (p-1)/p * n`` bytes
per rank in ``2 (p-1)`` steps; Open MPI picks its algorithm by size and rank count
(``coll/tuned``: recursive doubling, ring, segmented ring or Rabenseifner's for 2 ranks),
and with 2 ranks each of those sends ``n`` bytes per rank. :meth:`AllreduceTiming.fit`
estimates ``a`` and ``B`` from the measurements. Small tensors are all latency, large ones
all bandwidth; that is why Horovod fuses small gradients into one buffer
(``HOROVOD_FUSION_THRESHOLD``).

:func:`measure` runs inside each rank; :func:`allreduce_timing` starts ``np``
ranks through ``horovod.run`` and collects rank 0's numbers. It uses the transport the
horovod strategy uses here (``transport="auto"``: MPI where Horovod has it, else Gloo), so
the fit describes the all-reduces of the benchmark's Horovod runs.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ddlkit._tables import html_table
from ddlkit.contract import RANK_CPUS_VAR
from ddlkit.errors import ConfigError
from ddlkit.horovod.pinning import rank_cpus_env

DEFAULT_SIZES = tuple(4 * 2**k for k in range(8, 23, 2))  # 1 KiB .. 16 MiB


@dataclass(frozen=True)
class AllreducePoint:
    """One tensor size: its bytes and the median, min and max seconds of one allreduce."""

    nbytes: int
    seconds: float
    min_seconds: float
    max_seconds: float

    @property
    def gbytes_per_sec(self) -> float:
        """Algorithm bandwidth: tensor bytes per second of allreduce."""
        return self.nbytes / self.seconds / 1e9


@dataclass(frozen=True)
class AllreduceTiming:
    """Allreduce times against tensor size for ``ranks`` processes (``points`` by size)."""

    ranks: int
    points: tuple[AllreducePoint, ...]
    dtype: str = "float32"
    repeats: int = 0
    transport: str = "gloo"  # "gloo" or "mpi"
    # the cores each rank ran on when each had its own, by rank; None: the ranks shared the
    # machine's cores (and files recorded before ranks were pinned)
    rank_cpus: tuple[tuple[int, ...], ...] | None = None

    def fit(self) -> tuple[float, float]:
        """``(latency seconds, bandwidth bytes/s)`` of ``t = a + n / B``.

        Least squares on relative errors (weights ``1/t^2``), so the microsecond points
        count as much as the millisecond ones. Bandwidth is ``inf`` when the times do not
        grow with size (all latency).
        """
        if len(self.points) < 2:
            raise ConfigError("fitting needs at least two sizes. Fix: measure more sizes.")
        w = [1.0 / p.seconds**2 for p in self.points]
        n = [float(p.nbytes) for p in self.points]
        t = [p.seconds for p in self.points]
        sw, swn, swt = (
            sum(w),
            sum(a * b for a, b in zip(w, n, strict=True)),
            sum(a * b for a, b in zip(w, t, strict=True)),
        )
        swnn = sum(a * b * b for a, b in zip(w, n, strict=True))
        swnt = sum(a * b * c for a, b, c in zip(w, n, t, strict=True))
        det = sw * swnn - swn * swn
        slope = (sw * swnt - swn * swt) / det if det else 0.0
        intercept = (swt - slope * swn) / sw
        return max(intercept, 0.0), (1.0 / slope if slope > 0 else float("inf"))

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [
            (
                _bytes(p.nbytes),
                f"{p.seconds * 1e3:.3f}",
                f"{p.min_seconds * 1e3:.3f}",
                f"{p.gbytes_per_sec:.3f}",
            )
            for p in self.points
        ]

    def _repr_html_(self) -> str:
        latency, bandwidth = self.fit()
        caption = (
            f"allreduce ({self.dtype}) over {self.ranks} ranks ({self.transport}, "
            f"{self._placement()}), median of {self.repeats}; "
            f"fit: latency {latency * 1e6:.0f} us, bandwidth {bandwidth / 1e9:.2f} GB/s"
        )
        headers = ("tensor", "median ms", "min ms", "GB/s")
        return html_table(headers, self.rows(), caption=caption)

    def _placement(self) -> str:
        if self.rank_cpus is None:
            return "sharing the cores"
        return "cores " + " | ".join(",".join(map(str, c)) for c in self.rank_cpus)

    def plot(self, ax=None):
        """Time against tensor size (log-log), measured points and the fitted ``a + n/B``."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        xs = [p.nbytes for p in self.points]
        ax.errorbar(
            xs,
            [p.seconds * 1e3 for p in self.points],
            yerr=[
                [(p.seconds - p.min_seconds) * 1e3 for p in self.points],
                [(p.max_seconds - p.seconds) * 1e3 for p in self.points],
            ],
            fmt="o-",
            label=f"measured, {self.ranks} ranks ({self.transport})",
        )
        latency, bandwidth = self.fit()
        ax.plot(
            xs,
            [(latency + n / bandwidth) * 1e3 for n in xs],
            "--",
            label=f"a + n/B: a={latency * 1e6:.0f} us, B={bandwidth / 1e9:.2f} GB/s",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tensor size (bytes)")
        ax.set_ylabel("allreduce time (ms)")
        ax.set_title("Horovod allreduce time against tensor size")
        ax.legend()
        return ax

    def to_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "dtype": self.dtype,
            "repeats": self.repeats,
            "transport": self.transport,
            "points": [[p.nbytes, p.seconds, p.min_seconds, p.max_seconds] for p in self.points],
        } | ({} if self.rank_cpus is None else {"rank_cpus": [list(c) for c in self.rank_cpus]})

    @classmethod
    def from_dict(cls, data: dict) -> AllreduceTiming:
        cpus = data.get("rank_cpus")
        return cls(
            ranks=int(data["ranks"]),
            dtype=str(data["dtype"]),
            repeats=int(data["repeats"]),
            transport=str(data.get("transport", "gloo")),  # files before MPI: Gloo
            points=tuple(AllreducePoint(*row) for row in data["points"]),
            rank_cpus=None if cpus is None else tuple(tuple(int(c) for c in r) for r in cpus),
        )


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _check_sizes(sizes: Sequence[int], repeats: int) -> list[int]:
    sizes = list(sizes)
    if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s < 4 for s in sizes):
        raise ConfigError(
            f"sizes must be byte counts >= 4 (one float32), got {sizes!r}. "
            f"Fix: e.g. sizes=[4096, 65536, 1048576]."
        )
    if not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an int >= 1, got {repeats!r}. Fix: e.g. repeats=10.")
    return sorted(sizes)


def measure(
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 10,
    warmup: int = 2,
    rank_cpus: str | None = None,
) -> dict:
    """Time ``repeats`` allreduces of each size in this rank (all ranks must call it).

    Runs under ``horovodrun``/``horovod.run``; returns :meth:`AllreduceTiming.to_dict`.
    Each timing ends when this rank has the reduced tensor (``.numpy()``). ``rank_cpus``
    (``DDLKIT_RANK_CPUS``'s form, ``"0;1"``) pins each local rank to its own cores first,
    as the horovod strategy's ranks are.
    """
    from ddlkit.horovod.runtime import start

    sizes = _check_sizes(sizes, repeats)
    if rank_cpus is not None:
        os.environ[RANK_CPUS_VAR] = rank_cpus  # this rank's process only; start() reads it
    hvd, cpus = start()
    import tensorflow as tf

    for _ in range(10):  # the first collectives set up connections and caches
        hvd.allreduce(tf.ones([256]), op=hvd.Sum, name="timing.warmup").numpy()
    points = []
    for nbytes in sizes:
        tensor = tf.ones([nbytes // 4], tf.float32)
        times = []
        for i in range(warmup + repeats):
            start_s = time.perf_counter()
            hvd.allreduce(tensor, op=hvd.Sum, name=f"timing.{nbytes}").numpy()
            if i >= warmup:
                times.append(time.perf_counter() - start_s)
        # the slowest rank decides: take the max over ranks of each statistic
        stats = tf.constant([statistics.median(times), min(times), max(times)], tf.float64)
        stats = hvd.allreduce(stats, op=hvd.Max, name=f"timing.stats.{nbytes}").numpy()
        points.append([nbytes // 4 * 4, *(float(s) for s in stats)])
    out = {"ranks": hvd.size(), "dtype": "float32", "repeats": repeats, "points": points}
    placed = hvd.allgather_object(None if cpus is None else sorted(os.sched_getaffinity(0)))
    if all(c is not None for c in placed):
        out["rank_cpus"] = placed
    return out


def allreduce_timing(
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    np: int = 2,
    repeats: int = 10,
    warmup: int = 2,
    transport: str = "auto",
    pin: bool = True,
) -> AllreduceTiming:
    """Start ``np`` local ranks (``horovod.run``), time allreduce by size, return it.

    ``transport``: ``"auto"`` (MPI where this Horovod has it, as the horovod strategy
    chooses), ``"gloo"`` or ``"mpi"``. ``pin``: each rank on its own cores, as the horovod
    strategy runs them, when there are at least ``np`` (the result's ``rank_cpus`` says
    where they ran). Unpinned ranks float between the cores with TensorFlow's and the
    transport's threads, so on a machine with few cores their small all-reduces can take
    several times longer in one start than in the next; pinned, they take the same.
    """
    sizes = _check_sizes(sizes, repeats)
    if transport not in ("auto", "gloo", "mpi"):
        raise ConfigError(
            f"transport={transport!r} is not one of auto, gloo, mpi. Fix: pass 'auto' (MPI "
            f"where this Horovod has it), 'gloo' or 'mpi'."
        )
    import sys

    from ddlkit.horovod.runtime import require
    from ddlkit.strategies.horovod import MPI_ARGS, NO_MPI, mpi_unavailable

    require()
    import horovod

    why_not = mpi_unavailable(sys.executable) if transport != "gloo" else "not asked for"
    if transport == "mpi" and why_not is not None:
        raise ConfigError(NO_MPI.format(why=why_not).replace("horovod_transport", "transport"))
    via = "mpi" if transport != "gloo" and why_not is None else "gloo"
    kw = {"use_mpi": True, "mpi_args": MPI_ARGS} if via == "mpi" else {"use_gloo": True}
    cores = sorted(os.sched_getaffinity(0))
    cpus = rank_cpus_env(cores, np)[RANK_CPUS_VAR] if pin and len(cores) >= np else None
    results = horovod.run(
        measure, args=(sizes, repeats, warmup, cpus), num_proc=np, verbose=0, **kw
    )
    return AllreduceTiming.from_dict({**results[0], "transport": via})
