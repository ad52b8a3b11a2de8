"""Where the kit keeps things, and the switches notebooks and tests read.

All of these come from environment variables so that notebooks, workers and
CI agree without passing flags around:

- ``DDLKIT_HOME``: the kit's cache (offline data sets); default ``~/.cache/ddlkit``.
- ``DDLKIT_RUNS``: where runs write logs and metrics; default ``./runs`` next to
  the repository's notebooks, or the current directory's ``runs``.
- ``DDLKIT_FAST=1``: notebooks shrink their steps so CI runs them in minutes.
- ``DDLKIT_PLOTS=static``: draw one final figure instead of a live widget
  (set automatically outside a Jupyter kernel).
- ``DDLKIT_OFFLINE=1``: do not try Keras' downloads; use local caches only.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddlkit"
    return Path(os.environ.get("DDLKIT_HOME", default)).expanduser()


def data_dir() -> Path:
    return home() / "datasets"


def runs_dir() -> Path:
    if "DDLKIT_RUNS" in os.environ:
        return Path(os.environ["DDLKIT_RUNS"]).expanduser()
    if (REPO_ROOT / "pyproject.toml").exists():
        return REPO_ROOT / "runs"
    return Path.cwd() / "runs"


def fast_mode() -> bool:
    return _flag("DDLKIT_FAST")


def offline() -> bool:
    return _flag("DDLKIT_OFFLINE")


def plot_mode() -> str:
    """``"live"`` inside a Jupyter kernel, ``"static"`` elsewhere or when asked."""
    forced = os.environ.get("DDLKIT_PLOTS", "").strip().lower()
    if forced in ("live", "static"):
        return forced
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return "static"
    if shell is None or not hasattr(shell, "kernel"):
        return "static"
    return "live"
