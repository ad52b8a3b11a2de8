"""The worker scripts a lesson writes with ``%%writefile``, read back out of its notebook.

A course notebook writes each worker script whole in a ``%%writefile workers/<name>.py`` cell,
so the learner reads every line. A worked solution (``notebooks/solutions/``) or a test that
needs one of those scripts takes it from the notebook itself, the committed text, rather than
from a copy that could drift::

    paths = dk.lesson.scripts("../02_multi_worker_mirrored.ipynb", into=".")
    paths["workers/mwms_worker.py"]        # written under ./workers/

``%%writefile -a`` appends to the text written so far, as IPython does.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from ddlkit.errors import ConfigError

MAGIC = "%%writefile"


def extract(notebook: str | os.PathLike) -> dict[str, str]:
    """``{file name: text}`` of every ``%%writefile`` cell of ``notebook``, in order."""
    try:
        cells = json.loads(Path(notebook).read_text())["cells"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"cannot read the notebook {notebook}: {exc}. Fix: pass the path of a course "
            f"notebook (.ipynb), relative to the current directory {os.getcwd()}"
        ) from None
    found: dict[str, str] = {}
    for cell in cells:
        source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        first, _, body = source.partition("\n")
        if not first.startswith(MAGIC):
            continue
        words = shlex.split(first[len(MAGIC) :])
        append = "-a" in words or "--append" in words
        names = [w for w in words if not w.startswith("-")]
        if len(names) != 1:
            raise ConfigError(f"{notebook}: cannot read the file name of {first!r}")
        text = body if body.endswith("\n") else body + "\n"
        found[names[0]] = found.get(names[0], "") + text if append else text
    return found


def scripts(notebook: str | os.PathLike, into: str | os.PathLike = ".") -> dict[str, Path]:
    """Write ``notebook``'s scripts under ``into``, keeping their relative paths."""
    paths = {}
    for name, text in extract(notebook).items():
        path = Path(into) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths[name] = path
    if not paths:
        raise ConfigError(
            f"{notebook} writes no script (no {MAGIC} cell). Fix: pass a lesson that does"
        )
    return paths
