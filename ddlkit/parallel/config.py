"""The devices a split model or pipeline uses, and the CPU threads each stage gets.

::

    config = parallel.configure(stages=2)   # before any other TensorFlow code
    config                                  # devices, kind, threads: shown before use

On a machine with GPUs each stage gets its own GPU. Without, the CPU is split
into logical devices (:func:`ddlkit.lessons.replicas.devices`), which share the
machine's cores *and* TensorFlow's thread pools: the pools belong to the
process, not to a device. By default one op may use every core, so while
stage 0 works it can already use the cores "stage 1's device" would idle on,
and a pipeline has little idle hardware to reclaim. To make logical devices
behave like separate devices, :func:`configure` limits each op to
``cores // stages`` threads (``threads_per_stage``): each stage thread then
computes on its own share of the cores, and stages overlap only as the
schedule lets them. Both settings are fixed once TensorFlow has started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddlkit._tables import html_table
from ddlkit.errors import ConfigError
from ddlkit.lessons.replicas import devices as replica_devices


@dataclass(frozen=True)
class ParallelConfig:
    """The devices of the stages and TensorFlow's thread settings for them."""

    devices: tuple[str, ...]
    kind: str  # "GPU" or "logical CPU"
    cores: int
    intra_op_threads: int  # 0: TensorFlow's default (all cores for one op)
    inter_op_threads: int  # 0: TensorFlow's default

    @property
    def stages(self) -> int:
        return len(self.devices)

    def rows(self) -> list[tuple[str, str]]:
        def threads(n: int) -> str:
            return "TensorFlow's default (all cores)" if n == 0 else str(n)

        return [
            ("stages", str(self.stages)),
            *((f"stage {i} device", d) for i, d in enumerate(self.devices)),
            ("device kind", self.kind),
            ("CPU cores for this process", str(self.cores)),
            ("threads one op may use (intra-op)", threads(self.intra_op_threads)),
            ("ops run at once (inter-op)", threads(self.inter_op_threads)),
        ]

    def _repr_html_(self) -> str:
        return html_table(("setting", "value"), self.rows(), caption="Pipeline devices")

    def __repr__(self) -> str:
        return "\n".join(f"{k:<36} {v}" for k, v in self.rows())


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_plan(stages: int, kind: str, n_cores: int, threads_per_stage: int | str | None):
    """``(intra_op, inter_op)`` thread counts for ``stages`` stages (pure; 0 = TF's default).

    ``threads_per_stage="auto"``: on logical CPU devices ``max(1, cores // stages)`` per
    op, and room for every stage's ops to run at once; on GPUs TensorFlow's defaults.
    ``None``: TensorFlow's defaults everywhere. An int: that many threads per op.
    """
    if threads_per_stage is None:
        return 0, 0
    if threads_per_stage == "auto":
        if kind == "GPU":
            return 0, 0
        threads_per_stage = max(1, n_cores // stages)
    if (
        isinstance(threads_per_stage, bool)
        or not isinstance(threads_per_stage, int)
        or (threads_per_stage < 1)
    ):
        raise ConfigError(
            f"threads_per_stage={threads_per_stage!r}. Fix: pass 'auto', None (TensorFlow's "
            f"defaults) or an integer >= 1."
        )
    return threads_per_stage, max(stages, n_cores)


def configure(stages: int, *, threads_per_stage: int | str | None = "auto") -> ParallelConfig:
    """Devices for ``stages`` stages and the thread settings; call before other TF code."""
    import tensorflow as tf

    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 2:
        raise ConfigError(
            f"stages={stages!r}: model parallelism needs at least 2 stages. Fix: pass stages=2."
        )
    gpus = tf.config.list_physical_devices("GPU")  # physical: does not start TensorFlow
    kind = "GPU" if len(gpus) >= stages else "logical CPU"
    intra, inter = thread_plan(stages, kind, cores(), threads_per_stage)
    threading = tf.config.threading
    for name, want, setter, getter in (
        (
            "intra-op",
            intra,
            threading.set_intra_op_parallelism_threads,
            threading.get_intra_op_parallelism_threads,
        ),
        (
            "inter-op",
            inter,
            threading.set_inter_op_parallelism_threads,
            threading.get_inter_op_parallelism_threads,
        ),
    ):
        if getter() == want:  # already so (a second call, or the default): nothing to change
            continue
        try:
            setter(want)
        except RuntimeError as exc:
            raise ConfigError(
                f"cannot set TensorFlow's {name} threads to {want}: TensorFlow already started "
                f"with {getter()}. Fix: restart the kernel and call "
                f"parallel.configure({stages}) before any other TensorFlow code."
            ) from exc
    plan = replica_devices(stages)
    return ParallelConfig(plan.names, plan.kind, cores(), intra, inter)
