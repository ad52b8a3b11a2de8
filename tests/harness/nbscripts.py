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

import ast
import os
from pathlib import Path

from ddlkit.lessons.scripts import extract, scripts

__all__ = [
    "NOTEBOOKS",
    "extract",
    "guarded_imports",
    "imported_roots",
    "no_ddlkit_env",
    "private_attributes",
    "write_scripts",
]

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


# -- what a script's code uses, read from its syntax tree (the static tests of every notebook) ---
def imported_roots(tree: ast.AST) -> set[str]:
    """The top-level packages ``tree`` imports (``tf_keras.src.x`` -> ``tf_keras``)."""
    return {
        (getattr(node, "module", None) or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }


def private_attributes(tree: ast.AST) -> list[str]:
    """``line N: ._name`` for every private attribute ``tree`` reads (dunders allowed)."""
    return [
        f"line {n.lineno}: .{n.attr}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
    ]


def guarded_imports(tree: ast.AST, package: str) -> tuple[int, int]:
    """How many imports of ``package`` ``tree`` has, and how many of them sit inside a
    ``try`` whose handlers catch ``ImportError`` (the scripts' optional ddlkit block)."""
    guarded = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    imports = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        and any(
            (getattr(n, "module", None) or alias.name).split(".")[0] == package for alias in n.names
        )
    ]
    return len(imports), sum(id(n) in guarded for n in imports)
