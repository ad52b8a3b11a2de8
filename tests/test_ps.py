"""ddlkit.staleness: staleness summaries, eval curves, time to accuracy, the side-by-side view."""

from __future__ import annotations

import json
import time

import pytest
from harness.factories import step_record

from ddlkit.errors import DdlkitError
from ddlkit.lessons import ps
from ddlkit.metrics import Record
from ddlkit.metrics.store import JsonlWriter, metrics_path


def _eval(worker: str, seq: int, step: int, seconds: float, accuracy: float) -> Record:
    return Record(
        kind="event",
        worker=worker,
        step=step,
        epoch=0,
        wall_time=time.time(),
        seq=seq,
        name="eval",
        info={
            "step": step,
            "examples": step * 64,
            "train_seconds": seconds,
            "accuracy": accuracy,
            "loss": 1.0 - accuracy,
        },
    )


def test_summarize_counts_mean_median_max_and_stale_share():
    s = ps.summarize([0, 1, 1, 2, 1, 0])
    assert (s.count, s.max) == (6, 2)
    assert s.mean == pytest.approx(5 / 6)
    assert s.median == 1.0
    assert s.stale_fraction == pytest.approx(4 / 6)
    assert ps.summarize([3]).median == 3.0
    assert ps.summarize([0, 0]).stale_fraction == 0.0


@pytest.mark.parametrize("bad", [[-1], [1.5], [True], ["2"]])
def test_staleness_values_must_be_counts(bad):
    with pytest.raises(DdlkitError, match="integer >= 0"):
        ps.summarize(bad)


def test_summarize_of_nothing_is_a_clear_error():
    with pytest.raises(DdlkitError, match="no staleness values"):
        ps.summarize([])


def test_counts_fill_every_value_up_to_the_max_and_round_trip_through_json():
    values = [0, 3, 1, 1, 3]
    hist = ps.counts(values)
    assert hist == {"0": 1, "1": 2, "2": 0, "3": 2}
    assert ps.from_counts(json.loads(json.dumps(hist))) == sorted(values)
    assert ps.counts([]) == {}


def test_eval_curve_keeps_only_eval_events_in_time_order():
    records = [
        step_record("chief-0", 10, 500.0, seq=0),
        _eval("chief-0", 2, 20, 8.0, 0.9),
        _eval("chief-0", 1, 0, 0.0, 0.1),
        Record(kind="event", worker="chief-0", step=0, epoch=0, wall_time=1.0, seq=3,
               name="train_end", info={"steps": 20}),
    ]  # fmt: skip
    curve = ps.eval_curve(records)
    assert [(p.step, p.train_seconds, p.accuracy) for p in curve] == [(0, 0.0, 0.1), (20, 8.0, 0.9)]
    assert curve[1].examples == 20 * 64


def test_eval_event_without_its_fields_names_them():
    bad = Record(kind="event", worker="w", step=0, epoch=0, wall_time=1.0, seq=0, name="eval",
                 info={"step": 1})  # fmt: skip
    with pytest.raises(DdlkitError, match="train_seconds"):
        ps.eval_curve([bad])


def test_time_to_accuracy_is_the_first_point_reaching_the_target():
    curve = ps.eval_curve(
        [_eval("w", 0, 0, 0.0, 0.1), _eval("w", 1, 10, 5.0, 0.85), _eval("w", 2, 20, 9.0, 0.95)]
    )
    assert ps.time_to_accuracy(curve, 0.85) == 5.0
    assert ps.time_to_accuracy(curve, 0.9) == 9.0
    assert ps.time_to_accuracy(curve, 0.99) is None
    with pytest.raises(DdlkitError, match=r"\[0, 1\]"):
        ps.time_to_accuracy(curve, 90)


def _write_run(run_dir, records, results):
    for worker in {r.worker for r in records}:
        writer = JsonlWriter(metrics_path(run_dir, worker))
        for r in records:
            if r.worker == worker:
                writer.write((r.to_json() + "\n").encode())
        writer.close()
    (run_dir / "results").mkdir(parents=True, exist_ok=True)
    for worker, result in results.items():
        (run_dir / "results" / f"{worker}.json").write_text(json.dumps(result))


