"""What a cell on live workers shows: each worker's output labelled with its name, as it is
printed, and one clear message for each way it can go wrong.

The engines' messages arrive on ipyparallel's I/O thread; :class:`Labeller` only queues them
there, and the notebook's own thread prints them (:meth:`Labeller.drain`), so the output
lands under the cell that ran it. Whole lines are printed as they come, each as
``[worker-1] text``; a line still open at the end of the cell is printed then.
"""

from __future__ import annotations

import queue
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ddlkit.errors import DdlkitError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


def waiting_message(waiting: Sequence[str], absent: Sequence[str], seconds: float) -> str:
    """Who is still in a cell after the bounded wait, who never ran it, how to recover."""
    who = ", ".join(waiting)
    never = ", ".join(absent)
    ids = " ".join(a.rpartition("-")[2] for a in absent)
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

    ``names[i]`` is engine ``i``'s worker name.
    """

    def __init__(self, names: Sequence[str], out: TextIO | None = None) -> None:
        self.names = list(names)
        self.out = out
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
                self._write(stream, label_lines(self.names[engine], text))
        self._open.clear()

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
                self._write(content["name"], label_lines(name, done + "\n" if done else "\n"))
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
