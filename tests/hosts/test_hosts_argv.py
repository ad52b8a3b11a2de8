"""Pure tests of the multi-host argv builders: no processes, no root."""

from __future__ import annotations

import functools
import json
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlkit.errors import ConfigError
from ddlkit.hosts import netns, preflight, sshd
from ddlkit.hosts.preflight import HostCheck, Preflight, compare_versions, probe_argv
from ddlkit.hosts.ssh import (
    HostError,
    SshOptions,
    classify_ssh_failure,
    remote_argv,
    ssh_argv,
    ssh_options_argv,
    ssh_shim_text,
    stdin_env_line,
)
from ddlkit.launch import remote
from ddlkit.launch.spec import WorkerSpec


def test_ssh_argv_is_batch_mode_with_bounded_connect_and_quoted_argv():
    opts = SshOptions(identity="/k/id", known_hosts="/k/known", user="ann", connect_timeout=3)
    argv = ssh_argv("10.213.0.1", ["python", "-c", "print(1)", "a b", "$HOME;rm -rf /"], opts)
    assert argv[0] == "ssh"
    pairs = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"}
    assert {"BatchMode=yes", "ConnectTimeout=3", "StrictHostKeyChecking=yes"} <= pairs
    assert {"UserKnownHostsFile=/k/known", "IdentitiesOnly=yes"} <= pairs
    assert argv[argv.index("-i") + 1] == "/k/id"
    assert argv[argv.index("-l") + 1] == "ann"
    # the host follows "--", the remote command is one word the remote shell splits back
    assert argv[-3:-1] == ["--", "10.213.0.1"]
    assert shlex.split(argv[-1]) == ["python", "-c", "print(1)", "a b", "$HOME;rm -rf /"]


def test_ssh_argv_defaults_leave_openssh_defaults_and_accept_new_when_not_strict():
    argv = ssh_argv("h1", ["true"], SshOptions(strict=False))
    assert "-i" not in argv and "-l" not in argv and "-F" not in argv
    assert "StrictHostKeyChecking=accept-new" in argv
    assert not any(a.startswith("UserKnownHostsFile") for a in argv)


@pytest.mark.parametrize("host", ["", "-oProxyCommand=x", "a b", "root@h"])
def test_ssh_argv_refuses_hosts_ssh_could_misread(host):
    with pytest.raises(ConfigError, match="host"):
        ssh_argv(host, ["true"])


def test_ssh_argv_refuses_empty_command_and_bad_options():
    with pytest.raises(ConfigError, match="empty command"):
        ssh_argv("h", [])
    with pytest.raises(ConfigError, match="port=0"):
        SshOptions(port=0)
    with pytest.raises(ConfigError, match="connect_timeout=0"):
        SshOptions(connect_timeout=0)


def test_netns_plan_names_addresses_and_commands():
    p = netns.plan(2, subnet=7, tag="ab1")
    assert [h.address for h in p.hosts] == ["10.213.7.1", "10.213.7.2"]
    assert p.gateway == "10.213.7.254"
    names = [h.name for h in p.hosts] + [p.bridge] + [h.outer for h in p.hosts]
    assert len(set(names)) == len(names)
    assert {h.inner for h in p.hosts} == {"eth0"}  # one name on every host, as Horovod needs
    assert all(len(n) <= 15 for n in names)  # Linux interface-name limit
    cmds = netns.create_commands(p)
    assert all(isinstance(c, list) and c[0] == "ip" for c in cmds)
    assert ["ip", "netns", "add", "ddlkab1h1"] in cmds
    assert ["ip", "-n", "ddlkab1h0", "addr", "add", "10.213.7.1/24", "dev", "eth0"] in cmds
    assert ["ip", "-n", "ddlkab1h0", "link", "set", "lo", "up"] in cmds
    assert netns.destroy_commands(p)[-1] == ["ip", "link", "del", "dkab1br"]
    assert netns.cut_link_commands(p.hosts[1]) == [
        ["ip", "-n", "ddlkab1h1", "link", "set", "eth0", "down"]
    ]
    assert netns.route_commands(p, ["192.0.2.2"])[1] == [
        "ip", "-n", "ddlkab1h1", "route", "add", "192.0.2.2/32", "via", "10.213.7.254"
    ]  # fmt: skip
    assert netns.hosts_file_text(p.hosts[1], "vm").splitlines() == [
        "127.0.0.1 localhost",
        "10.213.7.2 vm",
    ]
    assert netns.restore_link_commands(p.hosts[0], ["192.0.2.2"]) == [
        ["ip", "-n", "ddlkab1h0", "link", "set", "eth0", "up"],
        ["ip", "-n", "ddlkab1h0", "route", "replace", "192.0.2.2/32", "via", "10.213.7.254"],
    ]
    assert p.hosts[0].exec_argv(["true"]) == ["ip", "netns", "exec", "ddlkab1h0", "true"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n": 0, "subnet": 1, "tag": "a"}, "n=0"),
        ({"n": 2, "subnet": 256, "tag": "a"}, "subnet=256"),
        ({"n": 2, "subnet": 1, "tag": "a-b"}, "tag="),
        ({"n": 2, "subnet": 1, "tag": "toolong7"}, "tag="),
    ],
)
def test_netns_plan_refuses_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        netns.plan(**kwargs)


