"""The reference case (the bare tf-keras loop), the ceiling ratio and repeat stability:
planned, computed, written to bench.json and shown (pure: no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit.bench.config import BenchCase, plan_cases
from ddlkit.bench.measured import BenchResult, CaseResult
from ddlkit.bench.results import HEADERS, from_file
from ddlkit.bench.schema import BenchFile, RunMeasure
from ddlkit.bench.stats import STABLE, drift_note, round_speeds, stability
from ddlkit.errors import ConfigError


def test_stable_repeats_have_no_note():
    ratio, note = stability([4000.0, 4100.0, 3950.0])
    assert ratio == pytest.approx(4100 / 3950) and ratio <= STABLE and note is None
    assert stability([4000.0]) == (None, None)


def test_a_halving_between_process_starts_is_flagged_bimodal_not_averaged():
    ratio, note = stability([3970.0, 1990.0, 3967.0])
    assert ratio == pytest.approx(3970 / 1990)
    assert note.startswith("bimodal: 1 of 3 runs at 1,990 examples/s, 2 at 3,968")
    assert "(1.99x)" in note


def test_spread_without_two_speeds_is_unstable():
    ratio, note = stability([4000.0, 4300.0, 4600.0])
    assert note == f"unstable: max/min of the runs {4600 / 4000:.2f} > {STABLE:.2f}"
    # just over the threshold: three decimals, never "1.10 > 1.10"
    assert stability([5259.0, 5439.0, 5789.0])[1] == "unstable: max/min of the runs 1.101 > 1.10"


DRIFT = (1.06, 1.0, 0.94)  # a machine that slows over a benchmark's three rounds


def test_round_speeds_find_a_drift_every_case_shares():
    cases = [[base * d for d in DRIFT] for base in (4000.0, 8000.0, 600.0)]
    mean = (1.06 * 1.0 * 0.94) ** (1 / 3)
    assert round_speeds(cases) == pytest.approx([d / mean for d in DRIFT])
    # a case that missed a round does not count; fewer than 2 full cases or rounds: None
    assert round_speeds([*cases, [5000.0, 10.0]]) == pytest.approx(round_speeds(cases))
    assert round_speeds(cases[:1]) is None
    assert round_speeds([[4000.0], [8000.0]]) is None


def test_drift_note_says_whether_the_machine_explains_a_spread():
    others = [[base * d for d in DRIFT] for base in (4000.0, 8000.0)]
    drifting = [5000.0 * d for d in DRIFT]  # max/min 1.13, all of it the machine's
    assert stability(drifting)[1].startswith("unstable: max/min of the runs 1.13")
    note = drift_note(drifting, others)
    assert note.startswith("; 1.00 with each run divided by the machine's speed in its round")
    assert note.endswith(f"within {STABLE:.2f}")
    own = [5000.0, 5000.0 * 1.2, 5000.0]  # a spread of its own, no drift in it
    assert drift_note(own, others).endswith(f"still beyond {STABLE:.2f}")
    assert drift_note([5000.0, 5100.0], others) == ""  # rounds do not line up


def test_the_table_and_about_show_the_machine_drift(tmp_path):
    rates = {
        "single-x1": [4000 * d for d in DRIFT],
        "independent-x2": [8000 * d for d in DRIFT],
        "horovod-x2": [7000 * d for d in DRIFT],
    }
    res = from_file(_result(tmp_path, rates).to_record(), tmp_path / "bench.json")
    about = dict(res.about_rows())
    assert about["machine by round"].startswith("1.06, 1.00, 0.94: each round's speed")
    assert "over the 3 cases run in every round" in about["machine by round"]
    (note,) = [n for n in res.notes() if "unstable" in n]  # the same for all three cases
    assert note.endswith(f"within {STABLE:.2f}")
    number = note.split(" ", 1)[0]  # "[k]"
    for row in res.rows():
        assert dict(zip(HEADERS, row, strict=True))["min-max (n)"].endswith(f" {number}")
    assert "with each run divided by the machine's speed" in res.summary()


def test_the_reference_runs_first_once_on_mnist_without_evaluations():
    cases = plan_cases(True, 2, True)
    assert cases[0].name == "reference-x1" and cases[0].eval_every == 0
    assert cases[1].name == "single-x1" and cases[1].eval_every > 0
    assert cases[0].args() == [
        "--dataset", "mnist", "--epochs", "1", "--steps-per-epoch", "50", "--batch-size", "64",
        "--test-examples", "2000",
    ]  # fmt: skip
    assert cases[0].script(Path("launch")).name == "bench_reference.py"
    assert cases[0].launch_strategy == cases[1].launch_strategy == "mirrored"
    assert "reference" not in {c.strategy for c in plan_cases(True, 2, True, model="cifar10")}
    with pytest.raises(ConfigError, match="Fix: model='mnist', eval_every=0"):
        BenchCase("reference", 1, 50, eval_every=10)
    with pytest.raises(ConfigError, match="one worker"):
        BenchCase("reference", 2, 50)


def _result(tmp_path, rates: dict[str, list[float]]) -> BenchResult:
    cases = []
    for name, values in rates.items():
        strategy, workers = name.rsplit("-x", 1)
        c = CaseResult(BenchCase(strategy, int(workers), 50, repeats=len(values)))
        c.runs = [RunMeasure(f"{name}-{i}", v, 64 / v, 0.9, 10.0) for i, v in enumerate(values)]
        cases.append(c)
    return BenchResult("b1", tmp_path, cases, (0, 1), 1)


def test_ratios_against_reference_and_ceiling_reach_bench_json_and_the_table(tmp_path):
    result = _result(
        tmp_path,
        {
            "reference-x1": [4000.0, 4010.0],
            "single-x1": [3900.0, 3920.0],
            "independent-x2": [8000.0, 8020.0],
            "horovod-x1": [3800.0, 3810.0],
            "horovod-x2": [7200.0, 3600.0],
        },
    )
    doc = result.to_record()
    assert BenchFile.from_json(doc.to_json()) == doc and doc.schema == 3
    by = {c.name: c for c in doc.cases}
    assert by["single-x1"].vs_reference == pytest.approx(3910 / 4005)
    assert by["single-x1"].vs_ceiling is None  # one worker: no ceiling of its own
    assert by["horovod-x2"].vs_ceiling == pytest.approx(5400 / 8010)
    assert by["horovod-x2"].repeat_ratio == pytest.approx(2.0)
    assert by["horovod-x2"].unstable.startswith("bimodal: 1 of 2 runs at 3,600")
    assert by["single-x1"].unstable is None
    res = from_file(doc, tmp_path / "bench.json")
    rows = {r[0]: dict(zip(HEADERS, r, strict=True)) for r in res.rows()}
    assert rows["single-x1"]["vs reference"] == f"{3910 / 4005:.2f}"
    assert rows["horovod-x2"]["vs ceiling"] == f"{5400 / 8010:.2f}"
    cell = rows["horovod-x2"]["min-max (n)"]
    assert cell.startswith("3,600-7,200 (2) [")  # a numbered note says how they split
    number = cell.rsplit("[", 1)[1].rstrip("]")
    assert res.notes()[int(number) - 1].startswith(f"[{number}] bimodal: 1 of 2 runs")
    assert rows["single-x1"]["min-max (n)"] == "3,900-3,920 (2)"  # agreeing: no note
    summary = res.summary()
    assert "0.67 of the independent-x2 ceiling" in summary
    assert f"{3910 / 4005:.2f}x the bare tf-keras loop" in summary
