"""The live workers' ipyparallel controller, as the launcher runs it.

``python .../ddlkit/interactive/controller.py ARGS`` is ``ipcontroller ARGS`` whose forked
children (ipyparallel forks its heart monitor even with threaded schedulers) get SIGKILL
when the controller dies: the controller itself gets it when this kernel dies (the
launcher's parent-death signal), so nothing of it outlives the notebook.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and sys.path[0] == os.path.dirname(__file__):
    del sys.path[0]  # run as a file: this package's directory is not a place for imports

import functools  # noqa: E402

from ddlkit.procs import die_with_parent  # noqa: E402


def main() -> None:
    if sys.platform.startswith("linux"):
        os.register_at_fork(after_in_child=functools.partial(die_with_parent, os.getpid()))
    from ipyparallel.controller.app import main as launch_controller

    sys.argv = ["ipcontroller", *sys.argv[1:]]
    launch_controller()


if __name__ == "__main__":
    main()
