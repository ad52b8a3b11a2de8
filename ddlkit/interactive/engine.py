"""One live worker: an ipyparallel engine in a process the launcher started as a worker.

Run as ``python .../ddlkit/interactive/engine.py --names worker-0,worker-1 --url-file F``
(the script of a ``dk.workers`` job; `ddlkit.interactive.plan`). The launcher has already
set this process's worker environment (TF_CONFIG, ``DDLKIT_*``, the Keras choice, thread
counts, its cores); a Horovod rank started by ``horovodrun`` first does what a rank of a
launched script does (``ddlkit.horovod.ranks.setup_rank``: its ``rank-N`` name and dying
with ``horovodrun``; ``pinning.pin_rank``: its own cores and thread counts). The engine's
id is the worker's place in ``--names``, so engine ``i`` is always the same worker.
Nothing imports TensorFlow here: the learner's first cell does.

Two changes to ipyparallel's engine (:func:`engine_class`), so that ending a worker ends it
at once, here or on another host:

- SIGTERM (the job stopping it, the watchdog of a worker on another host, srun) ends the
  process now. ipyparallel's own handler stops the engine through its event loop, which
  runs only once the cell in progress ends (a cell waiting in a collective never does).
  (Once a cell has created a MultiWorkerMirroredStrategy, TF 2.21's coordination service
  takes SIGTERM over as a preemption notice and the process ignores it: so
  ``Workers.close`` SIGKILLs the engines through their nannies first.)
- its nanny (it relays signals, such as an interrupt, to the engine) is started in a
  session of its own, so nothing that ends the worker's process group ends it; it lingered
  some 3-4 s after the engine, trying to report the end to a controller already gone. It
  is tied to the engine here (`ddlkit.procs.die_with_parent`) and dies with it.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and sys.path[0] == os.path.dirname(__file__):
    del sys.path[0]  # run as a file: this package's directory is not a place for imports

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from pathlib import Path  # noqa: E402

from ddlkit.contract import WORKER_VAR  # noqa: E402
from ddlkit.errors import ConfigError  # noqa: E402

LOG_LEVEL_VAR = "TF_CPP_MIN_LOG_LEVEL"
LOG_LEVEL = 2  # an engine's TF_CPP_MIN_LOG_LEVEL unless its environment sets one


def log_level(env: Mapping[str, str]) -> int:
    """The ``TF_CPP_MIN_LOG_LEVEL`` of an engine whose environment is ``env`` (pure): its
    own, else :data:`LOG_LEVEL`. The notebook hides C++ log lines below it from cell output
    (`ddlkit.interactive.output.hidden`), as TF 2.21 does not for its start-up lines."""
    value = env.get(LOG_LEVEL_VAR, "")
    return int(value) if value.strip().isdigit() else LOG_LEVEL


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


def wait_for_connection_file(path: Path, timeout: float, step: float = 0.05) -> None:
    """Return once the controller's engine file holds whole JSON. ipyparallel's controller
    writes it in place (``open``, then ``write``) and its engine reads it as soon as the file
    exists, so an engine started beside the controller could read it empty and die with a
    JSONDecodeError (seen with Slurm's tasks). ConfigError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            json.loads(path.read_text())
            return
        except (OSError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the controller's connection file {path} was not written whole within "
                    f"{timeout:.0f} s ({exc}). Fix: read the controller's log (ipcontroller.log "
                    f"in the run's logs), then start the workers again."
                ) from exc
        time.sleep(step)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one live worker: an ipyparallel engine")
    parser.add_argument("--names", required=True, help="every worker's name, in engine order")
    parser.add_argument("--url-file", required=True, help="the controller's engine file")
    parser.add_argument("--wait", type=float, default=120.0, help="s to wait for that file")
    args = parser.parse_args(argv)
    from ddlkit.horovod import pinning, ranks

    # TensorFlow's C++ start-up lines (CUDA probing, gRPC servers) would fill every cell's
    # output: errors only, unless the notebook asked otherwise (env=); see log_level.
    os.environ[LOG_LEVEL_VAR] = str(log_level(os.environ))

    if ranks.rank_of() is not None:  # a rank started by horovodrun, as a launched script's
        ranks.setup_rank()
        pinning.pin_rank()
    names = args.names.split(",")
    sys.argv = engine_argv(names, os.environ[WORKER_VAR], args.url_file, args.wait)
    wait_for_connection_file(Path(args.url_file), args.wait)
    engine_class().launch_instance()


def engine_class() -> type:
    """ipyparallel's engine application that SIGTERM ends at once and whose nanny dies with
    it (Linux); see the module docstring."""
    import functools
    import signal

    from ipyparallel.engine import nanny
    from ipyparallel.engine.app import IPEngine

    from ddlkit.procs import die_with_parent

    def end_now(signum: int, frame: object) -> None:
        os._exit(128 + signum)

    class WorkerEngine(IPEngine):
        def init_signal(self) -> None:
            super().init_signal()
            signal.signal(signal.SIGTERM, end_now)

        def start_nanny(self, control_url: str):
            popen = nanny.Popen  # what ipyparallel's start_nanny starts the nanny with
            tie = functools.partial(die_with_parent, os.getpid())
            nanny.Popen = functools.partial(popen, preexec_fn=tie)
            try:
                return super().start_nanny(control_url)
            finally:
                nanny.Popen = popen

    return WorkerEngine


if __name__ == "__main__":
    main()
