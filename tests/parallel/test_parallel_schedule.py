"""GPipe's schedule, the bubble arithmetic and the pictures: pure, no TensorFlow."""

from __future__ import annotations

import pytest

from ddlkit.errors import ConfigError
from ddlkit.parallel import gantt
from ddlkit.parallel.config import thread_plan
from ddlkit.parallel.schedule import (
    Task,
    Timeline,
    Timing,
    bubble_fraction,
    dependencies,
    gpipe_schedule,
    micro_batch_size,
    simulate,
    theoretical_bubble,
)
from ddlkit.parallel.split import cut_points


def test_each_stage_runs_all_forwards_then_the_backwards_in_reverse_then_one_update():
    schedule = gpipe_schedule(2, 3)
    assert [str(t) for t in schedule[0]] == ["F0,0", "F0,1", "F0,2", "B0,2", "B0,1", "B0,0", "U0"]
    assert [str(t) for t in schedule[1]] == ["F1,0", "F1,1", "F1,2", "B1,2", "B1,1", "B1,0", "U1"]


def test_dependencies_follow_the_data():
    assert dependencies(Task(0, 2, "F"), 3, 4) == ()
    assert dependencies(Task(2, 1, "F"), 3, 4) == (Task(1, 1, "F"),)
    # the last stage's backward needs only its own forward; the others also the next stage's
    assert dependencies(Task(2, 1, "B"), 3, 4) == (Task(2, 1, "F"),)
    assert dependencies(Task(0, 1, "B"), 3, 4) == (Task(0, 1, "F"), Task(1, 1, "B"))
    assert dependencies(Task(1, -1, "U"), 3, 2) == (Task(1, 0, "B"), Task(1, 1, "B"))
    with pytest.raises(ConfigError, match="unknown task kind"):
        dependencies(Task(0, 0, "X"), 2, 2)


@pytest.mark.parametrize(
    "stages, micro_batches, want",
    [(1, 5, 0.0), (2, 1, 0.5), (2, 4, 0.2), (2, 8, 1 / 9), (4, 4, 3 / 7), (4, 1, 0.75)],
)
def test_theoretical_bubble(stages, micro_batches, want):
    assert theoretical_bubble(stages, micro_batches) == pytest.approx(want)


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 8])
def test_the_ideal_timeline_of_equal_stages_has_exactly_the_theoretical_bubble(
    stages, micro_batches
):
    timeline = simulate(stages, micro_batches, forward=1.0, backward=2.0)
    assert timeline.order_violations() == []
    assert timeline.makespan == pytest.approx((micro_batches + stages - 1) * 3.0)
    assert timeline.bubble == pytest.approx(theoretical_bubble(stages, micro_batches))


def test_unequal_stages_idle_more_than_the_formula_says():
    # the MNIST CNN split after its convolutions: stage 0 does most of the work
    timeline = simulate(2, 8, forward=[4.0, 0.5], backward=[8.0, 1.0])
    assert timeline.bubble > theoretical_bubble(2, 8) + 0.3
    assert timeline.order_violations() == []


def test_order_violations_are_found():
    good = simulate(2, 2)
    assert good.order_violations() == []
    moved = []
    for t in good.timings:
        if t.task == Task(1, 0, "F"):  # start stage 1's first forward before stage 0's ended
            t = Timing(t.task, 0.0, t.end)
        moved.append(t)
    bad = Timeline(2, 2, tuple(moved))
    assert "F1,0 started before F0,0 ended" in bad.order_violations()
    missing = Timeline(2, 2, tuple(t for t in good.timings if t.task != Task(0, 1, "B")))
    assert "B0,1 did not run" in missing.order_violations()


@pytest.mark.parametrize(
    "busy, makespan, want",
    [((1.0, 1.0), 1.0, 0.0), ((0.5, 0.5), 1.0, 0.5), ((1.0, 0.0), 1.0, 0.5), ((0.0,), 2.0, 1.0)],
)
def test_bubble_fraction(busy, makespan, want):
    assert bubble_fraction(busy, makespan) == pytest.approx(want)


@pytest.mark.parametrize(
    "busy, makespan, match",
    [
        ((), 1.0, "busy is empty"),
        ((0.5,), 0.0, "makespan"),
        ((0.5, 2.0), 1.0, "stage 1 was busy"),
        ((-0.1,), 1.0, "stage 0 was busy"),
    ],
)
def test_bubble_fraction_refuses_impossible_inputs(busy, makespan, match):
    with pytest.raises(ConfigError, match=match):
        bubble_fraction(busy, makespan)


