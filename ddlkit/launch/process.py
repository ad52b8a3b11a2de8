"""The one place where worker processes are started, signalled and reaped.

Children die with their parent, two ways:

- Each worker runs in its own session and process group (``start_new_session``),
  so :meth:`WorkerProcess.signal` reaches everything the worker started, and a
  Ctrl-C or a Jupyter "interrupt kernel" (SIGINT to the kernel's group) does not
  hit workers behind the job's back: the job stops them itself.
- Each worker asks Linux to send it SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)`` between fork and exec), so killing or restarting the
  launching process (a notebook kernel) leaves no orphan workers. Linux sends that
  signal when the *thread* that forked the child ends, not the process; so every
  worker is forked by one daemon thread, ``ddlkit-spawner``, that lives until the
  process exits. A job started from a short-lived thread (a callback, an executor)
  therefore keeps its workers. The death signal covers the worker itself; processes
  the worker starts are reached by the group signal while the launcher lives.

A worker with a ``host`` is a local ``ssh`` process (:mod:`ddlkit.launch.remote`) whose
stdin is an open pipe: closing it ends the worker on its host, so SIGTERM to a remote
worker closes the pipe (the host's watchdog stops the worker, then ssh exits) and SIGKILL
kills the local ssh (the host's sshd then closes the session, with the same effect).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from ddlkit.environments import for_worker
from ddlkit.environments.base import Popen
from ddlkit.errors import ConfigError
from ddlkit.launch import warm, warm_pool
from ddlkit.launch.spec import JobSpec, WorkerSpec
from ddlkit.launch.spec import python_script as python_script  # re-exported

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_prctl = _load_prctl()


class _Spawner:
    """Runs callables on one daemon thread that lives as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="ddlkit-spawner", daemon=True
                )
                self._thread.start()
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def _loop(self) -> None:
        while True:
            fn, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who re-raises it
                future.set_exception(exc)

    def _after_fork(self) -> None:
        # A forked child has no copy of the thread; start a fresh one on demand.
        self.__init__()


_spawner = _Spawner()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_spawner._after_fork)


def _child_setup(parent_pid: int, cpus: tuple[int, ...] | None) -> Callable[[], None]:
    """The function run in the child between fork and exec."""

    def setup() -> None:
        if _prctl is not None:
            if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(128 + signal.SIGKILL)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


