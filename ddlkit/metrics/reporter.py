"""Worker side of live metrics: :class:`Reporter`, for any training loop.

::

    reporter = Reporter()                      # configured from the environment
    for epoch in range(epochs):
        for batch in data:
            loss, acc = train_step(batch)
            step += 1
            reporter.step(step=step, epoch=epoch, loss=loss, accuracy=acc, batch_size=64)
        reporter.epoch(epoch=epoch, step=step, loss=loss, accuracy=acc)
    reporter.close()

Where records go:

1. Always: appended and flushed to ``<run_dir>/metrics/<worker>.jsonl``.
   ``run_dir`` is the argument, else ``DDLKIT_RUN_DIR`` (set by the ddlkit
   launcher), else a new ``runs/local-<timestamp>-<pid>/`` under
   :func:`ddlkit.settings.runs_dir`, announced in one printed line. So a
   script run alone with plain ``python`` keeps its metrics, and
   ``ddlkit plot`` can draw them later.
2. If a collector is configured (argument, else ``DDLKIT_COLLECTOR`` and
   ``DDLKIT_TOKEN``): streamed to it by a background thread
   (:mod:`ddlkit.metrics.sender`) that never blocks or fails training.
3. If a ``sink`` is given (e.g. a :class:`~ddlkit.metrics.dashboard.Dashboard`
   in the same notebook): handed to it in-process.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddlkit import settings
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.metrics import protocol
from ddlkit.metrics.records import Record
from ddlkit.metrics.sender import Sender
from ddlkit.metrics.store import JsonlWriter, metrics_path

DEFAULT_WORKER = "local"
CLOSE_TIMEOUT = 2.0

Sink = Callable[[Record], Any]


@dataclasses.dataclass(frozen=True)
class ReporterStats:
    """What a reporter has done so far."""

    worker: str
    path: str
    written: int
    collector: str | None
    sent: int
    queued: int
    dropped: int
    connected: bool
    connects: int
    refused: str | None
    last_error: str | None


def local_run_dir(now: float | None = None, pid: int | None = None) -> Path:
    """``runs/local-<YYYYmmdd-HHMMSS>-<pid>``: a reporter's run dir when not launched by ddlkit."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return settings.runs_dir() / f"local-{stamp}-{os.getpid() if pid is None else pid}"


