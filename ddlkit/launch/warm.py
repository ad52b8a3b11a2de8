"""Warm start: the workers of one job fork from a process that has imported TensorFlow once.

``import tensorflow`` (and tf-keras) costs about three CPU-seconds per process on a small
machine, paid again by every worker of every job: on two cores, a four-process parameter
server job spends its first seconds importing the same modules four times over. The
launcher therefore starts local Python workers of one job from a *template*: one process,
started with the environment the workers share, imports TensorFlow before anything has run
(no op, no device, no thread of TensorFlow's own yet), then forks one child per worker. Each
child becomes the process ``python script.py args`` would have been:

- its own session and process group, the parent-death signal (the template's own death
  kills it; the launcher's kills the template), its cores (``sched_setaffinity``);
- its log on stdout and stderr, stdin from ``/dev/null``, its working directory;
- its whole environment (``os.environ`` and the C library's: TensorFlow reads
  ``TF_CONFIG`` and the device variables after this point, not at import);
- ``sys.argv``, ``sys.path[0]`` (the script's folder), fresh ``sys.stdout``/``sys.stderr``
  buffered as a new interpreter's, a new NumPy global seed (a fork copies it), and its
  command line in ``/proc/PID/cmdline`` (written over the template's, for which the
  launcher reserves the room), so ``ps`` and ``pgrep -f`` find it by its script;
- then the script runs as ``__main__`` (``runpy.run_path``) and the interpreter ends as
  usual: atexit handlers, non-daemon threads joined, the exit status of ``sys.exit``.

The template reaps each child, first killing what is left in the child's process group (as
the launcher does for a child of its own), and reports ``{"pid", "code"}`` on its stdout;
it exits when the last child has. What it cannot give a child: ``/proc/PID/environ`` shows
the shared environment, not the worker's own variables (``TF_CONFIG``, ``DDLKIT_WORKER``).

Which workers start warm (:func:`warm_groups`, pure): local ones whose command is this
Python (``sys.executable``) with a script and no interpreter options, whose script imports
``tensorflow`` or ``tf_keras``, in jobs of two or more such workers whose environments
differ only in variables read after import (:data:`PER_WORKER`). Everything else starts as
before. ``DDLKIT_WARM_START=0`` in the launcher's environment turns it off.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

WARM_VAR = "DDLKIT_WARM_START"
# What may differ between the workers of one template: read after the fork, not at import.
PER_WORKER = frozenset(
    {"DDLKIT_WORKER", "TF_CONFIG", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}
)
_IMPORTS_TF = re.compile(rb"^\s*(?:import|from)\s+(?:tensorflow|tf_keras)\b", re.M)
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

    ``items``: each worker's (argv, cwd, environment, is it local). Empty when fewer than two
    are eligible, when their environments differ beyond :data:`PER_WORKER`, or when
    ``launcher_env`` sets ``DDLKIT_WARM_START=0``.
    """
    if launcher_env.get(WARM_VAR, "1") == "0":
        return []
    chosen = [
        i for i, (argv, cwd, _, local) in enumerate(items) if local and eligible(argv, cwd, python)
    ]
    if len(chosen) < 2 or shared_env([items[i][2] for i in chosen]) is None:
        return []
    return chosen


def template_argv(python: str, workers: Sequence[Worker]) -> list[str]:
    """The template's command; its last argument reserves room in ``/proc/PID/cmdline`` for
    the longest worker command line, which each child writes over it."""
    room = max(len(_cmdline_bytes(w.argv)) for w in workers)
    base = [python, "-m", "ddlkit.launch.warm"]
    used = len(_cmdline_bytes(base))
    return [*base, "." * max(1, room - used)]


def _cmdline_bytes(argv: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(a) + b"\0" for a in argv)


