"""Each worker parses its TF_CONFIG with TensorFlow's own resolver and reports it.

Used by the launcher's integration test; also a quick way to check a cluster:
    ddlkit launch --strategy multi_worker -n 2 launch/report_tf_config.py
"""

from __future__ import annotations

import json
import os

import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)
from ddlkit import contract

# isort: split
import tensorflow as tf


def main() -> int:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    report = {
        "worker": os.environ.get(contract.WORKER_VAR),
        "task_type": resolver.task_type,
        "task_id": resolver.task_id,
        "cluster": resolver.cluster_spec().as_dict(),
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
    }
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
