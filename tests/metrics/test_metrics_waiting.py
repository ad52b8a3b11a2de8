"""ddlkit.metrics.waiting: the one loop that waits on a run (ps.wait_for_step uses it)."""

from __future__ import annotations

import pytest
from harness.factories import step_record

from ddlkit.errors import DdlkitError, JobTimeoutError, WorkerFailedError
from ddlkit.lessons import ps
from ddlkit.metrics.waiting import wait_for


class FakeJob:
    def __init__(self, states):
        self.states = list(states)  # one per poll: "running" until the last
        self.state = self.states[0]

    @property
    def done(self):
        self.state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return self.state != "running"


class FakeRun:
    """A run whose records grow by one step per poll; its job ends as `states` say."""

    run_id = "fake"

    def __init__(self, states, failure=None, steps=()):
        self.job = FakeJob(states)
        self.collector = object()
        self.failure = failure
        self.steps = list(steps)
        self.shown = 0

    def records(self, worker=None):
        self.shown = min(self.shown + 1, len(self.steps))
        return [step_record(worker or "chief-0", s) for s in self.steps[: self.shown]]

    def wait(self):
        if self.failure:
            raise self.failure


def test_wait_for_step_returns_the_step_once_reported():
    run = FakeRun(["running"] * 5, steps=[1, 2, 3, 4])
    assert ps.wait_for_step(run, 3, timeout=10) == 3


def test_wait_for_step_raises_the_runs_failure_before_saying_it_ended(monkeypatch):
    failure = WorkerFailedError("worker-1 exited with code 3", worker="worker-1", exit_code=3,
                                signal_name=None, log_path="x.log", log_tail="")  # fmt: skip
    monkeypatch.setattr("ddlkit.metrics.waiting.records_of", lambda run, worker: [])
    with pytest.raises(WorkerFailedError, match="code 3"):
        ps.wait_for_step(FakeRun(["running", "failed"], failure), 5, timeout=10)
    with pytest.raises(DdlkitError, match=r"ended \(finished\) before chief-0 reported step 5"):
        ps.wait_for_step(FakeRun(["running", "finished"]), 5, timeout=10)


def test_a_timeout_names_what_was_seen_and_leaves_the_run_alone():
    run = FakeRun(["running"], steps=[1])
    with pytest.raises(JobTimeoutError, match=r"not reported step 9 after 0.3 s \(last: 1\)"):
        ps.wait_for_step(run, 9, timeout=0.3)
    late = []
    with pytest.raises(JobTimeoutError, match="late"):
        wait_for(run, lambda r: None, timeout=0, ended=str, late=lambda r: late.append(r) or "late")
    assert late and run.job.state == "running"
