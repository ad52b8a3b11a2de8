"""Distribution strategies, one module each, behind :class:`~ddlkit.strategies.base.Strategy`.

``plan()`` (ddlkit.launch.plan) asks the registry for ``config.strategy``; results,
progress and the dashboard ask it for the strategy's conventions. A new strategy is one
module with a `Strategy` subclass, registered::

    from ddlkit import strategies

    class Solo(strategies.Strategy):
        name = "solo"
        def workers(self, config, cluster, planner):
            return [planner.spec("solo-0", {}, ddlkit.launch.devices.Devices(None, 1, None))]

    strategies.register(Solo())
    dk.launch.start(script, strategy="solo", workers=1)

Built in: ``mirrored``, ``multi_worker``, ``parameter_server``, ``horovod``.

Note for ddlkit.bench: a bench case's strategy conventions come from
here too: ``strategies.get(name).speaker(run.results())`` for the report that speaks for
a run, ``.result_processes(config)`` for its process count, ``.needs_horovodrun`` for
the Horovod-only steps (timeline, rank pinning through
``start(where=ThisMachine(cores=...))``).
"""

from __future__ import annotations

from ddlkit.strategies.base import Planner, Strategy, TaskStrategy, unknown
from ddlkit.strategies.horovod import Horovod
from ddlkit.strategies.mirrored import Mirrored
from ddlkit.strategies.multi_worker import MultiWorker
from ddlkit.strategies.parameter_server import ParameterServer

_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy, *, replace: bool = False) -> Strategy:
    """Make ``strategy`` launchable by its ``name``; returns it."""
    name = getattr(strategy, "name", None)
    if not isinstance(strategy, Strategy) or not isinstance(name, str) or not name:
        raise TypeError(f"{strategy!r} is not a Strategy with a name")
    if name in _REGISTRY and not replace and _REGISTRY[name] is not strategy:
        raise ValueError(f"strategy {name!r} is already registered (pass replace=True)")
    _REGISTRY[name] = strategy
    return strategy


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> Strategy:
    """The registered strategy called ``name``; ConfigError naming the known ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise unknown(name, names()) from None


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


for _builtin in (Mirrored(), MultiWorker(), ParameterServer(), Horovod()):
    register(_builtin)
BUILTIN = names()

__all__ = [
    "BUILTIN",
    "Horovod",
    "Mirrored",
    "MultiWorker",
    "ParameterServer",
    "Planner",
    "Strategy",
    "TaskStrategy",
    "get",
    "names",
    "register",
    "unregister",
]
