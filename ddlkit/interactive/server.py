"""A parameter-server job's ps or worker task for a coordinator in a notebook.

Run as ``python .../ddlkit/interactive/server.py`` with the task's TF_CONFIG (the launcher
sets it, `ddlkit.interactive.plan.servers_job`): it starts the task's TensorFlow server
and serves whatever the coordinator sends until it is ended (servers never exit by
themselves). These are the lines every ps and worker task of TensorFlow's
parameter-server tutorial runs.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and sys.path[0] == os.path.dirname(__file__):
    del sys.path[0]  # run as a file: this package's directory is not a place for imports


def main() -> None:
    import ddlkit  # noqa: F401  (chooses tf-keras before TensorFlow loads)

    # isort: split
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{resolver.task_type}-{resolver.task_id}: serving at {server.target}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
