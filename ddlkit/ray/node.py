"""``python -m ddlkit.ray.node RAY START ARGS...``: one node of a local Ray cluster that takes
everything it started down with it.

``ray start --block`` starts the node's daemons (GCS, raylet, agents); when ``ray start``
itself is SIGKILLed (the parent-death signal the launcher gives every process when a notebook
kernel dies) the raylet and GCS end, but its dashboard and runtime-env agents are left running
(seen with Ray 2.60). This wrapper is the process the launcher starts, the leader of the node's
process group: it turns its parent-death signal into SIGTERM, and on SIGTERM (its parent gone,
or the cluster closing) it passes SIGTERM on to ``ray start``, gives it ``GRACE`` seconds, then
SIGKILLs its whole process group, itself included.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time

GRACE = 5.0
_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # replaces the launcher's SIGKILL
    parent = os.getppid()
    child = subprocess.Popen(argv)

    def end(*_: object) -> None:
        child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(0, signal.SIGKILL)  # the node's daemons and agents, and this process

    signal.signal(signal.SIGTERM, end)
    if os.getppid() != parent:  # the parent died before the signal was armed
        end()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
