"""Warm start: workers fork from a process that has imported TensorFlow once.

``import tensorflow`` (and tf-keras) costs about three CPU-seconds per process on a small
machine, paid again by every worker of every job: on two cores, a four-process parameter
server job spends its first seconds importing the same modules four times over, and a
notebook that launches ten jobs pays it again for each. The launcher therefore starts
local Python workers from a *template* (:mod:`ddlkit.launch.template`): one process,
started with the environment the workers share, imports TensorFlow once, forks one child
per worker, and makes each child the process ``python script.py args`` would have been
(that module says how, and what differs).

A template outlives its job (:func:`fork_workers`): the next job whose workers share the
same environment, but for the variables the launcher sets per job (:data:`PER_JOB`), forks
from it too, with no import at all. It ends after ``DDLKIT_WARM_IDLE`` seconds without a
worker (default 600), when a third environment needs one (at most two run), or with the
launcher. Its children always fork from the state right after the imports: nothing a job
ran is left for the next. What it cannot see: the kit's or TensorFlow's files changed on
disk after it imported them (restart the kernel, as for the kernel's own imports).

Which workers start warm (:func:`warm_groups`, pure): local ones whose command is this
Python (``sys.executable``) with a script and no interpreter options, whose script imports
``tensorflow`` or ``tf_keras``, whose environments differ only in variables read after
import (:data:`PER_WORKER`). Everything else starts as before. ``DDLKIT_WARM_START=0`` in
the launcher's environment turns it off.

Here is the launcher's side: the rules, and :class:`Template` and :class:`Child`, what
:mod:`ddlkit.launch.process` holds of a started template and of each worker it forked;
:func:`forked_cpu_seconds` is the CPU time of ended workers that ``getrusage`` does not
count yet (their template, not this process, reaped them).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from ddlkit.launch.template import Worker, cmdline_bytes, killpg

__all__ = [
    "IDLE_VAR",
    "PER_JOB",
    "PER_WORKER",
    "WARM_VAR",
    "Child",
    "Template",
    "Worker",
    "fork_workers",
    "forked_cpu_seconds",
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


class Template:
    """A started template: its process, the workers it forked for each job, and each one's
    exit code and CPU seconds as it reports them."""

    def __init__(self, popen: subprocess.Popen, room: int, log: Path) -> None:
        self.popen = popen
        self.room = room
        self.log = log
        self.pids: list[int] = []  # every child, in the order forked
        self._codes: dict[int, int] = {}
        self._cpu: dict[int, float] = {}
        self._self_cpu = 0.0
        self.ended_at: dict[int, float] = {}  # when each child's code arrived (time.time())
        self._forked: dict[int, list[int]] = {}  # job number -> its children
        self._jobs = 0
        self._request = threading.Lock()  # one job's request at a time
        self._cond = threading.Condition()
        self._eof = False
        self.used_at = time.monotonic()
        self._idle_timer: threading.Timer | None = None
        self._idle = IDLE_SECONDS
        threading.Thread(target=self._read, name="ddlkit-warm-reader", daemon=True).start()

    @classmethod
    def start(
        cls,
        python: str,
        workers: Sequence[Worker],
        env: Mapping[str, str],
        log: Path,
        preexec_fn: Callable[[], None],
        title: Sequence[str] = (),
    ) -> Template:
        """Start a template with ``env``; it imports TensorFlow (and tf-keras where ``env``
        asks for it) while the launcher goes on. ``workers`` size its command-line room."""
        preload = ["ddlkit", "tensorflow"] + (
            ["tf_keras"] if env.get("TF_USE_LEGACY_KERAS") == "1" else []
        )
        argv = template_argv(python, workers)
        with open(log, "wb", buffering=0) as err:
            popen = subprocess.Popen(
                argv,
                cwd=workers[0].cwd,
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                close_fds=True,
                preexec_fn=preexec_fn,
            )
        t = cls(popen, len(cmdline_bytes(argv[3:])) + 1, log)
        t._send({"preload": preload, "title": list(title)})
        return t

    def _send(self, msg: dict) -> bool:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write((json.dumps(msg) + "\n").encode())
            self.popen.stdin.flush()
        except (BrokenPipeError, ValueError):
            return False  # it died, or was closed: the caller reports it with its log
        return True

    @property
    def alive(self) -> bool:
        with self._cond:
            return not self._eof and not self.popen.stdin.closed  # type: ignore[union-attr]

    def fork(
        self, workers: Sequence[Worker], idle: float = IDLE_SECONDS, timeout: float = 300.0
    ) -> list[int]:
        """Have the template fork ``workers`` and return their pids, in order; raise
        RuntimeError, with its log, if it cannot (what it did fork is killed). Once they
        have all ended, it waits ``idle`` seconds for another job before it ends."""
        with self._request:
            self._idle = idle
            if not self.alive:
                raise TemplateClosed(f"the template {self.popen.pid} has ended")
            self._cancel_idle()
            self.used_at = time.monotonic()
            self._jobs += 1
            job = self._jobs
            with self._cond:
                self._forked[job] = []
            sent = self._send({"job": job, "workers": [w.to_json() for w in workers]})
            with self._cond:
                self._cond.wait_for(
                    lambda: len(self._forked[job]) == len(workers) or self._eof or not sent,
                    timeout,
                )
                pids = list(self._forked[job])
        if len(pids) < len(workers):
            for pid in pids:
                killpg(pid)
            self.kill()
            tail = self.log.read_text(errors="replace")[-2000:].strip() or "(nothing)"
            raise RuntimeError(
                f"the warm-start template forked {len(pids)} of {len(workers)} workers "
                f"(its log {self.log}: {tail})"
            )
        return pids

    def _live(self) -> int:
        return len(self.pids) - len(self._codes)

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            msg = json.loads(line)
            with self._cond:
                if "code" in msg:
                    self._codes[msg["pid"]] = msg["code"]
                    self._cpu[msg["pid"]] = msg["cpu"]
                    self._self_cpu = msg["self_cpu"]
                    self.ended_at[msg["pid"]] = time.time()
                    idle = self._live() == 0
                else:
                    self.pids.append(msg["pid"])
                    self._forked.setdefault(msg["job"], []).append(msg["pid"])
                    idle = False
                self._cond.notify_all()
            if idle:
                self._idle_later()
        self.popen.wait()  # reaped here: its children's CPU time reaches this process's rusage
        with self._cond:
            for pid in self.pids:
                if pid not in self._codes:  # it died first: the death signal killed them,
                    self._codes[pid] = -signal.SIGKILL
                    self.ended_at[pid] = time.time()
                    killpg(pid)  # and what they started goes too
            self._eof = True
            self._cond.notify_all()

    def _idle_later(self) -> None:
        """End the template once it has had no worker for ``idle`` seconds (:data:`IDLE_VAR`)."""
        with self._cond:
            self._cancel_idle()
            timer = threading.Timer(self._idle, self._close_if_idle)
            timer.daemon = True
            self._idle_timer = timer
            timer.start()

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _close_if_idle(self) -> None:
        with self._request, self._cond:
            if self._live() == 0:
                self.close()

    def close(self) -> None:
        """Let the template end: it forks nothing more and exits once its children have."""
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.close()
        except BrokenPipeError:
            pass

    def code(self, pid: int) -> int | None:
        """The child's exit code once reported (its CPU seconds are then counted by
        :func:`forked_cpu_seconds`)."""
        with self._cond:
            return self._codes.get(pid)

    def unreaped_cpu(self) -> float:
        """CPU seconds of its ended children and of itself not yet in ``RUSAGE_CHILDREN``."""
        with self._cond:
            return 0.0 if self._eof else sum(self._cpu.values()) + self._self_cpu

    def unreaped(self) -> bool:
        with self._cond:
            return not self._eof

    def wait_reaped(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._eof, timeout)

    def kill(self) -> None:
        """End the template; its children die with it (their parent-death signal)."""
        self._cancel_idle()
        for pid in self.pids:
            if pid not in self._codes:
                killpg(pid)
        if self.popen.poll() is None:
            self.popen.kill()


class TemplateClosed(RuntimeError):
    """The template was let end (idle, or replaced) before this job's request reached it."""


