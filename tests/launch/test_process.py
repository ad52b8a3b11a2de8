"""The launcher's process layer: specs and environments (pure), then real worker processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest
from harness.procutil import alive, marked_pids, wait_until

from ddlkit.errors import ConfigError, JobTimeoutError, WorkerFailedError
from ddlkit.launch import (
    Job,
    JobSpec,
    WorkerSpec,
    list_runs,
    log_path,
    new_run_id,
    runs_table,
    thread_env,
    worker_env,
)
from ddlkit.launch.process import python_script
from ddlkit.launch.runs import tail

PY = sys.executable

WORKER = """\
import os, sys, time
mode = sys.argv[1]
print("worker", os.environ["DDLKIT_WORKER"], "says", os.environ.get("GREETING"))
print("threads", os.environ.get("OMP_NUM_THREADS"), os.environ.get("TF_NUM_INTEROP_THREADS"))
print("cpus", sorted(os.sched_getaffinity(0)))
if mode == "fail":
    for i in range(30):
        print("line", i)
    sys.exit(3)
if mode == "sleep":
    time.sleep(60)
if mode == "bind":
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", int(sys.argv[3])))
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "worker.py").write_text(WORKER)
    return tmp_path


@pytest.fixture
def marker() -> str:
    token = f"ddlkit-test-{uuid.uuid4().hex}"
    yield token
    leftover = marked_pids(token)
    for pid in leftover:
        os.kill(pid, 9)
    assert not leftover, f"test left processes running: {leftover}"


def spec_of(project: Path, modes: dict[str, str], marker: str, **extra) -> JobSpec:
    run_id = new_run_id("test")
    run_dir = project / "runs" / run_id
    workers = tuple(
        WorkerSpec(
            name=name,
            argv=(PY, "worker.py", mode, marker, *extra.get("args", ())),
            env={"GREETING": f"hello-{name}"},
            cwd=project,
            log_path=log_path(run_dir, name),
            threads=extra.get("threads"),
            cpus=extra.get("cpus", {}).get(name),
        )
        for name, mode in modes.items()
    )
    return JobSpec(run_id, run_dir, workers)


# -- pure: specs and environments ---------------------------------------------------------


def ws(**kw) -> WorkerSpec:
    args = dict(name="w0", argv=("python", "t.py"), env={}, cwd=Path("."), log_path=Path("w.log"))
    args.update(kw)
    return WorkerSpec(**args)


def test_worker_env_layers_base_spec_and_launcher_vars():
    base = {"PATH": "/bin", "GREETING": "base", "OMP_NUM_THREADS": "8"}
    w = ws(env={"GREETING": "spec", "TF_CONFIG": '{"task": {}}'}, threads=1)
    env = worker_env(w, "/runs/r1", base)
    assert env["PATH"] == "/bin"
    assert env["GREETING"] == "spec"
    assert env["TF_CONFIG"] == '{"task": {}}'
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["DDLKIT_WORKER"] == "w0" and env["DDLKIT_RUN_DIR"] == "/runs/r1"
    assert env["OMP_NUM_THREADS"] == "1" and env["TF_NUM_INTRAOP_THREADS"] == "1"
    assert env["TF_NUM_INTEROP_THREADS"] == "2"
    assert base["OMP_NUM_THREADS"] == "8", "the base mapping must not be changed"
    assert "OMP_NUM_THREADS" not in worker_env(ws(), "/r", {})


def test_thread_env_scales_with_threads():
    assert thread_env(4) == {
        "OMP_NUM_THREADS": "4",
        "TF_NUM_INTRAOP_THREADS": "4",
        "TF_NUM_INTEROP_THREADS": "4",
    }


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(argv=()), "empty argv"),
        (dict(argv="python t.py"), "not the string"),
        (dict(name="bad name"), "not a valid name"),
        (dict(env={"X": 1}), "not a string"),
        (dict(threads=0), "threads=0"),
        (dict(threads=2, env={"OMP_NUM_THREADS": "4"}), "OMP_NUM_THREADS"),
        (dict(cpus=(0, 0)), "distinct core"),
        (dict(cpus=(0,), env={"CUDA_VISIBLE_DEVICES": "0"}), "CPU-only"),
    ],
)
def test_worker_spec_rejects_bad_values(kw, words):
    with pytest.raises(ConfigError, match=words):
        ws(**kw)


