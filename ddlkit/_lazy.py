"""Attributes a package loads on first use (PEP 562), so importing it stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any


def lazy_attributes(
    package: str,
    lazy: Mapping[str, str],
    namespace: MutableMapping[str, Any],
    public: Sequence[str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of `package`.

    ``lazy`` maps an attribute to the module that defines it; the first access imports
    that module and caches the value in ``namespace`` (the package's ``globals()``).
    """

    def __getattr__(name: str) -> Any:
        if name in lazy:
            value = getattr(importlib.import_module(lazy[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__
