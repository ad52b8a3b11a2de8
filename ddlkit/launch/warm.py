"""Warm start: workers fork from a process that has imported TensorFlow once.

``import tensorflow`` (and tf-keras) costs about three CPU-seconds per process on a small
machine, paid again by every worker of every job: on two cores, a four-process parameter
server job spends its first seconds importing the same modules four times over, and a
notebook that launches ten jobs pays it again for each. The launcher therefore starts
local Python workers from a *template* (:mod:`ddlkit.launch.template`): one process,
started with the environment the workers share, imports TensorFlow once, forks one child
per worker, and makes each child the process ``python script.py args`` would have been
(that module says how, and what differs).

A template outlives its job (:func:`ddlkit.launch.warm_pool.fork_workers`): the next job
whose workers share the same environment, but for the variables the launcher sets per job
(:data:`PER_JOB`), forks from it too, with no import at all. It ends after
``DDLKIT_WARM_IDLE`` seconds without a worker (default 600), when a third environment needs
one (at most two run), or with the launcher. Its children always fork from the state right
after the imports: nothing a job ran is left for the next. What it cannot see: the kit's or
TensorFlow's files changed on disk after it imported them (restart the kernel, as for the
kernel's own imports).

Which workers start warm (:func:`warm_groups`, pure): local ones whose command is this
Python (``sys.executable``) with a script and no interpreter options, whose script imports
``tensorflow`` or ``tf_keras``, whose environments differ only in variables read after
import (:data:`PER_WORKER`). Everything else starts as before. ``DDLKIT_WARM_START=0`` in
the launcher's environment turns it off.

Here are the rules, all pure: who starts warm, what environment a template gets and what
may vary, how long it waits. :mod:`ddlkit.launch.warm_pool` runs the templates.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlkit.contract import (
    COLLECTOR_VAR,
    RANK_CPUS_VAR,
    REPLICAS_VAR,
    RUN_DIR_VAR,
    STRATEGY_VAR,
    TOKEN_VAR,
    WORKER_VAR,
)
from ddlkit.errors import ConfigError
from ddlkit.launch.template import Worker, cmdline_bytes

__all__ = [
    "IDLE_VAR",
    "PER_JOB",
    "PER_WORKER",
    "WARM_VAR",
    "Worker",
    "idle_seconds",
    "template_argv",
    "template_env",
    "warm_groups",
]
WARM_VAR = "DDLKIT_WARM_START"
# What may differ between the workers of one template: read after the fork, not at import.
PER_WORKER = frozenset({WORKER_VAR, "TF_CONFIG", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"})
_IMPORTS_TF = re.compile(rb"^\s*(?:import|from)\s+(?:tensorflow|tf_keras)\b", re.M)


def imports_tensorflow(script: Path) -> bool:
    """Whether the script has an ``import tensorflow``/``tf_keras`` line (False if unreadable)."""
    try:
        return bool(_IMPORTS_TF.search(script.read_bytes()))
    except OSError:
        return False


def eligible(argv: Sequence[str], cwd: Path, python: str = sys.executable) -> bool:
    """Whether ``argv`` is ``python script.py ...`` of this Python, the script importing TF."""
    if len(argv) < 2 or argv[0] != python or argv[1].startswith("-"):
        return False
    return imports_tensorflow(cwd / argv[1])


def shared_env(envs: Sequence[Mapping[str, str]]) -> dict[str, str] | None:
    """The environment every one of ``envs`` holds, if they differ only in
    :data:`PER_WORKER` variables; None if any other variable differs (pure)."""
    keys = set().union(*envs)
    common = {}
    for key in keys:
        values = {env.get(key) for env in envs}
        if len(values) == 1:
            common[key] = envs[0][key]
        elif key not in PER_WORKER:
            return None
    return common


def warm_groups(
    items: Sequence[tuple[Sequence[str], Path, Mapping[str, str], bool]],
    launcher_env: Mapping[str, str],
    python: str = sys.executable,
) -> list[int]:
    """Indices of the workers to start from one template (pure but for reading scripts).

    ``items``: each worker's (argv, cwd, environment, is it local). Empty when none is
    eligible, when their environments differ beyond :data:`PER_WORKER`, or when
    ``launcher_env`` sets ``DDLKIT_WARM_START=0``.
    """
    if launcher_env.get(WARM_VAR, "1") == "0":
        return []
    chosen = [
        i for i, (argv, cwd, _, local) in enumerate(items) if local and eligible(argv, cwd, python)
    ]
    if not chosen or shared_env([items[i][2] for i in chosen]) is None:
        return []
    return chosen


# Set by the launcher for one job, read by the kit after import: a template outlives a job,
# so these are each job's own and not part of what makes a template reusable.
PER_JOB = frozenset(
    {RUN_DIR_VAR, COLLECTOR_VAR, TOKEN_VAR, STRATEGY_VAR, REPLICAS_VAR, RANK_CPUS_VAR}
)
IDLE_VAR = "DDLKIT_WARM_IDLE"
IDLE_SECONDS = 600.0  # a template with no worker for this long ends (its memory freed)
MAX_TEMPLATES = 2  # at most this many at once; the least recently used ends first
_ROOM = 2048  # bytes of command line every template reserves for its children's


def template_env(shared: Mapping[str, str]) -> dict[str, str]:
    """The template's own environment, from what a job's workers share (pure): without the
    job's and the workers' variables (a one-worker job shares those too), which each child
    gets back with its own."""
    return {k: v for k, v in shared.items() if k not in PER_JOB and k not in PER_WORKER}


def template_argv(python: str, workers: Sequence[Worker]) -> list[str]:
    """The template's command; its last argument reserves room in ``/proc/PID/cmdline`` for
    the longest worker command line (at least ``_ROOM`` bytes, as it serves later jobs too),
    which each child writes over it."""
    room = max(_ROOM, *(len(cmdline_bytes(w.argv)) for w in workers))
    base = [python, "-m", "ddlkit.launch.template"]
    used = len(cmdline_bytes(base))
    return [*base, "." * max(1, room - used)]


def idle_seconds(environ: Mapping[str, str]) -> float:
    """How long a template waits for the next job (:data:`IDLE_VAR`), checked (pure)."""
    raw = environ.get(IDLE_VAR, "").strip()
    if not raw:
        return IDLE_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(
            f"{IDLE_VAR}={raw!r} is not a number of seconds. Fix: set it to the seconds a "
            f"warm-start template waits for the next job (0 ends it with its job), or unset it "
            f"for the default {IDLE_SECONDS:.0f}."
        )
    return seconds
