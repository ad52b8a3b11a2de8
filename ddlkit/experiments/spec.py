"""An experiment on the user's own model, as data (pure): the file, its costs, the cases.

    user = UserModel.of("my_model.py")                 # build_model() and dataset(...)
    cases = plan(user, ("multi_worker", "horovod"), (1, 2), steps=50, cores=2,
                 horovod_available=True)

The user's file holds two functions, and optionally a third:

- ``build_model()``: a tf-keras model, compiled (or uncompiled, with ``loss`` and
  ``optimizer`` given to the experiment);
- ``dataset(batch_size, input_context=None)``: a ``tf.data.Dataset`` of ``(features,
  labels)`` batches of ``batch_size`` examples (one replica's batch), any structure Keras
  accepts; ``input_context`` is the ``tf.distribute.InputContext`` of the pipeline being
  made (its ``input_pipeline_id`` and ``num_input_pipelines`` to shard by), None without a
  strategy;
- ``eval_dataset(batch_size)``, optional: held-out batches, evaluated during training
  (time to a target) and at the end.

Every case trains the same model on the same data for the same steps, as the benchmark's
cases do (:mod:`ddlkit.bench.config`): the same strategies, the same names (``horovod-x2``),
the same ceiling (``independent``); the worker script is ``launch/train_user.py``, which
imports the file unchanged in every worker and writes the strategy around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlkit.bench.config import BENCH_STRATEGIES, LAUNCH_STRATEGY, NO_HOROVOD, worker_counts
from ddlkit.errors import ConfigError

SCRIPT = "train_user.py"  # in launch/: the worker every case runs
# The strategies an experiment runs (the benchmark's, without its MNIST-only yardstick).
STRATEGIES = tuple(s for s in BENCH_STRATEGIES if s != "reference")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class UserModel:
    """The user's file and the names of its functions."""

    path: Path
    model: str = "build_model"
    data: str = "dataset"
    eval: str | None = None  # None: eval_dataset if the file defines it (the probe says)
    loss: str | None = None  # for an uncompiled model: a Keras loss name
    optimizer: str | None = None  # for an uncompiled model: a Keras optimizer name

    @classmethod
    def of(cls, path: str | Path, **names: Any) -> UserModel:
        """A UserModel for ``path`` (resolved: workers may start in another directory)."""
        return cls(Path(path).expanduser().resolve(), **names)

    def __post_init__(self) -> None:
        if self.path.suffix != ".py":
            raise ConfigError(
                f"{self.path}: the experiment imports a Python file. Fix: pass a .py file "
                f"that defines {self.model}() and {self.data}(batch_size, input_context=None)"
            )
        if not self.path.is_file():
            raise ConfigError(f"{self.path}: no such file. Fix: pass the path of your model file")
        for what in ("model", "data", "eval"):
            name = getattr(self, what)
            if name is not None and not IDENTIFIER.match(name):
                raise ConfigError(
                    f"{what}={name!r} is not a Python function name. Fix: the name of a "
                    f"function defined in {self.path.name}"
                )
        if (self.loss is None) != (self.optimizer is None):
            raise ConfigError(
                f"loss={self.loss!r}, optimizer={self.optimizer!r}: give both (to compile an "
                f"uncompiled model) or neither (build_model compiles it)"
            )

    @property
    def stem(self) -> str:
        return self.path.stem

    def args(self) -> list[str]:
        """The worker script's flags naming the file and its functions."""
        out = ["--file", str(self.path), "--model-fn", self.model, "--data-fn", self.data]
        if self.eval:
            out += ["--eval-fn", self.eval]
        if self.loss:
            out += ["--loss", self.loss, "--optimizer", self.optimizer or ""]
        return out


