"""Multi-host tier: two namespaced hosts on this machine, each running sshd with test keys.

Needs root, iproute2 (`ip`) and openssh-server/-client; skipped with the reason otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import pwd
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from harness.hosts import links, sshd_hosts
from harness.procutil import alive, wait_until

from ddlkit.errors import ConfigError
from ddlkit.hosts import netns, sshd
from ddlkit.hosts.preflight import check_hosts
from ddlkit.hosts.ssh import (
    HostError,
    SshOptions,
    remote_argv,
    run_on,
    ssh_argv,
    write_ssh_shim,
)

_WHY = netns.unavailable(try_it=True) or sshd.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_WHY), reason=_WHY or "")]

NS_PROBE = "import os, sys; print(os.readlink('/proc/self/ns/net'), sys.argv[1:])"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sshd_hosts(2, tmp_path_factory.mktemp("sshd")) as c:
        yield c


def test_ssh_runs_argv_inside_each_host(cluster):
    mine = os.readlink("/proc/self/ns/net")
    seen = set()
    for host, pid in zip(cluster.hosts, cluster.pids, strict=True):
        argv = [sys.executable, "-c", NS_PROBE, "a b", "$HOME;x"]
        done = run_on(host.address, argv, cluster.options, timeout=60)
        assert done.returncode == 0, done.stderr
        ns, args = done.stdout.strip().split(" ", 1)
        assert ns == os.readlink(f"/proc/{pid}/ns/net") != mine  # ran in that host's namespace
        assert args == "['a b', '$HOME;x']"  # arguments arrive as given, unexpanded
        # each host resolves the machine's hostname to its own address (Gloo relies on it)
        resolve = "import socket; print(socket.gethostbyname(socket.gethostname()))"
        named = run_on(host.address, [sys.executable, "-c", resolve], cluster.options, timeout=60)
        assert named.stdout.strip() == host.address
        seen.add(ns)
    assert len(seen) == 2
    # the program's own exit status comes back; ssh failures raise, naming host and fix
    first = cluster.addresses[0]
    exit3 = run_on(first, [sys.executable, "-c", "exit(3)"], cluster.options, timeout=60)
    assert exit3.returncode == 3
    with pytest.raises(HostError, match=f"no /nonexistent/x on {cluster.addresses[0]}") as info:
        run_on(cluster.addresses[0], ["/nonexistent/x"], cluster.options, timeout=60)
    assert info.value.reachable and info.value.hosts == (cluster.addresses[0],)


def test_preflight_reports_both_hosts_ok(cluster):
    report = check_hosts(cluster.addresses, cluster.options, ports=[29500, 29501])
    assert report.ok, str(report)
    for row in report.rows:
        assert row.python == platform.python_version()
        assert row.tensorflow == metadata.version("tensorflow")
        assert row.free_ports == (29500, 29501) and row.busy_ports == ()
    html = report._repr_html_()
    assert all(a in html for a in cluster.addresses) and "<table>" in html
    report.raise_for_failures()  # nothing to raise


def test_preflight_names_a_busy_port_and_its_host(cluster):
    # sshd listens on port 22 of each host's address: binding it is refused there
    report = check_hosts(cluster.addresses[:1], cluster.options, ports=[22, 29500])
    row = report.rows[0]
    assert not report.ok and row.reachable
    assert row.busy_ports == (22,) and row.free_ports == (29500,)
    assert "22" in row.problem and cluster.addresses[0] in row.problem


def test_auth_failure_names_host_and_fix(cluster, tmp_path):
    wrong = tmp_path / "wrong_key"
    subprocess.run(sshd.keygen_argv(wrong, "wrong"), check=True, capture_output=True)
    options = dataclasses.replace(cluster.options, identity=str(wrong))
    start = time.monotonic()
    report = check_hosts(cluster.addresses, options)
    assert time.monotonic() - start < 60
    for row, address in zip(report.rows, cluster.addresses, strict=True):
        assert "authentication failed" in row.problem and address in row.problem
        assert "identity" in row.fix
    with pytest.raises(HostError) as info:
        report.raise_for_failures()
    assert info.value.hosts == tuple(cluster.addresses)


def test_missing_environment_names_the_python_path(cluster):
    report = check_hosts(cluster.addresses[:1], cluster.options, python="/nonexistent/bin/python")
    row = report.rows[0]
    assert not row.ok and row.reachable
    assert f"no /nonexistent/bin/python on {cluster.addresses[0]}" in row.problem
    assert "venv" in row.fix


def test_python_without_tensorflow_is_a_missing_environment(cluster, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    report = check_hosts(cluster.addresses[:1], cluster.options, python=str(bare / "bin/python"))
    row = report.rows[0]
    assert row.python == platform.python_version() and row.tensorflow is None
    assert "TensorFlow is not installed" in row.problem and cluster.addresses[0] in row.problem


def test_unused_address_is_unreachable_within_bounded_time(cluster):
    unused = cluster.addresses[0].rsplit(".", 1)[0] + ".99"
    options = dataclasses.replace(cluster.options, connect_timeout=3)
    start = time.monotonic()
    report = check_hosts([unused], options)
    assert time.monotonic() - start < 30
    assert not report.rows[0].reachable and f"{unused} is unreachable" in report.rows[0].problem


def test_a_host_that_never_answers_is_cut_off_at_the_timeout(cluster):
    host = cluster.hosts[0]
    # a TCP listener that accepts and never speaks SSH
    silent = f"import socket, time; s = socket.create_server(({host.address!r}, 2200)); "
    silent += "c = s.accept(); time.sleep(600)"
    listener = subprocess.Popen(host.exec_argv([sys.executable, "-c", silent]))
    listening = host.exec_argv(["ss", "-Hltn", "sport", "= :2200"])
    try:
        assert wait_until(
            lambda: subprocess.run(listening, capture_output=True, text=True).stdout.strip(),
            timeout=30,
        )
        options = dataclasses.replace(cluster.options, port=2200, connect_timeout=30)
        start = time.monotonic()
        report = check_hosts([host.address], options, timeout=4)
        assert time.monotonic() - start < 30
        row = report.rows[0]
        assert not row.reachable
        assert f"{host.address} did not answer over SSH within 4 s" in row.problem
    finally:
        listener.kill()
        listener.wait()


def test_names_in_use_are_refused_and_left_alone(cluster):
    tag = cluster.hosts[0].name[4:-2]
    with pytest.raises(ConfigError, match="already exist"):
        with netns.namespaced_hosts(1, tag=tag):
            pass
    with pytest.raises(ConfigError, match="in use"):
        with netns.namespaced_hosts(1, subnet=int(cluster.addresses[0].split(".")[2])):
            pass
    assert check_hosts(cluster.addresses, cluster.options).ok  # the cluster still works


def test_refuses_bad_host_lists(tmp_path):
    with pytest.raises(ConfigError, match="no SSH key"):
        check_hosts(["10.213.0.1"], SshOptions(identity=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match="twice"):
        check_hosts(["10.213.0.1", "10.213.0.1"])
    with pytest.raises(ConfigError, match="not a host"):
        check_hosts(["-oProxyCommand=x"])


# a command that reports its env and cwd, leaves a grandchild, then runs for 10 minutes
WORKER = (
    "import os, subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(os.environ['DDLK_MARK'], os.getcwd(), flush=True); time.sleep(600)"
)


def _start_worker(cluster, host, cwd, **opts):
    """A watched worker on ``host`` over SSH; its stdin pipe keeps it alive."""
    argv = remote_argv(
        [sys.executable, "-c", WORKER], python=sys.executable, env={"DDLK_MARK": "m 1"}, cwd=cwd
    )
    session = subprocess.Popen(
        ssh_argv(host.address, argv, dataclasses.replace(cluster.options, **opts)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert session.stdout.readline() == f"m 1 {cwd}\n"  # env and cwd arrived
    assert wait_until(lambda: len(netns.pids_in(host)) >= 5, timeout=30)
    return session


def _only_sshd_left(cluster, host) -> bool:
    return set(netns.pids_in(host)) == {cluster.pids[cluster.hosts.index(host)]}


def test_killing_the_local_ssh_ends_the_remote_worker_and_its_children(cluster, tmp_path):
    host = cluster.hosts[0]
    session = _start_worker(cluster, host, str(tmp_path))
    session.kill()  # as a crashed launcher: nothing is sent to the host
    session.communicate()
    assert wait_until(lambda: _only_sshd_left(cluster, host), timeout=30)


def test_cut_link_mid_run_ends_the_session_then_host_is_unreachable(cluster, tmp_path):
    host = cluster.hosts[1]
    session = _start_worker(cluster, host, str(tmp_path), alive_interval=1, alive_count=3)
    try:
        netns.cut_link(host)
        start = time.monotonic()
        session.wait(timeout=60)  # ServerAlive ends it after ~3 s of silence
        assert session.returncode == 255 and time.monotonic() - start < 60
        # sshd's ClientAlive drops the session on the host too: the watchdog ends the worker
        assert wait_until(lambda: _only_sshd_left(cluster, host), timeout=60)
        report = check_hosts(
            cluster.addresses, dataclasses.replace(cluster.options, connect_timeout=3)
        )
        ok, cut = report.rows
        assert ok.ok and not cut.reachable and host.address in cut.problem
    finally:
        if session.poll() is None:
            session.kill()
        session.communicate()
        netns.restore_link(host)
    assert check_hosts(cluster.addresses, cluster.options).ok  # back, routes too
    routes = subprocess.run(host.exec_argv(["ip", "route"]), capture_output=True, text=True)
    assert all(f"{a} via {host.gateway}" in routes.stdout for a in netns.launcher_addresses())


def test_hosts_and_sshd_are_gone_after_exit_also_on_error(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with (
            netns.namespaced_hosts(1) as hosts,
            sshd.running_sshd(hosts, tmp_path) as c,
        ):
            stray = subprocess.Popen(
                hosts[0].exec_argv([sys.executable, "-c", "import time; time.sleep(600)"])
            )
            names = [h.name for h in hosts]
            pids = [*c.pids, stray.pid]
            assert wait_until(lambda: len(netns.pids_in(hosts[0])) >= 2, timeout=30)
            inside = netns.pids_in(hosts[0])
            raise RuntimeError("boom")
    stray.wait(timeout=30)
    assert not set(names) & set(netns.existing())
    assert wait_until(lambda: not any(alive(p) for p in [*pids, *inside]), timeout=30)
    assert f"dk{names[0][4:-2]}" not in links()  # bridge and veth ends are gone


MWMS_SMOKE = """\
import json, os
import tensorflow as tf
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(index + 1.0)), axis=None)
print("sum", float(total), flush=True)
"""


def test_two_host_mwms_all_reduce_over_ssh(cluster, tmp_path):
    """Two TensorFlow workers, one per namespaced host, started over SSH, all-reduce over gRPC."""
    port = 29650
    assert check_hosts(cluster.addresses, cluster.options, ports=[port]).ok
    script = tmp_path / "smoke.py"
    script.write_text(MWMS_SMOKE)
    workers = [f"{a}:{port}" for a in cluster.addresses]
    sessions, logs = [], []
    try:
        for index, host in enumerate(cluster.hosts):
            tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            env = {
                "TF_CONFIG": json.dumps(tf_config),
                "CUDA_VISIBLE_DEVICES": "",
                "TF_CPP_MIN_LOG_LEVEL": "2",
            }
            argv = remote_argv(
                [sys.executable, str(script)], python=sys.executable, env=env, cwd=str(tmp_path)
            )
            # the worker's output comes back over SSH into a local log; stdin stays open
            logs.append(tmp_path / f"worker-{index}.log")
            with logs[-1].open("w") as log:
                sessions.append(
                    subprocess.Popen(
                        ssh_argv(host.address, argv, cluster.options),
                        stdin=subprocess.PIPE,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        for s, log in zip(sessions, logs, strict=True):
            assert s.wait(timeout=300) == 0, log.read_text()[-2000:]
            assert log.read_text().strip().splitlines()[-1] == "sum 3.0"
    finally:
        for s in sessions:
            if s.poll() is None:
                s.kill()
            s.wait()
            s.stdin.close()
    for host in cluster.hosts:
        assert wait_until(lambda h=host: _only_sshd_left(cluster, h), timeout=30)


HVD_SMOKE = """\
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant(hvd.rank() + 1.0), op=hvd.Sum)
print("rank", hvd.rank(), "sum", float(total), flush=True)
"""


@pytest.mark.skipif(
    shutil.which("horovodrun", path=os.path.dirname(sys.executable)) is None,
    reason="no horovodrun in the venv: make horovod (scripts/build-horovod.sh)",
)
def test_two_host_horovodrun_through_the_ssh_shim(cluster, tmp_path):
    """horovodrun -H across both hosts; its ssh calls go through our BatchMode options."""
    known = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"
    before = known.read_bytes() if known.exists() else None
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    write_ssh_shim(shim_dir, cluster.options)
    script = tmp_path / "hvd_smoke.py"
    script.write_text(HVD_SMOKE)
    venv_bin = os.path.dirname(sys.executable)
    env = dict(
        os.environ,
        PATH=f"{shim_dir}:{venv_bin}:{os.environ['PATH']}",
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    hosts = ",".join(f"{a}:1" for a in cluster.addresses)
    argv = [f"{venv_bin}/horovodrun", "-np", "2", "-H", hosts, "--gloo"]
    argv += ["--network-interface", "eth0", "--start-timeout", "60", sys.executable, str(script)]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} sum 3.0" in done.stdout
    # our options came first: strict checking against the test's known_hosts, none added
    assert (known.read_bytes() if known.exists() else None) == before
    for host in cluster.hosts:
        assert wait_until(lambda h=host: _only_sshd_left(cluster, h), timeout=30)
