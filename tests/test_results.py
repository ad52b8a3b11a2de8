from __future__ import annotations

import json

import pytest
from harness.factories import step_record

from ddlkit import results
from ddlkit.errors import DdlkitError


def _result(**over):
    base = dict(
        name="baseline",
        strategy="single device",
        dataset="mnist",
        workers=1,
        replicas=1,
        global_batch=128,
        epochs=1.0,
        steps=469,
        examples_per_sec=1000.0,
        test_accuracy=0.98,
        train_seconds=60.0,
    )
    base.update(over)
    return results.Result(**base)


def test_save_and_load_round_trip(tmp_path):
    r = _result()
    path = results.save(r, tmp_path)
    assert json.loads(path.read_text())["test_accuracy"] == 0.98
    assert results.load("baseline", tmp_path) == r
    assert not list(tmp_path.glob("*.tmp*")), "no temp files left behind"


def test_missing_baseline_names_the_notebook(tmp_path):
    with pytest.raises(DdlkitError, match="00_start_here"):
        results.load("baseline", tmp_path)


@pytest.mark.parametrize(
    "over, word",
    [
        ({"name": "../x"}, "name"),
        ({"replicas": 0}, "replicas"),
        ({"test_accuracy": 1.5}, "test_accuracy"),
        ({"examples_per_sec": 0.0}, "positive"),
    ],
)
def test_bad_results_are_refused(over, word):
    with pytest.raises(ValueError, match=word):
        _result(**over)


def test_comparison_shows_speed_up_and_marks_synthetic_data(tmp_path):
    base = _result()
    fast = _result(name="mirrored", strategy="mirrored", replicas=2, examples_per_sec=1800.0)
    fake = _result(name="cifar", dataset="cifar10", synthetic_data=True)
    cmp = results.compare(fast, fake, baseline=base)
    html = cmp._repr_html_()
    assert "1.80x" in html
    assert "synthetic stand-in" in html
    assert "1.80x" in repr(cmp)


def test_throughput_is_the_sum_of_steady_worker_medians():
    from ddlkit.metrics import Record

    def step(worker, seq, eps):
        return Record(
            kind="step",
            worker=worker,
            step=seq,
            epoch=0,
            seq=seq,
            wall_time=1.0 + seq,
            examples_per_sec=eps,
        )

    warm = [step("w0", i, 10.0) for i in range(5)]
    steady = [step("w0", 5 + i, v) for i, v in enumerate([100.0, 120.0, 110.0])]
    other = [step("w1", i, 50.0) for i in range(3)]
    assert results.throughput(warm + steady + other) == 110.0 + 50.0


def test_throughput_without_steps_names_the_fix():
    with pytest.raises(DdlkitError, match="batch_size"):
        results.throughput([])


class _Run:
    """What from_run reads of a launched run: its reports, records, id, dir and config."""

    def __init__(self, tmp_path, reports, records=(), workers=2, strategy="multi_worker"):
        import types

        self.run_id, self.run_dir = "r1", tmp_path
        self.config = types.SimpleNamespace(workers=workers, strategy=strategy)
        self._reports, self._records = reports, list(records)

    def results(self):
        return self._reports

    def records(self):
        return self._records


def _report(**over):
    base = dict(
        dataset="mnist", epochs=1, steps=40, global_batch=128, replicas=2,
        examples_per_sec=900.0, test_accuracy=0.9, train_seconds=5.7,
    )  # fmt: skip
    base.update(over)
    return base


def test_from_run_speaks_for_worker_0_and_adds_up_the_workers_steady_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_FAST", "0")
    reports = {"worker-1": _report(test_accuracy=0.1), "worker-0": _report()}
    records = [step_record(w, i, 500.0 if i > 5 else 5.0) for w in ("worker-0", "worker-1")
               for i in range(12)]  # fmt: skip
    r = results.from_run(_Run(tmp_path, reports, records), "mwms", "MultiWorkerMirrored")
    assert (r.test_accuracy, r.examples_per_sec, r.workers, r.steps) == (0.9, 1000.0, 2, 40)
    assert r.steps_per_sec == pytest.approx(1000.0 / 128) and r.notes == ""