@dataclass(frozen=True)
class UserCase:
    """One strategy with a worker count on the user's model: a BenchCase's fields, so the
    benchmark's runner, statistics and bench.json take it as they are."""

    strategy: str
    workers: int
    steps: int
    user: UserModel
    batch: int = 64
    repeats: int = 1
    skip: str = ""
    eval_every: int = 0
    arch: str = "user"
    eval_examples: int = 0  # the user's eval_dataset decides its size

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"unknown strategy {self.strategy!r}. Fix: use one of {', '.join(STRATEGIES)}"
            )
        for attr in ("workers", "steps", "batch", "repeats"):
            value = getattr(self, attr)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{attr}={value!r}: must be an int >= 1. Fix: pass 1 or more")
        if self.strategy == "single" and self.workers != 1:
            raise ConfigError(f"single runs one worker, not {self.workers}. Fix: workers=1")
        if self.strategy == "independent" and self.workers < 2:
            raise ConfigError("independent is the ceiling of 2 or more workers. Fix: workers=2")

    @property
    def model(self) -> str:  # bench.json's "model": what was trained
        return self.user.stem

    @property
    def name(self) -> str:
        return f"{self.strategy}-x{self.workers}"

    @property
    def launch_strategy(self) -> str:
        return LAUNCH_STRATEGY.get(self.strategy, self.strategy)

    def script(self, launch_dir: Path) -> Path:
        return Path(launch_dir) / SCRIPT

    def args(self) -> list[str]:
        out = [*self.user.args(), "--strategy", self.strategy, "--steps", str(self.steps)]
        out += ["--batch-size", str(self.batch), "--eval-every", str(self.eval_every)]
        return out


def plan(
    user: UserModel,
    strategies: tuple[str, ...] | list[str] = STRATEGIES,
    workers: tuple[int, ...] | list[int] | None = None,
    *,
    steps: int,
    cores: int,
    horovod_available: bool,
    batch: int = 64,
    repeats: int = 1,
    eval_every: int = 0,
) -> list[UserCase]:
    """The cases of an experiment, in the benchmark's order (pure): ``single-x1`` and the
    ``independent`` ceiling of every worker count above 1 always, as what the strategies
    are measured against; each strategy at each of ``workers`` (default 1, 2, ... while each
    worker has its own core). Horovod without horovodrun is kept with the reason."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ConfigError(
            f"strategies={list(strategies)!r}: pick from {', '.join(STRATEGIES)}. "
            f"Fix: e.g. strategies=['multi_worker', 'horovod']"
        )
    counts = sorted(set(workers if workers is not None else worker_counts(cores)))
    if not counts or any(type(n) is not int or n < 1 for n in counts):
        raise ConfigError(f"workers={workers!r}: ints >= 1. Fix: e.g. workers=[1, 2]")
    if max(counts) > cores:
        raise ConfigError(
            f"workers={counts}: this machine has {cores} cores, so {max(counts)} workers would "
            f"share them and measure the sharing. Fix: at most {cores} workers here, or "
            f"where=dk.where.Hosts(...) for more"
        )
    from ddlkit import strategies as launcher

    wanted = {"single", *strategies} | ({"independent"} if max(counts) > 1 else set())
    cases = []
    for strategy in STRATEGIES:
        if strategy not in wanted:
            continue
        needs = launcher.get(LAUNCH_STRATEGY.get(strategy, strategy)).needs_horovodrun
        skip = NO_HOROVOD if needs and not horovod_available else ""
        sizes = [1] if strategy == "single" else counts
        for n in sizes:
            if strategy == "independent" and n < 2:
                continue
            every = 0 if strategy == "independent" else eval_every
            cases.append(UserCase(strategy, n, steps, user, batch, repeats, skip, every))
    return cases


@dataclass(frozen=True)
class GradientTensor:
    """One gradient: its variable's name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def elements(self) -> int:
        out = 1
        for d in self.shape:
            out *= d
        return out

    @property
    def nbytes(self) -> int:
        return self.elements * DTYPE_BYTES.get(self.dtype, 4)


DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}


