"""The notebooks' CPU-dependent cells, run under every setting in which CPUs differ.

TensorFlow turns oneDNN on by default only on some CPUs, and picks its CPU allocator from
that (``ddlkit.cpu``): a cell that works where the suite runs may fail on a learner's
machine of the other kind (``get_memory_info`` on the CPU raised on an AMD EPYC, where it
answered here). So the cells of a notebook tagged ``cpu-variants`` (the CPU-dependent ones
and the cells they need, in order, a program of their own) run in a fresh interpreter under
oneDNN forced off and on, each with TensorFlow's default CPU allocator and with BFC, but for
the setting this machine gives them by default: the notebook's own run in the suite covers it.
Every code cell that calls one of :data:`CPU_DEPENDENT` must carry the tag.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.nbscripts import NOTEBOOKS

from ddlkit import cpu

TAG = "cpu-variants"
# What behaves differently by CPU: allocator statistics, bfloat16 arithmetic (in hardware, in
# oneDNN or emulated), and the switch itself.
CPU_DEPENDENT = ("get_memory_info", "mixed_bfloat16", "TF_ENABLE_ONEDNN_OPTS")
PICKS_BFC = 'os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")'
VARIANTS = {
    f"onednn-{onednn}-{'bfc' if bfc else 'default-allocator'}": {
        "TF_ENABLE_ONEDNN_OPTS": onednn,
        "TF_CPU_ALLOCATOR_USE_BFC": bfc,
    }
    for onednn in ("0", "1")
    for bfc in (None, "true")
}
ALL = sorted([*NOTEBOOKS.glob("*.ipynb"), *(NOTEBOOKS / "solutions").glob("*.ipynb")])


def _code_cells(notebook: Path) -> list[dict]:
    cells = json.loads(notebook.read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code"]


def tagged(notebook: Path) -> list[str]:
    """The sources of ``notebook``'s cells tagged ``cpu-variants``, in order."""
    return [
        "".join(c["source"]) for c in _code_cells(notebook) if TAG in c["metadata"].get("tags", [])
    ]


WITH_TAGS = [nb for nb in ALL if tagged(nb)]


def variants(notebook: Path, environ=os.environ) -> list[str]:
    """The settings ``notebook``'s cells must also run under: every variant but the one its
    nbval run in this suite already uses (this machine's own, from ``environ``). Where its
    cells pick the BFC allocator themselves, TensorFlow's default one is never used, and
    only oneDNN varies."""
    picks_bfc = any(PICKS_BFC in source for source in tagged(notebook))
    here = cpu.read(environ)
    allocator = "bfc" if picks_bfc or here.allocator == "BFC" else "default-allocator"
    own = f"onednn-{int(here.onednn)}-{allocator}"
    names = [n for n in VARIANTS if n.endswith("-bfc")] if picks_bfc else sorted(VARIANTS)
    return [n for n in names if n != own]


CASES = [(nb, v) for nb in WITH_TAGS for v in variants(nb)]


def test_every_cpu_dependent_cell_is_tagged_and_runs_as_plain_python():
    untagged = [
        f"{nb.relative_to(NOTEBOOKS)}: {''.join(c['source']).splitlines()[0]!r}"
        for nb in ALL
        for c in _code_cells(nb)
        if any(api in "".join(c["source"]) for api in CPU_DEPENDENT)
        and not "".join(c["source"]).startswith("%%writefile")  # a script: run by its own test
        and TAG not in c["metadata"].get("tags", [])
    ]
    assert untagged == [], f"tag these cells {TAG!r}: {untagged}"
    for nb in WITH_TAGS:
        for source in tagged(nb):
            assert not any(line.lstrip().startswith(("%", "!")) for line in source.splitlines())
            compile(source, f"{nb.name}: tagged cell", "exec")
    assert NOTEBOOKS / "04_model_and_pipeline_parallelism.ipynb" in WITH_TAGS


def test_the_variants_are_the_settings_this_machine_does_not_give():
    nb04 = NOTEBOOKS / "04_model_and_pipeline_parallelism.ipynb"  # picks BFC itself
    epyc = {"TF_ENABLE_ONEDNN_OPTS": "0"}  # oneDNN off: as TensorFlow's default on AMD Zen 3
    assert variants(nb04, {**epyc, "TF_CPU_ALLOCATOR_USE_BFC": "true"}) == ["onednn-1-bfc"]
    assert variants(nb04, {"TF_ENABLE_ONEDNN_OPTS": "1"}) == ["onednn-0-bfc"]
    plain = NOTEBOOKS / "00_start_here.ipynb"  # leaves the allocator to TensorFlow
    assert variants(plain, epyc) == ["onednn-0-bfc", "onednn-1-bfc", "onednn-1-default-allocator"]


# Runs the tagged cells in one namespace, as the kernel would, in the notebook's directory.
DRIVER = """
import json, sys
ns = {"__name__": "__main__"}
for i, source in enumerate(json.load(open(sys.argv[1]))):
    exec(compile(source, f"<tagged cell {i}>", "exec"), ns)
print("all tagged cells ran")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("notebook", "variant"), CASES, ids=[f"{nb.relative_to(NOTEBOOKS)}-{v}" for nb, v in CASES]
)
def test_the_cpu_dependent_cells_run_under_every_cpu_setting(notebook, variant, data_env, tmp_path):
    cells = tmp_path / "cells.json"
    cells.write_text(json.dumps(tagged(notebook)))
    setting = VARIANTS[variant]
    env = {k: v for k, v in os.environ.items() if k not in setting and k != "TF_CONFIG"}
    env.update({k: v for k, v in setting.items() if v is not None})
    env.update(DDLKIT_FAST="1", DDLKIT_PLOTS="static", MPLBACKEND="Agg", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(cells)],
        capture_output=True, text=True, env=env, cwd=notebook.parent, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0 and "all tagged cells ran" in out.stdout, (
        f"{variant}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    )
