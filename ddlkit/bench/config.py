"""What a strategy benchmark runs (pure data): the cases, their scripts and arguments.

``independent`` is the ceiling: N copies of the single-device script, each on its own
core, that never talk to each other. What they reach over single-x1 is what this machine
allows without communication; a strategy's shortfall below it is its communication.

Every case trains the same model on the same data for a fixed number of steps with
the same per-replica batch (weak scaling: the global batch grows with the workers).
Each worker gets its own cores and matching TensorFlow thread counts, so 2 workers
on a 2-core machine are compared with 1 worker on 1 core.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddlkit._tables import html_table
from ddlkit.errors import ConfigError

BENCH_STRATEGIES = (
    "reference",
    "single",
    "independent",
    "mirrored",
    "multi_worker",
    "parameter_server",
    "horovod",
)
# The worker script of launch/ for each strategy, and the launcher strategy that runs it.
SCRIPTS = {
    "reference": "bench_reference.py",  # the bare tf-keras loop a learner writes: the yardstick
    "single": "train_single.py",
    "independent": "train_single.py",  # N processes, no communication: the ceiling
    "mirrored": "train_mirrored.py",
    "multi_worker": "train_multi_worker.py",
    "parameter_server": "train_parameter_server.py",
    "horovod": "train_horovod.py",
}
# single: one process, no strategy, launched like mirrored; independent: one process per
# worker, each pinned to its own core (the script ignores the TF_CONFIG it is given).
LAUNCH_STRATEGY = {"reference": "mirrored", "single": "mirrored", "independent": "multi_worker"}
DATASETS = ("mnist", "fashion_mnist", "cifar10")
# The architectures a case trains (the worker scripts' --model): the data set's tutorial CNN,
# or the small ResNet (ddlkit.models.small_resnet: more compute per parameter synchronised).
# A case's name carries the suffix, and its results are compared only with its own arch's.
ARCHS = {"cnn": "", "small_resnet": "-resnet"}
# Scripts whose step records leave their held-out evaluations out of the step time: the
# parameter-server chief evaluates between two joins and times only schedule() to join().
# The Keras scripts evaluate in a callback, inside the next step's time, so the bench leaves
# those steps out (ddlkit.bench.stats.measure); doing so here dropped every PS record that
# followed an evaluation, and measured PS on the rest.
EVALS_OUTSIDE_STEP_TIME = frozenset({"parameter_server"})
# `ddlkit bench --resnet`: these cases again with the small ResNet on CIFAR-10 (32x32x3, what
# it is built for), with fewer steps: a ResNet step takes about nine times the MNIST CNN's
# (batch 64, one core per worker; the recorded bench-full.json has both), so 30 steps train
# a few seconds; no held-out evaluations (each would cost seconds).
RESNET_CASES = (("single", 1), ("independent", 2), ("multi_worker", 2), ("horovod", 2))
RESNET_DATASET = "cifar10"
RESNET_STEPS = {"quick": 20, "full": 30}
# eval_every: a multiple of launch/train_parameter_server.py's --report-every (20), so its
# chief's joins for evaluations and reports coincide: every scheduled function then runs
# 10 steps and each worker gets one between joins (ddlkit.lessons.ps.call_size). Every 25 split
# each 25 steps into 20 on both workers and 5 on one: PS-x2 3,266 against 4,682 examples/s
# (50 steps, 2 runs each, measured on this 2-core machine).
QUICK = {"steps": 50, "repeats": 2, "eval_every": 20}
FULL = {"steps": 200, "repeats": 3, "eval_every": 20}
TARGET, QUICK_TARGET = 0.95, 0.85  # held-out accuracy whose time is measured (MNIST CNN)
EVAL_EXAMPLES = 1000  # held-out test images per evaluation (time to accuracy)
# Test images for each run's final accuracy (the "test acc" column): the first 2,000. All
# 10,000 took 2.4 s of CPU per MNIST CNN run (about 13 s per small-ResNet run), 40+ runs a
# benchmark; the accuracy only shows that a run learned, the speed is what is measured.
TEST_EXAMPLES = 2000
NO_HOROVOD = (
    "horovodrun was not found, so Horovod was not benchmarked. Fix: build it with "
    "scripts/build-horovod.sh .venv/bin/python (make lab does it)."
)


@dataclass(frozen=True)
class BenchCase:
    """One configuration: a strategy with a worker count, run `repeats` times.

    ``skip`` holds the reason a case is not run (e.g. no horovodrun); it is reported,
    never dropped. ``eval_every`` > 0: the first worker evaluates the first
    ``eval_examples`` test images every so many steps (time to accuracy). ``model`` is
    the data set; ``arch`` what is trained on it (one of :data:`ARCHS`: ``"cnn"``, its
    tutorial CNN, or ``"small_resnet"``, named ``<strategy>-x<N>-resnet``).
    """

    strategy: str
    workers: int
    steps: int
    batch: int = 64
    repeats: int = 1
    model: str = "mnist"
    skip: str = ""
    eval_every: int = 0
    eval_examples: int = EVAL_EXAMPLES
    arch: str = "cnn"

    def __post_init__(self) -> None:
        if self.strategy not in BENCH_STRATEGIES:
            raise ConfigError(
                f"unknown strategy {self.strategy!r}. Fix: use one of "
                f"{', '.join(BENCH_STRATEGIES)}."
            )
        if self.model not in DATASETS:
            raise ConfigError(
                f"unknown model {self.model!r}: the benchmark trains the CNN of a data set. "
                f"Fix: use one of {', '.join(DATASETS)}."
            )
        if self.arch not in ARCHS:
            raise ConfigError(
                f"unknown arch {self.arch!r}. Fix: use one of {', '.join(ARCHS)} (the worker "
                f"scripts' --model)."
            )
        for attr in ("workers", "steps", "batch", "repeats"):
            value = getattr(self, attr)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{attr}={value!r}: must be an int >= 1. Fix: pass 1 or more.")
        if type(self.eval_every) is not int or self.eval_every < 0:
            raise ConfigError(
                f"eval_every={self.eval_every!r}: must be an int >= 0. Fix: 0 (no held-out "
                f"evaluations) or the steps between them, e.g. 20."
            )
        if type(self.eval_examples) is not int or self.eval_examples < 1:
            raise ConfigError(f"eval_examples={self.eval_examples!r}: must be an int >= 1.")
        if self.strategy == "independent" and self.workers < 2:
            raise ConfigError(
                f"independent runs have 2 or more workers (x1 is single-x1), not "
                f"{self.workers}. Fix: workers=2."
            )
        if self.strategy in ("single", "reference") and self.workers != 1:
            raise ConfigError(
                f"{self.strategy} runs have one worker, not {self.workers}. Fix: workers=1."
            )
        if self.strategy == "reference" and (
            self.model != "mnist" or self.eval_every or self.arch != "cnn"
        ):
            raise ConfigError(
                f"the reference is the bare MNIST CNN loop without held-out evaluations, not "
                f"model={self.model!r}, arch={self.arch!r} with eval_every={self.eval_every}. "
                f"Fix: model='mnist', eval_every=0, arch='cnn'."
            )

    @property
    def name(self) -> str:
        return f"{self.strategy}-x{self.workers}{ARCHS[self.arch]}"

    @property
    def launch_strategy(self) -> str:
        return LAUNCH_STRATEGY.get(self.strategy, self.strategy)

    def script(self, launch_dir: Path) -> Path:
        return Path(launch_dir) / SCRIPTS[self.strategy]

    def args(self) -> list[str]:
        """The worker script's arguments: a fixed number of steps in one epoch."""
        args = ["--dataset", self.model, "--epochs", "1", "--steps-per-epoch", str(self.steps)]
        args += ["--batch-size", str(self.batch), "--test-examples", str(TEST_EXAMPLES)]
        if self.strategy == "reference":
            return args  # the bare loop has no other kit flags
        if self.arch != "cnn":
            args += ["--model", self.arch]
        args += ["--eval-every", str(self.eval_every)]
        if self.eval_every:
            args += ["--eval-examples", str(self.eval_examples)]
        return args

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("strategy", self.strategy),
            ("workers", str(self.workers)),
            ("steps", str(self.steps)),
            ("batch per replica", str(self.batch)),
            ("repeats", str(self.repeats)),
            ("model", describe(self.model, self.arch)),
            ("held-out eval", f"every {self.eval_every} steps" if self.eval_every else "none"),
            ("skipped", self.skip or "no"),
        ]

    def _repr_html_(self) -> str:
        return html_table(("setting", "value"), self.rows())


