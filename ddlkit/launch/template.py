"""The warm-start template: ``python -m ddlkit.launch.template`` (started by
:mod:`ddlkit.launch.warm`, which says when and why).

It reads one JSON line on stdin naming what to import, imports what workers share
(TensorFlow, tf-keras) before anything has run (no op, no device, no thread of TensorFlow's
own yet), then reads one line per job, each naming its workers, for as long as the launcher
keeps its stdin open. For each it forks one child per worker and makes each the process
``python script.py args`` would have been:

- its own session and process group, the parent-death signal (the template's own death
  kills it; the launcher's kills the template), its cores (``sched_setaffinity``);
- its log on stdout and stderr, stdin from ``/dev/null``, its working directory;
- its whole environment (``os.environ`` and the C library's: TensorFlow reads
  ``TF_CONFIG`` and the device variables after this point, not at import);
- ``sys.argv``, ``sys.path[0]`` (the script's folder), fresh ``sys.stdout``/``sys.stderr``
  buffered as a new interpreter's, a new NumPy global seed (a fork copies it), and its
  command line in ``/proc/PID/cmdline`` (written over the template's, for which the
  launcher reserves the room), so ``ps`` and ``pgrep -f`` find it by its script;
- then the script runs as ``__main__`` (``runpy.run_path``) and the child ends as an
  interpreter ends (:func:`run`).

The template reaps each child as it ends, first killing what is left in the child's
process group (as the launcher does for a child of its own), and reports ``{"job", "pid"}``
when it forks one and ``{"pid", "code", "cpu", "self_cpu"}`` when it ends (the child's CPU
seconds from ``wait4``, and the template's own so far), one JSON line each on its stdout.
It exits once its stdin has closed and its last child has ended. What it cannot give a
child: ``/proc/PID/environ`` shows the template's environment, not the worker's own.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import os
import resource
import select
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Worker:
    """What the template needs to turn a child into one worker (JSON on its stdin)."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    log: str
    cpus: tuple[int, ...] | None

    def to_json(self) -> dict:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "log": self.log,
            "cpus": None if self.cpus is None else list(self.cpus),
        }

    @classmethod
    def from_json(cls, d: Mapping) -> Worker:
        cpus = d["cpus"]
        return cls(
            tuple(d["argv"]), d["cwd"], d["env"], d["log"], None if cpus is None else tuple(cpus)
        )


def cmdline_bytes(argv: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(a) + b"\0" for a in argv)


def killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty


def _set_cmdline(argv: Sequence[str]) -> None:
    """Write ``argv`` over this process's command line (what ``/proc/PID/cmdline`` reads),
    padded with NUL bytes; a longer one is cut to the room there is."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    data = cmdline_bytes(argv)[: end - start - 1]
    data = data + b"\0" * (end - start - len(data))
    ctypes.memmove(start, data, len(data))


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the template ended before prctl took effect
        os._exit(128 + signal.SIGKILL)


def _stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, buffered as a new interpreter's would be."""
    enc = sys.stdout.encoding if sys.stdout is not None else "utf-8"

    def writer(fd: int, errors: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "wb", closefd=False)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buf, encoding=enc, errors=errors, line_buffering=line, write_through=unbuffered
        )

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding=enc
    )
    sys.stdout = sys.__stdout__ = writer(1, "strict", False)
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace", True)


