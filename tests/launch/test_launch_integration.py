"""Real worker processes started through ddlkit.launch.run on loopback."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.procutil import alive

from ddlkit.errors import ConfigError, WorkerFailedError
from ddlkit.launch import run as run_mod
from ddlkit.metrics import load_run
from ddlkit.where import Hosts, ThisMachine

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
pytestmark = pytest.mark.slow


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


CLI = (sys.executable, "-m", "ddlkit.cli", "launch")


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `ddlkit launch ARGS` as a user would: its own process, no stdin."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_two_workers_parse_one_cluster_with_unique_indexes(tmp_path):
    run = run_mod.start(LAUNCH / "report_tf_config.py", workers=2, runs_dir=tmp_path)
    result = run.wait(timeout=180)
    assert result.ok
    reports = [_json_lines(run.tail(name, 50))[-1] for name in ("worker-0", "worker-1")]
    assert reports[0]["cluster"] == reports[1]["cluster"]
    assert len(reports[0]["cluster"]["worker"]) == 2
    assert sorted((r["task_type"], r["task_id"]) for r in reports) == [
        ("worker", 0),
        ("worker", 1),
    ]
    assert [r["worker"] for r in reports] == ["worker-0", "worker-1"]
    assert all(r["legacy_keras"] == "1" for r in reports)
    assert reports[0]["cwd"] != reports[1]["cwd"], "each worker has its own working directory"
    job = json.loads((run.run_dir / "job.json").read_text())
    assert job["state"] == "finished"


def test_plain_tensorflow_tutorial_script_runs_unchanged(tmp_path):
    script = LAUNCH / "tf_tutorial_mwms.py"
    imported = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "ddlkit" not in imported and "tensorflow" in imported
    run = run_mod.start(script, workers=2, runs_dir=tmp_path, live=False)
    assert run.wait(timeout=240).ok
    for name in ("worker-0", "worker-1"):
        assert "final loss" in run.tail(name, 5)


def test_records_reach_the_collector_and_match_the_jsonl_files(tmp_path):
    run = run_mod.start(
        LAUNCH / "train_multi_worker.py",
        workers=2,
        args=["--steps-per-epoch", "15", "--epochs", "2"],
        runs_dir=tmp_path,
    )
    assert run.wait(timeout=300).ok
    on_disk = load_run(run.run_dir)
    for worker in ("worker-0", "worker-1"):
        live = [r for r in run.records(worker)]
        saved = [r for r in on_disk if r.worker == worker]
        assert live == saved, f"{worker}: collector and JSONL differ"
        steps = [r for r in live if r.kind == "step"]
        assert len(steps) == 30
        assert [r.seq for r in live] == list(range(len(live)))
        assert all(r.examples_per_sec and r.examples_per_sec > 0 for r in steps)
        # Each worker's own batch logs, not the sum over workers (tf-keras' default doubles
        # them with 2 workers): an untrained 10-class model starts near ln(10) = 2.30.
        assert steps[0].loss < 3.0 and steps[0].accuracy <= 0.5, steps[0]
    # Step logs are each worker's own (--step-logs local, ddlkit.local_logs): the workers
    # read different shards, so their running means differ; each epoch's logs are read
    # again synchronised: the same on both workers, and with equal batches the mean of the
    # two workers' last step logs of that epoch.
    workers = ("worker-0", "worker-1")
    step_records = {w: [r for r in run.records(w) if r.kind == "step"] for w in workers}
    epoch_records = {w: [r for r in run.records(w) if r.kind == "epoch"] for w in workers}
    assert [r.loss for r in step_records["worker-0"]] != [r.loss for r in step_records["worker-1"]]
    for epoch in (0, 1):
        last = [[r for r in step_records[w] if r.epoch == epoch][-1] for w in workers]
        ends = [epoch_records[w][epoch] for w in workers]
        assert ends[0].loss == pytest.approx(ends[1].loss, rel=1e-6)
        assert ends[0].accuracy == pytest.approx(ends[1].accuracy, rel=1e-6)
        assert ends[0].loss == pytest.approx((last[0].loss + last[1].loss) / 2, rel=1e-5)
        assert ends[0].accuracy == pytest.approx((last[0].accuracy + last[1].accuracy) / 2)
    stats = run.collector.stats()
    assert stats.malformed == 0 and all(w.gaps == 0 for w in stats.workers.values())
    results = run.results()
    assert results["worker-0"]["test_accuracy"] == results["worker-1"]["test_accuracy"]


def test_a_killed_worker_brings_the_job_down_with_no_orphans(tmp_path):
    run = run_mod.start(
        LAUNCH / "train_multi_worker.py",
        workers=2,
        args=["--steps-per-epoch", "100000"],
        runs_dir=tmp_path,
    )
    pids = dict(run.job.pids)
    deadline = time.monotonic() + 180
    while not run.records("worker-1") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.records("worker-1"), "worker-1 never reported a step"
    os.kill(pids["worker-1"], signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(WorkerFailedError) as err:
        run.wait(timeout=60)
    assert time.monotonic() - killed_at < 5 + 3.5  # noticed within 5 s, others stopped in grace
    message = str(err.value)
    assert "worker-1" in message and "SIGKILL" in message
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids.values() if alive(p)], "orphan worker processes left"
    assert run.collector.closed


def test_bad_input_starts_nothing(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        run_mod.start(tmp_path / "missing.py", workers=2, runs_dir=tmp_path)
    with pytest.raises(ConfigError, match="slots"):
        run_mod.start(
            LAUNCH / "report_tf_config.py",
            workers=3,
            where=Hosts("localhost:2"),
            runs_dir=tmp_path,
        )
    assert list(tmp_path.iterdir()) == [tmp_path / "missing.py"] or not list(tmp_path.iterdir())


def test_a_busy_collector_port_is_one_line_and_starts_nothing(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        proc = _cli(
            "-n",
            "2",
            "--collector-port",
            str(port),
            "--runs-dir",
            str(tmp_path / "runs"),
            str(LAUNCH / "report_tf_config.py"),
            timeout=60,
        )
    assert proc.returncode == 2
    assert f"{port}" in proc.stderr and "Fix" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "runs").glob("*/job.json")), "nothing may start"


def test_cli_reports_a_failing_worker_on_stderr_with_exit_1(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys\n"
        "print('working on', os.environ['DDLKIT_WORKER'], flush=True)\n"
        "sys.exit(3 if os.environ['DDLKIT_WORKER'] == 'worker-1' else 0)\n"
    )
    proc = _cli("-n", "2", "--runs-dir", str(tmp_path / "runs"), str(script))
    assert proc.returncode == 1, proc.stderr
    assert "worker-1" in proc.stderr and "3" in proc.stderr
    assert "working on worker-1" in proc.stderr


def test_ctrl_c_in_the_cli_stops_every_worker(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    runs = tmp_path / "runs"
    cli = subprocess.Popen(
        [*CLI, "-n", "2", "--no-live", "--runs-dir", str(runs), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 60
    pids: dict = {}
    while time.monotonic() < deadline and len(pids) < 2:
        time.sleep(0.2)
        for job_file in runs.glob("*/job.json"):
            try:
                pids = {
                    w["name"]: w["pid"]
                    for w in json.loads(job_file.read_text())["workers"]
                    if w.get("pid")
                }
            except (ValueError, KeyError):
                pass
    assert len(pids) == 2, "workers did not start"
    cli.send_signal(signal.SIGINT)
    # Generous: stopping takes ~1 s, but CI once needed more than 10 under a load of 8
    _, err = cli.communicate(timeout=30)
    assert cli.returncode == 130, err
    assert "stopped" in err
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids.values() if alive(p)]


def test_start_confines_workers_to_the_given_cores_and_adds_env(tmp_path):
    cores = run_mod.devices.local_cores()[-1:]  # one core: two workers share it, unsplit
    script = tmp_path / "where.py"
    script.write_text(
        "import json, os\n"
        "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)),\n"
        "                  'flag': os.environ.get('DDLKIT_TEST_FLAG'),\n"
        "                  'threads': os.environ.get('TF_NUM_INTRAOP_THREADS')}))\n"
    )
    before = (os.sched_getaffinity(0), "DDLKIT_TEST_FLAG" in os.environ)
    run = run_mod.start(
        script,
        workers=2,
        runs_dir=tmp_path,
        live=False,
        where=ThisMachine(cores=cores),
        env={"DDLKIT_TEST_FLAG": "on"},
    )
    assert run.wait(timeout=120).ok
    for name in ("worker-0", "worker-1"):
        (report,) = _json_lines(run.tail(name, 5))
        assert report == {"cpus": list(cores), "flag": "on", "threads": "1"}, name
    assert (os.sched_getaffinity(0), "DDLKIT_TEST_FLAG" in os.environ) == before
