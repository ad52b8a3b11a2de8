"""The launcher's warm-start templates: started, kept for later jobs, and ended.

:mod:`ddlkit.launch.warm` says which workers start warm and why; this module runs it. A
:class:`Template` is one running ``python -m ddlkit.launch.template`` (which says what a
child becomes): the launcher writes it one line per job and reads back each child's pid,
exit code and CPU seconds. :func:`fork_workers` keeps a few of them, one per environment,
for later jobs; :class:`Child` is what :mod:`ddlkit.launch.process` holds
of each worker forked; :func:`forked_cpu_seconds` is the CPU time of ended workers that
``getrusage`` does not count yet (their template, not this process, reaped them).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddlkit.launch.template import Worker, cmdline_bytes, killpg
from ddlkit.launch.warm import (
    IDLE_SECONDS,
    MAX_TEMPLATES,
    idle_seconds,
    template_argv,
    template_env,
)

__all__ = ["Child", "Template", "TemplateClosed", "fork_workers", "forked_cpu_seconds"]


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
        t = cls(popen, len(cmdline_bytes(argv)) - 1, log)  # what a child may write over
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
            with self._cond:
                others = self._live() > len(pids)  # earlier jobs' workers, still running
            if others:
                self.close()  # it takes no more jobs, and ends when they have
            else:
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
        """End the template once it has had no worker for ``self._idle`` seconds."""
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
    ``warm.PER_JOB``, until it has had no worker for ``DDLKIT_WARM_IDLE`` seconds (default
    ``warm.IDLE_SECONDS``; it then ends and frees its memory). At most
    ``warm.MAX_TEMPLATES`` take jobs at once, the least recently used ending first, and all
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
