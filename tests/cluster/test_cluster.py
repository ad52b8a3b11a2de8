"""Unit tests for ddlkit.cluster: host lists, ports, TF_CONFIG, Horovod slots."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.cluster import (
    ClusterSpec,
    HorovodSlot,
    Host,
    Task,
    format_hosts,
    free_ports,
    horovod_slots,
    parse_hostfile,
    parse_hosts,
    port_is_free,
    task_name,
)
from ddlkit.cluster.ports import PICKED_PORTS, SERVER_PORTS, free_port_block
from ddlkit.environments import slurm
from ddlkit.errors import ConfigError, DdlkitError


def ps_cluster() -> ClusterSpec:
    """chief, 2 ps, 2 workers and an evaluator on fixed ports, given out of order."""
    return ClusterSpec(
        tasks=[
            Task("worker", 1, "10.0.0.3", 2222),
            Task("evaluator", 0, "10.0.0.4", 2222),
            Task("ps", 1, "10.0.0.2", 2223),
            Task("chief", 0, "10.0.0.1", 2222),
            Task("worker", 0, "10.0.0.2", 2224),
            Task("ps", 0, "10.0.0.2", 2222),
        ]
    )


CLUSTER = {
    "chief": ["10.0.0.1:2222"],
    "ps": ["10.0.0.2:2222", "10.0.0.2:2223"],
    "worker": ["10.0.0.2:2224", "10.0.0.3:2222"],
}


# ---------------------------------------------------------------- TF_CONFIG


@pytest.mark.parametrize(
    ("name", "role", "index"),
    [
        ("chief-0", "chief", 0),
        ("ps-0", "ps", 0),
        ("ps-1", "ps", 1),
        ("worker-0", "worker", 0),
        ("worker-1", "worker", 1),
        ("evaluator-0", "evaluator", 0),
    ],
)
def test_tf_config_for_each_role(name, role, index):
    spec = ps_cluster()
    expected = {"cluster": CLUSTER, "task": {"type": role, "index": index}}
    assert spec.tf_config(name) == expected
    assert spec.tf_config(spec.task(name)) == expected


def test_evaluator_is_not_in_the_cluster_dict():
    spec = ps_cluster()
    assert "evaluator" not in spec.cluster_dict()
    assert "10.0.0.4:2222" not in json.dumps(spec.cluster_dict())
    assert spec.count("evaluator") == 1


def test_json_round_trip_and_env():
    spec = ps_cluster()
    for task in spec.tasks:
        text = spec.tf_config_json(task)
        assert json.loads(text) == spec.tf_config(task)
        env = spec.env(task)
        assert set(env) == {"TF_CONFIG", "DDLKIT_WORKER"}
        assert json.loads(env["TF_CONFIG"]) == spec.tf_config(task)
        assert env["DDLKIT_WORKER"] == task_name(task) == task.name


def test_multi_worker_cluster_without_chief():
    spec = ClusterSpec(
        tasks=[Task("worker", 0, "127.0.0.1", 20000), Task("worker", 1, "127.0.0.1", 20001)]
    )
    assert spec.tf_config("worker-1") == {
        "cluster": {"worker": ["127.0.0.1:20000", "127.0.0.1:20001"]},
        "task": {"type": "worker", "index": 1},
    }
    assert spec.num_workers == 2
    assert len(spec) == 2


def test_tasks_are_stored_in_stable_order():
    spec = ps_cluster()
    names = [t.name for t in spec.tasks]
    assert names == ["chief-0", "ps-0", "ps-1", "worker-0", "worker-1", "evaluator-0"]
    assert ClusterSpec(tasks=list(reversed(spec.tasks))) == spec
    assert len(spec) == 6
    assert spec.num_workers == 2  # the chief is not counted


@pytest.mark.parametrize(
    ("name", "role", "index"),
    [
        ("chief", "chief", 0),
        ("worker", "worker", 1),
        ("ps", "ps", 3),
        ("evaluator", "evaluator", 0),
    ],
)
def test_task_name(name, role, index):
    assert task_name(Task(role, index, "localhost", 2222)) == f"{name}-{index}"


def test_tf_config_of_a_foreign_task_names_the_task():
    spec = ps_cluster()
    with pytest.raises(ConfigError, match="worker-7") as err:
        spec.tf_config(Task("worker", 7, "10.0.0.9", 2222))
    assert "Fix" in str(err.value)
    with pytest.raises(ConfigError, match="'worker-9'.*Fix.*worker-0"):
        spec.tf_config("worker-9")


W0 = Task("worker", 0, "h", 1000)
W1 = Task("worker", 1, "h", 1001)
C0 = Task("chief", 0, "h", 1002)
P0 = Task("ps", 0, "h", 1003)
E0 = Task("evaluator", 0, "h", 1004)


@pytest.mark.parametrize(
    ("tasks", "pieces"),
    [
        ([], ["no tasks", "no chief and no worker"]),
        ([E0], ["evaluator-0", "no chief and no worker"]),
        ([W0, C0, Task("chief", 1, "h", 1009)], ["2 chief tasks", "at most one"]),
        ([W0, E0, Task("evaluator", 1, "h", 1009)], ["2 evaluator tasks"]),
        ([W0, Task("worker", 2, "h", 1009)], ["worker indexes are [0, 2]", "0, 1"]),
        ([W0, Task("worker", 0, "h", 1009)], ["worker indexes are [0, 0]"]),
        ([W1], ["worker indexes are [1]", "0..0"]),
        ([W0, Task("worker", 1, "h", 1000)], ["worker-0 and worker-1 both use h:1000"]),
        ([W0, P0], ["1 ps task", "no chief", "coordinator"]),
        ([C0, P0], ["1 ps task", "no worker"]),
        ([P0, Task("ps", 1, "h", 1009)], ["no chief and no worker"]),
    ],
)
def test_invalid_cluster_specs(tasks, pieces):
    with pytest.raises(ConfigError) as err:
        ClusterSpec(tasks=tasks)
    message = str(err.value)
    for piece in pieces:
        assert piece in message
    assert "Fix:" in message


@pytest.mark.parametrize(
    ("args", "piece"),
    [
        (("boss", 0, "h", 1), "'boss'"),
        (("worker", -1, "h", 1), "-1"),
        (("worker", True, "h", 1), "True"),
        (("worker", 0, "h", 0), "port 0"),
        (("worker", 0, "h", 70000), "70000"),
        (("worker", 0, "h", "2222"), "'2222'"),
        (("worker", 0, "", 2222), "empty"),
        (("worker", 0, "a b", 2222), "'a b'"),
    ],
)
def test_invalid_tasks(args, piece):
    with pytest.raises(ConfigError) as err:
        Task(*args)
    assert piece in str(err.value)
    assert "Fix:" in str(err.value)


def test_errors_are_ddlkit_errors_and_value_errors():
    with pytest.raises(DdlkitError):
        parse_hosts("h1:x")
    with pytest.raises(ValueError):
        parse_hosts("h1:x")


# ---------------------------------------------------------------- host lists


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost", (Host("localhost", 1),)),
        ("localhost:2", (Host("localhost", 2),)),
        ("host1:2,host2:2", (Host("host1", 2), Host("host2", 2))),
        ("10.213.0.1:2,10.213.0.2:1", (Host("10.213.0.1", 2), Host("10.213.0.2", 1))),
        (" h1 : 2 ,  h2:3 ", (Host("h1", 2), Host("h2", 3))),
        ("worker-0:4,node_1.example.com", (Host("worker-0", 4), Host("node_1.example.com", 1))),
        ("h1:02", (Host("h1", 2),)),
    ],
)
def test_parse_hosts_valid(text, expected):
    assert parse_hosts(text) == expected


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("h1:x,h2:2", ["'h1:x' in 'h1:x,h2:2'", "positive integer", "h1:2"]),
        ("h1:0", ["'h1:0'", "positive integer"]),
        ("h1:-2", ["'h1:-2'", "positive integer"]),
        ("h1:2.5", ["'h1:2.5'", "positive integer"]),
        ("h1:", ["'h1:'", "positive integer"]),
        (":2", ["':2'", "host name is empty"]),
        ("", ["''", "empty"]),
        ("   ", ["'   '", "empty"]),
        ("h1:2,,h2:2", ["'h1:2,,h2:2'", "empty host entry"]),
        ("h1:2,", ["'h1:2,'", "empty host entry"]),
        ("h1:2,h1:1", ["'h1'", "twice", "h1:3"]),
        ("h 1:2", ["'h 1'", "whitespace"]),
        ("h@1:2", ["'h@1'", "not a host name"]),
        ("-h:2", ["'-h'", "not a host name"]),
        ("300.1.1.1:2", ["'300.1.1.1'", "IPv4"]),
        ("::1:2", ["'::1:2'", "IPv6"]),
        ("h1:2:3", ["'h1:2:3'"]),
    ],
)
def test_parse_hosts_invalid(text, pieces):
    with pytest.raises(ConfigError) as err:
        parse_hosts(text)
    message = str(err.value)
    for piece in pieces:
        assert piece in message
    assert "Fix:" in message


def test_format_hosts_round_trip():
    hosts = parse_hosts("a:2,10.0.0.2:1,c")
    assert format_hosts(hosts) == "a:2,10.0.0.2:1,c:1"
    assert parse_hosts(format_hosts(hosts)) == hosts


@pytest.mark.parametrize(("name", "slots"), [("h", 0), ("h", -1), ("h", 1.5), ("h", True), ("", 1)])
def test_host_validates_itself(name, slots):
    with pytest.raises(ConfigError, match="Fix:"):
        Host(name, slots)


def test_parse_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text(
        "# two machines\n"
        "\n"
        "10.213.0.1 slots=2\n"
        "   node-b   slots=4   # the big one\n"
        "node-c\n"
        "  # indented comment\n"
    )
    assert parse_hostfile(path) == (Host("10.213.0.1", 2), Host("node-b", 4), Host("node-c", 1))
    assert parse_hostfile(str(path)) == parse_hostfile(path)


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("h1 slots=2\nh2 slots=x\n", ["line 2", "'h2 slots=x'", "positive integer", "h2 slots=2"]),
        ("h1 slots=0\n", ["line 1", "'h1 slots=0'", "positive integer"]),
        ("h1 slots = 2\n", ["line 1", "'h1 slots = 2'", "h1 slots=2"]),
        ("h1 cpus=2\n", ["'h1 cpus=2'", "slots=N"]),
        ("h1 slots=2 max_slots=4\n", ["'h1 slots=2 max_slots=4'"]),
        ("h1 slots=2\n\nh1 slots=1\n", ["'h1'", "twice", "h1:3"]),
        ("h@1 slots=2\n", ["line 1", "'h@1'"]),
        ("# nothing\n\n", ["lists no hosts"]),
        ("", ["lists no hosts"]),
    ],
)
def test_parse_hostfile_invalid(tmp_path, text, pieces):
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        parse_hostfile(path)
    message = str(err.value)
    assert str(path) in message
    for piece in pieces:
        assert piece in message
    assert "Fix:" in message


def test_missing_hostfile(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist\. Fix:"):
        parse_hostfile(tmp_path / "nope")


# ---------------------------------------------------------------- placement


def test_from_hosts_fills_each_host_in_order():
    spec = ClusterSpec.from_hosts("a:2,b:2", workers=2, ps=1, chief=True, base_port=2222)
    assert [(t.name, t.address) for t in spec.tasks] == [
        ("chief-0", "a:2222"),
        ("ps-0", "a:2223"),
        ("worker-0", "b:2222"),
        ("worker-1", "b:2223"),
    ]


def test_from_hosts_accepts_host_objects_and_leaves_spare_slots():
    spec = ClusterSpec.from_hosts([Host("a", 3), Host("b", 5)], workers=2, base_port=4000)
    assert spec.cluster_dict() == {"worker": ["a:4000", "a:4001"]}


def test_from_hosts_evaluator_takes_a_slot():
    spec = ClusterSpec.from_hosts("a:1,b:1", workers=1, evaluator=True, base_port=2222)
    assert spec.task("evaluator-0").address == "b:2222"
    assert spec.tf_config("evaluator-0")["cluster"] == {"worker": ["a:2222"]}


def test_too_many_tasks_for_the_slots():
    with pytest.raises(ConfigError) as err:
        ClusterSpec.from_hosts("a:1,b:1", workers=2, chief=True, base_port=2222)
    assert str(err.value) == (
        "3 tasks (chief-0, worker-0, worker-1) need 3 slots but hosts 'a:1,b:1' give 2. "
        "Fix: add slots (e.g. 'a:2,b:1') or ask for fewer tasks."
    )


@pytest.mark.parametrize(
    ("kwargs", "piece"),
    [
        ({"workers": -1}, "workers=-1"),
        ({"workers": 2, "ps": -1}, "ps=-1"),
        ({"workers": 2, "chief": 1}, "chief=1"),
        ({"workers": 2, "evaluator": "yes"}, "evaluator='yes'"),
        ({"workers": 0}, "no chief and no worker"),
        ({"workers": 2, "ps": 1}, "no chief"),
        ({"workers": 2, "base_port": 0}, "base_port=0"),
        ({"workers": 2, "base_port": 65535}, "base_port=65535"),
    ],
)
def test_from_hosts_bad_arguments(kwargs, piece):
    with pytest.raises(ConfigError) as err:
        ClusterSpec.from_hosts("a:4", **kwargs)
    assert piece in str(err.value)
    assert "Fix:" in str(err.value)


def test_from_hosts_without_base_port_needs_a_local_address():
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: no port can be picked there.
    with pytest.raises(ConfigError, match=r"'192\.0\.2\.1'.*Fix:.*base_port"):
        ClusterSpec.from_hosts("192.0.2.1:2", workers=2)


def test_local_cluster_on_free_ports():
    spec = ClusterSpec.local(workers=2, ps=1, chief=True, evaluator=True)
    assert [t.name for t in spec.tasks] == [
        "chief-0",
        "ps-0",
        "worker-0",
        "worker-1",
        "evaluator-0",
    ]
    assert {t.host for t in spec.tasks} == {"127.0.0.1"}
    assert len({t.port for t in spec.tasks}) == 5
    assert all(port_is_free(t.host, t.port) for t in spec.tasks)
    assert spec.num_workers == 2
    assert len(spec) == 5


def test_local_default_is_two_workers():
    spec = ClusterSpec.local()
    assert list(spec.cluster_dict()) == ["worker"]
    assert len(spec.cluster_dict()["worker"]) == 2


# ---------------------------------------------------------------- ports


def test_free_ports_are_distinct_and_bindable():
    # Many ports: were they released one by one while picking, the kernel's
    # random choice would repeat one in nearly every run of this size.
    ports = free_ports(500)
    assert len(ports) == 500
    assert len(set(ports)) == 500
    # below the kernel's ephemeral ports, which outgoing connections take meanwhile, below
    # the fixed ports of Slurm jobs' workers, and apart from live workers' blocks
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = PICKED_PORTS
    assert high <= min(ephemeral, slurm.PORT_FLOOR) and high <= SERVER_PORTS[0]
    assert all(low <= port < high for port in ports)
    held = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", port))
            sock.listen()
    finally:
        for sock in held:
            sock.close()


def test_port_blocks_lie_apart_from_picks_and_below_slurm_jobs_ports():
    # A live Slurm worker binds its job's fixed port (20000 up) when a cell makes the strategy:
    # a block this machine's live workers took there before would hold it ("Could not start
    # gRPC server").
    low, high = SERVER_PORTS
    assert PICKED_PORTS[1] <= low and high <= slurm.PORT_FLOOR
    for _ in range(20):
        first = free_port_block(24)
        assert low <= first and first + 24 <= high, first
        with socket.socket() as sock:
            sock.bind(("", first + 23))


def test_processes_picking_at_once_get_different_ports():
    # Each releases its ports before a server would bind them, so a random pick in the
    # range would repeat one of 160 in most runs; the picks go in turn instead.
    code = (
        "import json; from ddlkit.cluster import free_ports; "
        "print(json.dumps([free_ports(1)[0] for _ in range(20)]))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    ports = [port for p in procs for port in json.loads(p.communicate(timeout=60)[0])]
    assert len(ports) == 160 and len(set(ports)) == 160


def test_free_ports_edge_cases():
    assert free_ports(0) == []
    with pytest.raises(ConfigError, match=r"n=-1.*Fix:"):
        free_ports(-1)
    with pytest.raises(ConfigError, match=r"'192\.0\.2\.1'.*Fix:"):
        free_ports(1, host="192.0.2.1")


def test_port_is_free_is_false_for_a_port_held_open():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_is_free("127.0.0.1", port) is False
    assert port_is_free("127.0.0.1", port) is True


def test_port_is_free_rejects_bad_ports():
    for port in (0, 65536, "80"):
        with pytest.raises(ConfigError, match="Fix:"):
            port_is_free("127.0.0.1", port)
    # Not "busy", not "free": an address of another machine cannot be tested here.
    with pytest.raises(ConfigError, match=r"'192\.0\.2\.1'.*Fix:"):
        port_is_free("192.0.2.1", 2222)


# ---------------------------------------------------------------- display


def test_repr_html_and_str_show_every_task():
    spec = ps_cluster()
    page = spec._repr_html_()
    text = str(spec)
    assert page.startswith("<table>")
    assert "1 chief, 2 ps, 2 workers, 1 evaluator" in page
    for task in spec.tasks:
        assert f"<td>{task.name}</td>" in page
        assert f"<td>{task.address}</td>" in page
        assert any(
            line.startswith(task.name) and task.address in line for line in text.splitlines()
        )
    assert text.splitlines()[0] == "ClusterSpec: 1 chief, 2 ps, 2 workers, 1 evaluator"


# ---------------------------------------------------------------- horovod


def test_horovod_slots_fill_hosts_in_order():
    plan = horovod_slots("a:2,b:2", np=3)
    got = [
        (s.host, s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
        for s in plan
    ]
    assert got == [
        ("a", 0, 3, 0, 2, 0, 2),
        ("a", 1, 3, 1, 2, 0, 1),
        ("b", 2, 3, 0, 1, 1, 2),
    ]
    assert plan.np == len(plan) == 3
    assert plan.hosts_arg == "a:2,b:1"
    assert plan[2].env() == {
        "HOROVOD_HOSTNAME": "b",
        "HOROVOD_RANK": "2",
        "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
        "DDLKIT_WORKER": "rank-2",
    }
    page = plan._repr_html_()
    for slot in plan:
        assert f"<td>{slot.name}</td>" in page
    assert "3 processes on a:2,b:1" in str(plan)


def test_horovod_slots_local():
    plan = horovod_slots([Host("localhost", 2)], np=2)
    assert [(s.rank, s.local_rank, s.local_size, s.cross_size) for s in plan] == [
        (0, 0, 2, 1),
        (1, 1, 2, 1),
    ]


def test_horovod_np_beyond_slots():
    with pytest.raises(ConfigError) as err:
        horovod_slots("a:1,b:1", np=3)
    assert str(err.value) == (
        "np=3 processes need 3 slots but hosts 'a:1,b:1' give 2. "
        "Fix: add slots (e.g. 'a:2,b:1') or use np=2."
    )


@pytest.mark.parametrize("np", [0, -1, 1.0, True])
def test_horovod_bad_np(np):
    with pytest.raises(ConfigError, match=r"np=.*Fix:"):
        horovod_slots("a:2", np=np)


def test_horovod_slot_validates_itself():
    with pytest.raises(ConfigError, match=r"local_rank=2.*Fix:"):
        HorovodSlot("a", rank=0, size=2, local_rank=2, local_size=2, cross_rank=0, cross_size=1)


# ---------------------------------------------------------------- import cost


def test_importing_cluster_does_not_import_tensorflow():
    code = "import sys, ddlkit.cluster; print('tensorflow' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"
