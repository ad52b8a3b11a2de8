"""The worker scripts the notebooks write with ``%%writefile``, and a world without ddlkit.

The course writes its worker scripts in notebook cells so a learner reads them whole. The
tests take them out of the notebooks (the committed text, not a copy) and run them as a
learner would by hand, where ddlkit is not installed:

    scripts = write_scripts(NOTEBOOKS / "02_multi_worker_mirrored.ipynb", tmp_path)
    subprocess.run([sys.executable, scripts["workers/mwms_worker.py"]],
                   env=no_ddlkit_env(tmp_path), cwd=tmp_path)

Run them with a working directory outside the repository (``cwd=tmp_path``): ``python -c``
and ``python -m`` put the working directory first on ``sys.path``, ahead of the blocker.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddlkit.lesson import extract, scripts

__all__ = ["NOTEBOOKS", "extract", "no_ddlkit_env", "write_scripts"]

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
BLOCKED = "ddlkit is not importable here on purpose: this script must run without ddlkit"


def write_scripts(notebook: str | os.PathLike, dest: str | os.PathLike) -> dict[str, Path]:
    """Write ``notebook``'s scripts under ``dest`` (keeping their relative paths)."""
    return scripts(notebook, dest)


def no_ddlkit_env(tmp_path: str | os.PathLike, **extra: str) -> dict[str, str]:
    """An environment for a subprocess in which ``import ddlkit`` raises ImportError.

    A package named ``ddlkit`` that raises is put first on ``PYTHONPATH`` (ahead of the
    editable install); ``TF_CONFIG``, ``TF_USE_LEGACY_KERAS`` and every ``DDLKIT_*``
    variable but ``DDLKIT_HOME`` (where the prepared offline data is) are removed, so the
    script must choose its Keras and find its data itself.
    """
    blocker = Path(tmp_path) / "no-ddlkit"
    (blocker / "ddlkit").mkdir(parents=True, exist_ok=True)
    (blocker / "ddlkit" / "__init__.py").write_text(f"raise ImportError({BLOCKED!r})\n")
    keep = {"DDLKIT_HOME"}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "PYTHONPATH")
        and (not k.startswith("DDLKIT_") or k in keep)
    }
    env.update(PYTHONPATH=str(blocker), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env
