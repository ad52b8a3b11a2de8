"""What :func:`ddlkit.data.load` would use for each data set, and the kit cache's state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddlkit.data import cache, sources
from ddlkit.data.catalog import NAMES, spec
from ddlkit.data.info import STANDIN_NOTICE
from ddlkit.data.table import Table
from ddlkit.errors import ConfigError, CorruptCacheError

CACHE_STATES = ("ok", "corrupt", "missing", "n/a")


@dataclass(frozen=True)
class DataStatus:
    """One data set: the source ``load()`` would use, and its kit-cache entry."""

    name: str
    source: str
    path: Path | None
    cache: str
    detail: str

    def __post_init__(self) -> None:
        if self.cache not in CACHE_STATES:
            raise ConfigError(
                f"DataStatus.cache={self.cache!r}: must be one of {', '.join(CACHE_STATES)}."
            )

    def _repr_html_(self) -> str:
        return Table([self])._repr_html_()


def _one(name: str) -> DataStatus:
    sp = spec(name)
    path = cache.data_path(name)
    problem = ""
    if not sources.has_kit_cache(sp):
        state = "n/a"
    else:
        try:
            cache.verify(name, sources.layout(sp), fix_name=name)
            state = "ok"
        except FileNotFoundError:
            state = "missing"
        except CorruptCacheError as exc:
            state, problem = "corrupt", str(exc)
    keras = sources.availability(name, "keras")
    if keras.ok:
        return DataStatus(name, "keras", keras.path, state, keras.reason)
    if state == "ok":
        return DataStatus(name, "kit-cache", path, state, "verified (sha256 and shapes)")
    if state == "corrupt":
        return DataStatus(name, "error", path, state, problem)
    if sp.has_standin:
        return DataStatus(name, "synthetic", None, state, STANDIN_NOTICE)
    return DataStatus(name, "none", path, state, f"Fix: {sources.FIXES[name]}")


def status(names: list[str] | tuple[str, ...] | None = None) -> Table:
    """One :class:`DataStatus` row per data set (default: all), without loading any."""
    if names is None:
        names = NAMES
    names = (names,) if isinstance(names, str) else tuple(names)
    return Table(_one(name) for name in names)
