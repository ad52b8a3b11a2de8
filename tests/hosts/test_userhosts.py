"""User-mode demo hosts (no root): the plan as pure data, bad input, and real clusters.

- pure: addresses, ports, the sshd_config and ssh config texts, ssh options without ``-p``,
  TF server ports distinct across hosts that share one network stack;
- bad input: no sshd, a port in use: one clear error each, nothing started, nothing left;
- real (slow): a user-mode cluster reached by name with plain ``ssh`` and ddlkit; a host
  that stops answering (SIGSTOP) fails an MWMS job within the link-cut bounds; and, as an
  ordinary user (made here when the suite runs as root), a real 2-host training job.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harness.procutil import alive, wait_until
from harness.userhosts import user_env

from ddlkit import hosts
from ddlkit.cluster import ClusterSpec
from ddlkit.errors import ConfigError, MissingSystemPackageError, WorkerFailedError
from ddlkit.hosts import demo, drills, userhosts
from ddlkit.hosts.ssh import ssh_options_argv
from ddlkit.launch import run as run_mod
from ddlkit.where import Hosts

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "launch" / "train_multi_worker.py"
REPORT = ROOT / "launch" / "report_tf_config.py"
_WHY = demo.unavailable("user")
real = [pytest.mark.slow, pytest.mark.skipif(bool(_WHY), reason=_WHY or "")]


def _plan(tmp_path, n=2):
    return userhosts.plan(
        n, tmp_path, addresses=["127.0.0.5", "127.0.0.6"][:n], ports=[40001, 40002][:n],
        sshd="/usr/sbin/sshd", user="alice",
    )  # fmt: skip


# -- pure ---------------------------------------------------------------------------------


def test_the_plan_names_each_host_its_address_port_and_files(tmp_path):
    p = _plan(tmp_path)
    assert [(h.name, h.address, h.port) for h in p.hosts] == [
        ("host1", "127.0.0.5", 40001),
        ("host2", "127.0.0.6", 40002),
    ]
    text = p.sshd_config_text(p.hosts[1])
    for line in ("ListenAddress 127.0.0.6", "Port 40002", "UsePAM no", "StrictModes no"):
        assert line in text.splitlines()
    assert f"HostKey {tmp_path / 'host_ed25519'}" in text
    assert p.sshd_argv(p.hosts[0])[:3] == ["/usr/sbin/sshd", "-D", "-f"]
    config = p.ssh_config_text()
    block = config.split("\n\n")[1].splitlines()
    assert block[:4] == [
        "Host host2 127.0.0.6",
        "  HostName 127.0.0.6",
        "  Port 40002",
        "  User alice",
    ]
    assert f"  IdentityFile {tmp_path / 'client_ed25519'}" in block
    assert f"  UserKnownHostsFile {tmp_path / 'known_hosts'}" in block
    known = p.known_hosts_text("ssh-ed25519 AAAAkey comment\n")
    assert known.splitlines()[0] == "[127.0.0.5]:40001,[host1]:40001 ssh-ed25519 AAAAkey"


def test_options_leave_the_port_to_the_ssh_config(tmp_path):
    p = _plan(tmp_path)
    argv = ssh_options_argv(p.options())
    assert argv[:2] == ["-F", str(tmp_path / "ssh_config.options")] and "-p" not in argv
    assert "IdentityFile" not in p.ssh_config_text(identity=False)  # -i alone picks the key
    assert "-p" in ssh_options_argv(hosts.SshOptions())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"addresses": ["127.0.0.1", "127.0.0.2"]}, "127.0.0.1 is this machine"),
        ({"addresses": ["10.0.0.1", "127.0.0.2"]}, "loopback addresses"),
        ({"addresses": ["127.0.0.2", "127.0.0.2"]}, "repeat"),
        ({"ports": [22, 40002]}, "1024 to 65535"),
        ({"sshd": "sshd"}, "absolute path"),
        ({"n": 0}, "use 1 to"),
    ],
)
def test_a_bad_plan_is_one_config_error(tmp_path, kw, match):
    args = {"n": 2, "addresses": ["127.0.0.5", "127.0.0.6"], "ports": [40001, 40002]}
    args |= kw
    n = args.pop("n")
    if n == 0:
        args |= {"addresses": [], "ports": []}
    with pytest.raises(ConfigError, match=match):
        userhosts.plan(n, tmp_path, sshd=kw.get("sshd", "/usr/sbin/sshd"), user="a", **{
            k: v for k, v in args.items() if k != "sshd"
        })  # fmt: skip


def test_hosts_on_one_network_stack_get_ports_distinct_across_hosts():
    spec = ClusterSpec.from_hosts("127.0.0.2:2,127.0.0.3:1", workers=3, base_port=29600)
    assert [t.port for t in spec.tasks] == [29600, 29601, 29600]
    shared = ClusterSpec.from_hosts(
        "127.0.0.2:2,127.0.0.3:1", workers=3, base_port=29600, distinct_ports=True
    )
    assert [(t.host, t.port) for t in shared.tasks] == [
        ("127.0.0.2", 29600), ("127.0.0.2", 29601), ("127.0.0.3", 29602),
    ]  # fmt: skip


# -- bad input: one clear error, nothing started, nothing left ----------------------------


def _ours() -> set[str]:
    return set(glob.glob(f"{tempfile.gettempdir()}/ddlkit-userhosts-*"))


def _sshd_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-x", "sshd"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_no_sshd_binary_is_one_error_naming_the_fix():
    before, sshds = _ours(), _sshd_pids()
    with pytest.raises(MissingSystemPackageError, match="not an executable file.*openssh-server"):
        hosts.start_demo_cluster(1, kind="user", sshd_path="/nonexistent/sshd")
    with pytest.raises(MissingSystemPackageError, match="no sshd on PATH.*apt-get install"):
        userhosts.find_sshd(path="/nonexistent", dirs=())
    assert _ours() == before and _sshd_pids() <= sshds


@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_a_port_in_use_is_one_error_naming_port_and_fix():
    before, sshds = _ours(), _sshd_pids()
    with socket.socket() as holder:  # every address: taken on whichever host gets it
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.*is in use.*fix: end"):
            hosts.start_demo_cluster(1, kind="user", ports=[port])
    assert _ours() == before and _sshd_pids() <= sshds
    with pytest.raises(ConfigError, match="kind='bogus'"):
        hosts.start_demo_cluster(1, kind="bogus")


# -- real: a user-mode cluster as this process's user --------------------------------------


@pytest.fixture(scope="module")
def cluster():
    c = hosts.start_demo_cluster(2, kind="user")
    yield c
    c.close()
    assert c.leftovers() == []


@pytest.mark.slow
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_hosts_are_reached_by_name_with_plain_ssh_and_ddlkit(cluster):
    assert cluster.kind == "user" and cluster.names == ["host1", "host2"]
    shown = cluster._repr_html_()
    assert "user-mode hosts" in shown and "one network stack" in shown and "one user" in shown
    done = subprocess.run(
        ["ssh", "-F", cluster.ssh_config, "host2", "printenv", "SSH_CONNECTION"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split()[2:] == [
        cluster.addresses[1],
        str(cluster.hosts[1].port),
    ]
    assert hosts.check_hosts(cluster.names, cluster.ssh).ok
    assert hosts.run_on("host1", ["true"], cluster.ssh, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_a_host_that_stops_answering_fails_the_job_within_the_link_cut_bounds(cluster, tmp_path):
    ssh = dataclasses.replace(cluster.ssh, alive_interval=1, alive_count=3)
    where = dataclasses.replace(Hosts.demo(cluster), ssh=ssh)
    run = run_mod.start(
        TRAIN, workers=2, args=["--steps-per-epoch", "100000"], runs_dir=tmp_path, where=where
    )
    try:
        assert wait_until(lambda: run.records("worker-1"), timeout=240), run.tail("worker-1")
        stopped = cluster._user.stop_answering(1)
        assert len(stopped) >= 3  # sshd, the session, the worker (and its watchdog)
        cut_at = time.monotonic()
        with pytest.raises(WorkerFailedError) as err:
            run.wait(timeout=120)
        assert time.monotonic() - cut_at < 30  # the bound of the namespaced link cut
        assert err.value.worker == "worker-1"
        assert f"lost its SSH session to {cluster.addresses[1]}" in str(err.value)
    finally:
        run.stop()
        cluster.restore_link(1)  # SIGCONT: the session sees its client gone, ends the worker
    for i in range(2):
        assert wait_until(lambda i=i: not cluster.processes(i), timeout=60), cluster.processes(i)

    def left():  # what was frozen and is not gone yet (a dying worker: no cmdline, state R)
        return {p: _describe(p) for p in stopped if p not in cluster.sshd_pids and alive(p)}

    assert wait_until(lambda: not left(), timeout=30), left()
    assert not [p for p in run.job.pids.values() if alive(p)]
    assert hosts.check_hosts(cluster.addresses, cluster.ssh).ok


@pytest.mark.slow
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_the_failure_drills_work_on_user_mode_hosts(cluster, tmp_path):
    key = drills.new_key(tmp_path)
    refused = hosts.check_hosts(cluster.names, dataclasses.replace(cluster.ssh, identity=key))
    assert [r.host for r in refused.failures] == cluster.names
    assert all("authentication" in r.problem for r in refused.failures)
    port = userhosts.free_port("")
    with drills.occupy_port(cluster, 1, port):  # one network stack: taken on every host
        busy = hosts.check_hosts(cluster.addresses, cluster.ssh, ports=[port])
    assert [r.host for r in busy.failures] == cluster.addresses
    nobody = hosts.check_hosts(["127.0.0.254"], cluster.ssh, timeout=20)
    assert not nobody.ok and "unreachable" in nobody.failures[0].problem
    assert drills.wait_idle(cluster, timeout=10) == [[], []]


@pytest.mark.slow
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_live_workers_run_cells_on_both_hosts_and_close_leaves_nothing(
    cluster, tmp_path, monkeypatch, capsys
):
    """dk.workers on the demo hosts: one engine on each (over SSH), a cell's output from
    both, an all-reduce across them; close ends everything on both hosts."""
    import ddlkit as dk

    monkeypatch.setenv("DDLKIT_RUNS", str(tmp_path / "runs"))
    with dk.workers(2, strategy="multi_worker", where=Hosts.demo(cluster)) as live:
        assert live.run.preflight.ok and [w.host for w in live.run.job.spec.workers[1:]] == (
            cluster.addresses
        )
        live.run_cell(
            "import os, tensorflow as tf\n"
            "print('on', os.environ['SSH_CONNECTION'].split()[2])\n"
            "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
            "one = tf.constant(1.0 + strategy.cluster_resolver.task_id)\n"
            "print('sum', strategy.reduce('SUM', strategy.run(lambda: one), axis=None).numpy())"
        )
        out = capsys.readouterr().out
        for i, address in enumerate(cluster.addresses):
            assert f"[worker-{i}] on {address}" in out and f"[worker-{i}] sum 3.0" in out, out
            assert cluster.processes(i), f"no engine on {address}"
    # close ended the engines (and their nannies) on both hosts: what is left is sshd's
    # session ending after its client, for moments
    assert not [p for p in live.run.job.pids.values() if alive(p)]
    left = lambda: [cluster.processes(i) for i in range(2)]  # noqa: E731
    assert wait_until(lambda: left() == [[], []], timeout=2), [
        [_describe(p) for p in pids] for pids in left()
    ]


def _describe(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
    except OSError:
        return "gone"
    return f"state {stat[0]} ppid {stat[1]}: {cmd.decode(errors='replace')}"


# -- real: as an ordinary user -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_an_ordinary_user_trains_across_two_user_mode_hosts(prepared_data_home):
    # not under pytest's tmp dir: root's other pytest runs prune and chmod it
    with tempfile.TemporaryDirectory(prefix="ddlkit-ordinary-user-") as tmp:
        u = user_env(Path(tmp), prepared_data_home)
        job = str(ROOT / "tests" / "harness" / "userjob.py")
        done = subprocess.run(
            u.argv(job, str(u.runs_dir), "multi_worker", "4"),
            env=u.env, cwd=tmp, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    lines = [x for x in done.stdout.splitlines() if x.startswith("USERJOB ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("USERJOB "))
    assert out["uid"] != 0 and out["kind"] == "user"
    assert out["ssh_host2"][0] == 0 and out["ssh_host2"][1][2] == out["addresses"][1]
    assert out["preflight_ok"] and out["ok"]
    base = out["base_port"]
    assert out["tasks"] == [[out["addresses"][0], base], [out["addresses"][1], base + 1]]
    assert out["steps"] == {"worker-0": 4, "worker-1": 4} and out["results"] == out["steps"]
    assert out["left_on_hosts"] == [[], []] and out["leftovers"] == []


@pytest.mark.slow
@pytest.mark.skipif(bool(_WHY), reason=_WHY or "")
def test_the_cli_reaches_user_mode_hosts_through_their_ssh_config(cluster, tmp_path):
    cli = [sys.executable, "-m", "ddlkit.cli", "launch", "-n", "2", "--no-live"]
    cli += ["--runs-dir", str(tmp_path / "runs"), "-H", cluster.host_list()]
    base = cluster.launch_kwargs()["base_port"]
    argv = [*cli, "--ssh-config", cluster.ssh.config_file, "--ssh-identity", cluster.ssh.identity]
    argv += ["--distinct-ports", "--base-port", str(base), str(REPORT)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    reports = []
    for index in range(2):
        log = (run_dir / "logs" / f"worker-{index}.log").read_text()
        reports.append(json.loads([ln for ln in log.splitlines() if ln.startswith("{")][-1]))
    wanted = [f"{a}:{base + i}" for i, a in enumerate(cluster.addresses)]
    assert [r["cluster"]["worker"] for r in reports] == [wanted, wanted]
    assert [r["task_id"] for r in reports] == [0, 1]
    missing = [*cli, "--ssh-config", str(tmp_path / "none"), str(REPORT)]
    done = subprocess.run(missing, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no ssh config at" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