@dataclass(frozen=True)
class ModelCosts:
    """What one step of a model costs, counted on the model (:mod:`.costs`).

    ``forward_flops`` and ``train_flops`` are per example (TensorFlow's profiler), so are
    ``activation_bytes``; ``weight_bytes`` every weight, ``optimizer_bytes`` the optimizer's
    state after one step; ``peak_rss`` the probe process's peak resident memory, TensorFlow's
    own included (what one worker needs at this batch, measured)."""

    name: str
    batch: int
    params: int
    gradients: tuple[GradientTensor, ...]
    forward_flops: float
    train_flops: float
    activation_bytes: float
    weight_bytes: int
    optimizer_bytes: int
    policy: str = "float32"
    peak_rss: int = 0
    # when each gradient is ready in the backward pass (dk.scale.gradients' profile), and how
    # it was found: from the model's Conv2D and Dense layers, or even intervals (assumed)
    readiness: tuple = ()
    readiness_basis: str = ""

    @property
    def gradient_bytes(self) -> dict[str, int]:
        """Bytes of one copy of the gradients, by dtype."""
        out: dict[str, int] = {}
        for g in self.gradients:
            out[g.dtype] = out.get(g.dtype, 0) + g.nbytes
        return out

    @property
    def total_gradient_bytes(self) -> int:
        return sum(self.gradient_bytes.values())

    @property
    def train_to_forward(self) -> float:
        """The training step's FLOPs over the forward pass's (3 in the usual estimate)."""
        return self.train_flops / self.forward_flops if self.forward_flops else float("nan")

    def largest(self, n: int = 5) -> list[GradientTensor]:
        return sorted(self.gradients, key=lambda g: -g.nbytes)[:n]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch": self.batch,
            "params": self.params,
            "gradients": [
                {"name": g.name, "shape": list(g.shape), "dtype": g.dtype, "bytes": g.nbytes}
                for g in self.gradients
            ],
            "gradient_bytes": self.gradient_bytes,
            "forward_flops_per_example": self.forward_flops,
            "train_flops_per_example": self.train_flops,
            "activation_bytes_per_example": self.activation_bytes,
            "weight_bytes": self.weight_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "policy": self.policy,
            "peak_rss": self.peak_rss,
            "readiness": [list(r) for r in self.readiness],
            "readiness_basis": self.readiness_basis,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ModelCosts:
        return cls(
            name=raw["name"],
            batch=int(raw["batch"]),
            params=int(raw["params"]),
            gradients=tuple(
                GradientTensor(g["name"], tuple(g["shape"]), g["dtype"]) for g in raw["gradients"]
            ),
            forward_flops=float(raw["forward_flops_per_example"]),
            train_flops=float(raw["train_flops_per_example"]),
            activation_bytes=float(raw["activation_bytes_per_example"]),
            weight_bytes=int(raw["weight_bytes"]),
            optimizer_bytes=int(raw["optimizer_bytes"]),
            policy=raw.get("policy", "float32"),
            peak_rss=int(raw.get("peak_rss", 0)),
            readiness=tuple(tuple(r) for r in raw.get("readiness", ())),
            readiness_basis=raw.get("readiness_basis", ""),
        )

    HEADERS = ("quantity", "value", "counted by")

    def rows(self) -> list[tuple[str, str, str]]:
        by = ", ".join(f"{b / 1e6:.3f} MB {d}" for d, b in self.gradient_bytes.items())
        big = self.largest(1)
        return [
            ("parameters (trainable)", f"{self.params:,}", "the model's trainable variables"),
            ("gradients per step", by or "none", "one per trainable variable, its dtype"),
            ("gradient tensors", f"{len(self.gradients)} (largest "
             f"{big[0].nbytes / 1e6:.3f} MB)" if big else "0", "what fusion packs"),
            ("forward FLOPs / example", f"{self.forward_flops / 1e6:,.2f} M",
             "TensorFlow's profiler, forward graph"),
            ("training FLOPs / example", f"{self.train_flops / 1e6:,.2f} M "
             f"({self.train_to_forward:.2f}x forward)", "TensorFlow's profiler, step graph"),
            ("activations / example", f"{self.activation_bytes / 1e6:,.3f} MB",
             "forward tensors with a batch dimension"),
            ("weights + optimizer state", f"{(self.weight_bytes + self.optimizer_bytes) / 1e6:,.2f}"
             " MB", "after one step"),
            ("dtype policy", self.policy, "Keras mixed precision"),
            ("gradients ready", self.readiness_basis or "-", "for the overlap predicted"),
            ("one worker's peak memory", f"{self.peak_rss / 1e6:,.0f} MB",
             "the probe process, TensorFlow included"),
        ]  # fmt: skip
