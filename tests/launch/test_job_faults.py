"""Faults with real processes: killed workers, killed or interrupted launchers, no orphans."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from harness.procutil import alive, marked_pids, wait_until

from ddlkit.errors import ConfigError, WorkerFailedError
from ddlkit.launch import Job, JobSpec, WorkerSpec, log_path

PY = sys.executable
SLEEPER = "import sys, time; print('up', sys.argv[1], flush=True); time.sleep(60)"
# A worker that starts a grandchild in its own process group, then sleeps.
PARENT = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', sys.argv[1]]); "
    "print('up', flush=True); time.sleep(60)"
)

LAUNCHER = """\
import json, os, sys, time
from pathlib import Path
from ddlkit.launch import Job, JobSpec, WorkerSpec, log_path

mode, run_dir, marker = sys.argv[1], Path(sys.argv[2]), os.environ["MARKER"]
code = "import sys, time; print('up', sys.argv[1], flush=True); time.sleep(60)"
workers = tuple(
    WorkerSpec(name, (sys.executable, "-c", code, marker), {}, run_dir.parent.parent,
               log_path(run_dir, name))
    for name in ("worker-0", "worker-1")
)
job = Job.start(JobSpec(run_dir.name, run_dir, workers))
print(json.dumps(job.pids), flush=True)
if mode == "wait":
    try:
        job.wait()
    except KeyboardInterrupt:  # report the states before the atexit hook could act
        print(json.dumps({n: s.state for n, s in job.status().items()}), flush=True)
        raise
elif mode == "sleep":
    time.sleep(60)
