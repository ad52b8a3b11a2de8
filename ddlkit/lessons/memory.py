"""What each replica holds: bytes of weights, gradients and optimizer state, per holder.

::

    state = memory.ModelState.of(model, optimizer)   # counted from the real variables
    memory.by_device(model.weights)                  # bytes per device, pieces of
                                                     # mirrored/sharded variables apart
    memory.zero(state, replicas=8)                   # ZeRO stages 0-3: bytes per replica

A variable holds ``shape.num_elements() * dtype.size`` bytes. A training replica
holds the weights (trainable and not), one gradient per trainable weight, and the
optimizer's variables: slots shaped like the weights (Adam's ``m`` and ``v``, SGD's
momentum) and scalars (the step counter). :func:`zero` shards those parts over N
data-parallel replicas as the ZeRO paper's stages do (Rajbhandari et al., 2020,
arXiv:1910.02054): stage 1 the optimizer state, stage 2 also the gradients, stage 3
also the weights; a sharded part of ``B`` bytes leaves ``ceil(B / N)`` on each replica
(ZeRO pads its flat buffers to equal partitions), and the scalars stay whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ddlkit._tables import html_table, text_table
from ddlkit.errors import ConfigError

STAGES = (
    "0: plain data parallel",
    "1: shard optimizer state",
    "2: + shard gradients",
    "3: + shard weights",
)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what}={value!r} must be a whole number of bytes >= 0.")
    return value


def nbytes(tensors: Iterable[Any]) -> int:
    """Bytes of tensors or variables: ``shape.num_elements() * dtype.size`` each, summed."""
    return sum(int(t.shape.num_elements()) * int(t.dtype.size) for t in tensors)


def components(variable: Any) -> list[Any]:
    """The per-device pieces of a variable: a MirroredVariable's copies (``.values``), a
    ShardedVariable's shards (``.variables``), else the variable itself."""
    if hasattr(variable, "values") and isinstance(variable.values, tuple):
        return list(variable.values)
    pieces = getattr(variable, "variables", None)
    if isinstance(pieces, (list, tuple)) and pieces and pieces[0] is not variable:
        return list(pieces)
    return [variable]


def short_device(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1 CPU:0``; a local device -> ``CPU:1``."""
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    where = parts.get("device", device)
    job = parts.get("job")
    return where if job in (None, "localhost") else f"{job}:{parts.get('task', '0')} {where}"


def by_device(variables: Iterable[Any]) -> dict[str, int]:
    """Bytes per device (short names) of variables, each split into its :func:`components`."""
    sizes: dict[str, int] = {}
    for variable in variables:
        for piece in components(variable):
            key = short_device(piece.device)
            sizes[key] = sizes.get(key, 0) + nbytes([piece])
    return dict(sorted(sizes.items()))


@dataclass(frozen=True)
class Holding:
    """What one holder (a replica, a parameter server, a stage's device) keeps, in bytes."""

    holder: str
    weights: int
    gradients: int
    optimizer: int

    def __post_init__(self) -> None:
        if not self.holder:
            raise ConfigError("a Holding needs a holder name. Fix: e.g. holder='replica 0'.")
        for part in ("weights", "gradients", "optimizer"):
            _count(getattr(self, part), part)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


@dataclass(frozen=True)
class Holdings:
    """A table of :class:`Holding` rows, one per holder; shows in a notebook."""

    title: str
    rows: tuple[Holding, ...]

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigError(f"Holdings {self.title!r} has no rows. Fix: give one per holder.")
        names = [r.holder for r in self.rows]
        if len(set(names)) != len(names):
            raise ConfigError(f"Holdings {self.title!r} names a holder twice: {names}.")

    def row(self, holder: str) -> Holding:
        for r in self.rows:
            if r.holder == holder:
                return r
        raise KeyError(f"no holder {holder!r} in {[r.holder for r in self.rows]}")

    def _table(self) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
        headers = ("holder", "weights (B)", "gradients (B)", "optimizer (B)", "total (B)", "MiB")
        rows = [
            (r.holder, f"{r.weights:,}", f"{r.gradients:,}", f"{r.optimizer:,}", f"{r.total:,}",
             f"{r.total / 2**20:.3f}")
            for r in self.rows
        ]  # fmt: skip
        return headers, rows

    def _repr_html_(self) -> str:
        return html_table(*self._table(), caption=self.title)

    def __str__(self) -> str:
        return f"{self.title}\n{text_table(*self._table())}"


@dataclass(frozen=True)
class ModelState:
    """The bytes one unsharded replica holds for a model and its optimizer."""

    weights: int  # every weight, trainable or not
    trainable: int  # the trainable weights: the gradients are as many bytes
    slots: int  # optimizer variables shaped like a weight (m, v, momentum)
    scalars: int  # the optimizer's other variables (its step counter)

    def __post_init__(self) -> None:
        for part in ("weights", "trainable", "slots", "scalars"):
            _count(getattr(self, part), part)
        if self.trainable > self.weights:
            raise ConfigError(f"trainable={self.trainable} exceeds weights={self.weights}.")

    @classmethod
    def of(cls, model: Any, optimizer: Any) -> ModelState:
        """Count from ``model.weights``, ``model.trainable_weights`` and ``optimizer.variables``
        (built for the model's trainable weights first, if it was not)."""
        optimizer.build(model.trainable_weights)
        slots = [v for v in optimizer.variables if v.shape.rank]
        scalars = [v for v in optimizer.variables if not v.shape.rank]
        return cls(
            nbytes(model.weights), nbytes(model.trainable_weights), nbytes(slots), nbytes(scalars)
        )

    def replica(self, holder: str = "one replica") -> Holding:
        return Holding(holder, self.weights, self.trainable, self.slots + self.scalars)


def shard(size: int, replicas: int) -> int:
    """What each of ``replicas`` keeps of a part of ``size`` bytes split evenly: ceil(size/N)."""
    return math.ceil(_count(size, "size") / _check_replicas(replicas))


def _check_replicas(replicas: Any) -> int:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas={replicas!r} must be an integer >= 1. Fix: e.g. replicas=8.")
    return replicas


def zero(state: ModelState, replicas: int) -> Holdings:
    """Bytes per replica for ZeRO's stages 0-3 over ``replicas`` data-parallel replicas."""
    n = _check_replicas(replicas)
    w, g, s = state.weights, state.trainable, state.slots
    rows = (
        Holding(STAGES[0], w, g, s + state.scalars),
        Holding(STAGES[1], w, g, shard(s, n) + state.scalars),
        Holding(STAGES[2], w, shard(g, n), shard(s, n) + state.scalars),
        Holding(STAGES[3], shard(w, n), shard(g, n), shard(s, n) + state.scalars),
    )
    return Holdings(f"ZeRO: bytes per replica, N = {n}", rows)