def test_sshd_config_is_key_only_on_the_host_address(tmp_path: Path):
    keys = sshd.SshdKeys(tmp_path / "hk", tmp_path / "ck", tmp_path / "ak")
    text = sshd.sshd_config("10.213.7.2", 2222, keys, tmp_path / "pid")
    lines = set(text.splitlines())
    assert {"ListenAddress 10.213.7.2", "Port 2222", "PasswordAuthentication no"} <= lines
    assert {f"HostKey {tmp_path / 'hk'}", f"AuthorizedKeysFile {tmp_path / 'ak'}"} <= lines
    assert f"PidFile {tmp_path / 'pid'}" in lines
    assert "KbdInteractiveAuthentication no" in lines
    host = netns.plan(1, subnet=7, tag="x").hosts[0]
    argv = sshd.sshd_argv(host, tmp_path / "cfg", tmp_path / "log")
    assert argv[:4] == ["ip", "netns", "exec", host.name]
    assert argv[4] == "/usr/sbin/sshd" and "-D" in argv
    assert sshd.keygen_argv("/d/k", "c") == [
        "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "c", "-f", "/d/k"
    ]  # fmt: skip


def test_classify_ssh_failures_name_host_and_fix():
    auth = classify_ssh_failure("h1", 255, "root@h1: Permission denied (publickey).\n", "/py")
    assert "authentication failed on h1" in auth[0] and "identity" in auth[1]
    err = "ssh: connect to host h2 port 22: No route to host"
    down = classify_ssh_failure("h2", 255, err, "/py")
    assert "h2 is unreachable" in down[0] and "No route to host" in down[0]
    key = classify_ssh_failure("h3", 255, "Host key verification failed.", "/py")
    assert "host key" in key[0] and "ssh-keyscan h3" in key[1]
    env = classify_ssh_failure("h4", 127, "bash: line 1: /v/py: No such file or directory", "/v/py")
    assert "no /v/py on h4" in env[0] and "venv" in env[1]


def test_preflight_table_and_error_from_rows():
    ok = HostCheck("10.0.0.1", True, "3.11.7", "2.21.0", None, (29500,))
    bad = HostCheck("10.0.0.2", False, problem="10.0.0.2 is unreachable <x>", fix="check it")
    report = Preflight((ok, bad))
    assert not report.ok and report.failures == (bad,) and report["10.0.0.1"] is ok
    text = str(report)
    assert "missing" in text.splitlines()[3]  # Horovod absent on a reachable host
    assert "&lt;x&gt;" in report._repr_html_()  # cells are escaped
    with pytest.raises(HostError, match="unreachable <x> .fix: check it.") as info:
        report.raise_for_failures()
    assert info.value.hosts == ("10.0.0.2",)


