"""The browser harness's server plumbing: its argv and environment (pure), and the process sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from harness.procutil import alive
from labserver import MARKER, LabDirs, kill_tagged, lab_argv, lab_env, tagged_pids


def test_lab_env_keeps_the_developers_jupyter_settings_out():
    dirs = LabDirs(Path("/tmp/x"))
    developer = {
        "PATH": "/usr/bin",
        "HOME": "/home/dev",
        "JUPYTER_CONFIG_DIR": "/home/dev/.jupyter",
        "JUPYTER_PATH": "/home/dev/share",
        "JUPYTERLAB_SETTINGS_DIR": "/home/dev/lab",
        "JPY_SESSION_NAME": "x.ipynb",
        "IPYTHONDIR": "/home/dev/.ipython",
        "PYTHONSTARTUP": "/home/dev/startup.py",
        "MPLBACKEND": "TkAgg",
    }

    env = lab_env(dirs, "t1", "secret", developer)

    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/dev"
    assert "JUPYTER_PATH" not in env and "JPY_SESSION_NAME" not in env
    assert "PYTHONSTARTUP" not in env and "MPLBACKEND" not in env
    assert env["JUPYTER_CONFIG_DIR"] == "/tmp/x/config"
    assert env["JUPYTERLAB_SETTINGS_DIR"] == "/tmp/x/lab-settings"
    assert env["IPYTHONDIR"] == "/tmp/x/ipython"
    assert env["DDLKIT_RUNS"] == "/tmp/x/root/runs"
    assert env["JUPYTER_TOKEN"] == "secret" and env[MARKER] == "t1"
    assert not [v for v in env.values() if v.startswith("/home/dev/")]


def test_lab_argv_serves_loopback_on_an_os_port_and_keeps_the_token_out_of_ps():
    argv = lab_argv("/venv/bin/python", LabDirs(Path("/tmp/x")))

    assert argv[:3] == ["/venv/bin/python", "-m", "jupyterlab"]
    assert "--ServerApp.ip=127.0.0.1" in argv and "--ServerApp.port=0" in argv
    assert "--ServerApp.root_dir=/tmp/x/root" in argv and "--no-browser" in argv
    assert not [a for a in argv if "token=" in a.lower()]


def test_kill_tagged_ends_a_detached_grandchild_and_spares_untagged_processes():
    tag = uuid.uuid4().hex
    tagged_env = {**os.environ, MARKER: tag}
    # The parent exits at once: the sleeper is re-parented and in its own session,
    # as a worker a cell launched would be after its kernel went away.
    spawn = (
        "import subprocess; print(subprocess.Popen(['sleep', '300'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    )
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        spawner = subprocess.run(
            [sys.executable, "-c", spawn], env=tagged_env, capture_output=True, timeout=30
        )
        orphan = int(spawner.stdout)
        deadline = time.monotonic() + 5
        while orphan not in tagged_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tagged_pids(tag) == [orphan]

        assert kill_tagged(tag, timeout=5) == [orphan]

        assert not alive(orphan) and tagged_pids(tag) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)
        for pid in tagged_pids(tag):  # only if the test failed before the sweep
            os.kill(pid, signal.SIGKILL)
