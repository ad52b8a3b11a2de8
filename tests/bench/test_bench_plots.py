"""ddlkit.bench.plots: the bars, lines and labels read back from the matplotlib Axes."""

from __future__ import annotations

from dataclasses import replace

import matplotlib
import pytest
from matplotlib.container import BarContainer
from test_bench_results import case, document, resnet_document, spread

from ddlkit.bench import plots
from ddlkit.bench.results import EvalPoint, parse

matplotlib.use("Agg")


def results(**extra):
    return parse(document(**extra))


def containers(ax):
    """{legend label: [(bar centre x, height), ...]} for every bar series of `ax`."""
    return {
        c.get_label(): [(round(p.get_x() + p.get_width() / 2, 3), p.get_height()) for p in c]
        for c in ax.containers
        if isinstance(c, BarContainer)
    }


def lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def texts(ax):
    return " ".join(t.get_text() for t in ax.texts)


def test_throughput_bars_per_strategy_and_worker_count_with_min_max_whiskers():
    res = results()
    ax = plots.throughput(res).axes[0]
    bars = containers(ax)
    assert set(bars) == {"1 worker", "2 workers"}
    assert [h for _, h in bars["1 worker"]] == [2000.0, 1000.0]  # single-x1, multi_worker-x1
    assert [h for _, h in bars["2 workers"]] == [1600.0, 1200.0]
    # the x1 and x2 bars of multi_worker share its group: tick 1, left and right of it
    (x_single, _), (x_mw1, _) = bars["1 worker"]
    (x_mw2, _), (x_ps2, _) = bars["2 workers"]
    assert x_single == 0 and x_mw1 < 1 < x_mw2 and x_ps2 == 2
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["single", "multi_worker", "param_server", "horovod", "mirrored"]
    # whiskers from min to max: multi_worker-x2 is 1500-1650
    whiskers = [c for c in ax.containers if c.get_label() == "2 workers"][0].errorbar
    segments = whiskers.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segments][0] == (1500.0, 1650.0)
    # one device as a dashed line, labelled
    single = lines(ax)["one device, no strategy (single-x1)"]
    assert tuple(single.get_ydata()) == (2000.0, 2000.0)
    # bar values written on the bars
    values = {t.get_text() for t in ax.texts}
    assert {"2,000", "1,600"} <= values
    # skipped and failed cases are said, not dropped
    note = texts(ax)
    assert "horovod-x1: skipped" in note and "mirrored-x1: failed" in note


def test_efficiency_bars_against_x1_and_single_with_the_reference_lines():
    res = results()
    ax = plots.efficiency(res).axes[0]
    bars = containers(ax)
    own = bars["vs the same strategy with 1 worker"]
    single = bars["vs one device, no strategy (single-x1)"]
    # only multi_worker-x2 has an x1 to compare with; both x2 cases compare with single-x1
    assert [h for _, h in own] == [pytest.approx(80.0)]
    assert [h for _, h in single] == [pytest.approx(40.0), pytest.approx(30.0)]
    assert [x for x, _ in own] == [pytest.approx(-0.2)] and [x for x, _ in single] == [0.2, 1.2]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["multi_worker-x2", "param_server-x2"]
    refs = lines(ax)
    assert not [label for label in refs if "ceiling" in label]  # no independent case
    assert tuple(refs["linear scaling (100%)"].get_ydata()) == (100, 100)
    horovod = refs[plots.HOROVOD_LABEL]
    assert tuple(horovod.get_ydata()) == (90.0, 90.0)
    assert "90%" in plots.HOROVOD_LABEL and "Horovod" in plots.HOROVOD_LABEL
    assert {"80%", "40%"} <= {t.get_text() for t in ax.texts}
    assert "horovod-x2: skipped" in texts(ax)
    assert ax.get_ylim()[1] > 100  # the 100% line is inside the plot


def test_efficiency_with_every_strategy_measured_has_one_bar_pair_per_multi_worker_case():
    cases = [case("single", 1, 2000.0), case("independent", 2, 3600.0)]
    for strategy, x1, x2 in (("mirrored", 1200.0, 1800.0), ("horovod", 2400.0, 2400.0)):
        cases += [case(strategy, 1, x1), case(strategy, 2, x2)]
    ax = plots.efficiency(parse(document(cases=cases))).axes[0]
    bars = containers(ax)
    # independent-x2 is measured against single-x1: both of its bars are 90%
    assert [h for _, h in bars["vs the same strategy with 1 worker"]] == [
        pytest.approx(90.0),
        pytest.approx(75.0),
        pytest.approx(50.0),
    ]
    assert [h for _, h in bars["vs one device, no strategy (single-x1)"]] == [
        pytest.approx(90.0),
        pytest.approx(45.0),
        pytest.approx(60.0),
    ]
    ceiling = lines(ax)["this machine's ceiling: independent-x2 (no communication)"]
    assert tuple(ceiling.get_ydata()) == (pytest.approx(90.0), pytest.approx(90.0))
    assert texts(ax).count("skipped") == 0


