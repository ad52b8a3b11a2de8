"""The environment check reports what is really here."""

from __future__ import annotations

import os

from ddlkit import env


def test_check_reports_this_machine():
    report = env.check()
    assert report["TensorFlow"].value.startswith("2.")
    assert report["Keras"].value.startswith("tf-keras") and report["Keras"].ok
    assert report["CPU cores"].value == str(len(os.sched_getaffinity(0)))
    assert report["data: mnist"].ok, report["data: mnist"]
    assert report["data: fashion_mnist"].ok
    html = report._repr_html_()
    for check in report.checks:
        assert check.name in html
    assert "Horovod" in str(report)


def test_horovod_probe_runs_in_a_child_and_never_raises():
    status = env.horovod_status(timeout=120)
    assert isinstance(status["usable"], bool)
    if not status["usable"]:
        assert status["error"], "an unusable Horovod says why"


def test_optional_checks_do_not_fail_the_report():
    report = env.EnvReport(
        (env.Check("a", "1"), env.Check("Horovod", "missing", ok=False, optional=True))
    )
    assert report.ok
    broken = env.EnvReport((env.Check("a", "1", ok=False, fix="do x"),))
    assert not broken.ok and "do x" in str(broken)
