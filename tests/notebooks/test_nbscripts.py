"""The harness that runs the notebooks' own scripts outside ddlkit (tests/harness/nbscripts.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness.nbscripts import NOTEBOOKS, extract, no_ddlkit_env, write_scripts


def _notebook(tmp_path, *sources: str):
    cells = [{"cell_type": "code", "source": s.splitlines(True), "metadata": {}} for s in sources]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_extract_reads_writefile_cells_in_order_with_append(tmp_path):
    nb = _notebook(
        tmp_path,
        "%%writefile workers/a.py\nprint('a')",
        "x = 1",
        "%%writefile -a workers/a.py\nprint('more')\n",
        "%%writefile 'workers/b c.py'\npass\n",
    )
    assert extract(nb) == {
        "workers/a.py": "print('a')\nprint('more')\n",
        "workers/b c.py": "pass\n",
    }
    paths = write_scripts(nb, tmp_path / "out")
    assert paths["workers/a.py"].read_text() == "print('a')\nprint('more')\n"


def test_a_writefile_without_a_name_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="file name"):
        extract(_notebook(tmp_path, "%%writefile\nprint(1)\n"))


def test_ddlkit_cannot_be_imported_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{}")
    monkeypatch.setenv("DDLKIT_RUN_DIR", "/nowhere")
    env = no_ddlkit_env(tmp_path)
    assert "TF_CONFIG" not in env and "DDLKIT_RUN_DIR" not in env
    assert "TF_USE_LEGACY_KERAS" not in env
    proc = subprocess.run(
        [sys.executable, "-c", "import ddlkit"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "not importable here on purpose" in proc.stderr
    guarded = (
        "try:\n    from ddlkit.metrics import KerasReporter\n"
        "except ImportError:\n    print('without')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", guarded], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.stdout.strip() == "without"


def test_every_committed_notebook_parses():
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        for name, text in extract(nb).items():
            compile(text, f"{nb.name}:{name}", "exec")


def test_a_notebook_without_scripts_or_unreadable_says_so(tmp_path):
    from ddlkit.errors import ConfigError
    from ddlkit.lessons.scripts import scripts

    with pytest.raises(ConfigError, match="writes no script"):
        scripts(_notebook(tmp_path, "x = 1"), tmp_path / "out")
    with pytest.raises(ConfigError, match="cannot read the notebook"):
        scripts(tmp_path / "missing.ipynb", tmp_path / "out")
