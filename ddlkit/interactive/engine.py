"""One live worker: an ipyparallel engine in a process the launcher started as a worker.

Run as ``python .../ddlkit/interactive/engine.py --names worker-0,worker-1 --url-file F``
(the script of a ``dk.workers`` job; `ddlkit.interactive.plan`). The launcher has already
set this process's worker environment (TF_CONFIG, ``DDLKIT_*``, the Keras choice, thread
counts, its cores); a Horovod rank started by ``horovodrun`` first does what a rank of a
launched script does (``ddlkit.horovod.ranks.setup_rank``: its ``rank-N`` name and dying
with ``horovodrun``; ``pinning.pin_rank``: its own cores and thread counts). The engine's
id is the worker's place in ``--names``, so engine ``i`` is always the same worker.
Nothing imports TensorFlow here: the learner's first cell does.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and sys.path[0] == os.path.dirname(__file__):
    del sys.path[0]  # run as a file: this package's directory is not a place for imports

import argparse  # noqa: E402

from ddlkit.contract import WORKER_VAR  # noqa: E402
from ddlkit.errors import ConfigError  # noqa: E402


def engine_argv(names: list[str], name: str, url_file: str, wait: float) -> list[str]:
    """ipengine's arguments for the worker called ``name`` (pure)."""
    if name not in names:
        raise ConfigError(
            f"this worker is {name!r}, which is not one of the live workers "
            f"{', '.join(names)}. Fix: start engines through dk.workers, which names them."
        )
    return [
        "ipengine",
        f"--file={url_file}",
        f"--IPEngine.id={names.index(name)}",
        f"--IPEngine.wait_for_url_file={wait}",
        "--log-level=WARN",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one live worker: an ipyparallel engine")
    parser.add_argument("--names", required=True, help="every worker's name, in engine order")
    parser.add_argument("--url-file", required=True, help="the controller's engine file")
    parser.add_argument("--wait", type=float, default=120.0, help="s to wait for that file")
    args = parser.parse_args(argv)
    from ddlkit.horovod import pinning, ranks

    # TensorFlow's C++ start-up lines (CUDA probing, gRPC servers) would fill every cell's
    # output: warnings and errors only, unless the notebook asked otherwise (env=).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    if ranks.rank_of() is not None:  # a rank started by horovodrun, as a launched script's
        ranks.setup_rank()
        pinning.pin_rank()
    sys.argv = engine_argv(args.names.split(","), os.environ[WORKER_VAR], args.url_file, args.wait)
    from ipyparallel.engine.app import launch_new_instance

    launch_new_instance()


if __name__ == "__main__":
    main()