def test_from_run_prefers_the_chief_and_falls_back_to_the_reported_rate(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_FAST", "1")
    reports = {"worker-0": _report(test_accuracy=0.1), "chief-0": _report(test_accuracy=0.8)}
    r = results.from_run(_Run(tmp_path, reports), "ps", "ParameterServer", notes="2 ps")
    assert (r.test_accuracy, r.examples_per_sec, r.notes) == (0.8, 900.0, "2 ps, fast mode")


def test_from_run_counts_a_mirrored_run_as_one_process_with_its_replicas(tmp_path):
    reports = {"main": _report(replicas=4, global_batch=256)}
    r = results.from_run(_Run(tmp_path, reports, workers=4, strategy="mirrored"), "m", "Mirrored")
    assert (r.workers, r.replicas, r.global_batch) == (1, 4, 256)


def test_from_run_errors_name_the_fix(tmp_path):
    with pytest.raises(DdlkitError, match=r"run.wait\(\)"):
        results.from_run(_Run(tmp_path, {}), "x", "y")
    with pytest.raises(DdlkitError, match="no result from 'rank-3'.*worker-0"):
        results.from_run(_Run(tmp_path, {"worker-0": _report()}), "x", "y", worker="rank-3")
    partial = _report()
    del partial["steps"], partial["dataset"]
    with pytest.raises(DdlkitError, match="lacks dataset, steps"):
        results.from_run(_Run(tmp_path, {"worker-0": partial}), "x", "y")


def test_from_run_prefers_the_real_chief_name_chief_0(tmp_path):
    reports = {"worker-0": _report(test_accuracy=0.1), "chief-0": _report(test_accuracy=0.8)}
    r = results.from_run(_Run(tmp_path, reports), "ps", "ParameterServer")
    assert r.test_accuracy == 0.8


def _event(worker, name, wall_time, **info):
    from ddlkit.metrics import Record

    return Record(kind="event", worker=worker, step=info.get("steps", 0), epoch=0,
                  wall_time=wall_time, seq=0, name=name, info=info)  # fmt: skip


def _plain_script_records(workers=("worker-0", "worker-1"), evaluate=True):
    """What two workers of a plain script with a KerasReporter send (batch 64 each)."""
    out = []
    for w in workers:
        out.append(_event(w, "train_begin", 100.0, epochs=2, steps=20, batch_size=64,
                          every=1, initial_step=0, replicas=2))  # fmt: skip
        out += [step_record(w, i, 500.0 if i > 5 else 5.0) for i in range(12)]
        out.append(_event(w, "train_end", 112.5, steps=40))
        if evaluate:
            out.append(_event(w, "evaluate", 113.0, loss=0.3, accuracy=0.91, steps=10))
    return out


def test_from_run_without_reports_builds_the_result_from_records(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLKIT_FAST", "0")
    run = _Run(tmp_path, {}, _plain_script_records())
    r = results.from_run(run, "mwms", "MultiWorkerMirrored", dataset="mnist")
    assert (r.test_accuracy, r.examples_per_sec, r.workers, r.replicas) == (0.91, 1000.0, 2, 2)
    assert (r.global_batch, r.epochs, r.steps, r.train_seconds) == (128, 2.0, 40, 12.5)
    r = results.from_run(run, "m", "M", dataset="mnist", global_batch=256)
    assert r.global_batch == 256


def test_from_records_errors_name_the_fix(tmp_path):
    run = _Run(tmp_path, {}, _plain_script_records())
    with pytest.raises(DdlkitError, match="pass dataset="):
        results.from_run(run, "x", "y")
    run = _Run(tmp_path, {}, _plain_script_records(evaluate=False))
    with pytest.raises(DdlkitError, match=r"no 'evaluate' event.*model.evaluate\(test_ds"):
        results.from_run(run, "x", "y", dataset="mnist")
    with pytest.raises(DdlkitError, match="neither worker results"):
        results.from_run(_Run(tmp_path, {}), "x", "y", dataset="mnist")
