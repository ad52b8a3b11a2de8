"""The step a run's status table shows per process (ddlkit.launch.run._progress)."""

from __future__ import annotations

from ddlkit import strategies
from ddlkit.launch.run import _progress
from ddlkit.metrics import Record


class _Collector:
    def __init__(self, steps: dict[str, int]) -> None:
        self._latest = {
            w: Record(kind="step", worker=w, step=s, epoch=0, wall_time=1.0, seq=s)
            for w, s in steps.items()
        }

    def workers(self) -> list[str]:
        return sorted(self._latest)

    def latest(self, worker: str) -> Record | None:
        return self._latest.get(worker)


def test_a_worker_shows_its_own_latest_step():
    step = _progress(_Collector({"worker-0": 7, "worker-1": 9}), strategies.get("multi_worker"))
    assert (step("worker-0"), step("worker-1"), step("worker-2")) == (7, 9, None)


def test_horovodrun_shows_its_slowest_rank():
    horovod = strategies.get("horovod")  # the strategy whose launcher stands for its ranks
    step = _progress(_Collector({"rank-0": 12, "rank-1": 10, "other": 1}), horovod)
    assert step("horovodrun") == 10
    assert _progress(_Collector({}), horovod)("horovodrun") is None
