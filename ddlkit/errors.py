"""Errors ddlkit raises. Each message names the cause and the exact fix."""

from __future__ import annotations


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
