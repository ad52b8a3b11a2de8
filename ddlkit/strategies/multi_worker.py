"""MultiWorkerMirroredStrategy: one process per worker, each with its TF_CONFIG."""

from __future__ import annotations

from ddlkit import contract
from ddlkit.strategies.base import TaskStrategy


class MultiWorker(TaskStrategy):
    name = "multi_worker"
    title = "MultiWorkerMirroredStrategy"
    # TensorFlow's chief: the chief task if there is one, else worker 0.
    speakers = (contract.task_name("chief", 0), contract.task_name("worker", 0))
    api_classes = ("MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy")
    written_with = "tf.distribute.MultiWorkerMirroredStrategy()"