def test_worker_env_refuses_to_override_launcher_vars():
    with pytest.raises(ConfigError, match="DDLKIT_WORKER"):
        worker_env(ws(env={"DDLKIT_WORKER": "other"}), "/r", {})


def test_job_spec_rejects_duplicates_and_no_workers():
    with pytest.raises(ConfigError, match="share the name 'w0'"):
        JobSpec("r1", Path("runs/r1"), (ws(), ws(log_path=Path("other.log"))))
    with pytest.raises(ConfigError, match="share the log file"):
        JobSpec("r1", Path("runs/r1"), (ws(), ws(name="w1")))
    with pytest.raises(ConfigError, match="no workers"):
        JobSpec("r1", Path("runs/r1"), ())


def test_spec_html_shows_workers_and_hides_secrets():
    spec = JobSpec("r1", Path("runs/r1"), (ws(env={"DDLKIT_TOKEN": "s3cret", "A": "b&c"}),))
    html = spec._repr_html_()
    assert "w0" in html and "python t.py" in html and "A=b&amp;c" in html
    assert "s3cret" not in html and "DDLKIT_TOKEN=***" in html
    assert spec.to_dict()["workers"][0]["env"]["DDLKIT_TOKEN"] == "***"


@pytest.mark.parametrize(
    "argv, script",
    [
        (("python", "t.py", "-x"), "t.py"),
        (("python3.11", "-u", "-X", "dev", "dir/t.py"), "dir/t.py"),
        ((PY, "-W", "ignore", "t.py"), "t.py"),
        (("python", "-c", "print(1)"), None),
        (("python", "-m", "pkg"), None),
        (("horovodrun", "t.py"), None),
    ],
)
def test_python_script_finds_the_script_argument(argv, script):
    assert python_script(argv) == script


def test_run_ids_sort_by_time_and_check_labels():
    import datetime as dt

    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC)
    a = new_run_id("mnist", now=t0)
    b = new_run_id("mnist", now=t0 + dt.timedelta(milliseconds=1))
    assert a.startswith("20260102-030405.006-mnist-") and a < b
    assert new_run_id() != new_run_id()
    with pytest.raises(ConfigError, match="directory name"):
        new_run_id("a/b")


# -- real processes ---------------------------------------------------------------------


def test_two_workers_finish_and_the_run_is_recorded(project, marker):
    spec = spec_of(project, {"worker-0": "ok", "worker-1": "ok"}, marker, threads=1)
    job = Job.start(spec)
    assert json.loads((spec.run_dir / "job.json").read_text())["state"] == "running"
    result = job.wait(timeout=20)
    assert job.done and job.result() is result
    assert result.ok and result.state == "finished"
    assert result.exit_codes == {"worker-0": 0, "worker-1": 0}
    assert {s.state for s in job.status().values()} == {"finished"}
    for name in ("worker-0", "worker-1"):
        log = (spec.run_dir / "logs" / f"{name}.log").read_text()
        assert f"worker {name} says hello-{name}" in log
        assert "threads 1 2" in log
        assert job.tail(name, 1) == log.splitlines()[-1]
    data = json.loads((spec.run_dir / "job.json").read_text())
    assert data["state"] == "finished" and data["run_id"] == spec.run_id
    assert [(w["name"], w["state"], w["exit_code"]) for w in data["workers"]] == [
        ("worker-0", "finished", 0),
        ("worker-1", "finished", 0),
    ]
    assert data["workers"][0]["env"] == {"GREETING": "hello-worker-0"}
    [run] = list_runs(project / "runs")
    assert (run.run_id, run.state, run.workers) == (spec.run_id, "finished", spec.names)
    html = job.status_table()._repr_html_()
    assert "worker-1" in html and "finished" in html


