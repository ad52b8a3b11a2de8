"""What a cell on live workers shows: each worker's output labelled with its name, as it is
printed, and one clear message for each way it can go wrong.

The engines' messages arrive on ipyparallel's I/O thread; :class:`Labeller` only queues them
there, and the notebook's own thread prints them (:meth:`Labeller.drain`), so the output
lands under the cell that ran it. Whole lines are printed as they come, each as
``[worker-1] text``; a line still open at the end of the cell is printed then.

TensorFlow's C++ start-up lines (oneDNN, CUDA probing: absl's ``I0000 ...`` format) reach a
cell too, since an engine forwards what its process writes to its stderr: TF 2.21 logs them
through absl before ``absl::InitializeLog()``, when absl prints every severity whatever
``TF_CPP_MIN_LOG_LEVEL`` says (abseil/abseil-cpp#1957, open). :func:`hidden` applies that
level itself: such lines below it stay in the worker's log (``workers.tail(name)``), not
under the cell.
"""

from __future__ import annotations

import queue
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ddlkit.contract import CONTROLLER
from ddlkit.errors import DdlkitError, WorkerFailedError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# absl's log line: severity, MMDD hh:mm:ss.micros, thread, file:line] (before absl is set
# up, the time is "00:00:<seconds since 1970>": I0000 00:00:1795712599.724945 4762 port.cc:153])
_ABSL = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to"
SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}  # TF_CPP_MIN_LOG_LEVEL's numbers


class CellError(DdlkitError):
    """A cell raised on one or more workers (their tracebacks were shown, named)."""

    def __init__(self, message: str, failed: dict[str, tuple[str, str]]) -> None:
        super().__init__(message)
        self.failed = failed  # worker -> (exception name, its message)

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


class CollectiveWaitError(DdlkitError):
    """A cell ran on some workers only, and they are still in it after the bounded wait."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class WorkerDiedError(DdlkitError):
    """A live worker is gone: its name, exit code or signal, and its log's last lines."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def plain(text: str) -> str:
    """``text`` without terminal colour codes (IPython colours tracebacks)."""
    return _ANSI.sub("", text)


def hidden(line: str, level: int) -> bool:
    """Whether ``line`` is a C++ log line that ``TF_CPP_MIN_LOG_LEVEL=level`` hides (absl's
    format, severity below ``level``; absl's notice that it logs before being set up is a
    warning) (pure)."""
    if line.startswith(_ABSL_NOTICE):
        return level > SEVERITY["W"]
    found = _ABSL.match(line)
    return found is not None and SEVERITY[found.group(1)] < level


def label_lines(name: str, text: str) -> str:
    """Every line of ``text`` prefixed ``[name] `` (pure)."""
    return "".join(f"[{name}] {line}\n" for line in text.splitlines())


def failed_message(failed: dict[str, tuple[str, str]], others: Sequence[str]) -> str:
    """One sentence for a cell that raised on ``failed`` workers (pure)."""
    said = "; ".join(f"{w}: {e}: {m}" for w, (e, m) in failed.items())
    rest = f" {', '.join(others)} ran it without error." if others else ""
    return (
        f"the cell raised on {', '.join(failed)} ({said}); the traceback of each is above, "
        f"under its name.{rest} The workers are still running with what the cell did before "
        f"it raised: fix the cell and run it again (a collective the others finished without "
        f"this worker may now wait for it: then workers.restart())."
    )


def death_message(
    names: Sequence[str],
    alive: Sequence[str],
    killed: dict[str, str],
    failure: WorkerFailedError | None,
    tail: Callable[[str], str],
) -> str:
    """Which live worker died and how, and the way back (pure but for ``tail(name)``, the
    last lines of its log). ``alive``: the workers the controller still has; ``killed``: name ->
    how it was killed on purpose; ``failure``: the job's (exit code or signal, log tail)."""
    failed = failure.worker if failure is not None else None
    gone = [n for n in names if n in killed or n not in alive or n == failed]
    if failed == CONTROLLER:
        gone = [CONTROLLER]  # the engines were stopped with it
    who = ", ".join(f"{n} ({killed[n]})" if n in killed else n for n in gone)
    if failure is not None:
        body = str(failure).replace(", and launch again", "")
    else:
        body = "\n".join(f"--- {n} ---\n{tail(n)}" for n in gone)
    return (
        f"live worker {who or 'process'} died. {body}\nFix: workers.restart() starts "
        f"fresh workers with the same settings (then run the cells again from the first)."
    )