def become(w: Worker, template: int) -> str:
    """Turn this forked child into worker ``w``; the script to run as ``__main__``."""
    os.setsid()
    _die_with_parent(template)
    if w.cpus is not None:
        os.sched_setaffinity(0, w.cpus)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(w.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(w.cwd)
    os.environ.clear()
    os.environ.update(w.env)
    _stdio(bool(w.env.get("PYTHONUNBUFFERED")))
    _set_cmdline(w.argv)
    script = w.argv[1]
    sys.argv = list(w.argv[1:])
    sys.orig_argv = list(w.argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fork copied the template's global seed
    return script


def _report(msg: dict) -> None:
    os.write(_OUT, (json.dumps(msg) + "\n").encode())


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _reap(pids: set[int]) -> None:
    """Reap every child that has ended, without waiting for the others: kill what is left in
    its group, then report its code and its CPU seconds (and the template's own so far)."""
    while pids:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return
        pid = info.si_pid
        killpg(pid)  # while it is a zombie its group id cannot be reused
        _, status, usage = os.wait4(pid, 0)
        pids.discard(pid)
        own = _cpu(resource.getrusage(resource.RUSAGE_SELF))
        code = os.waitstatus_to_exitcode(status)
        _report({"pid": pid, "code": code, "cpu": _cpu(usage), "self_cpu": own})


def _lines(fd: int, pending: bytearray) -> list[bytes] | None:
    """The whole lines now readable from ``fd`` (a part line stays in ``pending``); None
    once it is closed."""
    data = os.read(fd, 1 << 16)
    if not data:
        return None
    pending += data
    *lines, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    return lines


_OUT = 1


def main() -> str | None:
    """The template: import what the first line names, then fork the workers of each request
    line as it comes and reap them as they end. Returns the script to run in a child; None
    in the template once its stdin has closed and its last child has been reported."""
    global _OUT
    requests = os.dup(0)  # the launcher's pipe, away from the fds a child takes over
    _OUT = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # what the imports print goes to the template's log
    pending = bytearray()
    lines: list[bytes] = []
    while not lines:
        got = _lines(requests, pending)
        if got is None:
            return None  # closed before it said what to import
        lines = got
    first = json.loads(lines.pop(0))
    _set_cmdline(["ddlkit-warm-start", *first.get("title", [])])
    for name in first["preload"]:
        try:
            __import__(name)
        except Exception as exc:  # noqa: BLE001 - each child imports it again and fails there
            print(
                f"warm start: importing {name} failed ({exc!r}); workers import it themselves",
                file=sys.stderr,
            )
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # what is imported now stays out of the children's collections (and pages)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd hears it
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    me, pids, open_ = os.getpid(), set(), True
    while open_ or pids or lines:
        for line in lines:
            request = json.loads(line)
            for d in request["workers"]:
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (_OUT, requests, wake_r, wake_w):
                        os.close(fd)
                    return become(Worker.from_json(d), me)
                pids.add(pid)
                _report({"job": request["job"], "pid": pid})
        lines = []
        ready, _, _ = select.select([requests, wake_r] if open_ else [wake_r], [], [], 5.0)
        if wake_r in ready:
            while True:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    break
        _reap(pids)
        if requests in ready:
            got = _lines(requests, pending)
            if got is None:
                open_ = False
            else:
                lines = got
    return None


def run(script: str) -> None:
    """Run ``script`` as ``__main__`` in this child, then end it as an interpreter ends (non-
    daemon threads joined, atexit handlers, streams flushed) but without tearing down every
    module: after a fork that teardown writes to every page shared with the template, about
    1.5 CPU-seconds with TensorFlow loaded, where a fresh process's takes a tenth of that."""
    import atexit
    import runpy
    import threading

    code: int = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        _end(threading, atexit)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as the interpreter does: ended by the signal
    except BaseException as exc:  # noqa: BLE001 - printed as the interpreter prints it
        tb = exc.__traceback__
        ours = (__file__, runpy.__file__, "<frozen runpy>")
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next  # the frames of this module and runpy are not the script's
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        code = 1
    _end(threading, atexit)
    os._exit(code)


def _exit_code(value: object) -> int:
    """The exit status ``sys.exit(value)`` gives (a message is printed, status 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _end(threading, atexit) -> None:  # noqa: ANN001 - the modules
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    _script = main()
    if _script is not None:
        run(_script)
    else:  # the template: nothing of its own to tear down, its children all reported
        sys.stderr.flush()
        os._exit(0)
