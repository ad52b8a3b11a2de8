"""``DDLKIT_CPU_REPORT=FILE``: the CPU seconds each test file costs, not only its wall time.

``--durations`` gives wall seconds, which under ``-n 3`` on 2 cores mostly measure how busy
the *other* files kept the machine. With ``DDLKIT_CPU_REPORT`` set, this plugin appends one
JSON line per test file to FILE (delete it to start over): the CPU seconds (user + system)
of the pytest process that ran it plus every child process it waited for (worker
processes, ``horovodrun`` and its ranks, notebook kernels and what they started), and its
wall seconds. At the end of a session it prints the files that cost most, from all of
FILE's lines (``make test`` runs two sessions: notebook 00, then the rest).

A process is counted when it is reaped, so a session-scoped fixture's processes (the Spark
cluster of tests/spark/conftest.py, and the training it ran) land in the last file its
xdist worker ran; processes nobody in pytest waits for are not counted at all, but for a
notebook kernel's warm-start templates, read from ``/proc`` before the kernel is killed.

    DDLKIT_CPU_REPORT=/tmp/cpu.jsonl make test

An environment variable, not a pytest option: xdist's workers re-parse the command line
before the root conftest (which loads this plugin) has registered any option, so an
option's value would be taken for a test path there.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

ENV = "DDLKIT_CPU_REPORT"  # the report's path
TOP = 15  # files in the closing summary


@dataclass(frozen=True)
class FileCost:
    """One test file's cost, as one line of the report."""

    file: str
    tests: int
    cpu: float  # pytest's own CPU seconds + waited-for children's, while the file ran
    children_cpu: float
    wall: float
    pid: int  # the pytest (or xdist worker) process that ran it


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    warm = sys.modules.get("ddlkit.launch.warm_pool")  # workers its templates reaped
    forked = warm.forked_cpu_seconds() if warm is not None else 0.0
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime + forked


def _kernels_templates_cpu() -> float:
    """CPU seconds of the warm-start templates (ddlkit.launch.warm) of this process's children,
    with the workers they reaped: a notebook's kernel is killed (nbval stops it with
    ``shutdown_kernel(now=True)``) without reaping its templates, so what they and their
    workers used would reach no one's ``getrusage``. Read from ``/proc`` while they live."""
    me, tick, total = os.getpid(), os.sysconf("SC_CLK_TCK"), 0
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stats[int(entry)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    for pid, fields in stats.items():
        parent = int(fields[1])
        if parent == me or stats.get(parent, [None, None])[1] != str(me):
            continue  # not a grandchild (a template of ours is counted when we reap it)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"ddlkit-warm-start\0"):
                    continue
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class CpuReport:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: str | None = None
        self.tests = 0
        self.start = (0.0, 0.0, 0.0)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item) -> None:
        name = _file(item.nodeid)
        if name != self.current:
            self.current, self.tests = name, 0
            self.start = (*_cpu(), time.monotonic())
        self.tests += 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        last = nextitem is None or _file(nextitem.nodeid) != self.current
        orphaned = _kernels_templates_cpu() if last else 0.0  # before the kernel is killed
        yield  # after the teardown: the file's module fixtures are finalised with its last test
        if not last:
            return
        own0, kids0, wall0 = self.start
        own, kids = _cpu()
        kids += orphaned
        cost = FileCost(
            _file(item.nodeid),
            self.tests,
            round(own - own0 + kids - kids0, 2),
            round(kids - kids0, 2),
            round(time.monotonic() - wall0, 2),
            os.getpid(),
        )
        with self.path.open("a") as out:  # one short line per write: O_APPEND keeps it whole
            out.write(json.dumps(asdict(cost)) + "\n")
        self.current = None


def read(path: Path) -> list[FileCost]:
    """The report's lines, most CPU first."""
    rows = [FileCost(**json.loads(line)) for line in path.read_text().splitlines() if line]
    return sorted(rows, key=lambda r: -r.cpu)


def summary(rows: list[FileCost], top: int = TOP) -> list[str]:
    total = sum(r.cpu for r in rows)
    lines = [f"CPU by test file: {total:,.0f} s in {len(rows)} files (CPU s, share, wall s, tests)"]
    for r in rows[:top]:
        share = r.cpu / total if total else 0.0
        lines.append(f"{r.cpu:8.1f} {share:6.1%} {r.wall:8.1f} {r.tests:4d}  {r.file}")
    return lines


def pytest_configure(config) -> None:
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(CpuReport(Path(path).resolve()), "ddlkit-cpu-report")


def pytest_terminal_summary(terminalreporter, config) -> None:
    path = os.environ.get(ENV)
    if not path or hasattr(config, "workerinput"):  # the xdist controller (or plain pytest) sums
        return
    if Path(path).is_file():
        for line in summary(read(Path(path))):
            terminalreporter.write_line(line)
