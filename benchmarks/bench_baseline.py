"""Training throughput of the single-device baseline: examples per second.

For each model, ``model.fit`` runs ``1 + windows`` epochs of ``steps`` steps
on a repeated ddlkit pipeline (so the input pipeline's cost is included).
The first epoch is warm-up (tracing, allocation) and is discarded; the
result is the median over the timed windows. Images are random uint8:
throughput does not depend on pixel values, and the benchmark then needs no
data set. Prints one JSON line per model.

    .venv/bin/python benchmarks/bench_baseline.py            # a few minutes on 2 cores
    .venv/bin/python benchmarks/bench_baseline.py --quick    # seconds: checks it runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

import ddlkit  # noqa: F401  (chooses Keras before TensorFlow is imported)
from ddlkit import backend, models
from ddlkit.data.pipeline import make_dataset
from ddlkit.errors import ConfigError

MODELS = {
    "mnist_cnn": (models.mnist_cnn, (28, 28)),
    "small_resnet": (models.small_resnet, (32, 32, 3)),
}


@dataclass(frozen=True)
class Bench:
    """One measurement to make."""

    model: str
    batch_size: int
    steps: int
    windows: int

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(
                f"Unknown model {self.model!r}. Fix: use one of {', '.join(sorted(MODELS))}."
            )
        for name in ("batch_size", "steps", "windows"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name}={getattr(self, name)} is below 1. Fix: pass a positive {name}."
                )


def plan(args: argparse.Namespace) -> list[Bench]:
    """The measurements the command line asks for (pure)."""

    def pick(given: int | None, quick: int, full: int) -> int:
        return given if given is not None else (quick if args.quick else full)

    batch = pick(args.batch, 32, 128)
    steps = pick(args.steps, 3, 50)
    windows = pick(args.windows, 2, 5)
    return [Bench(name, batch, steps, windows) for name in args.models]


def measure(bench: Bench) -> dict:
    """Run one benchmark; return its result as a JSON-ready dict."""
    keras = backend.keras()
    build, image_shape = MODELS[bench.model]
    rng = np.random.default_rng(0)
    n = bench.batch_size * bench.steps
    x = rng.integers(0, 256, size=(n, *image_shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=n, dtype=np.uint8)
    ds = make_dataset(x, y, batch_size=bench.batch_size, repeat=True, seed=0)
    model = models.compile_classifier(build(seed=0))

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._start)

    timer = EpochTimer()
    model.fit(
        ds, epochs=1 + bench.windows, steps_per_epoch=bench.steps, callbacks=[timer], verbose=0
    )
    rates = [n / s for s in timer.seconds[1:]]  # the first epoch is warm-up
    return {
        "bench": "single_device_baseline",
        **asdict(bench),
        "examples_per_sec": round(statistics.median(rates), 1),
        "window_examples_per_sec": [round(r, 1) for r in rates],
        "warmup_s": round(timer.seconds[0], 3),
        "params": model.count_params(),
        "keras": backend.active_flavour(),
        "tensorflow": backend.tf().__version__,
        "cpus": os.cpu_count(),
        "data": "random uint8",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny run: checks the script works")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, help="batch size (default 128, quick 32)")
    parser.add_argument("--steps", type=int, help="steps per timed window (default 50, quick 3)")
    parser.add_argument("--windows", type=int, help="timed windows (default 5, quick 2)")
    args = parser.parse_args(argv)
    try:
        benches = plan(args)
    except ConfigError as exc:
        parser.error(str(exc))
    for bench in benches:
        print(json.dumps(measure(bench)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