def test_preflight_fails_hosts_whose_versions_differ_from_the_first():
    row = functools.partial(HostCheck, reachable=True, horovod="0.28.1")
    first = row("10.0.0.1", python="3.11.7", tensorflow="2.21.0")
    patch = row("10.0.0.2", python="3.11.9", tensorflow="2.21.0")  # a patch release: fine
    old_tf = row("10.0.0.3", python="3.11.7", tensorflow="2.20.0")
    old_py = row("10.0.0.4", python="3.10.12", tensorflow="2.21.0")
    no_hvd = row("10.0.0.5", python="3.11.7", tensorflow="2.21.0", horovod=None)
    down = HostCheck("10.0.0.6", False, problem="unreachable", fix="check it")
    rows = compare_versions((down, first, patch, old_tf, old_py, no_hvd))
    assert [r.ok for r in rows] == [False, True, True, False, False, True]
    assert rows[0] is down and rows[1] is first and rows[2] is patch
    assert rows[3].problem == (
        "versions differ: 10.0.0.3 has TensorFlow 2.20.0 where 10.0.0.1 has 2.21.0"
    )
    assert "Python 3.10.12 where 10.0.0.1 has 3.11.7" in rows[4].problem
    assert "same versions on every host" in rows[3].fix
    horovod = compare_versions((first, no_hvd), horovod=True)
    assert (
        horovod[1].problem == "versions differ: 10.0.0.5 has Horovod None where 10.0.0.1 has 0.28.1"
    )
    assert compare_versions((down,)) == (down,), "nothing to compare against"


def test_probe_argv_passes_ports_and_files_as_arguments():
    argv = probe_argv("/v/bin/python", [29500, 29501], ["/a b/x.py"])
    assert argv[:2] == ["/v/bin/python", "-c"] and argv[3:] == ["29500", "29501", "--", "/a b/x.py"]
    assert compile(argv[2], "probe", "exec")


def test_probe_run_here_reports_busy_ports_and_missing_files(tmp_path):
    """The probe's own logic, run by this Python without SSH: a held port, a missing file."""
    held = socket.create_server(("", 0))
    try:
        port = held.getsockname()[1]
        there = tmp_path / "train.py"
        there.write_text("")
        argv = probe_argv(sys.executable, [port], [str(there), str(tmp_path / "gone.py")])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    finally:
        held.close()
    answer = json.loads(done.stdout)
    assert answer["busy_ports"] == [port] and answer["free_ports"] == []
    assert answer["missing_files"] == [str(tmp_path / "gone.py")]
    row = preflight._row_from_answer("h1", answer, sys.executable, 0.1)
    assert "TensorFlow" not in row.problem and f"port(s) {port}" not in row.problem
    assert "gone.py not found on h1" in row.problem and "same path" in row.fix
    hvd = dict(answer, missing_files=[], horovod=None)
    row = preflight._row_from_answer("h1", hvd, sys.executable, 0.1, horovod=True)
    assert row.problem == f"Horovod is not installed for {sys.executable} on h1"
    assert "build-horovod.sh" in row.fix


def test_remote_argv_adds_env_and_cwd_through_env_and_a_watchdog():
    argv = remote_argv(["python", "w.py"], python="/v/py", env={"TF_CONFIG": '{"a": 1}'}, cwd="/r")
    assert argv[:2] == ["env", 'TF_CONFIG={"a": 1}']
    assert argv[2:4] == ["/v/py", "-c"] and argv[5:] == ["/r", "0", "0", "python", "w.py"]
    assert compile(argv[4], "watchdog", "exec")
    assert remote_argv(["x"], python="p")[:2] == ["env", "p"]
    assert remote_argv(["x"], python="p")[4:] == ["", "0", "0", "x"]  # the login directory
    assert remote_argv(["x"], python="p", silence=30)[4:] == ["", "30.0", "0", "x"]
    assert remote_argv(["x"], python="p", stdin_env=True)[4:] == ["", "0", "1", "x"]
    with pytest.raises(ConfigError, match="silence=0"):
        remote_argv(["x"], python="p", silence=0)
    for bad in ("", "1A", "A-B", "A=B", "-u"):
        with pytest.raises(ConfigError, match="environment name"):
            remote_argv(["x"], python="p", env={bad: "v"})


