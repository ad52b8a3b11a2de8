"""dk.recorded: the course's recorded numbers, read by the kit's own readers."""

from __future__ import annotations

import json
import shutil

import pytest

from ddlkit import recorded
from ddlkit.bench.results import load_results
from ddlkit.errors import ConfigError
from ddlkit.horovod.timing import AllreduceTiming


def test_bench_quantities_are_the_results_table_numbers():
    res = load_results(recorded.DATA / recorded.BENCH, curves=False)
    q = recorded.quantities()
    for case in res.measured:
        assert q[f"bench.{case.name}.examples_per_sec"].value == case.throughput.median
        assert q[f"bench.{case.name}.step_ms"].value == pytest.approx(case.step_time.median * 1e3)
        if case.vs_ceiling is not None:
            assert q[f"bench.{case.name}.vs_ceiling"].value == case.vs_ceiling
    assert q["bench.overhead.median"].value == res.overhead_ratio


def test_allreduce_quantities_are_the_fit_and_the_points():
    for strategy, name in recorded.ALLREDUCE.items():
        path = recorded.DATA / name
        if not path.exists():
            continue
        timing = AllreduceTiming.from_dict(json.loads(path.read_text()))
        latency, bandwidth = timing.fit()
        q = recorded.quantities()
        assert q[f"allreduce.{strategy}.latency_ms"].value == pytest.approx(latency * 1e3)
        assert q[f"allreduce.{strategy}.bandwidth_gbs"].value == pytest.approx(bandwidth / 1e9)
        first = timing.points[0]
        assert q[f"allreduce.{strategy}.ms_1KiB"].value == pytest.approx(first.seconds * 1e3)


def test_show_picks_by_prefix_and_a_wrong_name_lists_the_near_ones(tmp_path):
    shown = recorded.show("bench.horovod-x2")
    assert shown.rows and all(r.name.startswith("bench.horovod-x2.") for r in shown.rows)
    assert "horovod-x2-resnet" not in str(shown)
    assert "<table>" in shown._repr_html_()
    with pytest.raises(ConfigError, match="bench.horovod-x2.vs_ceiling"):
        recorded.get("bench.horovod-x2.vs_celing")
    with pytest.raises(ConfigError, match="no recorded quantity named or starting with 'nope'"):
        recorded.show("nope")
    shutil.copy(recorded.DATA / recorded.BENCH, tmp_path / recorded.BENCH)
    only_bench = recorded.quantities(tmp_path)
    assert only_bench and not any(n.startswith("allreduce.") for n in only_bench)
