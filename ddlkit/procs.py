"""Processes on this machine seen through /proc: who descends from whom (Linux only).

Used to find and end what a job left (ddlkit.spark's workers, a user-mode host's sessions);
:func:`die_with_parent` ties a child that a library starts to its parent's life (the live
workers' controller and engines, `ddlkit.interactive`)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Collection
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# libc is loaded here, in the parent: a child between fork and exec must not load libraries.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent_pid: int) -> None:
    """In a just-forked child: SIGKILL when ``parent_pid`` (the process, strictly the thread,
    that forked it) dies, by Linux's ``PR_SET_PDEATHSIG``; ends at once if that parent has
    already gone. Elsewhere than Linux: nothing."""
    if _LIBC is None:
        return
    if _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # it ended while we looked
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    return children


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int, *, prune: Collection[int] = ()) -> list[tuple[int, str]]:
    """Every living descendant of ``pid`` with its command line, parents first.

    ``prune``: processes left out with all of theirs, judged from the same look at /proc
    (two looks would race: a process seen under ``pid`` may be gone from the second)."""
    children = _children_map()
    found: list[tuple[int, str]] = []
    todo = [child for child in children.get(pid, []) if child not in prune]
    while todo:
        child = todo.pop(0)
        found.append((child, cmdline(child)))
        todo += [c for c in children.get(child, []) if c not in prune]
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is neither a zombie (Z) nor dead (X)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def pids_with_env(name: str, value: str) -> list[int]:
    """Live processes (not this one, no zombies) whose environment holds ``name=value``: the
    processes of a run, a lab or a test that tagged what it started. Another user's processes,
    which /proc does not let us read, are not found."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ and alive(int(entry)):
            found.append(int(entry))
    return found
