"""A running job: start, watch, wait for and stop the worker processes of a JobSpec.

One concern, kept whole (about 440 lines): the job's life cycle and the failure
reports its watcher writes (forking is :mod:`ddlkit.launch.process`'s).

A watcher thread per job polls the workers every 0.1 s. When a worker fails
(non-zero exit, or killed by a signal) it stops the others at once, whether or
not anyone is waiting; :meth:`Job.wait` then raises :class:`WorkerFailedError`.
Jobs still running when the interpreter exits are stopped by an ``atexit`` hook,
and if the process is killed outright its workers get SIGKILL from the kernel
(see :mod:`ddlkit.launch.process`).
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from ddlkit.environments import for_worker
from ddlkit.errors import ConfigError, JobTimeoutError, WorkerFailedError
from ddlkit.launch import runs
from ddlkit.launch.process import WorkerProcess, check_startable, signal_name, start_workers
from ddlkit.launch.remote import HEARTBEAT_INTERVAL
from ddlkit.launch.spec import JobSpec
from ddlkit.launch.status import JobResult, StatusTable, WorkerStatus

WATCH_INTERVAL = 0.1
TAIL_LINES = 20
_PORT_BUSY = re.compile(
    r"address already in use|EADDRINUSE|could not start grpc server|failed to add port",
    re.IGNORECASE,
)

ProgressFn = Callable[[str], "int | None"]


_ACTIVE: set[Job] = set()
_ACTIVE_LOCK = threading.Lock()


class Job:
    """Worker processes started from a :class:`JobSpec`. Create with :meth:`Job.start`."""

    def __init__(self, spec: JobSpec, progress_fn: ProgressFn | None, grace: float) -> None:
        self.spec = spec
        self.progress_fn = progress_fn
        self.grace = grace
        self.started_at = time.time()
        self._procs: dict[str, WorkerProcess] = {}
        self._handled: set[str] = set()
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._failure: WorkerFailedError | None = None
        self._internal_error: BaseException | None = None
        self._stop_asked = False
        self._result: JobResult | None = None
        self._callbacks: list[Callable[[JobResult], None]] = []
        self._progress_warned = False

    # -- starting ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        spec: JobSpec,
        *,
        progress_fn: ProgressFn | None = None,
        base_env: Mapping[str, str] | None = None,
        grace: float = 3.0,
    ) -> Job:
        """Check everything, then start every worker of ``spec``; bad input starts nothing."""
        base = dict(os.environ if base_env is None else base_env)
        # each worker's environment where it runs (on a host: what is set there)
        envs = {w.name: for_worker(w).worker_env(w, spec.run_dir, base) for w in spec.workers}
        check_startable(spec, envs)
        job_file = spec.run_dir / runs.JOB_FILE
        if job_file.exists():
            raise ConfigError(
                f"{job_file} exists: run {spec.run_id!r} was already started there. "
                f"Fix: start a new run with its own id (ddlkit.launch.new_run_id())."
            )
        dirs = {spec.run_dir, runs.metrics_dir(spec.run_dir)}
        dirs |= {w.log_path.parent for w in spec.workers}
        for d in sorted(dirs):
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"cannot create the directory {str(d)!r} ({exc.strerror}). Fix: choose a "
                    f"writable runs directory (set DDLKIT_RUNS) or fix its permissions."
                ) from exc
        job = cls(spec, progress_fn, grace)
        job._write_json()
        try:
            job._procs = {p.spec.name: p for p in start_workers(spec.workers, envs, base)}
        except BaseException as exc:
            job._internal_error = exc
            job._finalize()  # job.json records the failed start
            raise
        job._write_json()
        with _ACTIVE_LOCK:
            _ACTIVE.add(job)
        threading.Thread(target=job._watch, name=f"ddlkit-job-{spec.run_id}", daemon=True).start()
        return job

    # -- reading ----------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def run_dir(self) -> Path:
        return self.spec.run_dir

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    @property
    def state(self) -> str:
        """running until the job ends; then finished, failed or stopped."""
        return "running" if self._result is None else self._result.state

    @property
    def done(self) -> bool:
        """True once every worker has ended and the job's result is recorded."""
        return self._done.is_set()

    def status(self) -> dict[str, WorkerStatus]:
        """Every worker's current :class:`WorkerStatus`, in spec order."""
        return {name: self._status(p, poll=True) for name, p in self._procs.items()}

    def status_table(self) -> StatusTable:
        return StatusTable(self)

    def tail(self, name: str, n: int = TAIL_LINES) -> str:
        """The last ``n`` lines of worker ``name``'s log."""
        return runs.tail(self.spec.worker(name).log_path, n)

    def result(self) -> JobResult | None:
        """The :class:`JobResult` once the job has ended, else None."""
        return self._result

    @property
    def failure(self) -> WorkerFailedError | None:
        """What stopped the job: the first worker that failed (what ``wait()`` raises)."""
        return self._failure

    def _status(self, p: WorkerProcess, poll: bool) -> WorkerStatus:
        code = p.poll() if poll else p.returncode
        step = self._step(p.spec.name)
        if code is None:
            shown = step is not None or _size(p.spec.log_path) > 0
            state = "running" if shown else "starting"
        elif p.stop_requested:
            state = "stopped"
        else:
            state = "finished" if code == 0 else "failed"
        return WorkerStatus(
            name=p.spec.name,
            state=state,
            pid=p.pid,
            exit_code=code,
            signal=signal_name(code),
            current_step=step,
            started_at=p.started_at,
            ended_at=p.ended_at,
        )

    def _step(self, name: str) -> int | None:
        if self.progress_fn is None:
            return None
        try:
            return self.progress_fn(name)
        except Exception as exc:  # a broken hook must not stop the job from being watched
            if not self._progress_warned:
                self._progress_warned = True
                warnings.warn(
                    f"progress_fn raised {exc!r} for worker {name!r}, so steps show as empty. "
                    f"Fix: make progress_fn return an int or None for every worker name.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return None

    # -- waiting and stopping ---------------------------------------------------------------

    def wait(self, timeout: float | None = None, poll: float = 0.2) -> JobResult:
        """Block until every worker has ended; the :class:`JobResult`.

        Raises WorkerFailedError as soon as a worker fails (the others are stopped
        first), JobTimeoutError after ``timeout`` seconds (workers keep running).
        A KeyboardInterrupt stops every worker, then propagates.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            # time.sleep, not self._done.wait(): a Ctrl-C that lands inside Event.wait can
            # leave the event's lock held (CPython's with-statements are not safe against
            # asynchronous exceptions), and stop() below sets that event. Once, under the
            # parallel suite, an interrupted launcher did not end within 10 s
            # (tests/launch/test_job_faults.py); this path now holds no lock when Ctrl-C comes.
            while not self._done.is_set():
                step = min(poll, 0.05)
                if deadline is not None:
                    step = max(0.0, min(step, deadline - time.monotonic()))
                time.sleep(step)
                if self._done.is_set():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    running = [n for n, s in self.status().items() if s.exit_code is None]
                    raise JobTimeoutError(
                        f"run {self.run_id!r} is still running after {timeout} s "
                        f"(workers {', '.join(running)}). Fix: call wait() again with a longer "
                        f"timeout, or job.stop() to end it."
                    )
        except KeyboardInterrupt:
            self.stop()
            raise
        if self._internal_error is not None:
            raise self._internal_error
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    def stop(self, grace: float | None = None) -> JobResult:
        """SIGTERM every worker's process group, SIGKILL after ``grace`` s; reap. Idempotent.

        A KeyboardInterrupt during the grace period skips to SIGKILL, then propagates.
        """
        if self._result is not None:
            return self._result
        self._stop_asked = True
        self._stop_workers(self.grace if grace is None else grace)
        return self._finalize()

    def ending(self) -> None:
        """Say the workers are being ended on purpose by other means than :meth:`stop`
        (``dk.workers`` kills its engines through ipyparallel first): a worker that ends
        from now on is stopped, not failed. :meth:`stop` ends what is left."""
        with self._lock:
            self._stop_asked = True
            for p in self._procs.values():
                p.stop_requested = True

    def _stop_workers(self, grace: float) -> None:
        live = [p for p in self._procs.values() if p.poll() is None]
        for p in live:
            p.stop_requested = True
            p.signal(signal.SIGTERM)
        try:
            deadline = time.monotonic() + grace
            while any(p.poll() is None for p in live) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:  # also on KeyboardInterrupt
            for p in live:
                p.signal(signal.SIGKILL)
            for p in live:
                p.wait_ended(timeout=5.0)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL) to worker ``name`` as a fault would: on purpose.

        The job reacts as it would to a crash: an ordinary worker's death stops the
        job and ``wait()`` raises WorkerFailedError; an ``expendable`` one's is only
        recorded. For teaching fault tolerance; use :meth:`stop` to end a job.
        """
        self.spec.worker(name)  # a clear error for an unknown name
        p = self._procs[name]
        if p.poll() is not None:
            raise ConfigError(
                f"worker {name!r} already ended (exit code {p.returncode}), so it cannot be "
                f"killed. Fix: kill a running worker: "
                f"{', '.join(n for n, q in self._procs.items() if q.returncode is None) or 'none'}."
            )
        p.killed_by = f"{signal_name(-sig) or sig} sent by Job.kill"
        p.signal(sig)

    def add_done_callback(self, fn: Callable[[JobResult], None]) -> None:
        """Call ``fn(result)`` once the job has ended (at once if it already has)."""
        with self._lock:
            if self._result is None:
                self._callbacks.append(fn)
                return
        fn(self._result)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Job {self.run_id} {self.state}: {', '.join(self._procs)}>"

    # -- the watcher thread -----------------------------------------------------------------

    def _watch(self) -> None:
        beat_at = 0.0
        try:
            while self._result is None:
                self._check()
                if time.monotonic() >= beat_at:  # remote workers end when the beats stop
                    beat_at = time.monotonic() + HEARTBEAT_INTERVAL
                    for p in self._procs.values():
                        if for_worker(p.spec).heartbeat:
                            p.heartbeat()
                if all(p.returncode is not None for p in self._procs.values()):
                    self._finalize()
                    return
                time.sleep(WATCH_INTERVAL)
        except BaseException as exc:
            self._internal_error = exc
            self.stop()
            raise

    def _check(self) -> None:
        ended = []
        for name, p in self._procs.items():
            if name not in self._handled and p.poll() is not None:
                self._handled.add(name)
                ended.append(p)
        failed = [p for p in ended if p.returncode != 0 and not p.stop_requested]
        fatal = [p for p in failed if not p.spec.expendable]
        expendable = [p for p in self._procs.values() if p.spec.expendable]
        if expendable and all(p.returncode not in (None, 0) for p in expendable):
            fatal += [p for p in failed if p.spec.expendable]  # none left to go on with
        if fatal and self._failure is None and not self._stop_asked:
            # The cause, of several that ended since the last check: one killed on purpose,
            # else the first to end (a peer of a dead worker fails soon after it).
            cause = min(fatal, key=lambda p: (p.killed_by is None, p.ended_at or time.time()))
            self._failure = self._failure_error(cause)
            self._stop_workers(self.grace)
            return
        mains = [p for p in self._procs.values() if not p.spec.service]
        if mains and all(p.returncode == 0 for p in mains):
            self._stop_workers(self.grace)  # only services are left: end them

    def _failure_error(self, p: WorkerProcess) -> WorkerFailedError:
        code = p.returncode
        assert code is not None
        sig = signal_name(code)
        how = f"was killed by {sig}" if sig else f"exited with code {code}"
        where = for_worker(p.spec)
        meaning = where.exit_meaning(code)  # e.g. ssh's 255: the link to the host was lost
        if p.killed_by:
            how += f" ({p.killed_by})"
        elif meaning is not None:
            how = meaning[0]
        elif sig == "SIGKILL":
            how += " (the out-of-memory killer, or a kill -9)"
        if p.spec.expendable:
            how += ", and it was the last of the workers the job could lose"
        log = p.spec.log_path
        lines = runs.tail(log, TAIL_LINES) if log.exists() else ""
        others = [n for n, q in self._procs.items() if q is not p and q.returncode is None]
        stopped = f"; the job stopped {', '.join(others)}" if others else ""
        fix = "Fix: read the log lines below (whole log: the path above), correct the cause"
        if meaning is not None:
            fix = meaning[1]
        if _PORT_BUSY.search(lines):
            fix = where.port_busy_fix()
        message = (
            f"worker {p.spec.name!r} (pid {p.pid}) {how}{stopped}. Log: {log}\n"
            f"{fix}, and launch again.\n"
            f"--- last {TAIL_LINES} lines of {p.spec.name}'s log ---\n{lines}"
        )
        return WorkerFailedError(
            message,
            worker=p.spec.name,
            exit_code=code,
            signal_name=sig,
            log_path=str(log),
            log_tail=lines,
        )

    def _finalize(self) -> JobResult:
        with self._lock:
            if self._result is not None:
                return self._result
            statuses = {name: self._status(p, poll=False) for name, p in self._procs.items()}
            if self._failure is not None or self._internal_error is not None:
                state = "failed"
            elif self._stop_asked:
                state = "stopped"
            else:
                state = "finished"
            ends = [s.ended_at for s in statuses.values() if s.ended_at is not None]
            self._result = JobResult(
                run_id=self.run_id,
                run_dir=self.run_dir,
                state=state,
                workers=statuses,
                started_at=self.started_at,
                ended_at=max(ends, default=time.time()),
            )
            callbacks, self._callbacks = self._callbacks, []
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self)
        try:
            self._write_json()
        finally:
            self._done.set()
        for fn in callbacks:
            try:
                fn(self._result)
            except Exception:
                traceback.print_exc()
        return self._result

    def _write_json(self) -> None:
        result = self._result
        statuses = (
            result.workers
            if result is not None
            else {name: self._status(p, poll=False) for name, p in self._procs.items()}
        )
        workers = []
        for w in self.spec.workers:
            entry = w.to_dict()
            if w.name in statuses:
                entry.update(statuses[w.name].to_dict())
            else:
                entry["state"] = "starting"
            workers.append(entry)
        data = {
            "version": runs.FORMAT_VERSION,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "state": "running" if result is None else result.state,
            "host": runs.this_host(),
            "launcher_pid": os.getpid(),
            "created_at": runs.iso(self.started_at),
            "ended_at": None if result is None else runs.iso(result.ended_at),
            "error": _first_line(self._failure or self._internal_error),
            "workers": workers,
        }
        runs.write_json_atomic(self.run_dir / runs.JOB_FILE, data)


def _first_line(exc: BaseException | None) -> str | None:
    return None if exc is None else (str(exc).split("\n")[0] or repr(exc))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _stop_all_at_exit() -> None:
    with _ACTIVE_LOCK:
        jobs = list(_ACTIVE)
    for job in jobs:
        job.stop()


atexit.register(_stop_all_at_exit)