# mode "exit": return at once; the atexit hook must stop the job
"""


@pytest.fixture
def marker() -> str:
    token = f"ddlkit-fault-{uuid.uuid4().hex}"
    yield token
    leftover = marked_pids(token)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"test left processes running: {leftover}"


def job_spec(tmp_path: Path, codes: dict[str, str], marker: str) -> JobSpec:
    run_dir = tmp_path / "runs" / "r1"
    workers = tuple(
        WorkerSpec(name, (PY, "-c", code, marker), {}, tmp_path, log_path(run_dir, name))
        for name, code in codes.items()
    )
    return JobSpec("r1", run_dir, workers)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of ``proc``'s stdout, waiting at most ``timeout`` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"launcher printed nothing in {timeout} s; stderr: {proc.stderr.read1()!r}"
    line = proc.stdout.readline().decode()
    assert line, f"launcher ended early; stderr: {proc.stderr.read()!r}"
    return line


@pytest.fixture
def launcher(tmp_path: Path, marker: str):
    """Start the launcher script in ``mode``; yields (process, worker pids, run dir)."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    procs = []

    def start(mode: str):
        run_dir = tmp_path / "runs" / mode
        proc = subprocess.Popen(
            [PY, str(script), mode, str(run_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "MARKER": marker},  # not in argv: only workers carry it
        )
        procs.append(proc)
        pids = json.loads(read_line(proc, timeout=20))
        if mode != "exit":
            assert wait_until(lambda: sorted(marked_pids(marker)) == sorted(pids.values()), 10)
        return proc, pids, run_dir

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def test_worker_killed_from_outside_tears_the_job_down(tmp_path, marker):
    job = Job.start(job_spec(tmp_path, {"victim": SLEEPER, "parent": PARENT}, marker))
    # the victim, the parent worker and its grandchild all carry the marker
    assert wait_until(lambda: len(marked_pids(marker)) == 3, 10)
    victim_log = job.spec.worker("victim").log_path  # running is not printing yet: wait for it
    assert wait_until(lambda: f"up {marker}" in victim_log.read_text(), 10)
    os.kill(job.pids["victim"], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        job.wait(timeout=20)
    assert time.monotonic() - t0 < 5
    assert (info.value.worker, info.value.signal_name) == ("victim", "SIGKILL")
    assert "'victim'" in str(info.value) and "killed by SIGKILL" in str(info.value)
    assert f"up {marker}" in info.value.log_tail
    assert wait_until(lambda: marked_pids(marker) == [], 5), "grandchild or worker left running"
    assert {n: s.state for n, s in job.status().items()} == {
        "victim": "failed",
        "parent": "stopped",
    }


def test_stop_ends_the_whole_process_tree_of_a_worker(tmp_path, marker):
    with Job.start(job_spec(tmp_path, {"parent": PARENT}, marker)):
        assert wait_until(lambda: len(marked_pids(marker)) == 2, 10)
    # stop() SIGKILLs the group; a killed process leaves /proc once it is scheduled to exit
    assert wait_until(lambda: marked_pids(marker) == [], 5), "grandchild or worker left running"


def test_killed_launcher_takes_its_workers_along(launcher, marker):
    proc, pids, _ = launcher("sleep")
    proc.kill()
    proc.wait(timeout=10)
    assert wait_until(lambda: not any(alive(p) for p in pids.values()), 5)
    assert marked_pids(marker) == []


def test_interrupted_launcher_stops_workers_and_fails(launcher, marker):
    proc, pids, run_dir = launcher("wait")
    time.sleep(0.5)  # let the launcher get from print() into job.wait()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=10)
    assert time.monotonic() - t0 < 5
    assert code != 0
    assert json.loads(read_line(proc, timeout=1)) == {"worker-0": "stopped", "worker-1": "stopped"}
    assert b"KeyboardInterrupt" in proc.stderr.read()
    assert marked_pids(marker) == []
    data = json.loads((run_dir / "job.json").read_text())
    assert data["state"] == "stopped"
    assert {w["state"] for w in data["workers"]} == {"stopped"}


def test_launcher_exiting_normally_stops_its_jobs(launcher, marker):
    proc, pids, run_dir = launcher("exit")
    assert proc.wait(timeout=10) == 0
    assert marked_pids(marker) == []
    data = json.loads((run_dir / "job.json").read_text())
    assert [w["signal"] for w in data["workers"]] == ["SIGTERM", "SIGTERM"]
    assert data["state"] == "stopped"


KERNEL_CELL = """\
import json, sys
from pathlib import Path
from ddlkit.launch import Job, JobSpec, WorkerSpec, log_path
run_dir = Path({run_dir!r})
code = "import time; time.sleep(60)"
job = Job.start(JobSpec(run_dir.name, run_dir, tuple(
    WorkerSpec(n, (sys.executable, "-c", code, {marker!r}), {{}}, run_dir.parent.parent,
               log_path(run_dir, n))
    for n in ("worker-0", "worker-1"))))
print(json.dumps(job.pids))
"""


@pytest.mark.slow
def test_kernel_interrupt_and_restart_leave_no_workers(tmp_path, marker):
    manager = pytest.importorskip("jupyter_client.manager", reason="needs the lab extra")
    km, kc = manager.start_new_kernel(kernel_name="python3", startup_timeout=60)

    def output(msg_id: str, timeout: float = 30) -> str:
        """What cell ``msg_id`` printed, once the kernel is idle again (bounded by ``timeout``)."""
        out, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
        raise AssertionError(f"kernel did not finish a cell in {timeout} s")

    def start(name: str) -> dict[str, int]:
        cell = KERNEL_CELL.format(run_dir=str(tmp_path / "runs" / name), marker=marker)
        return json.loads(output(kc.execute(cell)))

    try:
        pids = start("interrupted")
        waiting = kc.execute("job.wait()")
        time.sleep(1.0)  # let the cell get into job.wait()
        t0 = time.monotonic()
        km.interrupt_kernel()
        output(waiting)  # the KeyboardInterrupt ends the cell
        assert wait_until(lambda: not any(alive(p) for p in pids.values()), 5)
        assert time.monotonic() - t0 < 5
        job_file = tmp_path / "runs" / "interrupted" / "job.json"
        assert wait_until(lambda: json.loads(job_file.read_text())["state"] == "stopped", 5)

        pids = start("restarted")
        km.restart_kernel(now=True)  # the kernel is killed: the death signal must act
        assert wait_until(lambda: not any(alive(p) for p in pids.values()), 5)
        assert marked_pids(marker) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kill_stops_the_job_and_names_the_deliberate_kill(tmp_path, marker):
    spec = job_spec(tmp_path, {"worker-0": SLEEPER, "worker-1": SLEEPER}, marker)
    job = Job.start(spec)
    assert wait_until(lambda: "up" in job.tail("worker-1"), timeout=10)
    job.kill("worker-1")
    with pytest.raises(WorkerFailedError) as info:
        job.wait(timeout=10)
    assert info.value.worker == "worker-1" and info.value.signal_name == "SIGKILL"
    assert "sent by Job.kill" in str(info.value)
    assert not alive(job.pids["worker-0"])


def test_losing_an_expendable_worker_does_not_stop_the_job(tmp_path, marker):
    run_dir = tmp_path / "runs" / "r1"
    finisher = "import sys, time; print('up', sys.argv[1], flush=True); time.sleep(2)"

    def worker(name: str, code: str, **flags: bool) -> WorkerSpec:
        return WorkerSpec(
            name, (PY, "-c", code, marker), {}, tmp_path, log_path(run_dir, name), **flags
        )

    workers = (
        worker("chief", finisher),
        worker("worker-0", SLEEPER, service=True, expendable=True),
        worker("worker-1", SLEEPER, service=True, expendable=True),
    )
    job = Job.start(JobSpec("r1", run_dir, workers))
    assert wait_until(lambda: "up" in job.tail("worker-0"), timeout=10)
    job.kill("worker-0")
    result = job.wait(timeout=20)  # the chief finishes; the job ends the other worker
    assert result.state == "finished"
    states = {n: s.state for n, s in result.workers.items()}
    assert states == {"chief": "finished", "worker-0": "failed", "worker-1": "stopped"}
    assert result.workers["worker-0"].signal == "SIGKILL"


def test_losing_every_expendable_worker_fails_the_job(tmp_path, marker):
    run_dir = tmp_path / "runs" / "r1"
    workers = tuple(
        WorkerSpec(
            name,
            (PY, "-c", SLEEPER, marker),
            {},
            tmp_path,
            log_path(run_dir, name),
            service=name != "chief",
            expendable=name != "chief",
        )
        for name in ("chief", "worker-0", "worker-1")
    )
    job = Job.start(JobSpec("r1", run_dir, workers))
    assert wait_until(lambda: "up" in job.tail("worker-1"), timeout=10)
    job.kill("worker-0")
    time.sleep(0.5)
    assert job.state == "running"  # one worker left: the job goes on
    job.kill("worker-1")
    with pytest.raises(WorkerFailedError) as info:
        job.wait(timeout=10)
    assert "last of the workers the job could lose" in str(info.value)
    assert not alive(job.pids["chief"])


def test_kill_of_an_unknown_or_ended_worker_is_a_clear_error(tmp_path, marker):
    quick = "import sys; print('up', sys.argv[1])"
    spec = job_spec(tmp_path, {"worker-0": quick, "worker-1": SLEEPER}, marker)
    job = Job.start(spec)
    try:
        with pytest.raises(ConfigError, match="no worker named 'worker-9'"):
            job.kill("worker-9")
        assert wait_until(lambda: job.status()["worker-0"].exit_code is not None, timeout=10)
        with pytest.raises(ConfigError, match="already ended"):
            job.kill("worker-0")
    finally:
        job.stop()