class Reporter:
    """Records one worker's training progress; see the module docstring.

    Thread-safe. ``step_time`` is measured automatically when not given: the
    time since the previous record of this reporter, divided by ``steps``.
    """

    def __init__(
        self,
        worker: str | None = None,
        run_dir: str | os.PathLike | None = None,
        *,
        collector: str | None = None,
        token: str | None = None,
        sink: Sink | None = None,
        queue_size: int = 10000,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.worker = worker or env.get(protocol.WORKER_VAR) or DEFAULT_WORKER
        announce = False
        if run_dir is None and env.get(protocol.RUN_DIR_VAR):
            run_dir = env[protocol.RUN_DIR_VAR]
        if run_dir is None:
            run_dir, announce = local_run_dir(), True
        self.run_dir = Path(run_dir)
        self.path = metrics_path(self.run_dir, self.worker)
        address = collector or env.get(protocol.COLLECTOR_VAR) or None
        token = token or env.get(protocol.TOKEN_VAR) or None
        if address is not None and token is None:
            raise ConfigError(
                f"a collector is set ({protocol.COLLECTOR_VAR}={address}) but no token. Fix: "
                f"start workers with the collector's env() (it sets {protocol.COLLECTOR_VAR} and "
                f"{protocol.TOKEN_VAR}), or pass token=collector.token."
            )
        if address is not None:
            protocol.parse_address(address)
        self._writer = JsonlWriter(self.path)
        self._seq = self._writer.next_seq
        self._written = 0
        self.sink = sink
        self._sink_failed = False
        self._lock = threading.Lock()
        self._mark = time.perf_counter()
        self._epoch_mark = self._mark
        self._epoch_examples = 0
        self._epoch_steps = 0
        self._last_step = 0
        self._last_epoch = 0
        self._closed = False
        self._sender = Sender(address, self.worker, token, capacity=queue_size) if address else None
        _LIVE.add(self)
        if announce:
            print(
                f"ddlkit.metrics: not launched by ddlkit ({protocol.RUN_DIR_VAR} unset); "
                f"writing {self.worker!r} metrics to {self.path}"
            )

    # -- records ----------------------------------------------------------------
    def step(
        self,
        *,
        step: int,
        epoch: int = 0,
        loss: float | None = None,
        accuracy: float | None = None,
        batch_size: int | None = None,
        step_time: float | None = None,
        steps: int = 1,
        metrics: Mapping[str, float] | None = None,
    ) -> Record:
        """Report training step ``step`` (steps done so far, across epochs).

        ``batch_size`` (examples per step) gives ``examples_per_sec``; ``steps``
        is how many steps this record covers when reporting every N steps.
        """
        if batch_size is not None and (not _is_int(batch_size) or batch_size < 1):
            raise ConfigError(
                f"batch_size must be a positive int or None, got {batch_size!r}. "
                f"Fix: pass the number of examples one step processes."
            )
        if not _is_int(steps) or steps < 1:
            raise ConfigError(f"steps must be a positive int, got {steps!r}. Fix: pass e.g. 1.")
        with self._lock:
            now = time.perf_counter()
            if step_time is None:
                step_time = (now - self._mark) / steps
            eps = batch_size / step_time if batch_size and step_time and step_time > 0 else None
            self._epoch_steps += steps
            self._epoch_examples += (batch_size or 0) * steps
            return self._emit(
                now,
                kind="step",
                step=step,
                epoch=epoch,
                loss=_num(loss),
                accuracy=_num(accuracy),
                examples_per_sec=eps,
                step_time=step_time,
                metrics=_numbers(metrics),
            )

    def epoch(
        self,
        *,
        epoch: int,
        step: int,
        loss: float | None = None,
        accuracy: float | None = None,
        examples_per_sec: float | None = None,
        step_time: float | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> Record:
        """Report the end of ``epoch`` (0-based) after ``step`` steps in all.

        Unless given, ``examples_per_sec`` and ``step_time`` are computed from the
        ``step()`` calls since the previous epoch record, and ``metrics`` gets
        ``epoch_time`` (seconds since then).
        """
        with self._lock:
            now = time.perf_counter()
            elapsed = now - self._epoch_mark
            if step_time is None and self._epoch_steps:
                step_time = elapsed / self._epoch_steps
            if examples_per_sec is None and self._epoch_examples and elapsed > 0:
                examples_per_sec = self._epoch_examples / elapsed
            extra = _numbers(metrics)
            extra.setdefault("epoch_time", elapsed)
            record = self._emit(
                now,
                kind="epoch",
                step=step,
                epoch=epoch,
                loss=_num(loss),
                accuracy=_num(accuracy),
                examples_per_sec=_num(examples_per_sec),
                step_time=_num(step_time),
                metrics=extra,
            )
            self._epoch_mark = now
            self._epoch_steps = self._epoch_examples = 0
            return record

    def event(self, name: str, **info: Any) -> Record:
        """Report that something happened (e.g. ``train_begin``), with plain-value details."""
        with self._lock:
            now = time.perf_counter()
            if name == "train_begin":
                self._epoch_mark = now
                self._epoch_steps = self._epoch_examples = 0
            return self._emit(
                now,
                kind="event",
                step=self._last_step,
                epoch=self._last_epoch,
                name=name,
                info=info,
            )

    def _emit(self, now: float, **fields: Any) -> Record:
        if self._closed:
            raise DdlkitError(
                f"the reporter of worker {self.worker!r} is closed. Fix: report before close(), "
                f"or create a new Reporter."
            )
        record = Record(worker=self.worker, seq=self._seq, wall_time=time.time(), **fields)
        line = (record.to_json() + "\n").encode()
        self._writer.write(line)
        self._seq += 1
        self._written += 1
        self._mark = now
        self._last_step, self._last_epoch = record.step, record.epoch
        if self._sender is not None:
            self._sender.put(line)
        if self.sink is not None:
            self._feed_sink(record)
        return record

    def _feed_sink(self, record: Record) -> None:
        sink = self.sink
        add = getattr(sink, "add", sink)
        try:
            add(record)
        except Exception as exc:  # a display problem must not stop training
            if not self._sink_failed:
                self._sink_failed = True
                warnings.warn(
                    f"ddlkit.metrics: the sink {sink!r} failed ({type(exc).__name__}: {exc}); "
                    f"records still go to {self.path}.",
                    RuntimeWarning,
                    stacklevel=4,
                )

    # -- lifecycle --------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait (at most ``timeout`` s) until queued records reached the collector.

        True when everything was delivered (or there is no collector); False
        when the collector is unreachable right now (records are in the file).
        """
        return True if self._sender is None else self._sender.flush(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> ReporterStats:
        """Deliver what is queued (at most ``timeout`` s), stop the sender, close the file."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._sender is not None:
                    self._sender.close(timeout)
                self._writer.close()
                _LIVE.discard(self)
        return self.stats()

    def stats(self) -> ReporterStats:
        sender = self._sender
        return ReporterStats(
            worker=self.worker,
            path=str(self.path),
            written=self._written,
            collector=None if sender is None else sender.address,
            sent=0 if sender is None else sender.sent,
            queued=0 if sender is None else sender.queued,
            dropped=0 if sender is None else sender.dropped,
            connected=False if sender is None else sender.connected,
            connects=0 if sender is None else sender.connects,
            refused=None if sender is None else sender.refused,
            last_error=None if sender is None else sender.last_error,
        )

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        target = self._sender.address if self._sender else "no collector"
        return f"Reporter(worker={self.worker!r}, path={str(self.path)!r}, {target})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: Any) -> float | None:
    """A plain float from numbers, numpy scalars or 0-d tensors; None stays None."""
    return None if value is None else float(value)


def _numbers(values: Mapping[str, Any] | None) -> dict[str, float]:
    return {} if not values else {key: float(value) for key, value in values.items()}


_LIVE: weakref.WeakSet[Reporter] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for reporter in list(_LIVE):
        try:
            reporter.close(timeout=1.0)
        except Exception as exc:  # pragma: no cover - interpreter shutdown
            print(f"ddlkit.metrics: closing {reporter!r} failed: {exc}", file=sys.stderr)