def test_ssh_shim_puts_our_options_first_without_a_shell(tmp_path):
    opts = SshOptions(identity="/k/id", known_hosts="/k/kh", config_file="/dev/null")
    text = ssh_shim_text("/usr/bin/ssh", opts, python="/v/py")
    assert text.startswith("#!/v/py\n") and "os.execv('/usr/bin/ssh'" in text
    assert repr(ssh_options_argv(opts)) in text
    assert ssh_argv("h", ["x"], opts)[1:-3] == ssh_options_argv(opts)
    compile(text, "shim", "exec")


def test_watchdog_run_here_makes_the_directory_and_ends_the_command_when_stdin_closes(tmp_path):
    """The remote command, run by this Python without SSH: cwd made, env given, then EOF."""
    cwd = tmp_path / "run" / "work" / "worker-0"
    code = "import os, time; print(os.getcwd(), os.environ['MARK'], flush=True); time.sleep(600)"
    argv = remote_argv([sys.executable, "-c", code], python=sys.executable, env={"MARK": "m"},
                       cwd=str(cwd))  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == f"{cwd} m\n"
        proc.stdin.close()  # as the SSH session closing
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watchdog_run_here_takes_secrets_from_stdin_not_from_its_argv(tmp_path):
    code = "import os, time; print(os.environ['DDLKIT_TOKEN'], flush=True); time.sleep(600)"
    argv = remote_argv([sys.executable, "-c", code], python=sys.executable, stdin_env=True)
    assert not any("s3cret" in a for a in argv)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(stdin_env_line({"DDLKIT_TOKEN": "s3cret-token"}).decode())
        proc.stdin.flush()
        assert proc.stdout.readline() == "s3cret-token\n"
        proc.stdin.close()
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # stdin closing before the line arrives: the command never starts
    early = subprocess.run(argv, input="", capture_output=True, text=True, timeout=30)
    assert early.returncode != 0 and "no variables arrived on stdin" in early.stderr
    assert "s3cret" not in early.stdout


def test_a_remote_workers_token_goes_on_stdin_and_never_in_the_ssh_argv(tmp_path):
    worker = WorkerSpec(
        name="worker-0", argv=("/v/py", "train.py"), env={}, cwd=tmp_path, log_path=tmp_path / "l",
        host="10.0.0.7",
    )  # fmt: skip
    env = {"TF_CONFIG": "{}", "DDLKIT_TOKEN": "s3cret-token", "DDLKIT_WORKER": "worker-0"}
    argv = remote.ssh_command(worker, env)
    assert not any("s3cret" in a for a in argv) and "TF_CONFIG={}" in argv[-1]
    assert json.loads(remote.stdin_line(env)) == {"DDLKIT_TOKEN": "s3cret-token"}


def test_probe_run_here_counts_a_port_in_time_wait_as_free():
    """A finished job's server port lingers in TIME_WAIT; the next job's servers can bind it."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end goes to TIME_WAIT
    client.close()
    server.close()
    states = subprocess.run(["ss", "-Htan", "sport", f"= :{port}"], capture_output=True, text=True)
    assert "TIME-WAIT" in states.stdout
    done = subprocess.run(probe_argv(sys.executable, [port]), capture_output=True, text=True)
    assert json.loads(done.stdout)["free_ports"] == [port]


def test_watchdog_run_here_ends_the_command_when_the_heartbeat_stops(tmp_path):
    """stdin stays open but silent (a cut link sshd does not notice): the command ends."""
    code = "import time; print('up', flush=True); time.sleep(600)"
    argv = remote_argv([sys.executable, "-c", code], python=sys.executable, silence=3)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        for _ in range(4):  # beats keep it running past the limit
            time.sleep(1)
            proc.stdin.write(b".")
            proc.stdin.flush()
        assert proc.poll() is None
        start = time.monotonic()
        assert proc.wait(timeout=30) != 0  # then silence: ended after ~3 s
        assert 2 < time.monotonic() - start < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