def test_failing_worker_names_code_and_log_and_stops_the_others(project, marker):
    spec = spec_of(project, {"sleeper": "sleep", "crasher": "fail"}, marker)
    job = Job.start(spec)
    sleeper = job.pids["sleeper"]
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        job.wait(timeout=20)
    assert time.monotonic() - t0 < 5
    err = info.value
    assert (err.worker, err.exit_code, err.signal_name) == ("crasher", 3, None)
    message = str(err)
    assert (
        "'crasher'" in message and "exited with code 3" in message and "stopped sleeper" in message
    )
    assert "line 29" in message and "line 10" in message and "line 9\n" not in message
    assert err.log_tail.splitlines() == [f"line {i}" for i in range(10, 30)]
    assert not alive(sleeper)
    states = {n: s.state for n, s in job.status().items()}
    assert states == {"sleeper": "stopped", "crasher": "failed"}
    data = json.loads((spec.run_dir / "job.json").read_text())
    assert data["state"] == "failed" and "crasher" in data["error"]
    with pytest.raises(WorkerFailedError):  # asking again gives the same answer
        job.wait(timeout=1)


def test_busy_port_is_named_in_the_failure(project, marker):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        spec = spec_of(project, {"server": "bind"}, marker, args=(str(port),))
        with pytest.raises(WorkerFailedError, match="port was busy"):
            Job.start(spec).wait(timeout=20)


@pytest.mark.parametrize(
    "problem, words",
    [
        ("missing script", "script 'nowhere.py' does not exist"),
        ("missing cwd", "working directory"),
        ("missing program", "not on the worker's PATH"),
        ("empty argv", "empty argv"),
        ("duplicate names", "share the name"),
    ],
)
def test_bad_input_starts_nothing(project, marker, problem, words):
    run_dir = project / "runs" / "r1"

    def worker(name: str, **kw) -> WorkerSpec:
        args = dict(
            name=name,
            argv=(PY, "worker.py", "sleep", marker),
            env={},
            cwd=project,
            log_path=log_path(run_dir, name),
        )
        args.update(kw)
        return WorkerSpec(**args)

    with pytest.raises(ConfigError, match=words) as info:
        good = worker("good")
        if problem == "missing script":
            bad = worker("bad", argv=(PY, "nowhere.py", marker))
        elif problem == "missing cwd":
            bad = worker("bad", cwd=project / "no-such-dir")
        elif problem == "missing program":
            bad = worker("bad", argv=("no-such-program-ddlkit", marker))
        elif problem == "empty argv":
            bad = worker("bad", argv=())
        else:
            bad = worker("good", log_path=log_path(run_dir, "other"))
        Job.start(JobSpec("r1", run_dir, (good, bad)))
    assert "Fix:" in str(info.value) and "\n" not in str(info.value)
    time.sleep(0.2)
    assert marked_pids(marker) == []
    assert not run_dir.exists()


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 cores to pin two workers apart",
)
def test_cpu_pinning_is_visible_in_the_child(project, marker):
    a, b = sorted(os.sched_getaffinity(0))[:2]
    spec = spec_of(project, {"p0": "ok", "p1": "ok"}, marker, cpus={"p0": (a,), "p1": (b,)})
    Job.start(spec).wait(timeout=20)
    assert f"cpus [{a}]" in (spec.run_dir / "logs" / "p0.log").read_text()
    assert f"cpus [{b}]" in (spec.run_dir / "logs" / "p1.log").read_text()


def test_cpus_outside_the_machine_are_refused(project, marker):
    spec = spec_of(project, {"p0": "ok"}, marker, cpus={"p0": (4096,)})
    with pytest.raises(ConfigError, match="4096"):
        Job.start(spec)
    assert not spec.run_dir.exists()


