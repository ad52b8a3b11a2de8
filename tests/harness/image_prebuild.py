"""The kit's image, built in the background from the start of a test session that needs it.

Building the image (``ddlkit.image.build``) takes minutes of mostly copying on a fresh
machine. The tests that run its containers come late in a full run (conftest.py puts the
notebooks first), and notebook 11 a few minutes in, so the session starts the build at once
at the lowest CPU priority: it takes the cores' idle moments while the suite waits on
sockets and process starts. The tests' fixture and notebook 11 call the same build, which
waits for this one under its lock and then finds the image up to date. The build runs in its
own process group; the session ends it (and anything it started) if it is still running then.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDS_IMAGE = ROOT / "tests" / "k8s" / "test_k8s_containers.py"
NEEDS_IMAGE_TOO = (NEEDS_IMAGE, ROOT / "notebooks" / "11_kubernetes.ipynb")  # its pods
_proc: subprocess.Popen | None = None


def wanted(args: list[str], rootdir: Path) -> bool:
    """Whether the session runs the container tests or notebook 11 (pure): no paths given
    (the testpaths), or a given path is one of them or holds one."""
    paths = [Path(a.split("::")[0]) for a in args if not a.startswith("-")]
    if not paths:
        return True
    for p in paths:
        p = p if p.is_absolute() else rootdir / p
        if any(need.is_relative_to(p.resolve()) for need in NEEDS_IMAGE_TOO):
            return True
    return False


def start(config) -> None:
    global _proc
    from ddlkit.k8s.containers import unavailable

    if os.environ.get("DDLKIT_IMAGE_PREBUILD", "1") == "0":
        return  # asked not to (the fixture still builds the image when a test needs it)
    if hasattr(config, "workerinput") or unavailable():
        return  # an xdist worker (the controller starts it), or no podman here
    if "not slow" in (config.option.markexpr or ""):
        return  # the container tests are slow ones
    if not wanted(list(config.args), Path(str(config.rootpath))):
        return
    log = Path(os.environ.get("DDLKIT_HOME", Path.home() / ".cache" / "ddlkit"))
    log = log / "containers" / "prebuild.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    low = ["nice", "-n", "19"]
    if shutil.which("ionice"):
        low = ["ionice", "-c", "3", *low]  # idle I/O class too: the build is mostly copying
    with open(log, "wb") as out:
        _proc = subprocess.Popen(
            [*low, sys.executable, "-m", "ddlkit.image", "build"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=ROOT,
        )  # fmt: skip


def stop() -> None:
    if _proc is not None and _proc.poll() is None:
        os.killpg(_proc.pid, signal.SIGTERM)
        try:
            _proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(_proc.pid, signal.SIGKILL)
            _proc.wait()
