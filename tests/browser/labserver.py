"""A throwaway JupyterLab server for browser tests, and the sweep that leaves nothing behind.

The server runs from this interpreter's environment on 127.0.0.1, on a port the
OS picks, with a random token and its own config, data, runtime, settings,
workspace and IPython dirs under one temporary directory, so the developer's
settings don't leak in and nothing is left behind. Every process it starts
(kernels, and whatever a cell launches) inherits the marker variable
``DDLKIT_LAB_TEST``; on stop the sweep finds them by that marker in
``/proc/*/environ`` even after they were re-parented, and kills the rest.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.procutil import wait_until

from ddlkit.procs import pids_with_env

MARKER = "DDLKIT_LAB_TEST"

# Variables that would point the server or its kernels at the developer's files.
_LEAKY_PREFIXES = ("JUPYTER", "JPY_", "IPYTHON")
_LEAKY_NAMES = ("PYTHONSTARTUP", "MPLBACKEND")

# JupyterLab user settings written before start: no "get Jupyter news?" toast
# covering the notebook, and no requests to the internet for news or updates.
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


class LabHarnessError(RuntimeError):
    """The test harness could not start, drive or clean up JupyterLab."""


@dataclass(frozen=True)
class LabDirs:
    """Everything one server writes, under ``base``."""

    base: Path

    @property
    def root(self) -> Path:
        """The notebooks' directory and the kernels' working directory."""
        return self.base / "root"

    @property
    def jupyter(self) -> dict[str, Path]:
        return {
            "JUPYTER_CONFIG_DIR": self.base / "config",
            "JUPYTER_DATA_DIR": self.base / "data",
            "JUPYTER_RUNTIME_DIR": self.base / "runtime",
            "JUPYTERLAB_SETTINGS_DIR": self.base / "lab-settings",
            "JUPYTERLAB_WORKSPACES_DIR": self.base / "lab-workspaces",
            "IPYTHONDIR": self.base / "ipython",
        }

    @property
    def log(self) -> Path:
        return self.base / "server.log"


def lab_env(dirs: LabDirs, tag: str, token: str, base_env: dict[str, str]) -> dict[str, str]:
    """The server's environment: ``base_env`` without Jupyter/IPython pointers, plus ours.

    The token goes here, not in argv, where any local user could read it with ``ps``.
    """
    env = {
        k: v
        for k, v in base_env.items()
        if not k.startswith(_LEAKY_PREFIXES) and k not in _LEAKY_NAMES
    }
    env.update({name: str(path) for name, path in dirs.jupyter.items()})
    env["DDLKIT_RUNS"] = str(dirs.root / "runs")  # runs a cell starts stay in the temp dir
    env["DDLKIT_FAST"] = "1"
    env["JUPYTER_TOKEN"] = token
    env[MARKER] = tag
    return env


def lab_argv(python: str, dirs: LabDirs) -> list[str]:
    """``jupyter lab`` on 127.0.0.1, an OS-chosen port, no browser, nothing fetched online
    (the token comes from ``JUPYTER_TOKEN``, see ``lab_env``).

    ``expose_app_in_browser`` puts the app at ``window.jupyterapp``: the page
    helper reads the kernel's state and the cells' outputs from its models.
    """
    return [
        python,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={dirs.root}",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.extension_manager=readonly",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
    ]


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment holds ``DDLKIT_LAB_TEST=<tag>``."""
    return pids_with_env(MARKER, tag)


