"""Model and pipeline parallelism: one model's layers on several devices.

- :mod:`~ddlkit.parallel.schedule` (pure): GPipe's task lists, the bubble arithmetic,
  an ideal simulator.
- :mod:`~ddlkit.parallel.split`: cut a chain of layers into stages, each created on
  its own device (:func:`split`), and :func:`mlp`, a model with equal stages.
- :mod:`~ddlkit.parallel.pipeline`: :class:`Pipeline`, GPipe's micro-batched schedule
  run by one thread per stage, with every task's start and end time measured.
- :mod:`~ddlkit.parallel.train`: :func:`train` with live metrics, :func:`evaluate`,
  :func:`sweep` over micro-batch counts; :mod:`~ddlkit.parallel.gantt`: the pictures.
- :mod:`~ddlkit.parallel.config`: :func:`configure`, the stages' devices and threads.

Importing this package does not start TensorFlow; :func:`configure` must come before
any other TensorFlow code.
"""

from ddlkit.parallel.config import ParallelConfig, configure
from ddlkit.parallel.gantt import plot_bubble, plot_timeline, plot_timelines
from ddlkit.parallel.pipeline import Pipeline, StepResult, full_batch_gradients
from ddlkit.parallel.schedule import (
    Task,
    Timeline,
    Timing,
    bubble_fraction,
    dependencies,
    gpipe_schedule,
    micro_batch_size,
    simulate,
    theoretical_bubble,
)
from ddlkit.parallel.split import SplitModel, mlp, split
from ddlkit.parallel.train import Sweep, SweepPoint, TrainSummary, evaluate, sweep, train

__all__ = [
    "ParallelConfig",
    "Pipeline",
    "SplitModel",
    "StepResult",
    "Sweep",
    "SweepPoint",
    "Task",
    "Timeline",
    "Timing",
    "TrainSummary",
    "bubble_fraction",
    "configure",
    "dependencies",
    "evaluate",
    "full_batch_gradients",
    "gpipe_schedule",
    "micro_batch_size",
    "mlp",
    "plot_bubble",
    "plot_timeline",
    "plot_timelines",
    "simulate",
    "split",
    "sweep",
    "theoretical_bubble",
    "train",
]