def test_workers_outlive_the_thread_that_started_them(project, marker):
    jobs = []
    starter = threading.Thread(
        target=lambda: jobs.append(Job.start(spec_of(project, {"s": "sleep"}, marker)))
    )
    starter.start()
    starter.join(timeout=10)
    assert not starter.is_alive() and jobs
    job = jobs[0]
    # With the death signal tied to the forking thread, the worker would be killed now.
    time.sleep(0.5)
    assert job.status()["s"].state in ("starting", "running")
    assert job.stop().workers["s"].state == "stopped"


def test_status_progress_timeout_stop_and_context_manager(project, marker):
    steps = {"a": 7}
    spec = spec_of(project, {"a": "sleep", "b": "sleep"}, marker)
    with Job.start(spec, progress_fn=steps.get) as job:
        assert wait_until(lambda: job.status()["b"].state == "running", 10)
        status = job.status()
        assert (status["a"].state, status["a"].current_step) == ("running", 7)
        assert status["b"].current_step is None and status["b"].pid == job.pids["b"]
        with pytest.raises(JobTimeoutError, match="still running"):
            job.wait(timeout=0.3)
        assert job.state == "running" and not job.done
        pids = list(job.pids.values())
    assert all(not alive(p) for p in pids)
    assert job.state == "stopped" and job.stop().state == "stopped"  # idempotent
    assert {s.state for s in job.status().values()} == {"stopped"}


def test_service_workers_are_ended_when_the_others_finish(project, marker):
    run_dir = project / "runs" / "svc"
    main = WorkerSpec(
        "chief", (PY, "worker.py", "ok", marker), {}, project, log_path(run_dir, "chief")
    )
    ps = WorkerSpec(
        "ps-0",
        (PY, "worker.py", "sleep", marker),
        {},
        project,
        log_path(run_dir, "ps-0"),
        service=True,
    )
    done = []
    job = Job.start(JobSpec("svc", run_dir, (main, ps)))
    job.add_done_callback(done.append)
    result = job.wait(timeout=20)
    assert result.state == "finished"
    assert {n: s.state for n, s in result.workers.items()} == {
        "chief": "finished",
        "ps-0": "stopped",
    }
    assert done == [result]


def test_list_runs_marks_lost_and_unreadable_runs(tmp_path):
    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait(timeout=10)
    for run_id, launcher in (
        ("20260101-000000.000-a", os.getpid()),
        ("20260101-000001.000-b", gone.pid),
    ):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "job.json").write_text(
            json.dumps(
                {
                    "run_id": run_id,
                    "state": "running",
                    "host": socket.gethostname(),
                    "launcher_pid": launcher,
                    "workers": [{"name": "worker-0"}],
                }
            )
        )
    (tmp_path / "20260101-000002.000-c").mkdir()
    (tmp_path / "20260101-000002.000-c" / "job.json").write_text("{not json")
    (tmp_path / "not-a-run").mkdir()
    runs = list_runs(tmp_path)
    assert [(r.run_id, r.state) for r in runs] == [
        ("20260101-000000.000-a", "running"),
        ("20260101-000001.000-b", "lost"),
        ("20260101-000002.000-c", "unreadable"),
    ]
    assert "job.json" in runs[2].error
    assert "20260101-000001.000-b  lost" in runs_table(runs)


def test_tail_reads_only_the_last_lines_of_a_big_log(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert tail(log, 3) == "line 99997\nline 99998\nline 99999"
    assert tail(log, 0) == ""


def test_a_broken_progress_hook_warns_once_and_the_job_goes_on(project, marker):
    def broken(name: str) -> int:
        raise KeyError(name)

    with pytest.warns(RuntimeWarning, match="progress_fn raised KeyError"):
        job = Job.start(spec_of(project, {"a": "sleep"}, marker), progress_fn=broken)
    with job:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # only the first failure warns
            status = job.status()
        assert status["a"].current_step is None and status["a"].exit_code is None
    assert job.state == "stopped"