def describe(dataset: str, arch: str) -> str:
    """``mnist CNN``, ``cifar10 small ResNet``: what a case trains, for tables (pure)."""
    return f"{dataset} {'CNN' if arch == 'cnn' else 'small ResNet'}"


def worker_counts(cores: int) -> list[int]:
    """1 and 2 workers, then doubling while every worker still gets its own core (pure)."""
    counts = [1, 2]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts


def plan_cases(
    quick: bool,
    cores: int,
    horovod_available: bool,
    *,
    strategies: tuple[str, ...] = BENCH_STRATEGIES,
    steps: int | None = None,
    repeats: int | None = None,
    batch: int = 64,
    model: str = "mnist",
    eval_every: int | None = None,
    resnet: bool = False,
    resnet_steps: int | None = None,
) -> list[BenchCase]:
    """Every case of a benchmark, in run order (pure).

    `quick` takes fewer steps and repeats; `steps`, `repeats` and `eval_every` (steps
    between held-out evaluations, 0: none) override either.
    Without horovodrun the Horovod cases are kept with their reason in ``skip``.
    `resnet` adds the :data:`RESNET_CASES` among `strategies` with the small ResNet on
    CIFAR-10, after the CNN's: :data:`RESNET_STEPS` steps (`resnet_steps` overrides them),
    the same batch and repeats, no held-out evaluations.
    """
    if type(cores) is not int or cores < 1:
        raise ConfigError(f"cores={cores!r}: a machine has at least one core.")
    if not strategies:
        raise ConfigError(f"no strategies to benchmark. Fix: pick from {BENCH_STRATEGIES}.")
    unknown = [s for s in strategies if s not in BENCH_STRATEGIES]
    if unknown:
        raise ConfigError(
            f"unknown strategy {', '.join(map(repr, unknown))}. Fix: use one of "
            f"{', '.join(BENCH_STRATEGIES)}."
        )
    if resnet_steps is not None and not resnet:
        raise ConfigError(
            f"resnet_steps={resnet_steps} without the ResNet cases. Fix: add resnet=True "
            f"(ddlkit bench --resnet), or leave the ResNet's steps out."
        )
    sizes = QUICK if quick else FULL
    steps = sizes["steps"] if steps is None else steps
    repeats = sizes["repeats"] if repeats is None else repeats
    eval_every = sizes["eval_every"] if eval_every is None else eval_every
    cases = []
    for strategy in BENCH_STRATEGIES:  # a fixed order, whatever order was asked
        if strategy not in strategies:
            continue
        skip = NO_HOROVOD if strategy == "horovod" and not horovod_available else ""
        counts = worker_counts(cores)
        if strategy == "reference" and model != "mnist":
            continue  # the bare loop is the MNIST CNN's
        if strategy in ("single", "reference"):
            counts = [1]
        elif strategy == "independent":
            counts = counts[1:]  # its x1 is single-x1
        every = 0 if strategy == "reference" else eval_every  # the bare loop evaluates at the end
        for n in counts:
            cases.append(BenchCase(strategy, n, steps, batch, repeats, model, skip, every))
    if resnet:
        if resnet_steps is None:
            resnet_steps = RESNET_STEPS["quick" if quick else "full"]
        for strategy, n in RESNET_CASES:
            if strategy in strategies:
                skip = NO_HOROVOD if strategy == "horovod" and not horovod_available else ""
                planned = (strategy, n, resnet_steps, batch, repeats, RESNET_DATASET, skip)
                cases.append(BenchCase(*planned, arch="small_resnet"))
    return cases


def cases_table(cases: list[BenchCase]) -> str:
    rows = [(c.name, c.steps, c.batch, c.repeats, describe(c.model, c.arch), c.skip) for c in cases]
    return html_table(("case", "steps", "batch", "repeats", "model", "skipped"), rows)
