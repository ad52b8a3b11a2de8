"""Warm start: the workers of one job fork from a process that has imported TensorFlow once.

``import tensorflow`` (and tf-keras) costs about three CPU-seconds per process on a small
machine, paid again by every worker of every job: on two cores, a four-process parameter
server job spends its first seconds importing the same modules four times over. The
launcher therefore starts local Python workers of one job from a *template*
(:mod:`ddlkit.launch.template`): one process, started with the environment the workers
share, imports TensorFlow once, forks one child per worker, and makes each child the process
``python script.py args`` would have been (that module says how, and what differs).

Which workers start warm (:func:`warm_groups`, pure): local ones whose command is this
Python (``sys.executable``) with a script and no interpreter options, whose script imports
``tensorflow`` or ``tf_keras``, in jobs of two or more such workers whose environments
differ only in variables read after import (:data:`PER_WORKER`). Everything else starts as
before. ``DDLKIT_WARM_START=0`` in the launcher's environment turns it off.

Here is the launcher's side: the rules, and :class:`Template` and :class:`Child`, what
:mod:`ddlkit.launch.process` holds of a started template and of each worker it forked.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddlkit.contract import WORKER_VAR
from ddlkit.launch.template import Worker, cmdline_bytes, killpg

__all__ = ["PER_WORKER", "WARM_VAR", "Child", "Template", "Worker", "warm_groups"]
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
    room = max(len(cmdline_bytes(w.argv)) for w in workers)
    base = [python, "-m", "ddlkit.launch.template"]
    used = len(cmdline_bytes(base))
    return [*base, "." * max(1, room - used)]


class Template:
    """A started template: its process, and each child's exit code as it reports them."""

    def __init__(self, popen: subprocess.Popen, count: int) -> None:
        self.popen = popen
        self.count = count
        self.pids: list[int] = []
        self._codes: dict[int, int] = {}
        self.ended_at: dict[int, float] = {}  # when each child's code arrived (time.time())
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
                    self.ended_at[msg["pid"]] = time.time()
                else:
                    self.pids.append(msg["pid"])
                self._cond.notify_all()
        self.popen.wait()  # reaped here, so its children's CPU time reaches this process
        with self._cond:
            for pid in self.pids:
                if pid not in self._codes:  # it died first: the death signal killed them,
                    self._codes[pid] = -signal.SIGKILL
                    self.ended_at[pid] = time.time()
                    killpg(pid)  # and what they started goes too

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
            killpg(pid)
        if self.popen.poll() is None:
            self.popen.kill()


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