_pool: dict[tuple, Template] = {}  # the templates that take new jobs, by environment
_started: list[Template] = []  # every template not yet reaped
_pool_lock = threading.Lock()


def _template_for(
    python: str,
    workers: Sequence[Worker],
    env: Mapping[str, str],
    log: Path,
    preexec_fn: Callable[[], None],
    title: Sequence[str],
) -> Template:
    own = template_env(env)
    key = (python, tuple(sorted(own.items())))
    need = max(len(cmdline_bytes(w.argv)) for w in workers)
    with _pool_lock:
        for k in [k for k, t in _pool.items() if not t.alive]:
            del _pool[k]
        t = _pool.get(key)
        if t is not None and t.room >= need:
            return t
        if t is not None:
            _pool.pop(key).close()
        while len(_pool) >= MAX_TEMPLATES:
            _pool.pop(min(_pool, key=lambda k: _pool[k].used_at)).close()
        t = Template.start(python, workers, own, log, preexec_fn, title)
        _pool[key] = t
        _started[:] = [x for x in _started if x.unreaped()] + [t]
        return t


def fork_workers(
    python: str,
    workers: Sequence[Worker],
    env: Mapping[str, str],
    log: Path,
    preexec_fn: Callable[[], None],
    title: Sequence[str] = (),
) -> tuple[Template, list[int]]:
    """Fork ``workers`` (one job's, sharing ``env``) from this process's template for that
    environment: the one already running, or a new one logging to ``log``.

    A template serves every later job whose workers share the same environment but for
    :data:`PER_JOB`, until it has had no worker for :data:`IDLE_VAR` seconds (default
    :data:`IDLE_SECONDS`; it then ends and frees its memory). At most
    :data:`MAX_TEMPLATES` take jobs at once, the least recently used ending first, and all
    end with this process. Raises RuntimeError, with the template's log, if it cannot fork.
    """
    idle = idle_seconds(os.environ)
    for _ in range(2):
        t = _template_for(python, workers, env, log, preexec_fn, title)
        try:
            return t, t.fork(workers, idle)
        except TemplateClosed:
            continue  # it ended between the choice and the request: take a new one
    raise RuntimeError("the warm-start templates kept ending before they could fork")


def forked_cpu_seconds() -> float:
    """CPU seconds of this process's forked workers that have ended, and of their templates,
    not yet counted by ``getrusage(RUSAGE_CHILDREN)`` (a template is reaped when it ends)."""
    with _pool_lock:
        return sum(t.unreaped_cpu() for t in _started)


@atexit.register
def _end_templates(timeout: float = 10.0) -> None:
    """Close every template and reap it, so this process's rusage counts it; kill one whose
    children outlive ``timeout``."""
    with _pool_lock:
        templates = list(_started)
        _pool.clear()
    for t in templates:
        t.close()
    deadline = time.monotonic() + timeout
    for t in templates:
        if not t.wait_reaped(max(0.0, deadline - time.monotonic())):
            t.kill()
            t.wait_reaped(5.0)


class Child:
    """A worker forked by a template, as the launcher sees it (what it uses of a Popen)."""

    stdin = None

    def __init__(self, template: Template, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.template.code(self.pid)
        return self.returncode