def with_curves(res, curves):
    """`res` with held-out curves on the named cases (as load_results reads them)."""
    cases = tuple(
        replace(c, evals=tuple(tuple(EvalPoint(t, a) for t, a in run) for run in curves[c.name]))
        if c.name in curves
        else c
        for c in res.cases
    )
    return replace(res, cases=cases)


def test_time_to_accuracy_draws_each_case_and_the_target():
    doc = document(target_accuracy=0.9)
    doc["cases"][2]["seconds_to_target"] = spread(3.5, 3.0, 4.0)
    res = with_curves(
        parse(doc),
        {
            "multi_worker-x2": [[(2.0, 0.8), (4.0, 0.92)], [(2.5, 0.78)]],
            "single-x1": [[(3.0, 0.95)]],
        },
    )
    ax = plots.time_to_accuracy(res).axes[0]
    drawn = lines(ax)
    assert tuple(drawn["multi_worker-x2"].get_xdata()) == (2.0, 4.0)
    assert tuple(drawn["multi_worker-x2"].get_ydata()) == (0.8, 0.92)
    assert tuple(drawn["single-x1"].get_ydata()) == (0.95,)
    assert tuple(drawn["target 0.90"].get_ydata()) == (0.9, 0.9)
    # the second run is drawn too, fainter and without its own legend entry
    faint = [ln for ln in ax.get_lines() if tuple(ln.get_xdata()) == (2.5,)]
    assert len(faint) == 1 and faint[0].get_alpha() < 1
    # colour by strategy; 1 worker dashed, 2 workers solid
    assert drawn["single-x1"].get_linestyle() == "--"
    assert drawn["multi_worker-x2"].get_linestyle() == "-"
    assert drawn["single-x1"].get_color() != drawn["multi_worker-x2"].get_color()
    # the median time to the target, marked on the target line
    (mark,) = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert (tuple(mark.get_xdata()), tuple(mark.get_ydata())) == ((3.5,), (0.9,))
    assert ax.get_xlabel().startswith("training seconds")


def test_time_to_accuracy_without_curves_shows_seconds_to_target_per_case():
    ax = plots.time_to_accuracy(results()).axes[0]  # bench.json alone: no run directories
    bars = containers(ax)
    (label,) = bars
    assert label == "seconds to 0.95"
    # horizontal bars: one, multi_worker-x1's median 9.0 s with whiskers 8-10
    (bar,) = [c for c in ax.containers if isinstance(c, BarContainer)][0]
    assert bar.get_width() == 9.0
    whiskers = [c for c in ax.containers if isinstance(c, BarContainer)][0].errorbar
    assert tuple(whiskers.lines[2][0].get_segments()[0][:, 0]) == (8.0, 10.0)
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == ["single-x1", "multi_worker-x1", "multi_worker-x2", "param_server-x2"]
    notes = texts(ax)
    assert "9.0 s" in notes
    assert "not reached in 60 steps by 2 of 2 runs (best held-out accuracy 0.930)" in notes
    assert "0.95" in ax.get_title()


def test_time_to_accuracy_without_evals_says_so_and_how_to_get_them():
    doc = document()
    for c in doc["cases"]:
        c["eval_every"], c["seconds_to_target"] = 0, None
    ax = plots.time_to_accuracy(parse(doc)).axes[0]
    assert not ax.get_lines() and not ax.containers
    assert "no held-out evaluations" in texts(ax) and "--eval-every" in texts(ax)


def test_plots_draw_into_a_given_axes():
    from matplotlib.figure import Figure

    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert plots.throughput(results(), ax=left) is fig
    assert plots.efficiency(results(), ax=right) is fig
    assert left.containers and right.containers


def test_a_strategy_without_x1_still_plots_its_throughput():
    doc = document(cases=[case("horovod", 2, 900.0, examples_per_sec=spread(900.0))])
    ax = plots.throughput(parse(doc)).axes[0]
    assert containers(ax) == {"2 workers": [(0.0, 900.0)]}
    assert "one device" not in " ".join(lines(ax))


def test_each_chart_shows_one_architecture():
    res = parse(resnet_document())
    cnn = plots.throughput(res).axes[0]
    assert [h for _, h in containers(cnn)["2 workers"]] == [1600.0, 1200.0]  # no ResNet bar
    assert "mnist CNN" in cnn.get_title()
    ax = plots.throughput(res, arch="small_resnet").axes[0]
    assert [h for _, h in containers(ax)["2 workers"]] == [380.0, 361.0]
    assert tuple(lines(ax)["one device, no strategy (single-x1)"].get_ydata()) == (200.0, 200.0)
    assert "cifar10 small ResNet" in ax.get_title()
    eff = plots.efficiency(res, arch="small_resnet").axes[0]
    labels = [t.get_text() for t in eff.get_xticklabels()]
    assert labels == ["independent-x2-resnet", "multi_worker-x2-resnet"]
    assert [h for _, h in containers(eff)["vs one device, no strategy (single-x1)"]] == [
        pytest.approx(95.0),
        pytest.approx(90.25),
    ]
    assert "cifar10" not in plots.throughput(parse(document())).axes[0].get_title()
