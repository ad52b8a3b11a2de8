"""ParameterServerStrategy for real: a chief, 2 ps and 2 worker processes on loopback.

launch/train_parameter_server.py trains through a ClusterCoordinator; these tests read
what its chief reports (losses, staleness, where each variable lives), kill a worker
mid-training, and run the synchronous counterpart (launch/train_sync_eval.py) for the
side-by-side view of ddlkit.lessons.ps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness.procutil import alive, wait_until

from ddlkit.errors import DdlkitError
from ddlkit.launch import run as run_mod
from ddlkit.lessons import ps
from ddlkit.metrics import load_run

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
PS_SCRIPT = LAUNCH / "train_parameter_server.py"
pytestmark = pytest.mark.slow


def _start_ps(runs_dir: Path, *args: str):
    return run_mod.start(PS_SCRIPT, strategy="parameter_server", workers=2, ps=2,
                         args=list(args), runs_dir=runs_dir)  # fmt: skip


def _no_orphans(pids: dict[str, int]) -> list[str]:
    wait_until(lambda: not any(alive(p) for p in pids.values()), timeout=10)
    return [name for name, pid in pids.items() if alive(pid)]


@pytest.fixture(scope="module")
def ps_run(tmp_path_factory):
    """One finished PS job: 60 steps, a report every 10, held-out evals every 30."""
    run = _start_ps(
        tmp_path_factory.mktemp("ps"),
        *("--steps-per-epoch", "60", "--report-every", "10"),
        *("--eval-every", "30", "--eval-examples", "500"),
    )
    pids = dict(run.job.pids)
    result = run.wait(timeout=400)
    return run, result, pids


def test_a_ps_job_trains_and_ends_every_server(ps_run):
    run, result, pids = ps_run
    assert result.state == "finished"
    states = {name: s.state for name, s in result.workers.items()}
    assert states == {"chief-0": "finished", "ps-0": "stopped", "ps-1": "stopped",
                      "worker-0": "stopped", "worker-1": "stopped"}  # fmt: skip
    assert not _no_orphans(pids), "servers left running after the chief finished"
    chief = run.results()["chief-0"]
    assert chief["steps"] == 60 and chief["replicas"] == 2 and chief["ps"] == 2
    # An untrained 10-class model starts near ln(10) = 2.30; 60 Adam steps bring it well down.
    assert 1.5 < chief["first_loss"] < 3.0, chief["first_loss"]
    assert chief["last_loss"] < 0.75 * chief["first_loss"], chief
    evals = chief["evals"]
    assert [e["step"] for e in evals] == [0, 30, 60]
    assert evals[-1]["accuracy"] > evals[0]["accuracy"] + 0.3, evals
    assert 0.0 < chief["test_accuracy"] <= 1.0


def test_variables_are_sharded_across_both_ps_tasks(ps_run):
    run, _, _ = ps_run
    placement = run.results()["chief-0"]["placement"]
    ps_of = lambda device: re.search(r"/job:ps/replica:0/task:(\d+)/", device).group(1)  # noqa: E731
    used = {ps_of(s["device"]) for v in placement for s in v["shards"]}
    assert used == {"0", "1"}, placement
    dense = next(v for v in placement if v["name"] == "dense/kernel")
    assert dense["shape"] == [1600, 128]  # 800 KiB: above the 256 KiB minimum shard
    assert [s["shape"] for s in dense["shards"]] == [[800, 128], [800, 128]]
    assert {ps_of(s["device"]) for s in dense["shards"]} == {"0", "1"}
    small = next(v for v in placement if v["name"] == "logits/bias")
    assert len(small["shards"]) == 1  # 40 bytes: not worth splitting
    assert "dense/kernel" in run.tail("chief-0", 200)  # the chief prints the placement too


def test_staleness_is_measured_for_every_step_and_two_workers_make_stale_updates(ps_run):
    run, _, _ = ps_run
    chief = run.results()["chief-0"]
    values = ps.from_counts(chief["staleness_counts"])
    assert len(values) == 60 and min(values) >= 0
    # Two workers update the same variables concurrently: while one computes its
    # gradients the other applies its own, so most steps see one other update.
    assert chief["staleness"]["stale_fraction"] > 0.2, chief["staleness"]
    steps = [r for r in load_run(run.run_dir) if r.kind == "step"]
    assert [r.step for r in steps] == [10, 20, 30, 40, 50, 60]
    assert all(r.worker == "chief-0" for r in steps)
    assert all(0 <= r.metrics["staleness_mean"] <= r.metrics["staleness_max"] for r in steps)
    assert all(r.examples_per_sec and r.examples_per_sec > 0 for r in steps)


def test_a_worker_killed_mid_training_and_the_chief_still_finishes(tmp_path):
    steps = 160
    run = _start_ps(tmp_path, "--steps-per-epoch", str(steps), "--report-every", "10",
                    "--eval-every", "0")  # fmt: skip
    pids = dict(run.job.pids)
    killed_at = ps.wait_for_step(run, 30, timeout=300)
    run.kill("worker-1")
    assert killed_at < steps, "training ended before the kill: make it longer"
    result = run.wait(timeout=400)
    assert result.state == "finished", result
    assert result.workers["worker-1"].state == "failed"
    assert result.workers["worker-1"].signal == "SIGKILL"
    assert result.workers["chief-0"].state == "finished"
    assert result.workers["worker-0"].state == "stopped"  # ended by the kit, not by a failure
    chief = run.results()["chief-0"]
    assert chief["steps"] == steps  # every scheduled step ran: the lost ones on worker-0
    assert len(ps.from_counts(chief["staleness_counts"])) == steps
    assert "failed with UnavailableError" in run.tail("chief-0", 400)  # the coordinator saw it
    assert not _no_orphans(pids)
    before, after = ps.throughput_around(run.records(), killed_at)
    assert before > 0 and after > 0  # the speeds themselves depend on the machine's load


def test_waiting_for_a_step_of_a_finished_job_says_it_ended(ps_run):
    with pytest.raises(DdlkitError, match="ended"):
        ps.wait_for_step(ps_run[0], 10_000, timeout=5)


def test_sync_eval_run_gives_the_other_half_of_the_comparison(tmp_path, ps_run):
    run = run_mod.start(LAUNCH / "train_sync_eval.py", strategy="multi_worker", workers=2,
                        args=["--steps-per-epoch", "30", "--eval-every", "15",
                              "--eval-examples", "500"], runs_dir=tmp_path)  # fmt: skip
    pids = dict(run.job.pids)
    assert run.wait(timeout=400).state == "finished"
    records = load_run(run.run_dir)
    evals = [r for r in records if r.kind == "event" and r.name == "eval"]
    assert {r.worker for r in evals} == {"worker-0"}  # one evaluator
    curve = ps.eval_curve(records)
    assert [p.step for p in curve] == [0, 15, 30]
    assert [p.examples for p in curve] == [0, 15 * 128, 30 * 128]  # global batch 2 x 64
    assert curve[-1].accuracy > curve[0].accuracy + 0.3
    assert all(a.train_seconds < b.train_seconds for a, b in zip(curve, curve[1:], strict=False))
    view = ps.compare(run.run_dir, ps_run[0].run_dir)
    assert view.sync.staleness == () and len(view.async_.staleness) == 60
    assert view.sync.examples_per_sec > 0 and view.async_.examples_per_sec > 0
    assert "<table>" in view._repr_html_()
    assert not _no_orphans(pids)
