"""DDLKIT_CPU_REPORT=FILE (tests/harness/cpu_report.py), on a small suite of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.cpu_report import read

HARNESS = Path(__file__).parent
BURN = 0.8  # CPU seconds the child of the first file spends

BURNS = f"""
import subprocess, sys

CHILD = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {BURN}: pass"

def test_a_child_burns_cpu():
    subprocess.run([sys.executable, "-c", CHILD], check=True)

def test_and_the_file_goes_on():
    assert True
"""

IDLE = """
import time

def test_waits_without_computing():
    time.sleep(0.3)
"""


def test_each_file_gets_its_cpu_with_its_children_and_the_costliest_come_first(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_burns.py").write_text(BURNS)
    (suite / "test_idle.py").write_text(IDLE)
    report = tmp_path / "cpu.jsonl"
    old = '{"file": "test_x.py", "tests": 1, "cpu": 0.5, "children_cpu": 0, "wall": 1, "pid": 1}'
    report.write_text(old + "\n")  # a line of an earlier session: kept, and summed
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.cpu_report", "-n", "2", "--dist",
         "loadfile", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(HARNESS), "DDLKIT_CPU_REPORT":
        str(report)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    burns, earlier, idle = read(report)  # most CPU first
    assert earlier.file == "test_x.py"
    assert (Path(burns.file).name, burns.tests) == ("test_burns.py", 2)
    assert (Path(idle.file).name, idle.tests) == ("test_idle.py", 1)
    assert BURN <= burns.children_cpu <= burns.cpu  # the child's CPU, counted once it was reaped
    assert idle.children_cpu < 0.1 and idle.wall >= 0.3 > idle.cpu  # waiting costs no CPU
    assert burns.pid != idle.pid  # two xdist workers wrote them ...
    summary = done.stdout[done.stdout.index("CPU by test file:") :]  # ... the controller sums
    assert summary.index("test_burns.py") < summary.index("test_idle.py")
