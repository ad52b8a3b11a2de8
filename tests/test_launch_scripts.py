"""The worker scripts in launch/ keep the kit's conventions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
SCRIPTS = sorted(p for p in LAUNCH.glob("*.py") if not p.name.startswith("_"))


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return sorted(found)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_ddlkit_is_imported_before_tensorflow(script):
    names = [name for _, name in _imports(ast.parse(script.read_text()))]
    if "ddlkit" in names and "tensorflow" in names:
        assert names.index("ddlkit") < names.index("tensorflow"), (
            f"{script.name} imports tensorflow before ddlkit, so ddlkit cannot choose tf-keras"
        )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_docstring_lists_how_to_launch_it(script):
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    assert "ddlkit launch" in doc or "python launch/" in doc, f"{script.name}: no launch command"


def test_distribution_lines_are_marked():
    text = (LAUNCH / "train_multi_worker.py").read_text()
    marked = [line for line in text.splitlines() if "# [dist]" in line]
    assert any("MultiWorkerMirroredStrategy()" in line for line in marked)
    assert any("strategy.scope()" in line for line in marked)
    assert "# [dist]" not in (LAUNCH / "train_single.py").read_text()