def signal_name(returncode: int | None) -> str | None:
    """``"SIGKILL"`` for a return code of -9; None when the process was not signalled."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class WorkerProcess:
    """A started worker: its Popen, times, and whether the job asked it to stop."""

    def __init__(
        self, spec: WorkerSpec, popen: subprocess.Popen | warm_pool.Child, started_at: float
    ) -> None:
        self.spec = spec
        self.popen = popen
        self.pid = popen.pid
        self.started_at = started_at
        self.ended_at: float | None = None
        self.stop_requested = False
        self.killed_by: str | None = None  # who sent a deliberate kill (Job.kill), if anyone
        self._lock = threading.Lock()

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        """Return code if the worker has ended (reaping it), else None.

        Before reaping, anything still in the worker's process group gets SIGKILL:
        while the ended worker is an unreaped zombie its group id cannot be reused,
        so the signal reaches only the worker's own leftovers.
        """
        with self._lock:
            if self.popen.returncode is not None:
                return self.popen.returncode
            if isinstance(self.popen, warm_pool.Child):  # its template killed its group, reaped it
                code = self.popen.poll()
                if code is not None and self.ended_at is None:
                    self.ended_at = self.popen.template.ended_at.get(self.pid, time.time())
                return code
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = True  # already reaped elsewhere: let Popen record the code
            if info is None:
                return None
            self._killpg(signal.SIGKILL)
            code = self.popen.poll()
            if code is not None and self.ended_at is None:
                self.ended_at = time.time()
                self._close_stdin()
            return code

    def wait_ended(self, timeout: float) -> int | None:
        """Poll until the worker has ended or ``timeout`` seconds passed; its return code."""
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return code

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the worker's whole process group, if it is still running.

        A remote worker's SIGTERM or SIGINT closes its ssh's stdin instead: the watchdog on
        the host ends the worker there and ssh exits with its status.
        """
        with self._lock:
            if self.popen.returncode is None:
                soft = sig in (signal.SIGTERM, signal.SIGINT)
                if soft and for_worker(self.spec).soft_stop_closes_stdin():
                    self._close_stdin()
                else:
                    self._killpg(sig)

    def heartbeat(self) -> None:
        """Write one byte to a running remote worker's ssh (see :mod:`ddlkit.launch.remote`)."""
        with self._lock:
            stdin = self.popen.stdin
            if self.popen.returncode is None and stdin is not None and not stdin.closed:
                try:
                    os.write(stdin.fileno(), b".")
                except OSError:  # BlockingIOError (ssh stalled) or BrokenPipeError (ssh gone)
                    pass

    def _close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass  # ssh has gone: the pipe is broken

    def _killpg(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already empty


def check_startable(job: JobSpec, envs: Mapping[str, Mapping[str, str]]) -> None:
    """Raise ConfigError for the first reason a worker of ``job`` could not start.

    Reads the file system but changes nothing. ``envs`` maps worker names to their
    whole environment (for the PATH that finds argv[0]); each worker's environment
    (:mod:`ddlkit.environments`) says what it needs there.
    """
    for w in job.workers:
        for_worker(w).check_startable(w, envs[w.name])


def _start_one(spec: WorkerSpec, how: Popen, parent_pid: int) -> WorkerProcess:
    """Start one worker as its environment says (``how``: for a remote one, the local ssh,
    see :mod:`ddlkit.environments.ssh`)."""
    with open(spec.log_path, "wb", buffering=0) as log:
        started_at = time.time()
        popen = subprocess.Popen(
            list(how.argv),
            cwd=how.cwd,
            env=dict(how.env),
            stdin=subprocess.DEVNULL if how.stdin is None else subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_child_setup(parent_pid, spec.cpus),
        )
    if popen.stdin is not None and how.stdin is not None:
        # The first bytes (an SSH worker's secrets) while the pipe is empty: cannot block.
        os.write(popen.stdin.fileno(), how.stdin)
        os.set_blocking(popen.stdin.fileno(), False)  # a stalled ssh never blocks a heartbeat
    return WorkerProcess(spec, popen, started_at)


def _start_warm(
    specs: Sequence[WorkerSpec], hows: Sequence[Popen], parent_pid: int, indices: Sequence[int]
) -> dict[int, WorkerProcess]:
    """Start ``specs`` from a warm-start template (:mod:`ddlkit.launch.warm`)."""
    for spec in specs:
        with open(spec.log_path, "wb"):
            pass  # each child appends to its own, emptied here as a cold start's is
    env = warm.shared_env([h.env for h in hows])
    assert env is not None  # warm_groups chose these workers for it
    started_at = time.time()
    template, pids = warm_pool.fork_workers(
        hows[0].argv[0],
        [
            warm.Worker(tuple(h.argv), str(h.cwd), dict(h.env), str(s.log_path), s.cpus)
            for s, h in zip(specs, hows, strict=True)
        ],
        env,
        specs[0].log_path.parent / "warm-start.log",
        _child_setup(parent_pid, None),  # each child takes its own cores
        title=[f"launcher={parent_pid}"],
    )
    return {
        i: WorkerProcess(spec, warm_pool.Child(template, pid), started_at)
        for i, spec, pid in zip(indices, specs, pids, strict=True)
    }


def _kill_now(procs: Sequence[WorkerProcess]) -> None:
    for p in procs:
        p.signal(signal.SIGKILL)
    for p in procs:
        p.wait_ended(timeout=10.0)


def start_workers(
    workers: Sequence[WorkerSpec],
    envs: Mapping[str, Mapping[str, str]],
    base: Mapping[str, str] | None = None,
) -> list[WorkerProcess]:
    """Start every worker from the spawner thread; all or none (a failure kills the rest).

    ``envs`` holds each worker's whole environment, or for a remote worker what is set on
    its host; its local ssh runs with ``base`` (default: this process's environment).
    A KeyboardInterrupt while waiting for the spawner kills whatever it starts.
    """
    base = dict(os.environ if base is None else base)
    parent_pid = os.getpid()
    warm.idle_seconds(os.environ)  # a bad DDLKIT_WARM_IDLE is one error, before anything starts
    if _prctl is None:
        warnings.warn(
            f"{sys.platform} has no parent-death signal: if this process is killed, its "
            f"workers keep running. Fix: end jobs with job.stop() (or run on Linux).",
            RuntimeWarning,
            stacklevel=3,
        )

    def start_all() -> list[WorkerProcess]:
        started: dict[int, WorkerProcess] = {}
        hows: list[Popen] = []
        i = 0
        try:
            for w in workers:
                i = len(hows)
                hows.append(for_worker(w).popen(w, envs[w.name], base))
            local = [
                for_worker(w).forks_here and h.stdin is None
                for w, h in zip(workers, hows, strict=True)
            ]
            forked = warm.warm_groups(
                [(h.argv, h.cwd, h.env, ok) for h, ok in zip(hows, local, strict=True)], os.environ
            )
            if forked:
                i = forked[0]
                specs = [workers[j] for j in forked]
                started.update(_start_warm(specs, [hows[j] for j in forked], parent_pid, forked))
            for i, w in enumerate(workers):
                if i not in started:
                    started[i] = _start_one(w, hows[i], parent_pid)
        except BaseException as exc:
            _kill_now(list(started.values()))
            raise ConfigError(
                f"worker {workers[i].name!r} could not be started ({exc}); no worker was left "
                f"running. Fix: check its argv {list(workers[i].argv)!r} and cwd."
            ) from exc
        return [started[i] for i in range(len(workers))]

    def kill_when_started(future: Future[list[WorkerProcess]]) -> None:
        if future.exception() is None:
            _kill_now(future.result())

    future = _spawner.submit(start_all)
    try:
        return future.result()
    except KeyboardInterrupt:
        future.add_done_callback(kill_when_started)
        raise
