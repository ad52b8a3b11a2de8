"""dk.launch across hosts over SSH: two namespaced hosts on this machine, each running sshd.

One module-scoped demo cluster (`ddlkit.hosts.demo_cluster`) serves every test. Needs root,
iproute2 and openssh-server/-client; skipped with the reason otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.hosts import demo_hosts
from harness.procutil import alive, wait_until

from ddlkit import hosts
from ddlkit.errors import WorkerFailedError
from ddlkit.hosts import demo, netns, sshd
from ddlkit.hosts.ssh import HostError
from ddlkit.launch import job as job_mod
from ddlkit.launch import remote
from ddlkit.launch import run as run_mod
from ddlkit.metrics import load_run
from ddlkit.where import Hosts

_WHY = demo.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_WHY), reason=_WHY or "")]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "launch" / "train_multi_worker.py"
HOROVOD = ROOT / "launch" / "train_horovod.py"
PS = ROOT / "launch" / "train_parameter_server.py"
REPORT = ROOT / "launch" / "report_tf_config.py"


@pytest.fixture(scope="module")
def cluster():
    with demo_hosts(2) as c:
        yield c


def _nothing_left(cluster, run=None, timeout: float = 30, keep=()) -> None:
    """No process but sshd (and ``keep``) on either host, and no local ssh of ``run`` alive."""

    def others(i):
        return set(cluster.processes(i)) - set(keep)

    for i, address in enumerate(cluster.addresses):
        assert wait_until(lambda i=i: not others(i), timeout=timeout), (
            f"left running on {address}: {others(i)}"
        )
    if run is not None:
        assert not [p for p in run.job.pids.values() if alive(p)]


WHERE = {f.name for f in dataclasses.fields(Hosts)}


def _start(cluster, tmp_path, script=TRAIN, **kw):
    """Start ``script`` on the cluster's hosts; the keywords of `Hosts` change where."""
    changed = {k: kw.pop(k) for k in list(kw) if k in WHERE}
    where = dataclasses.replace(Hosts.demo(cluster), **changed)
    return run_mod.start(script, runs_dir=tmp_path, where=where, **kw)


# -- bad input: one HostError naming host and fix, within a bounded time, nothing started --


def _refused(cluster, tmp_path, match: str, keep=(), **kw) -> HostError:
    start = time.monotonic()
    with pytest.raises(HostError, match=match) as err:
        _start(cluster, tmp_path, workers=2, **kw)
    assert time.monotonic() - start < 60
    assert not any(tmp_path.iterdir()), "a run directory was made: something started"
    _nothing_left(cluster, keep=keep)
    return err.value


def test_wrong_key_is_an_authentication_failure_naming_both_hosts(cluster, tmp_path):
    wrong = tmp_path.parent / f"{tmp_path.name}-key"
    subprocess.run(sshd.keygen_argv(wrong, "wrong"), check=True, capture_output=True)
    err = _refused(
        cluster,
        tmp_path,
        "SSH authentication failed",
        ssh=dataclasses.replace(cluster.ssh, identity=str(wrong)),
    )
    assert err.hosts == tuple(cluster.addresses) and "identity" in str(err)


def test_an_address_without_sshd_is_unreachable(cluster, tmp_path):
    unused = cluster.addresses[0].rsplit(".", 1)[0] + ".77"
    err = _refused(
        cluster,
        tmp_path,
        f"{unused} is unreachable",
        hosts=f"{unused}:1,{cluster.addresses[1]}:1",
        ssh=dataclasses.replace(cluster.ssh, connect_timeout=3),
    )
    assert err.hosts == (unused,) and "sshd listens" in str(err)


def test_a_host_without_the_kits_python_is_a_missing_environment(cluster, tmp_path):
    err = _refused(
        cluster, tmp_path, "no /nonexistent/bin/python on", python="/nonexistent/bin/python"
    )
    assert err.hosts == tuple(cluster.addresses) and "venv at the same path" in str(err)


def test_a_busy_port_on_one_host_names_that_host(cluster, tmp_path):
    host = cluster.hosts[1]
    port = 29777
    hold = f"import socket, time; s = socket.create_server(('', {port})); time.sleep(600)"
    listener = subprocess.Popen(host.exec_argv([sys.executable, "-c", hold]))
    listening = host.exec_argv(["ss", "-Hltn", "sport", f"= :{port}"])
    try:
        assert wait_until(
            lambda: subprocess.run(listening, capture_output=True, text=True).stdout.strip(),
            timeout=30,
        )
        err = _refused(
            cluster,
            tmp_path,
            f"port\\(s\\) {port} already in use",
            keep=[listener.pid],
            base_port=port,
        )
        assert err.hosts == (host.address,)
    finally:
        listener.kill()
        listener.wait()