def stuck_message(
    failed: dict[str, tuple[str, str]], running: Sequence[str], seconds: float
) -> str:
    """A cell that raised on ``failed`` workers while ``running`` ones are still in it (pure)."""
    said = "; ".join(f"{w}: {e}: {m}" for w, (e, m) in failed.items())
    who = ", ".join(running)
    return (
        f"the cell raised on {', '.join(failed)} ({said}; the traceback is above), and {who} "
        f"{'is' if len(running) == 1 else 'are'} still running it {seconds:.0f} s later. A "
        f"collective (strategy.run or reduce, fit, hvd.allreduce) waits for every worker, so "
        f"{who} may wait forever for {', '.join(failed)}. Fix: workers.restart() for fresh "
        f"workers; the cell's later output shows with the next cell."
    )


def waiting_message(waiting: Sequence[str], absent: Sequence[str], seconds: float) -> str:
    """Who is still in a cell after the bounded wait, who never ran it, how to recover."""
    who = ", ".join(waiting)
    never = ", ".join(absent)
    ids = ",".join(a.rpartition("-")[2] for a in absent)
    return (
        f"{who} {'is' if len(waiting) == 1 else 'are'} still running this cell after "
        f"{seconds:.0f} s; {never} never joined (the cell was not run there). A collective "
        f"(creating MultiWorkerMirroredStrategy, strategy.run or reduce, fit, hvd.allreduce) "
        f"waits for every worker, so {who} may wait forever. Fix: run the same cell on "
        f"{never} (%%px --targets {ids}) to let the collective finish, or "
        f"workers.restart() for fresh workers; the cell's later output shows with the next cell."
    )


class Labeller:
    """Collects one cell's engine messages (any thread) and prints them labelled (one thread).

    ``names[i]`` is engine ``i``'s worker name; ``level``: the engines'
    ``TF_CPP_MIN_LOG_LEVEL`` (C++ log lines below it are not shown, see :func:`hidden`).
    """

    def __init__(self, names: Sequence[str], out: TextIO | None = None, level: int = 0) -> None:
        self.names = list(names)
        self.out = out
        self.level = level
        self._queue: queue.SimpleQueue[tuple[int, dict[str, Any]]] = queue.SimpleQueue()
        self._open: dict[tuple[int, str], str] = {}
        self.errors: dict[str, tuple[str, str]] = {}

    def callback(self, engine: int):
        """The iopub callback for engine ``engine`` (runs on ipyparallel's I/O thread)."""

        def on_message(msg: dict[str, Any]) -> None:
            self._queue.put((engine, msg))

        return on_message

    def drain(self) -> None:
        """Print what has arrived (complete lines; errors; results; displays)."""
        while True:
            try:
                engine, msg = self._queue.get_nowait()
            except queue.Empty:
                return
            self._show(engine, msg)

    def finish(self) -> None:
        """Print what is left, open lines included."""
        self.drain()
        for (engine, stream), text in sorted(self._open.items()):
            if text:
                self._lines(stream, self.names[engine], text)
        self._open.clear()

    def _lines(self, stream: str, name: str, text: str) -> None:
        """Write ``text``'s lines labelled, without the hidden C++ log lines."""
        shown = [line for line in text.split("\n") if not hidden(line, self.level)]
        if shown:
            self._write(stream, "".join(f"[{name}] {line}\n" for line in shown))

    def _write(self, stream: str, text: str) -> None:
        target = self.out or (sys.stderr if stream == "stderr" else sys.stdout)
        target.write(text)
        target.flush()

    def _show(self, engine: int, msg: dict[str, Any]) -> None:
        kind = msg["header"]["msg_type"]
        content = msg["content"]
        name = self.names[engine]
        if kind == "stream":
            key = (engine, content["name"])
            text = self._open.get(key, "") + content["text"]
            done, _, rest = text.rpartition("\n")
            self._open[key] = rest
            if done or text.endswith("\n"):
                self._lines(content["name"], name, done)
        elif kind == "error":
            self.errors[name] = (content["ename"], content["evalue"])
            trace = plain("\n".join(content.get("traceback") or []))
            self._write("stderr", f"--- {name}: {content['ename']} ---\n{trace}\n")
        elif kind == "execute_result":
            text = content["data"].get("text/plain", "")
            count = content.get("execution_count")
            self._write("stdout", label_lines(name, f"Out[{count}]: {text}"))
        elif kind == "display_data":
            self._display(name, content)

    def _display(self, name: str, content: dict[str, Any]) -> None:
        try:
            from IPython.display import display
        except ImportError:
            return
        self._write("stdout", f"[{name}]\n")
        display(content["data"], raw=True, metadata=content.get("metadata") or {})