def test_micro_batch_size():
    assert micro_batch_size(256, 4) == 64
    assert micro_batch_size(7, 1) == 7
    assert micro_batch_size(8, 8) == 1


@pytest.mark.parametrize(
    "batch, micro, match",
    [
        (10, 3, r"micro_batches=3 does not divide batch_size=10.*\[1, 2\]"),
        (8, 16, r"does not divide batch_size=8.*\[1, 2, 4, 8\]"),
        (8, 0, "micro_batches=0 must be an integer >= 1"),
        (8, -2, "micro_batches=-2 must be"),
        (8, 2.0, "micro_batches=2.0 must be"),
        (8, True, "micro_batches=True must be"),
        (0, 1, "batch_size=0 must be"),
    ],
)
def test_a_bad_micro_batch_count_is_one_clear_error(batch, micro, match):
    with pytest.raises(ConfigError, match=match):
        micro_batch_size(batch, micro)


def test_schedule_and_simulator_check_their_inputs():
    with pytest.raises(ConfigError, match="stages=0"):
        gpipe_schedule(0, 2)
    with pytest.raises(ConfigError, match="micro_batches=0"):
        simulate(2, 0)
    with pytest.raises(ConfigError, match="one per stage"):
        simulate(2, 2, forward=[1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match="time >= 0"):
        simulate(2, 2, backward=-1.0)


def test_cut_points_group_layers_into_stages():
    names = ["conv1", "pool1", "conv2", "pool2", "flatten", "dense", "logits"]
    assert cut_points(names, ["flatten"]) == (
        ("conv1", "pool1", "conv2", "pool2"),
        ("flatten", "dense", "logits"),
    )
    assert cut_points(names, ["conv2", "dense"]) == (
        ("conv1", "pool1"),
        ("conv2", "pool2", "flatten"),
        ("dense", "logits"),
    )
    with pytest.raises(ConfigError, match=r"cannot cut at \['dense9'\]"):
        cut_points(names, ["dense9"])
    with pytest.raises(ConfigError, match="in model order"):
        cut_points(names, ["dense", "conv2"])
    with pytest.raises(ConfigError, match="in model order"):
        cut_points(names, ["conv1"])


@pytest.mark.parametrize(
    "stages, kind, cores, per_stage, want",
    [
        (2, "logical CPU", 2, "auto", (1, 2)),
        (2, "logical CPU", 8, "auto", (4, 8)),
        (4, "logical CPU", 2, "auto", (1, 4)),
        (2, "GPU", 8, "auto", (0, 0)),
        (2, "logical CPU", 2, None, (0, 0)),
        (2, "logical CPU", 2, 3, (3, 2)),
    ],
)
def test_thread_plan(stages, kind, cores, per_stage, want):
    assert thread_plan(stages, kind, cores, per_stage) == want


@pytest.mark.parametrize("bad", [0, -1, "all", 1.5, True])
def test_thread_plan_refuses_bad_thread_counts(bad):
    with pytest.raises(ConfigError, match="threads_per_stage"):
        thread_plan(2, "logical CPU", 2, bad)


def test_gantt_bars_and_figures_show_every_task():
    timeline = simulate(2, 4, forward=0.01, backward=0.02, update=0.005)
    bars = gantt.bars(timeline)
    assert len(bars) == 2 * (4 + 4 + 1)
    first = min(bars, key=lambda b: b[1])
    assert first[:2] == (0, 0.0) and first[3] == "F"
    assert max(b[1] + b[2] for b in bars) == pytest.approx(timeline.makespan * 1000)
    fig = gantt.plot_timelines([simulate(2, 1), timeline])
    assert len(fig.axes) == 2
    assert len(fig.axes[1].patches) == len(bars)
    title = fig.axes[1].get_title()
    assert "M=4, ideal" in title and "step 155 ms" in title and "theory 20%" in title
    fig = gantt.plot_bubble(2, [1, 2, 4], [0.45, 0.3, 0.18], [100.0, 150.0, 170.0])
    assert len(fig.axes) == 2
    with pytest.raises(ConfigError, match="one value per count"):
        gantt.plot_bubble(2, [1, 2], [0.5])
    with pytest.raises(ConfigError, match="no timelines"):
        gantt.plot_timelines([])


def test_timeline_shows_as_a_table():
    html = simulate(2, 4)._repr_html_()
    assert "simulated" in html and "bubble 20.0% (theory 20.0%)" in html
    assert "<td style='text-align:left'>1</td>" in html  # stage 1's row
