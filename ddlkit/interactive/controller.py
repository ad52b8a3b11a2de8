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

import ctypes  # noqa: E402
import ctypes.util  # noqa: E402
import signal  # noqa: E402

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a forked child: SIGKILL when the process that forked it dies (Linux)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def main() -> None:
    if sys.platform.startswith("linux"):
        os.register_at_fork(after_in_child=die_with_parent)
    from ipyparallel.controller.app import main as launch_controller

    sys.argv = ["ipcontroller", *sys.argv[1:]]
    launch_controller()


if __name__ == "__main__":
    main()
