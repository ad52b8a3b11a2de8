"""JSONL files of metric records: ``<run_dir>/metrics/<worker>.jsonl`` (ddlkit.contract).

Workers append one record per line and flush after each, so a record a
worker made is on disk even if the notebook, the collector or the connection
is gone. :func:`load_run` reads a run back for re-plotting.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ddlkit.contract import METRICS_DIR, METRICS_SUFFIX, metrics_dir
from ddlkit.contract import metrics_path as metrics_path  # re-exported
from ddlkit.errors import ConfigError, RecordError
from ddlkit.metrics.records import Record


class JsonlWriter:
    """Appends encoded record lines to one worker's file, flushing after each line.

    An existing file is continued: :attr:`next_seq` is one past the last
    record's ``seq`` there, so a restarted worker keeps counting and readers
    see no duplicates. A last line cut short (a worker killed mid-write) is
    ended with a newline first, so the next record starts on a line of its own.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.next_seq = 0
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size > 0:
            last = _last_line(self.path)
            needs_newline = not last.endswith(b"\n")
            try:
                self.next_seq = Record.from_json(last).seq + 1
            except RecordError:
                self.next_seq = _max_seq(self.path) + 1
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        if needs_newline:
            self._file.write(b"\n")

    def write(self, line: bytes) -> None:
        """Append one encoded record line (ending in a newline)."""
        view = memoryview(line)
        while view:
            view = view[self._file.write(view) :]

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


def _last_line(path: Path, chunk: int = 65536) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - chunk))
        tail = f.read()
    lines = tail.splitlines(keepends=True)
    return lines[-1] if lines else b""


def _max_seq(path: Path) -> int:
    best = -1
    with open(path, "rb") as f:
        for line in f:
            try:
                best = max(best, Record.from_json(line).seq)
            except RecordError:
                continue
    return best


def read_jsonl(path: str | os.PathLike) -> tuple[list[Record], list[int]]:
    """Records of one JSONL file, and the 1-based numbers of lines that were not records."""
    records: list[Record] = []
    bad: list[int] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(Record.from_json(line))
            except RecordError:
                bad.append(number)
    return records, bad


def load_run(run_dir: str | os.PathLike) -> list[Record]:
    """All records of a past run, ordered by worker then ``seq``.

    Lines that are not valid records (e.g. the last line of a worker killed
    while writing) are skipped with one warning per file naming the lines.
    """
    directory = metrics_dir(run_dir)
    if not directory.is_dir():
        raise ConfigError(
            f"{Path(run_dir)} has no {METRICS_DIR}/ directory, so it holds no metric records. "
            f"Fix: pass a run directory written by ddlkit (see `ddlkit runs`)."
        )
    records: list[Record] = []
    for path in sorted(directory.glob(f"*{METRICS_SUFFIX}")):
        found, bad = read_jsonl(path)
        if bad:
            shown = ", ".join(str(n) for n in bad[:10]) + (" ..." if len(bad) > 10 else "")
            warnings.warn(
                f"{path}: skipped {len(bad)} line(s) that are not metric records (line {shown}).",
                RuntimeWarning,
                stacklevel=2,
            )
        records.extend(found)
    records.sort(key=lambda r: (r.worker, r.seq))
    return records