def test_cli_bad_hosts_exit_2_with_one_line(cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{a} slots=1\n" for a in cluster.addresses))
    wrong = tmp_path / "wrong"
    subprocess.run(sshd.keygen_argv(wrong, "wrong"), check=True, capture_output=True)
    argv = [sys.executable, "-m", "ddlkit.cli", "launch", "-n", "2", "--hostfile", str(hostfile)]
    argv += ["--ssh-identity", str(wrong), "--ssh-known-hosts", cluster.ssh.known_hosts]
    argv += ["--collector-host", "auto", "--runs-dir", str(tmp_path / "runs"), str(TRAIN)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SSH authentication failed" in lines[0]
    assert all(a in lines[0] for a in cluster.addresses)
    assert not (tmp_path / "runs").exists()
    missing = [*argv[:-1], "--ssh-identity", str(tmp_path / "none"), str(TRAIN)]
    done = subprocess.run(missing, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "no SSH key at" in done.stderr


# -- real jobs across the two hosts ----------------------------------------------------------


def test_cli_launch_across_hosts_from_a_hostfile(cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the demo cluster\n" + "".join(f"{a}\n" for a in cluster.addresses))
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "ddlkit.cli", "launch", "-n", "2", "--hostfile", str(hostfile)]
    argv += ["--ssh-identity", cluster.ssh.identity, "--ssh-known-hosts", cluster.ssh.known_hosts]
    argv += ["--collector-host", "auto", "--runs-dir", str(runs), str(REPORT)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preflight" in done.stdout and all(a in done.stdout for a in cluster.addresses)
    (run_dir,) = runs.iterdir()
    for index in range(len(cluster.addresses)):
        log = (run_dir / "logs" / f"worker-{index}.log").read_text()
        report = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
        assert report["cluster"]["worker"] == [f"{a}:29600" for a in cluster.addresses]
        assert (report["task_type"], report["task_id"]) == ("worker", index)
        assert report["cwd"] == str(run_dir / "work" / f"worker-{index}")
    _nothing_left(cluster)


def test_collector_auto_is_the_launchers_address_on_the_hosts_network(cluster):
    assert remote.address_towards(cluster.addresses) == cluster.collector_host
    assert cluster.collector_host == cluster.hosts[0].gateway


def test_two_host_multi_worker_run_streams_records_and_brings_logs_back(cluster, tmp_path):
    run = _start(
        cluster,
        tmp_path,
        workers=2,
        args=["--steps-per-epoch", "12", "--epochs", "1"],
        collector_host="auto",
    )
    try:
        assert run.preflight.ok and [r.host for r in run.preflight.rows] == cluster.addresses
        # TF servers bound to the hosts' own addresses: they can only run inside those hosts
        assert [t.host for t in run.cluster.tasks] == cluster.addresses
        assert run.collector.host == cluster.collector_host
        shown = run._repr_html_()  # config, what the hosts answered, the cluster, the workers
        assert "preflight" in shown and "not pinned on other hosts" in shown
        assert all(a in shown for a in cluster.addresses)
        result = run.wait(timeout=300)
    finally:
        run.stop()
    assert result.ok
    on_disk = load_run(run.run_dir)
    for worker in ("worker-0", "worker-1"):
        live = run.records(worker)  # sent over TCP from the host to the collector here
        steps = [r for r in live if r.kind == "step"]
        assert len(steps) == 12, worker
        assert live == [r for r in on_disk if r.worker == worker]
        log = run.run_dir / "logs" / f"{worker}.log"
        assert "RESULT {" in log.read_text()  # the worker's output, back over SSH
    results = run.results()
    assert results["worker-0"]["test_accuracy"] == results["worker-1"]["test_accuracy"]
    _nothing_left(cluster, run)


def test_mirrored_runs_as_one_process_on_the_host_it_is_given(cluster, tmp_path):
    mirrored = ROOT / "launch" / "train_mirrored.py"
    host = cluster.addresses[1]
    run = _start(
        cluster,
        tmp_path,
        script=mirrored,
        strategy="mirrored",
        workers=2,
        hosts=f"{host}:1",
        args=["--steps-per-epoch", "6", "--epochs", "1"],
    )
    try:
        assert [r.host for r in run.preflight.rows] == [host]
        assert run.job.spec.workers[0].host == host
        result = run.wait(timeout=300)
    finally:
        run.stop()
    assert result.ok, run.tail("main", 40)
    assert run.results()["main"]["replicas"] == 2
    assert len([r for r in run.records("main") if r.kind == "step"]) == 6
    assert "RESULT {" in (run.run_dir / "logs" / "main.log").read_text()
    _nothing_left(cluster, run)


def test_two_host_parameter_server_run_ends_its_remote_servers(cluster, tmp_path):
    run = _start(
        cluster,
        tmp_path,
        script=PS,
        strategy="parameter_server",
        workers=1,
        ps=1,
        hosts=f"{cluster.addresses[0]}:2,{cluster.addresses[1]}:1",
        args=["--steps-per-epoch", "20", "--report-every", "10"],
    )
    try:
        placed = {t.name: t.address for t in run.cluster.tasks}
        a0, a1 = cluster.addresses
        assert placed == {
            "chief-0": f"{a0}:29600",
            "ps-0": f"{a0}:29601",
            "worker-0": f"{a1}:29600",
        }
        result = run.wait(timeout=300)
    finally:
        run.stop()
    assert result.state == "finished", run.tail("chief-0", 40)
    states = {name: s.state for name, s in result.workers.items()}
    # the servers never end by themselves: the job ended them by closing their ssh's stdin
    assert states == {"chief-0": "finished", "ps-0": "stopped", "worker-0": "stopped"}
    assert run.results()["chief-0"]["steps"] == 20
    _nothing_left(cluster, run)


@pytest.mark.skipif(
    not os.path.exists(os.path.join(os.path.dirname(sys.executable), "horovodrun")),
    reason="no horovodrun in the venv: make horovod (scripts/build-horovod.sh)",
)
def test_two_host_horovod_run_through_launch(cluster, tmp_path):
    run = _start(
        cluster,
        tmp_path,
        script=HOROVOD,
        strategy="horovod",
        workers=2,
        args=["--steps-per-epoch", "8", "--epochs", "1"],
    )
    try:
        assert all(r.horovod for r in run.preflight.rows)
        argv = run.job.spec.workers[0].argv
        assert argv[argv.index("-H") + 1] == cluster.host_list()
        result = run.wait(timeout=300)
    finally:
        run.stop()
    assert result.ok, run.tail("horovodrun", 40)
    for rank in ("rank-0", "rank-1"):
        assert len([r for r in run.records(rank) if r.kind == "step"]) == 8, rank
    _nothing_left(cluster, run)


def test_heartbeats_keep_a_quiet_remote_worker_running_past_the_silence_limit(
    cluster, tmp_path, monkeypatch
):
    # The job beats every 2 s: three beats fit in the silence, so a beat delayed by a loaded
    # machine does not end the worker, and the worker stays quiet for twice the silence.
    monkeypatch.setattr(remote, "SILENCE", 6.0)
    quiet = tmp_path.parent / f"{tmp_path.name}-quiet.py"
    quiet.write_text("import time\ntime.sleep(12)\nprint('still here', flush=True)\n")
    run = _start(cluster, tmp_path, script=quiet, workers=1, live=False)
    try:
        on_host = shlex.split(_ssh_argv(run)[-1])  # the command ssh runs there
        assert on_host[on_host.index(str(quiet)) - 3 :][:2] == ["6.0", "1"]  # silence, stdin env
        result = run.wait(timeout=120)
    finally:
        run.stop()
    assert result.ok and "still here" in run.tail("worker-0")
    _nothing_left(cluster, run)


def test_a_remote_worker_whose_heartbeats_stop_is_ended_on_its_host(cluster, tmp_path, monkeypatch):
    """What a cut link does where sshd never notices: the launcher's beats stop arriving."""
    monkeypatch.setattr(remote, "SILENCE", 4.0)
    monkeypatch.setattr(job_mod, "HEARTBEAT_INTERVAL", 1000.0)  # one beat, then none
    quiet = tmp_path.parent / f"{tmp_path.name}-quiet.py"
    quiet.write_text("import time\ntime.sleep(60)\n")
    run = _start(cluster, tmp_path, script=quiet, workers=1, live=False)
    start = time.monotonic()
    with pytest.raises(WorkerFailedError, match="worker-0"):
        run.wait(timeout=60)
    assert time.monotonic() - start < 30
    _nothing_left(cluster, run)


def test_a_failing_remote_worker_is_reported_with_its_log_from_the_host(cluster, tmp_path):
    failing = tmp_path.parent / f"{tmp_path.name}-fails.py"
    failing.write_text(
        "import os, sys\n"
        "print('on', os.environ['DDLKIT_WORKER'], 'in', os.getcwd(), flush=True)\n"
        "sys.exit('grpc: Address already in use')\n"
    )
    run = _start(cluster, tmp_path, script=failing, workers=1, live=False)
    with pytest.raises(WorkerFailedError) as err:
        run.wait(timeout=60)
    message = str(err.value)
    assert err.value.exit_code == 1 and "exited with code 1" in message
    assert f"port was busy on {cluster.addresses[0]}" in message and "--base-port" in message
    assert f"on worker-0 in {run.run_dir / 'work' / 'worker-0'}" in err.value.log_tail
    _nothing_left(cluster, run)


def _ssh_argv(run) -> list[str]:
    with open(f"/proc/{run.job.pids['worker-0']}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def test_cut_link_mid_run_fails_the_job_within_a_bounded_time(cluster, tmp_path):
    # ssh notices a silent link after alive_interval x alive_count = 3 s
    ssh = dataclasses.replace(cluster.ssh, alive_interval=1, alive_count=3)
    run = _start(cluster, tmp_path, workers=2, args=["--steps-per-epoch", "100000"], ssh=ssh)
    try:
        assert wait_until(lambda: run.records("worker-1"), timeout=240), run.tail("worker-1")
        cluster.cut_link(1)
        cut_at = time.monotonic()
        with pytest.raises(WorkerFailedError) as err:
            run.wait(timeout=120)
        assert time.monotonic() - cut_at < 30
        message = str(err.value)
        assert err.value.worker == "worker-1", message
        assert f"lost its SSH session to {cluster.addresses[1]}" in message
        assert run.job.state == "failed"
        # sshd on the cut host drops the silent session (ClientAlive 2 s x 3): the watchdog
        # there ends the worker; the other host's worker was stopped by the job
        _nothing_left(cluster, run, timeout=60)
    finally:
        run.stop()
        cluster.restore_link(1)
    assert hosts.check_hosts(cluster.addresses, cluster.ssh).ok


@pytest.mark.skipif(
    not os.path.exists(os.path.join(os.path.dirname(sys.executable), "horovodrun")),
    reason="no horovodrun in the venv: make horovod (scripts/build-horovod.sh)",
)
def test_cut_link_mid_horovod_run_fails_the_job_within_a_bounded_time(cluster, tmp_path):
    ssh = dataclasses.replace(cluster.ssh, alive_interval=1, alive_count=3)  # horovodrun's too
    run = _start(
        cluster,
        tmp_path,
        script=HOROVOD,
        strategy="horovod",
        workers=2,
        args=["--steps-per-epoch", "100000"],
        ssh=ssh,
    )
    try:
        assert wait_until(lambda: run.records("rank-1"), timeout=240), run.tail("horovodrun")
        cluster.cut_link(1)
        cut_at = time.monotonic()
        with pytest.raises(WorkerFailedError, match="horovodrun"):
            run.wait(timeout=120)
        assert time.monotonic() - cut_at < 60
        _nothing_left(cluster, run, timeout=60)
    finally:
        run.stop()
        cluster.restore_link(1)
    assert hosts.check_hosts(cluster.addresses, cluster.ssh).ok


def test_a_started_demo_cluster_closes_once_and_leaves_nothing():
    """The notebook form (no `with` across cells): start, use, close; close twice is fine."""
    c = hosts.start_demo_cluster(1)
    try:
        names = [h.name for h in c.hosts]
        assert set(names) <= set(netns.existing())
        assert hosts.check_hosts(c.addresses, c.ssh).ok
        assert "demo cluster: 1 hosts" in str(c) and c.addresses[0] in c._repr_html_()
    finally:
        c.close()
    c.close()
    assert not set(names) & set(netns.existing())
    assert not any(alive(p) for p in c.sshd_pids)
