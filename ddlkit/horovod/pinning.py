"""Each Horovod rank on its own cores, with TensorFlow's thread counts to match.

``horovodrun`` starts the ranks itself, so a launcher can only pin ``horovodrun``,
and every rank would share all of its cores. Instead the launcher puts one core list
per local rank in the environment, and each rank pins itself in :func:`ddlkit.horovod.init`
before TensorFlow makes its thread pools::

    env.update(rank_cpus_env((0, 1), ranks=2))   # {"DDLKIT_RANK_CPUS": "0;1", ...threads}
    # in rank N:  pin_rank()  ->  os.sched_setaffinity to "0;1".split(";")[HOROVOD_LOCAL_RANK]

A pinned rank computes on its one core, where Horovod's background thread also wakes every
``HOROVOD_CYCLE_TIME``; :func:`idle_priority` moves that thread (and the transport's) to
Linux's idle scheduling class, so it runs when the rank's compute waits, not in its middle.

Pure builders (:func:`rank_cpus`, :func:`rank_cpus_env`, :func:`parse_rank_cpus`,
:func:`cpus_for_rank`) and the effectful :func:`pin_rank`, :func:`thread_ids` and
:func:`idle_priority`. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from ddlkit.contract import RANK_CPUS_VAR, thread_env
from ddlkit.errors import ConfigError

# horovodrun --gloo sets HOROVOD_LOCAL_RANK; under --mpi the MPI launcher sets its own.
LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def rank_cpus(cores: Sequence[int], ranks: int) -> list[tuple[int, ...]]:
    """Contiguous disjoint core slices, one per local rank (pure).

    Raises ConfigError when there are fewer cores than ranks (nothing to pin to).
    """
    if type(ranks) is not int or ranks < 1:
        raise ConfigError(f"ranks={ranks!r}: must be an int >= 1.")
    cores = tuple(cores)
    if len(cores) < ranks:
        raise ConfigError(
            f"{ranks} ranks cannot each have their own core: only {len(cores)} core(s) "
            f"{list(cores)}. Fix: fewer ranks, or do not pin (leave {RANK_CPUS_VAR} unset)."
        )
    per = len(cores) // ranks
    return [cores[i * per : (i + 1) * per] for i in range(ranks)]


def rank_cpus_env(cores: Sequence[int], ranks: int) -> dict[str, str]:
    """The variables for ``horovodrun``'s environment that pin its local ranks (pure)."""
    shares = rank_cpus(cores, ranks)
    value = ";".join(",".join(str(c) for c in share) for share in shares)
    return {RANK_CPUS_VAR: value, **thread_env(len(shares[0]))}


def parse_rank_cpus(value: str) -> list[tuple[int, ...]]:
    """``"0;1"`` or ``"0,1;2,3"`` to core lists, one per local rank (pure)."""
    out = []
    for part in value.split(";"):
        try:
            cpus = tuple(int(c) for c in part.split(","))
        except ValueError:
            cpus = ()
        if not cpus or any(c < 0 for c in cpus):
            raise ConfigError(
                f"{RANK_CPUS_VAR}={value!r}: {part!r} is not a core list. Fix: one "
                f"comma-separated core list per local rank, separated by ';' (e.g. '0;1')."
            )
        out.append(cpus)
    return out


def local_rank(environ: Mapping[str, str]) -> int | None:
    var = next((v for v in LOCAL_RANK_VARS if v in environ), None)
    if var is None:
        return None
    if not environ[var].isdigit():
        raise ConfigError(
            f"{var}={environ[var]!r} is not a local rank. Fix: start ranks with horovodrun."
        )
    return int(environ[var])


def cpus_for_rank(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """This rank's cores from ``DDLKIT_RANK_CPUS`` and its local rank; None: no pinning asked."""
    value = environ.get(RANK_CPUS_VAR)
    if not value:
        return None
    rank = local_rank(environ)
    if rank is None:
        return None  # not under horovodrun: nothing to choose by
    shares = parse_rank_cpus(value)
    if rank >= len(shares):
        raise ConfigError(
            f"local rank {rank} has no cores in {RANK_CPUS_VAR}={value!r} "
            f"({len(shares)} list(s)). Fix: one core list per local rank (-np ranks per host)."
        )
    return shares[rank]


def _set_affinity_all_threads(cpus: tuple[int, ...]) -> None:
    # Affinity is per thread on Linux: threads that already exist keep the old set.
    for tid in thread_ids():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(tid, cpus)


def pin_rank(environ: MutableMapping[str, str] | None = None) -> tuple[int, ...] | None:
    """Pin this rank (every thread) to its cores and size TensorFlow's thread pools.

    Must run before TensorFlow's runtime starts (the first op): importing TensorFlow is
    fine. When TensorFlow is imported, its thread counts are also set through
    ``tf.config.threading``; if the runtime has already started that raises ConfigError
    naming the fix. Returns the cores, or None when no pinning was asked for.
    """
    env = os.environ if environ is None else environ
    cpus = cpus_for_rank(env)
    if cpus is None:
        return None
    missing = sorted(set(cpus) - os.sched_getaffinity(0))
    if missing:
        raise ConfigError(
            f"{RANK_CPUS_VAR} gives this rank cores {list(cpus)}, but {missing} are not "
            f"available to it ({sorted(os.sched_getaffinity(0))}). Fix: core ids this "
            f"machine (and horovodrun's affinity) allows."
        )
    _set_affinity_all_threads(cpus)
    env.update(thread_env(len(cpus)))
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        threads = len(cpus)
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
        except RuntimeError as exc:
            raise ConfigError(
                f"TensorFlow's runtime started before this rank was pinned ({exc}). "
                f"Fix: call ddlkit.horovod.init() before any TensorFlow op."
            ) from None
    return cpus


def thread_ids() -> set[int]:
    """The ids of this process's threads now (Linux: /proc/self/task)."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def idle_priority(tids: Iterable[int]) -> list[int]:
    """Put these threads of this process in the idle scheduling class (``SCHED_IDLE``).

    An idle-class thread runs when nothing else of normal priority wants its core, and never
    preempts one that does. A thread that has ended meanwhile is skipped; lowering a
    priority needs no privilege. Returns the threads it moved.
    """
    moved = []
    for tid in sorted(tids):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            moved.append(tid)
    return moved