# -- in the launcher ------------------------------------------------------------------------
class Template:
    """A started template: its process, and each child's exit code as it reports them."""

    def __init__(self, popen: subprocess.Popen, count: int) -> None:
        self.popen = popen
        self.count = count
        self.pids: list[int] = []
        self._codes: dict[int, int] = {}
        self._cond = threading.Condition()
        self._eof = False
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
        timeout: float = 300.0,
    ) -> Template:
        """Start the template and wait until it has forked every worker (it imports
        TensorFlow first); raise RuntimeError, with its log, if it cannot."""
        preload = ["ddlkit", "tensorflow"] + (
            ["tf_keras"] if env.get("TF_USE_LEGACY_KERAS") == "1" else []
        )
        request = {
            "workers": [w.to_json() for w in workers],
            "preload": preload,
            "title": list(title),
        }
        with open(log, "wb", buffering=0) as err:
            popen = subprocess.Popen(
                template_argv(python, workers),
                cwd=workers[0].cwd,
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                close_fds=True,
                preexec_fn=preexec_fn,
            )
        assert popen.stdin is not None
        try:
            popen.stdin.write(json.dumps(request).encode())
            popen.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: reported below with its log
        t = cls(popen, len(workers))
        with t._cond:
            t._cond.wait_for(lambda: len(t.pids) == t.count or t._eof, timeout)
        if len(t.pids) < t.count:
            t.kill()
            tail = log.read_text(errors="replace")[-2000:].strip() or "(nothing)"
            raise RuntimeError(
                f"the warm-start template forked {len(t.pids)} of {t.count} workers "
                f"(its log {log}: {tail})"
            )
        return t

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            msg = json.loads(line)
            with self._cond:
                if "code" in msg:
                    self._codes[msg["pid"]] = msg["code"]
                else:
                    self.pids.append(msg["pid"])
                self._cond.notify_all()
        self.popen.wait()  # reaped here, so its children's CPU time reaches this process
        with self._cond:
            for pid in self.pids:
                if pid not in self._codes:  # it died first: the death signal killed them,
                    self._codes[pid] = -signal.SIGKILL
                    _killpg(pid)  # and what they started goes too

            self._eof = True
            self._cond.notify_all()

    def code(self, pid: int) -> int | None:
        """The child's exit code once reported; the last child's only once the template has
        been reaped (so ``getrusage`` of this process counts every worker)."""
        with self._cond:
            code = self._codes.get(pid)
            if code is None or self._eof or len(self._codes) < self.count:
                return code
            self._cond.wait_for(lambda: self._eof, 30.0)
            return code

    def kill(self) -> None:
        """End the template; its children die with it (their parent-death signal)."""
        for pid in self.pids:
            _killpg(pid)
        if self.popen.poll() is None:
            self.popen.kill()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty


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


# -- in the template and its children ------------------------------------------------------
def _set_cmdline(argv: Sequence[str]) -> None:
    """Write ``argv`` over this process's command line (what ``/proc/PID/cmdline`` reads),
    padded with NUL bytes; a longer one is cut to the room there is."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    data = _cmdline_bytes(argv)[: end - start - 1]
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


def _reap(pids: set[int]) -> None:
    """Wait for every child; kill what is left in its group, then report its code."""
    while pids:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        pid = info.si_pid
        _killpg(pid)  # while it is a zombie its group id cannot be reused
        _, status = os.waitpid(pid, 0)
        pids.discard(pid)
        _report({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


_OUT = 1


def main() -> str | None:
    """The template: read the workers, import TensorFlow, fork them, reap them. Returns the
    script to run in a child; None in the template, which has reported every child."""
    global _OUT
    request = json.loads(sys.stdin.buffer.read())
    workers = [Worker.from_json(d) for d in request["workers"]]
    _OUT = os.dup(1)  # the pipe to the launcher, away from the fds a child takes over
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # what the imports print goes to the template's log
    _set_cmdline(["ddlkit-warm-start", *request.get("title", [])])
    for name in request["preload"]:
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
    me, pids = os.getpid(), set()
    for w in workers:
        pid = os.fork()
        if pid == 0:
            os.close(_OUT)
            return become(w, me)
        pids.add(pid)
        _report({"pid": pid})
    _reap(pids)
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
