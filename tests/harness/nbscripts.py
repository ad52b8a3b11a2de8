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

import json
import os
import shlex
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
MAGIC = "%%writefile"
BLOCKED = "ddlkit is not importable here on purpose: this script must run without ddlkit"


def extract(notebook: str | os.PathLike) -> dict[str, str]:
    """``{file name: text}`` of every ``%%writefile`` cell of ``notebook``, in order.

    ``%%writefile -a`` appends to the text written so far, as IPython does.
    """
    cells = json.loads(Path(notebook).read_text())["cells"]
    scripts: dict[str, str] = {}
    for cell in cells:
        source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        first, _, body = source.partition("\n")
        if not first.startswith(MAGIC):
            continue
        words = shlex.split(first[len(MAGIC) :])
        append = "-a" in words or "--append" in words
        names = [w for w in words if not w.startswith("-")]
        if len(names) != 1:
            raise ValueError(f"{notebook}: cannot read the file name of {first!r}")
        text = body if body.endswith("\n") else body + "\n"
        scripts[names[0]] = scripts.get(names[0], "") + text if append else text
    return scripts


def write_scripts(notebook: str | os.PathLike, dest: str | os.PathLike) -> dict[str, Path]:
    """Write ``notebook``'s scripts under ``dest`` (keeping their relative paths)."""
    paths = {}
    for name, text in extract(notebook).items():
        path = Path(dest) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths[name] = path
    return paths


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
