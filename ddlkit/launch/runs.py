"""The run directory: ids, layout and ``job.json``.

The layout inside a run directory is the worker contract's (:mod:`ddlkit.contract`):
``job.json``, ``logs/<worker>.log``, ``metrics/<worker>.jsonl``, ``results/<worker>.json``.

Run ids sort by start time: ``20261101-153012.345-<label>-<4 hex>`` (UTC).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import secrets
import socket
from pathlib import Path

from ddlkit._tables import html_table, text_table
from ddlkit.contract import JOB_FILE, NAME_PATTERN
from ddlkit.contract import log_path as log_path  # re-exported: the run directory layout
from ddlkit.contract import metrics_dir as metrics_dir
from ddlkit.errors import ConfigError

FORMAT_VERSION = 1


def new_run_id(label: str = "", now: dt.datetime | None = None) -> str:
    """A new run id: UTC timestamp to the millisecond, ``label``, a short random suffix."""
    now = now or dt.datetime.now(dt.UTC)
    now = now.astimezone(dt.UTC)
    stamp = now.strftime("%Y%m%d-%H%M%S") + f".{now.microsecond // 1000:03d}"
    if label and not NAME_PATTERN.fullmatch(label):
        raise ConfigError(
            f"run label {label!r} cannot be part of a directory name. Fix: use letters, "
            f"digits, '.', '_' or '-' (e.g. 'mnist-mwms'), at most 40 characters."
        )
    if len(label) > 40:
        raise ConfigError(f"run label {label!r} is longer than 40 characters. Fix: shorten it.")
    parts = [stamp, label, secrets.token_hex(2)] if label else [stamp, secrets.token_hex(2)]
    return "-".join(parts)


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON so a reader never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="milliseconds")


def this_host() -> str:
    return socket.gethostname()


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One past or running run, as read from its ``job.json``.

    ``state`` is the job's state as written (running, finished, failed, stopped),
    ``lost`` when job.json says running but its launcher process on this host is
    gone, or ``unreadable`` (with ``error``) when job.json cannot be read.
    """

    run_id: str
    run_dir: Path
    state: str
    workers: tuple[str, ...] = ()
    created_at: str | None = None
    ended_at: str | None = None
    error: str | None = None

    def _row(self) -> list[object]:
        return [self.run_id, self.state, len(self.workers), self.created_at, self.ended_at]

    def _repr_html_(self) -> str:
        return html_table(_RUN_HEADERS, [self._row()])


_RUN_HEADERS = ("run", "state", "workers", "started", "ended")


def runs_table(runs: list[RunInfo]) -> str:
    """Plain-text table of runs (for ``ddlkit runs``)."""
    return text_table(_RUN_HEADERS, [r._row() for r in runs])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_run(run_dir: Path) -> RunInfo:
    """The :class:`RunInfo` of one run directory."""
    path = run_dir / JOB_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        workers = tuple(w["name"] for w in data["workers"])
        state = str(data["state"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return RunInfo(run_dir.name, run_dir, "unreadable", error=f"{path}: {exc}")
    if (
        state == "running"
        and data.get("host") == this_host()
        and isinstance(data.get("launcher_pid"), int)
        and not _pid_alive(data["launcher_pid"])
    ):
        state = "lost"
    return RunInfo(
        run_id=str(data.get("run_id", run_dir.name)),
        run_dir=run_dir,
        state=state,
        workers=workers,
        created_at=data.get("created_at"),
        ended_at=data.get("ended_at"),
    )


def list_runs(runs_dir: Path | str) -> list[RunInfo]:
    """Every run under ``runs_dir`` that has a ``job.json``, oldest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    dirs = sorted(p for p in root.iterdir() if (p / JOB_FILE).exists())
    return [read_run(d) for d in dirs]


def tail(path: Path | str, n: int = 20, block: int = 8192) -> str:
    """The last ``n`` lines of a text file (reads only the end of a big file)."""
    if n <= 0:
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        end = pos = f.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            pos = max(0, pos - block)
            f.seek(pos)
            data = f.read(end - pos)
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-n:])