def kill_tagged(tag: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL every live process tagged ``tag`` and wait until they are gone; returns their pids.

    Raises ``LabHarnessError`` naming any that outlive ``timeout``.
    """
    pids = tagged_pids(tag)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not wait_until(lambda: not tagged_pids(tag), timeout):
        raise LabHarnessError(
            f"processes tagged {MARKER}={tag} survived SIGKILL for {timeout:.0f} s: "
            f"{tagged_pids(tag)}"
        )
    return pids


class LabServer:
    """One JupyterLab server; use ``with LabServer() as server:``."""

    def __init__(self, start_timeout: float = 60.0) -> None:
        self.start_timeout = start_timeout
        self.token = secrets.token_hex(24)
        self.tag = secrets.token_hex(8)
        self.dirs = LabDirs(Path(tempfile.mkdtemp(prefix="ddlkit-lab-")))
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    # lifecycle -------------------------------------------------------------
    def __enter__(self) -> LabServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for path in [self.dirs.root, *self.dirs.jupyter.values()]:
            path.mkdir(parents=True, exist_ok=True)
        settings = self.dirs.jupyter["JUPYTERLAB_SETTINGS_DIR"]
        for name, values in USER_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(values))
        env = lab_env(self.dirs, self.tag, self.token, dict(os.environ))
        with open(self.dirs.log, "wb") as log:
            self._proc = subprocess.Popen(
                lab_argv(sys.executable, self.dirs),
                cwd=self.dirs.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        info = self.dirs.jupyter["JUPYTER_RUNTIME_DIR"] / f"jpserver-{self._proc.pid}.json"
        # Jupyter creates the file, then writes it: wait until it parses (under the parallel
        # suite it was once read empty).
        started = lambda: _server_info(info) or self._proc.poll() is not None  # noqa: E731
        if not wait_until(started, self.start_timeout):
            raise LabHarnessError(
                f"jupyter lab wrote no {info.name} within {self.start_timeout:.0f} s; "
                f"its log ends with:\n{self.log_tail()}"
            )
        if self._proc.poll() is not None:
            raise LabHarnessError(
                f"jupyter lab exited with code {self._proc.returncode} while starting; "
                f"its log ends with:\n{self.log_tail()}"
            )
        self.url = _server_info(info)["url"]
        if not wait_until(self._answers, self.start_timeout, step=0.2):
            raise LabHarnessError(
                f"jupyter lab at {self.url} did not answer /api/status within "
                f"{self.start_timeout:.0f} s; its log ends with:\n{self.log_tail()}"
            )

    def _answers(self) -> bool:
        try:
            self.api("GET", "api/status", timeout=2)
        except (OSError, urllib.error.URLError):
            return False
        return True

    def stop(self) -> None:
        """Shut the server down, kill anything it or its kernels left, delete the temp dir.

        Raises ``LabHarnessError`` if a marked process survives SIGKILL.
        """
        try:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                if self.url:  # known once it started listening
                    try:
                        self.api("POST", "api/shutdown", timeout=5)  # ends its kernels too
                    except (OSError, urllib.error.URLError):
                        pass  # the signals below end it anyway
                if not wait_until(lambda: proc.poll() is not None, 15):
                    os.killpg(proc.pid, signal.SIGTERM)
                    if not wait_until(lambda: proc.poll() is not None, 5):
                        os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            kill_tagged(self.tag)
        finally:
            shutil.rmtree(self.dirs.base, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.dirs.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # REST ------------------------------------------------------------------
    def api(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        """One call to the server's REST API; returns the decoded JSON (or None)."""
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def put_notebook(self, name: str, cells: list[str]) -> str:
        """Write a notebook of code cells into the root dir; returns its path for the API."""
        notebook = {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
            },
            "cells": [
                {
                    "cell_type": "code",
                    "id": f"cell-{i}",
                    "metadata": {},
                    "source": source,
                    "outputs": [],
                    "execution_count": None,
                }
                for i, source in enumerate(cells)
            ],
        }
        self.api("PUT", f"api/contents/{name}", {"type": "notebook", "content": notebook})
        return name

    def shutdown_kernels(self) -> None:
        """End every session (and its kernel), e.g. between tests sharing this server."""
        for session in self.api("GET", "api/sessions"):
            self.api("DELETE", f"api/sessions/{session['id']}")


def _server_info(path: Path) -> dict | None:
    """The server's runtime file as a dict once it is whole, else None."""
    try:
        info = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info if isinstance(info, dict) and "url" in info else None
