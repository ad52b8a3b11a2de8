"""Devices for in-process strategies: GPUs where they exist, else logical CPUs.

MirroredStrategy, model parallelism and pipelines place work on several devices of
one process. A machine without GPUs has one CPU device, so the kit splits it into
logical CPU devices (``/device:CPU:0`` ... ``/device:CPU:{n-1}``), as TensorFlow's
own tests do. They share the machine's cores and thread pools: they teach the
mechanics (what is mirrored, where a layer runs), not a speed-up.

The split must happen before TensorFlow creates its devices, which the first op
does; afterwards it can only be repeated with the same count::

    devices = dk.replicas.devices(2)        # ('/device:CPU:0', '/device:CPU:1') on CPU
    strategy = tf.distribute.MirroredStrategy(devices)
"""

from __future__ import annotations

from dataclasses import dataclass

from ddlkit._tables import html_table
from ddlkit.errors import ConfigError


@dataclass(frozen=True)
class DevicePlan:
    """The devices a strategy gets: their names and what kind they are."""

    names: tuple[str, ...]
    kind: str  # "GPU" or "logical CPU"

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> str:
        return self.names[i]

    def _repr_html_(self) -> str:
        rows = [(i, name, self.kind) for i, name in enumerate(self.names)]
        return html_table(("replica", "device", "kind"), rows)


def split_cpu(n: int) -> tuple[str, ...]:
    """Split this process's CPU into ``n`` logical devices; their names.

    Idempotent for the same ``n``. Raises ConfigError once TensorFlow has created its
    devices with another count, naming the fix (restart the kernel, call this first).
    """
    import tensorflow as tf

    _check_count(n)
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    if current is None or len(current) != n:
        try:
            tf.config.set_logical_device_configuration(cpus[0], wanted)
        except RuntimeError as exc:
            have = len(tf.config.list_logical_devices("CPU"))
            raise ConfigError(
                f"cannot split the CPU into {n} logical devices: TensorFlow already created "
                f"its devices ({have} logical CPU). Fix: restart the kernel and call "
                f"dk.replicas.devices({n}) (or split_cpu) before any other TensorFlow code."
            ) from exc
    return tuple(d.name for d in tf.config.list_logical_devices("CPU"))


def devices(n: int, *, use_gpus: bool = True) -> DevicePlan:
    """``n`` devices for in-process replicas: the first ``n`` GPUs if there are that
    many (TensorFlow's normal discovery), else ``n`` logical CPU devices."""
    import tensorflow as tf

    _check_count(n)
    # Physical, not logical: listing logical devices would create them, and the CPU
    # could then no longer be split.
    gpus = tf.config.list_physical_devices("GPU") if use_gpus else []
    if len(gpus) >= n:
        return DevicePlan(tuple(f"/device:GPU:{i}" for i in range(n)), "GPU")
    return DevicePlan(split_cpu(n), "logical CPU")


def _check_count(n: int) -> None:
    if type(n) is not int or n < 1:
        raise ConfigError(f"n={n!r}: need at least one device. Fix: pass n=1 or more.")
