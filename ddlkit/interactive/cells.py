"""Running one cell on live workers and waiting for it, boundedly where it must be.

:func:`run_cell` sends the code to the chosen engines (ipyparallel's ``execute``), prints
their output labelled as it arrives (`ddlkit.interactive.output.Labeller`) and waits,
checking every 50 ms that no worker died. A cell on every worker waits as long as it runs
(an interrupt stops it on every worker), unless it raised on one: then the others get
``after_error`` seconds (they may wait for it in a collective forever). A cell on some
workers only waits ``alone`` seconds, then says who is still in it and who never joined.
Either way the cell is left running (:class:`Pending`: its output shows with the next
cell).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ddlkit.interactive.output import (  # noqa: F401  (CollectiveWaitError: re-exported)
    CellError,
    CollectiveWaitError,
    Labeller,
    failed_message,
    stuck_message,
    waiting_message,
)

POLL = 0.05  # seconds between checks while a cell runs
INTERRUPT_WAIT = 10.0  # seconds an interrupted cell gets to end on every worker


@dataclass
class Pending:
    """A cell left running on some workers after the bounded wait."""

    result: Any  # ipyparallel AsyncResult
    labeller: Labeller
    targets: tuple[int, ...]


def submit(
    client: Any, code: str, targets: Sequence[int], names: Sequence[str], level: int = 0
) -> Pending:
    """Send ``code`` to the engines ``targets``; their messages go to a new Labeller (C++ log
    lines below ``level`` hidden, `ddlkit.interactive.output.hidden`)."""
    labeller = Labeller(names, level=level)
    with _io_held(client):
        result = client[list(targets)].execute(code, silent=False, block=False)
        for engine, child in zip(targets, result._children, strict=True):
            child.iopub_callbacks.append(labeller.callback(engine))
    return Pending(result, labeller, tuple(targets))


@contextlib.contextmanager
def _io_held(client: Any, timeout: float = 10.0) -> Iterator[None]:
    """Hold ipyparallel's I/O thread, which sends the request and dispatches the engines'
    messages, until the callbacks are attached: else a quick cell's output may arrive
    before them and be lost (ipyparallel's own ``stream_output`` has this race: "FIXME:
    there's still a race here", client/asyncresult.py). ``timeout`` bounds the hold."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(timeout)

    client._io_loop.add_callback(hold)
    held.wait(timeout)
    try:
        yield
    finally:
        release.set()


def wait(
    pending: Pending,
    names: Sequence[str],
    check_alive: Callable[[], None],
    interrupt: Callable[[Sequence[int]], None],
    alone: float | None,
    after_error: float,
) -> list[Any]:
    """Wait for ``pending``; its results by engine, or one clear error.

    ``check_alive`` raises when a worker died; ``interrupt(targets)`` sends them SIGINT;
    ``alone``: seconds to wait for a cell run on only some workers (None: no bound);
    ``after_error``: seconds to wait for the others once the cell raised on one (the
    others may be waiting for it in a collective, which never ends).
    """
    started = time.monotonic()
    result, labeller = pending.result, pending.labeller
    raised_at = None
    try:
        while not result.ready():
            labeller.drain()
            check_alive()
            now = time.monotonic()
            if alone is not None and now - started > alone:
                waiting = [names[t] for t in pending.targets]
                absent = [n for i, n in enumerate(names) if i not in pending.targets]
                raise CollectiveWaitError(waiting_message(waiting, absent, alone))
            if labeller.errors:
                raised_at = raised_at or now
                if now - raised_at > after_error:
                    children = zip(pending.targets, result._children, strict=True)
                    running = [names[t] for t, child in children if not child.done()]
                    said = stuck_message(labeller.errors, running, after_error)
                    raise CollectiveWaitError(said)
            result.wait(POLL)  # returns as soon as the cell ends (a sleep added up to 50 ms)
    except KeyboardInterrupt:
        interrupt(pending.targets)
        deadline = time.monotonic() + INTERRUPT_WAIT
        while not result.ready() and time.monotonic() < deadline:
            labeller.drain()
            time.sleep(POLL)
        labeller.finish()
        raise
    result.wait_for_output(timeout=5)
    labeller.finish()
    if labeller.errors:
        others = [names[t] for t in pending.targets if names[t] not in labeller.errors]
        raise CellError(failed_message(labeller.errors, others), dict(labeller.errors))
    return list(result.get())