def test_compare_reads_two_run_directories_and_shows_a_table_and_a_figure(tmp_path):
    sync_dir, async_dir = tmp_path / "sync", tmp_path / "async"
    _write_run(
        sync_dir,
        [_eval("worker-0", 0, 0, 0.0, 0.1), _eval("worker-0", 1, 10, 4.0, 0.93)]
        + [step_record("worker-0", i, 300.0, seq=2 + i) for i in range(3)]
        + [step_record("worker-1", i, 200.0, seq=i) for i in range(3)],
        {"worker-0": {"test_accuracy": 0.93}, "worker-1": {"test_accuracy": 0.93}},
    )
    _write_run(
        async_dir,
        [_eval("chief-0", 0, 0, 0.0, 0.1), _eval("chief-0", 1, 20, 6.0, 0.91)]
        + [step_record("chief-0", i, 450.0, seq=2 + i) for i in range(3)],
        {"chief-0": {"staleness_counts": {"0": 3, "1": 6, "2": 1}}},
    )
    view = ps.compare(sync_dir, async_dir)
    assert view.sync.staleness == () and view.sync.examples_per_sec == 500.0  # workers add up
    assert view.async_.staleness == (0, 0, 0, 1, 1, 1, 1, 1, 1, 2)
    assert view.chosen_target == 0.9  # the lower final accuracy, less 0.01, rounded down
    rows = view.rows()
    assert rows[0][1:5] == ["synchronous", "0.9300", "4.0", "4.0"]
    assert rows[1][1:5] == ["asynchronous", "0.9100", "6.0", "6.0"]
    assert "mean 0.80, max 2, 70% stale" in rows[1][6]
    page = view._repr_html_()
    assert page.startswith("<img src='data:image/png;base64,") and "<table>" in page
    fig = view.plot(tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 1000
    left, right = fig.axes
    assert [len(line.get_xdata()) for line in left.get_lines()[:2]] == [2, 2]
    assert [p.get_height() for p in right.patches] == [3, 6, 1]
    slow = ps.SyncAsync(view.sync, view.async_, target=0.92)
    assert slow.rows()[1][4] == "not reached"


def test_a_run_without_eval_events_is_refused_with_the_fix(tmp_path):
    _write_run(tmp_path / "r", [step_record("worker-0", 1, 10.0, seq=0)], {})
    with pytest.raises(DdlkitError, match="--eval-every"):
        ps.load(tmp_path / "r")


def test_placement_names_the_task_of_every_shard_and_adds_up_what_each_holds():
    report = {
        "placement": [
            {"name": "dense/kernel", "shape": [1600, 128], "shards": [
                {"device": "/job:ps/replica:0/task:0/device:CPU:0", "shape": [800, 128]},
                {"device": "/job:ps/replica:0/task:1/device:CPU:0", "shape": [800, 128]}]},
            {"name": "dense/bias", "shape": [128], "shards": [
                {"device": "/job:ps/replica:0/task:1/device:CPU:0", "shape": [128]}]},
        ]
    }  # fmt: skip
    placement = ps.Placement.from_report(report)
    assert placement.rows[0][2] == (("ps-0", (800, 128)), ("ps-1", (800, 128)))
    assert placement.tasks() == {"ps-0": 800 * 128, "ps-1": 800 * 128 + 128}
    page = placement._repr_html_()
    assert "ps-0 800x128 + ps-1 800x128" in page and "ps-1: 102,528 parameters" in page
    with pytest.raises(DdlkitError, match="chief-0"):
        ps.Placement.from_report({"test_accuracy": 0.9})
    with pytest.raises(DdlkitError, match="names no task"):
        ps.task_of("/device:CPU:0")


def test_throughput_around_a_step_leaves_out_the_first_record():
    records = [step_record("chief-0", 10 * (i + 1), eps, seq=i) for i, eps in
               enumerate([50.0, 400.0, 420.0, 410.0, 300.0, 280.0, 320.0])]  # fmt: skip
    records.append(step_record("other", 10, 9999.0, seq=0))
    assert ps.throughput_around(records, 40) == (410.0, 300.0)
    with pytest.raises(DdlkitError, match="kill later"):
        ps.throughput_around(records, 10)


def test_comparison_of_four_runs_one_table_one_figure(tmp_path):
    dirs = {name: tmp_path / name for name in ("mwms", "sync", "async", "downpour")}
    _write_run(
        dirs["mwms"], [_eval("worker-0", 0, 0, 0.0, 0.1), _eval("worker-0", 1, 10, 4.0, 0.95)], {}
    )
    _write_run(
        dirs["sync"],
        [_eval("chief-0", 0, 0, 0.0, 0.1), _eval("chief-0", 1, 10, 5.0, 0.94)],
        {"chief-0": {"staleness_counts": {"0": 4}}},
    )
    _write_run(
        dirs["async"],
        [_eval("chief-0", 0, 0, 0.0, 0.1), _eval("chief-0", 1, 10, 3.0, 0.93)],
        {"chief-0": {"staleness_counts": {"0": 1, "1": 3}}},
    )
    _write_run(
        dirs["downpour"],
        [_eval("chief-0", 0, 0, 0.0, 0.1), _eval("chief-0", 1, 10, 8.0, 0.90)],
        {"chief-0": {"staleness_counts": {"0": 1, "1": 0, "2": 1}}},
    )
    view = ps.compare_runs(
        {
            "MWMS": (dirs["mwms"], "all-reduce"),
            "sync PS": (dirs["sync"], "synchronous"),
            "async PS": dirs["async"],
            "Downpour": (dirs["downpour"], "Downpour"),
        }
    )
    assert view.kinds == ("all-reduce", "synchronous", "", "Downpour")
    assert view.chosen_target == 0.89  # the lowest final accuracy (0.90) less 0.01
    assert view.times_to_target() == {"MWMS": 4.0, "sync PS": 5.0, "async PS": 3.0, "Downpour": 8.0}
    rows = view.rows()
    assert [r[0] for r in rows] == ["MWMS", "sync PS", "async PS", "Downpour"]
    assert rows[0][6] == "not measured (none by design)"
    assert rows[1][6] == "mean 0.00, max 0, 0% stale"
    assert rows[2][6] == "mean 0.75, max 1, 75% stale"
    fig = view.plot()
    left, right = fig.axes
    assert len(left.get_lines()) == 5  # four curves and the target line
    # shares of updates: sync [1.0], async [0.25, 0.75], Downpour [0.5, 0.0, 0.5]
    assert [round(p.get_height(), 2) for p in right.patches] == [1.0, 0.25, 0.75, 0.5, 0.0, 0.5]
    assert ps.Comparison(view.runs, target=0.96).rows()[0][4] == "not reached"
    assert "<table>" in view._repr_html_()


def test_comparison_needs_two_runs_and_one_kind_per_run(tmp_path):
    _write_run(tmp_path / "a", [_eval("chief-0", 0, 0, 0.0, 0.5)], {})
    run = ps.load(tmp_path / "a")
    with pytest.raises(DdlkitError, match="at least two runs"):
        ps.Comparison((run,))
    with pytest.raises(DdlkitError, match="one kind per run"):
        ps.Comparison((run, run), kinds=("sync",))


def _intervals(total: int, report_every: int, eval_every: int) -> list[int]:
    """The steps between the chief's joins, as launch/train_parameter_server.py walks them."""
    done, next_eval, out = 0, (0 if eval_every else total + 1), []
    while done < total:
        if done == next_eval:
            next_eval = done + eval_every
        k = min(report_every, total - done, next_eval - done)
        out.append(k)
        done += k
    return out


@pytest.mark.parametrize(
    ("per_call", "report", "every", "workers", "size"),
    [
        (10, 20, 100, 1, 10),  # the script's defaults
        (10, 20, 20, 2, 10),  # the benchmark's: a function per worker between joins
        (10, 20, 25, 1, 5),  # joins at 20, 25, 40, 45, ...: 5 divides them all
        (10, 20, 0, 4, 5),  # 4 workers: 4 functions of 5 between joins
        (10, 3, 0, 8, 1),
        (1, 20, 100, 1, 1),
    ],
)
def test_call_size_divides_every_interval_between_joins(per_call, report, every, workers, size):
    assert ps.call_size(per_call, report, every, workers) == size
    for total in (50, 200, 937):
        intervals = _intervals(total, report, every)
        sizes = {n for k in intervals[:-1] for n in ps.split_steps(k, size)}
        assert sizes <= {size}  # one traced function for all but the run's last interval
        assert sum(sum(ps.split_steps(k, size)) for k in intervals) == total


def test_split_steps_and_bad_call_sizes():
    assert ps.split_steps(25, 10) == [10, 10, 5] and ps.split_steps(3, 10) == [3]
    with pytest.raises(DdlkitError, match="per_call=0"):
        ps.call_size(0, 20)
    with pytest.raises(DdlkitError, match="eval_every=-1"):
        ps.call_size(10, 20, -1)
