"""Checks for exercise answers: each one says what is wrong and by how much, not just False.

An exercise whose answer is a value or code ends with a check the learner runs on their own
answer; the worked solutions (``notebooks/solutions/``) run the same checks in CI::

    dk.check.close(ratio, 2.0, what="the reduced loss over the true mean loss", rel=0.01)
    dk.check.tf_config([cfg0, cfg1], hosts=["10.0.0.1", "10.0.0.2"])

A check that passes returns a `Passed` (shown as one line with a tick); one that fails
raises `CheckFailed` (an ``AssertionError``), whose message names the value, what was
expected and, where given, the hint.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class CheckFailed(AssertionError):
    """An exercise's answer is not right yet; the message says what differs."""


@dataclass(frozen=True)
class Passed:
    """A check that passed, and what it checked."""

    message: str

    def __str__(self) -> str:
        return f"✓ {self.message}"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return f"<span style='color:#1a7f37'>✓</span> {html.escape(self.message)}"


def _fail(message: str, hint: str = "") -> CheckFailed:
    return CheckFailed(f"{message}. {hint}".strip() if hint else message)


def _num(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _fail(f"{what} should be a number, got {value!r}") from None
    if math.isnan(number):
        raise _fail(f"{what} is NaN")
    return number


def close(
    value: Any,
    expected: float,
    *,
    what: str,
    rel: float | None = None,
    abs: float | None = None,
    hint: str = "",
) -> Passed:
    """``value`` within ``rel`` (a fraction of ``expected``) or ``abs`` of ``expected``.

    With neither given, ``rel=1e-6``.
    """
    got = _num(value, what)
    rel_tol = rel if rel is not None else (0.0 if abs is not None else 1e-6)
    abs_tol = abs if abs is not None else 0.0
    if not math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        bound = " or ".join(
            part
            for part in (
                f"{rel_tol:.0%}"
                if rel_tol >= 0.01
                else (f"{rel_tol:g} relative" if rel_tol else ""),
                f"{abs_tol:g}" if abs_tol else "",
            )
            if part
        )
        raise _fail(
            f"{what} is {got:.6g}, expected {expected:.6g} (within {bound}); "
            f"off by {got - expected:+.3g}",
            hint,
        )
    return Passed(f"{what} is {got:.4g}, as expected ({expected:.4g})")


def between(value: Any, low: float, high: float, *, what: str, hint: str = "") -> Passed:
    """``low <= value <= high``."""
    got = _num(value, what)
    if not low <= got <= high:
        side = "below" if got < low else "above"
        raise _fail(f"{what} is {got:.6g}, {side} the expected range [{low:g}, {high:g}]", hint)
    return Passed(f"{what} is {got:.4g}, within [{low:g}, {high:g}]")


def equal(value: Any, expected: Any, *, what: str, hint: str = "") -> Passed:
    """``value == expected`` (for counts, names, shapes, placements)."""
    if value != expected:
        raise _fail(f"{what} is {value!r}, expected {expected!r}", hint)
    return Passed(f"{what} is {value!r}")


def arrays_close(
    value: Any, expected: Any, *, what: str, rtol: float = 1e-5, atol: float = 1e-6, hint: str = ""
) -> Passed:
    """Two arrays (or tensors) of the same shape, element by element; names the worst element."""
    import numpy as np

    a, b = np.asarray(value, dtype=float), np.asarray(expected, dtype=float)
    if a.shape != b.shape:
        raise _fail(f"{what} has shape {a.shape}, expected {b.shape}", hint)
    bad = ~np.isclose(a, b, rtol=rtol, atol=atol)
    if bad.any():
        diff = np.abs(a - b)
        worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), a.shape)
        raise _fail(
            f"{what}: {int(bad.sum())} of {a.size} elements differ; the worst at index "
            f"{tuple(int(i) for i in worst)} is {a[worst]:.6g}, expected {b[worst]:.6g}",
            hint,
        )
    return Passed(f"{what}: all {a.size} elements match")


def same_weights(model: Any, other: Any, *, what: str = "the two models' weights", **tol) -> Passed:
    """Two Keras models (or lists of arrays) hold the same weights, variable by variable."""
    mine = model.get_weights() if hasattr(model, "get_weights") else list(model)
    theirs = other.get_weights() if hasattr(other, "get_weights") else list(other)
    if len(mine) != len(theirs):
        raise _fail(f"{what}: {len(mine)} weight arrays against {len(theirs)}")
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        arrays_close(a, b, what=f"{what}, array {i}", **tol)
    return Passed(f"{what}: all {len(mine)} arrays match")


def _parse(config: Any, i: int) -> dict:
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise _fail(f"TF_CONFIG {i} is not valid JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(config, Mapping):
        raise _fail(f"TF_CONFIG {i} should be a dict (or its JSON), got {type(config).__name__}")
    for key in ("cluster", "task"):
        if key not in config:
            raise _fail(f"TF_CONFIG {i} has no {key!r} key", "It needs 'cluster' and 'task'")
    return dict(config)


def tf_config(configs: Sequence[Any], *, hosts: Sequence[str] | None = None) -> Passed:
    """One TF_CONFIG per task (dicts or JSON strings) that together describe one job.

    Every task must see the same ``cluster``; each ``task`` must name a job of it and an index
    inside it, and no two tasks may be the same; every address is ``host:port``. With
    ``hosts``, every address must be on one of those hosts (not ``localhost``), as a job
    across machines needs.
    """
    parsed = [_parse(c, i) for i, c in enumerate(configs)]
    if not parsed:
        raise _fail("no TF_CONFIG given")
    cluster = parsed[0]["cluster"]
    for i, cfg in enumerate(parsed[1:], start=1):
        if cfg["cluster"] != cluster:
            raise _fail(
                f"TF_CONFIG {i}'s cluster {cfg['cluster']} differs from TF_CONFIG 0's {cluster}",
                "Every task gets the same 'cluster'; only 'task' differs",
            )
    tasks = set()
    for i, cfg in enumerate(parsed):
        task = cfg["task"]
        kind, index = task.get("type"), task.get("index")
        if kind not in cluster:
            raise _fail(
                f"TF_CONFIG {i}'s task type {kind!r} is not a job of the cluster {list(cluster)}"
            )
        if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
            raise _fail(
                f"TF_CONFIG {i}'s task index {index!r} is outside {kind!r}'s "
                f"{len(cluster[kind])} addresses (0 to {len(cluster[kind]) - 1})"
            )
        if (kind, index) in tasks:
            raise _fail(
                f"two TF_CONFIGs are both task {kind}:{index}", "Give each task its own index"
            )
        tasks.add((kind, index))
    want = sum(len(v) for v in cluster.values())
    if len(tasks) != want:
        raise _fail(f"{len(tasks)} TF_CONFIGs for a cluster of {want} tasks", "Write one per task")
    for kind, addresses in cluster.items():
        for address in addresses:
            host, sep, port = str(address).rpartition(":")
            if not sep or not host or not port.isdigit():
                raise _fail(f"{kind} address {address!r} is not host:port")
            if hosts is not None and host not in hosts:
                raise _fail(
                    f"{kind} address {address!r} is not on one of the hosts {list(hosts)}",
                    "Each address must be one the other machines reach (not localhost)",
                )
    return Passed(f"{len(tasks)} TF_CONFIGs describe one cluster of {want} tasks, each task once")
