"""Errors ddlkit raises. Each message names the cause and the exact fix."""

from __future__ import annotations

import pickle


class DdlkitError(Exception):
    """Base class: a problem the user can fix, explained in one message."""


class DataError(DdlkitError):
    """A data set cannot be loaded (unknown, missing or corrupt)."""


class CorruptCacheError(DataError):
    """A file in the kit's offline data cache fails its checksum or format check."""


class MissingSystemPackageError(DdlkitError):
    """A Debian package the kit needs is not installed."""


class ConfigError(DdlkitError, ValueError):
    """A configuration value is invalid."""


class UnsafePickleError(DataError, pickle.UnpicklingError):
    """A pickle asked for something the restricted unpickler does not admit."""


class RecordError(DdlkitError, ValueError):
    """A metric record (one JSON line) is malformed or not a version-1 record."""


class WorkerFailedError(DdlkitError):
    """A worker of a job exited non-zero or was killed; the job stopped the others.

    ``worker``, ``exit_code`` (negative: killed by signal ``signal_name``),
    ``log_path`` and ``log_tail`` (its last lines) say what happened.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: str,
        exit_code: int,
        signal_name: str | None,
        log_path: str,
        log_tail: str,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.exit_code = exit_code
        self.signal_name = signal_name
        self.log_path = log_path
        self.log_tail = log_tail


class JobTimeoutError(DdlkitError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out of time; the workers are still running."""
