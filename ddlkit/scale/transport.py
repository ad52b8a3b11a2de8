"""A transport as the scaling model sees it: a recorded all-reduce fit and its points (pure).

    t = transport("data/allreduce-mwms.json", "gRPC (MWMS's fit)")
    t.link              # a Link: hop latency a / 2, bandwidth B (a ring of 2 takes a + n / B)
    t.fitted(900_136)   # the fit at a size, seconds
    t.measured(900_136) # the recorded median, fastest and slowest there, interpolated

The fit ``t = a + n / B`` is :meth:`ddlkit.horovod.timing.AllreduceTiming.fit` (weighted so
that the small sizes count as much as the large ones); :meth:`Transport.measured` reads the
recorded points around a size instead, so a calibration can say how far the fit is from its own
measurements at the size that matters.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import Link


@dataclass(frozen=True)
class Transport:
    """A recorded all-reduce fit and the points it was fitted to (none for a bare pair)."""

    name: str
    latency: float
    bandwidth: float
    points: tuple = ()  # AllreducePoint: nbytes, seconds, min_seconds, max_seconds

    @property
    def link(self) -> Link:
        return Link(self.name, self.bandwidth, self.latency / 2, "recorded fit, a / 2 a hop")

    def fitted(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth

    def measured(self, nbytes: float) -> tuple[float, float, float] | None:
        """(median, fastest, slowest) seconds at ``nbytes``, interpolated log-log between the
        two recorded sizes around it; None outside them."""
        pts = sorted(self.points, key=lambda p: p.nbytes)
        for lo, hi in zip(pts, pts[1:], strict=False):
            if lo.nbytes <= nbytes <= hi.nbytes:
                x = math.log(nbytes / lo.nbytes) / math.log(hi.nbytes / lo.nbytes)

                def at(a: float, b: float, x: float = x) -> float:
                    return math.exp(math.log(a) + x * (math.log(b) - math.log(a)))

                return (
                    at(lo.seconds, hi.seconds),
                    at(lo.min_seconds, hi.min_seconds),
                    at(lo.max_seconds, hi.max_seconds),
                )
        return None


def transport(allreduce, name: str = "all-reduce") -> Transport:
    """A :class:`Transport` from an AllreduceTiming, its dict or JSON file, or a pair."""
    from ddlkit.horovod.timing import AllreduceTiming

    if isinstance(allreduce, Transport):
        return allreduce
    if isinstance(allreduce, tuple) and len(allreduce) == 2:
        return Transport(name, float(allreduce[0]), float(allreduce[1]))
    if isinstance(allreduce, str | Path):
        try:
            allreduce = json.loads(Path(allreduce).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"cannot read the all-reduce timing {allreduce}: {exc}. Fix: pass the JSON "
                f"AllreduceTiming.to_dict() wrote (notebook 05), or (latency, bandwidth)"
            ) from None
    if isinstance(allreduce, dict):
        allreduce = AllreduceTiming.from_dict(allreduce)
    if not isinstance(allreduce, AllreduceTiming):
        raise ConfigError(
            f"allreduce={type(allreduce).__name__}: pass an AllreduceTiming "
            f"(dk.horovod.allreduce_timing), its JSON file, or (latency, bandwidth)"
        )
    latency, bandwidth = allreduce.fit()
    return Transport(name, latency, bandwidth, tuple(allreduce.points))
