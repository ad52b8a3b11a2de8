"""Strategy -> processes, as pure data: argv, TF_CONFIG, Keras choice, cores."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from ddlkit.errors import ConfigError
from ddlkit.hosts import SshOptions
from ddlkit.launch import devices as dev
from ddlkit.launch import plan as p

SCRIPT = Path(__file__)


def _plan(strategy, workers=2, cores=(0, 1), gpus=(), **kw):
    cfg = p.LaunchConfig(script=SCRIPT, strategy=strategy, workers=workers, **kw)
    return cfg, p.plan(
        cfg,
        p.cluster_for(cfg),
        run_id="r1",
        run_dir=Path("/tmp/ddlkit-plan-test"),
        cores=cores,
        gpus=gpus,
        horovodrun="/opt/hvd/horovodrun",
        extra_env={"DDLKIT_COLLECTOR": "127.0.0.1:5000", "DDLKIT_TOKEN": "t"},
    )


def test_multi_worker_gives_each_worker_its_tf_config_and_own_core():
    _, job = _plan("multi_worker", args=("--epochs", "1"))
    assert job.names == ("worker-0", "worker-1")
    configs = [json.loads(w.env["TF_CONFIG"]) for w in job.workers]
    assert configs[0]["cluster"] == configs[1]["cluster"]
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert [w.cpus for w in job.workers] == [(0,), (1,)]
    assert all(w.threads == 1 for w in job.workers)
    for w in job.workers:
        assert w.argv[1:] == (str(SCRIPT), "--epochs", "1")
        assert w.env["TF_USE_LEGACY_KERAS"] == "1"
        assert w.env["DDLKIT_COLLECTOR"] == "127.0.0.1:5000"
        assert w.cwd == Path("/tmp/ddlkit-plan-test/work") / w.name
        assert not w.service


def test_parameter_server_ends_servers_after_the_chief():
    cfg, job = _plan("parameter_server", ps=2)
    assert cfg.processes == 5
    roles = {w.name: json.loads(w.env["TF_CONFIG"])["task"]["type"] for w in job.workers}
    assert roles == {
        "chief-0": "chief",
        "ps-0": "ps",
        "ps-1": "ps",
        "worker-0": "worker",
        "worker-1": "worker",
    }
    services = {w.name for w in job.workers if w.service}
    assert services == {"ps-0", "ps-1", "worker-0", "worker-1"}
    expendable = {w.name for w in job.workers if w.expendable}
    assert expendable == {"worker-0", "worker-1"}  # the coordinator survives losing these
    pinned = {w.name: w.cpus for w in job.workers}
    assert pinned["worker-0"] == (0,) and pinned["worker-1"] == (1,)
    assert pinned["chief-0"] is None and pinned["ps-0"] is None


def test_mirrored_is_one_process_with_the_replica_count():
    _, job = _plan("mirrored", workers=3)
    (main,) = job.workers
    assert main.env["DDLKIT_REPLICAS"] == "3"
    assert "TF_CONFIG" not in main.env
    assert main.threads == 2


def test_horovod_runs_horovodrun_with_gloo_and_the_hosts():
    _, job = _plan("horovod", workers=2, hosts="localhost:2")
    (hvd,) = job.workers
    assert hvd.argv[:7] == (
        "/opt/hvd/horovodrun",
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        hvd.argv[6],
    )
    assert hvd.argv[7] == str(SCRIPT)


def _horovod_flags(transport="auto", mpi_unavailable=None, hosts=None):
    cfg = p.LaunchConfig(
        script=SCRIPT, strategy="horovod", workers=2, hosts=hosts, horovod_transport=transport
    )
    job = p.plan(
        cfg,
        None,
        run_id="r",
        run_dir=Path("/tmp/r"),
        horovodrun="/opt/hvd/horovodrun",
        mpi_unavailable=mpi_unavailable,
    )
    (hvd,) = job.workers
    return [a for a in hvd.argv if a.startswith("--") and a != "--start-timeout"]


def test_horovod_transport_is_mpi_here_when_horovod_has_it_and_gloo_otherwise():
    mpi = ["--mpi", "--mpi-args=--mca mpi_yield_when_idle 1 -x PYTHONUNBUFFERED="]
    assert _horovod_flags() == mpi
    assert _horovod_flags("mpi") == mpi
    assert _horovod_flags(mpi_unavailable="built without MPI") == ["--gloo"]
    assert _horovod_flags("gloo") == ["--gloo"]
    assert _horovod_flags(hosts="10.0.0.7:1,10.0.0.8:1") == ["--gloo"]  # over ssh: Gloo


def test_horovod_transport_errors_name_the_cause_and_the_fix():
    with pytest.raises(ConfigError, match="built without MPI.*apt-get install openmpi-bin"):
        _horovod_flags("mpi", mpi_unavailable="the Horovod of X was built without MPI")
    with pytest.raises(ConfigError, match="over Gloo only"):
        _horovod_flags("mpi", hosts="10.0.0.7:1,10.0.0.8:1")
    with pytest.raises(ConfigError, match="not one of auto, gloo, mpi"):
        p.LaunchConfig(script=SCRIPT, strategy="horovod", horovod_transport="nccl")
    with pytest.raises(ConfigError, match="only the horovod strategy"):
        p.LaunchConfig(script=SCRIPT, strategy="multi_worker", horovod_transport="mpi")


def test_horovod_ranks_get_their_cores_to_pin_themselves_only_where_each_has_one():
    from ddlkit.horovod.pinning import RANK_CPUS_VAR

    _, job = _plan("horovod", workers=2, cores=(0, 1))
    env = job.workers[0].env
    assert env[RANK_CPUS_VAR] == "0;1" and env["TF_NUM_INTRAOP_THREADS"] == "1"
    assert job.workers[0].cpus is None  # horovodrun itself is not pinned: its ranks are
    for kw in ({"pin_cores": False}, {"gpus": ("0", "1")}, {"workers": 3}):
        _, job = _plan("horovod", **{"workers": 2, "cores": (0, 1), **kw})
        assert RANK_CPUS_VAR not in job.workers[0].env, kw


def test_horovod_without_horovodrun_says_how_to_get_it():
    cfg = p.LaunchConfig(script=SCRIPT, strategy="horovod", workers=2)
    with pytest.raises(ConfigError, match="horovodrun was not found"):
        p.plan(cfg, None, run_id="r", run_dir=Path("/tmp/x"), horovodrun=None)


def test_mirrored_on_another_host_is_one_unpinned_process_there():
    config = p.LaunchConfig(script=SCRIPT, strategy="mirrored", workers=2, hosts="10.0.0.7:1")
    job = p.plan(config, None, run_id="r", run_dir=Path("/tmp/r"), cores=(0, 1))
    (main,) = job.workers
    assert (main.name, main.host, main.cpus, main.threads) == ("main", "10.0.0.7", None, None)
    assert main.env[p.REPLICAS_VAR] == "2" and config.processes == 1


def test_gpus_are_sliced_and_never_pinned():
    _, job = _plan("multi_worker", workers=2, gpus=("0", "1", "2", "3"))
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in job.workers] == ["0,1", "2,3"]
    assert all(w.cpus is None for w in job.workers)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"strategy": "nccl_magic"}, "unknown strategy 'nccl_magic'"),
        ({"workers": 0}, "at least one worker"),
        ({"script": Path("no/such/train.py")}, "not found"),
        ({"hosts": "localhost:1", "workers": 2}, "give 1 slots"),
        ({"hosts": "h1:x"}, "slots must be"),
        ({"strategy": "mirrored", "hosts": "10.0.0.7:1,10.0.0.8:1"}, "one process, on one host"),
        ({"hosts": "localhost:1,10.0.0.7:1"}, "mix this machine"),
        ({"hosts": "10.0.0.7:2", "base_port": 80}, "unprivileged ports"),
        ({"hosts": "10.0.0.7:2", "ssh": "-i key"}, "is not SshOptions"),
        ({"strategy": "parameter_server", "ps": 0}, "at least one parameter server"),
        ({"args": "--epochs 2"}, "list of arguments"),
    ],
)
def test_bad_input_is_one_clear_error(kw, message):
    kw = {"script": SCRIPT, **kw}
    with pytest.raises(ConfigError, match=message) as err:
        p.LaunchConfig(**kw)
    assert "Fix" in str(err.value)


@pytest.mark.parametrize(
    "n, cores, gpus, expect",
    [
        (2, (0, 1), (), [((0,), 1, None), ((1,), 1, None)]),
        (1, (0, 1), (), [((0, 1), 2, None)]),
        (3, (0, 1), (), [(None, 1, None)] * 3),
        (2, (0, 1), ("0",), [(None, None, ("0",)), (None, None, ("0",))]),
    ],
)
def test_device_assignment(n, cores, gpus, expect):
    got = [(d.cpus, d.threads, d.gpus) for d in dev.assign(n, cores, gpus)]
    assert got == expect


def test_visible_gpus_parsing():
    assert dev.parse_visible_gpus(None) is None
    assert dev.parse_visible_gpus("") == ()
    assert dev.parse_visible_gpus("-1") == ()
    assert dev.parse_visible_gpus("0, 2") == ("0", "2")


def test_config_shows_as_a_table():
    cfg = p.LaunchConfig(script=SCRIPT, strategy="parameter_server", workers=2)
    html = cfg._repr_html_()
    assert "parameter servers" in html and "parameter_server" in html


def test_no_pinning_leaves_cores_and_threads_alone():
    _, job = _plan("multi_worker", pin_cores=False)
    assert all(w.cpus is None and w.threads is None for w in job.workers)


def _remote_plan(strategy, hosts, **kw):
    ssh = SshOptions(identity="/k/id", known_hosts="/k/kh")
    return _plan(strategy, hosts=hosts, ssh=ssh, **kw)


def test_remote_multi_worker_puts_tasks_on_host_slots_and_runs_them_over_ssh():
    cfg, job = _remote_plan("multi_worker", "10.0.0.7:1,10.0.0.8:1", base_port=30000)
    assert cfg.remote
    configs = [json.loads(w.env["TF_CONFIG"]) for w in job.workers]
    assert configs[0]["cluster"] == {"worker": ["10.0.0.7:30000", "10.0.0.8:30000"]}
    assert [w.host for w in job.workers] == ["10.0.0.7", "10.0.0.8"]
    assert all(w.ssh.identity == "/k/id" for w in job.workers)
    # another host's cores are not this machine's: no pinning, TensorFlow's own threads
    assert all(w.cpus is None and w.threads is None for w in job.workers)
    rows = dict(cfg.rows())
    assert "not pinned" in rows["cores"] and rows["TF server ports"].startswith("30000")
    assert p.remote_ports(p.cluster_for(cfg)) == {"10.0.0.7": [30000], "10.0.0.8": [30000]}


def test_remote_parameter_server_fills_each_host_on_consecutive_ports():
    cfg, job = _remote_plan("parameter_server", "10.0.0.7:2,10.0.0.8:2", workers=2)
    addresses = {w.name: (w.host, json.loads(w.env["TF_CONFIG"])) for w in job.workers}
    assert {n: h for n, (h, _) in addresses.items()} == {
        "chief-0": "10.0.0.7",
        "ps-0": "10.0.0.7",
        "worker-0": "10.0.0.8",
        "worker-1": "10.0.0.8",
    }
    cluster = addresses["chief-0"][1]["cluster"]
    assert cluster["ps"] == [f"10.0.0.7:{p.BASE_PORT + 1}"]
    assert cluster["worker"] == [f"10.0.0.8:{p.BASE_PORT}", f"10.0.0.8:{p.BASE_PORT + 1}"]


def test_remote_horovod_adds_start_timeout_and_interface():
    _, job = _remote_plan("horovod", "10.0.0.7:1,10.0.0.8:1", network_interface="eth0")
    (hvd,) = job.workers
    argv = list(hvd.argv)
    assert hvd.host is None  # horovodrun runs here and reaches the hosts itself
    assert argv[argv.index("-H") + 1] == "10.0.0.7:1,10.0.0.8:1"
    assert argv[argv.index("--network-interface") + 1] == "eth0"
    assert argv[argv.index("--start-timeout") + 1] == str(p.HOROVOD_START_TIMEOUT)


def test_remote_worker_spec_refuses_pinning_and_is_run_through_ssh():
    from ddlkit.launch.remote import SILENCE, remote_env, ssh_command
    from ddlkit.launch.spec import WorkerSpec

    with pytest.raises(ConfigError, match="pins cores only on this machine"):
        WorkerSpec("w", ("python", "x.py"), {}, "/r/w", "/r/w.log", cpus=(0,), host="h1")
    w = WorkerSpec(
        "worker-0", ("/v/python", "/s/t.py", "--epochs", "1"), {"TF_CONFIG": "{}"},
        "/r/work/worker-0", "/r/logs/worker-0.log", threads=2, host="h1",
        ssh=SshOptions(identity="/k/id"),
    )  # fmt: skip
    env = remote_env(w, "/r", {"DDLKIT_FAST": "1", "HOME": "/root", "DDLKIT_HOME": "/c"})
    assert env["DDLKIT_FAST"] == "1" and env["DDLKIT_HOME"] == "/c" and "HOME" not in env
    assert env["DDLKIT_WORKER"] == "worker-0" and env["DDLKIT_RUN_DIR"] == "/r"
    assert env["TF_NUM_INTRAOP_THREADS"] == "2" and env["TF_CONFIG"] == "{}"
    argv = ssh_command(w, env)
    assert argv[0] == "ssh" and argv[argv.index("-i") + 1] == "/k/id"
    assert argv[-2] == "h1"
    remote = shlex.split(argv[-1])
    assert remote[0] == "env" and "TF_CONFIG={}" in remote
    assert remote[-7:-4] == ["/r/work/worker-0", repr(float(SILENCE)), "1"]  # "1": stdin env
    assert remote[-4:] == ["/v/python", "/s/t.py", "--epochs", "1"]
    assert w.to_dict()["host"] == "h1"


def test_remote_hosts_without_a_reachable_collector_is_refused_before_anything_starts(tmp_path):
    from ddlkit.launch import run as run_mod
    from ddlkit.where import Hosts

    for collector_host in (None, "127.0.0.1"):
        with pytest.raises(ConfigError, match="cannot send live metrics") as err:
            where = Hosts("10.0.0.7:1,10.0.0.8:1", collector_host=collector_host)
            run_mod.start(SCRIPT, where=where, runs_dir=tmp_path)
        assert "collector_host='auto'" in str(err.value)
    assert not any(tmp_path.iterdir())  # no run directory: nothing was started


def test_cli_remote_hosts_without_collector_host_exit_2_with_one_line(tmp_path):
    import subprocess
    import sys

    argv = [sys.executable, "-m", "ddlkit.cli", "launch", "-n", "2", "-H", "10.0.0.7:1,10.0.0.8:1"]
    argv += ["--runs-dir", str(tmp_path / "runs"), str(SCRIPT)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot send live metrics" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_hostfile_places_tasks_and_goes_to_horovodrun_as_a_host_list(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\n10.0.0.7 slots=1\n10.0.0.8\n")
    cfg, job = _remote_plan("multi_worker", None, hostfile=hostfile)
    assert [w.host for w in job.workers] == ["10.0.0.7", "10.0.0.8"]
    assert dict(cfg.rows())["hostfile"] == str(hostfile)
    _, job = _remote_plan("horovod", None, hostfile=hostfile)
    argv = list(job.workers[0].argv)
    # parsed here: horovodrun's own -hostfile reader fails on comments and bare host names
    assert argv[argv.index("-H") + 1] == "10.0.0.7:1,10.0.0.8:1" and "-hostfile" not in argv
    with pytest.raises(ConfigError, match="both given"):
        p.LaunchConfig(script=SCRIPT, hosts="10.0.0.7:2", hostfile=hostfile)
    with pytest.raises(ConfigError, match="does not exist"):
        p.LaunchConfig(script=SCRIPT, hostfile=tmp_path / "none")


def test_explicit_cores_confine_every_process_of_the_run_to_them():
    cfg = p.LaunchConfig(script=SCRIPT, strategy="parameter_server", workers=2, cores=(2, 3))
    job = p.plan(cfg, p.cluster_for(cfg), run_id="r", run_dir=Path("/tmp/r"), cores=(0, 1, 2, 3))
    cpus = {w.name: (w.cpus, w.threads) for w in job.workers}
    assert cpus["worker-0"] == ((2,), 1) and cpus["worker-1"] == ((3,), 1)
    assert cpus["chief-0"] == ((2, 3), 1) and cpus["ps-0"] == ((2, 3), 1)
    assert ("cores", "2,3") in cfg.rows()


@pytest.mark.parametrize(
    "strategy, workers, pin, expect",
    [
        ("mirrored", 2, True, [((4, 5), 2)]),
        ("multi_worker", 3, True, [((4, 5), 1)] * 3),  # more workers than cores: not split
        ("multi_worker", 2, False, [((4, 5), None)] * 2),  # no slices: the run's cores
    ],
)
def test_explicit_cores_by_strategy(strategy, workers, pin, expect):
    cfg = p.LaunchConfig(
        script=SCRIPT, strategy=strategy, workers=workers, cores=(4, 5), pin_cores=pin
    )
    job = p.plan(cfg, p.cluster_for(cfg), run_id="r", run_dir=Path("/tmp/r"), cores=(0, 1))
    assert [(w.cpus, w.threads) for w in job.workers] == expect


def test_explicit_cores_reach_horovodrun_and_its_ranks():
    from ddlkit.horovod.pinning import RANK_CPUS_VAR

    cfg = p.LaunchConfig(script=SCRIPT, strategy="horovod", workers=2, cores=(6, 7))
    job = p.plan(cfg, None, run_id="r", run_dir=Path("/tmp/r"), cores=(0,), horovodrun="/h")
    (hvd,) = job.workers
    assert hvd.cpus == (6, 7)  # the ranks it starts inherit them, then each pins itself
    assert hvd.env[RANK_CPUS_VAR] == "6;7" and hvd.env["TF_NUM_INTRAOP_THREADS"] == "1"


def test_default_cores_leave_unsliced_processes_unpinned_and_gpus_never_pinned():
    _, job = _plan("parameter_server", cores=(0, 1))
    assert {w.name: w.cpus for w in job.workers}["chief-0"] is None
    cfg = p.LaunchConfig(script=SCRIPT, strategy="mirrored", workers=2, cores=(0, 1))
    job = p.plan(cfg, None, run_id="r", run_dir=Path("/tmp/r"), gpus=("0", "1"))
    assert job.workers[0].cpus is None


def test_extra_env_reaches_every_worker_and_cannot_override_the_launcher():
    env = {"HOROVOD_TIMELINE": "/tmp/t.json", "MY_TOKEN": "s3"}
    for strategy in p.STRATEGIES:
        cfg = p.LaunchConfig(script=SCRIPT, strategy=strategy, workers=2, env=env)
        job = p.plan(cfg, p.cluster_for(cfg), run_id="r", run_dir=Path("/tmp/r"), horovodrun="/h")
        for w in job.workers:
            assert w.env["HOROVOD_TIMELINE"] == "/tmp/t.json", (strategy, w.name)
            assert w.to_dict()["env"]["MY_TOKEN"] == "***"
    assert ("extra env", "HOROVOD_TIMELINE=/tmp/t.json, MY_TOKEN=***") in cfg.rows()
    with pytest.raises(ConfigError, match="env sets TF_CONFIG, which the launcher sets"):
        p.LaunchConfig(script=SCRIPT, env={"TF_CONFIG": "{}"})
    cfg = p.LaunchConfig(script=SCRIPT, workers=2, env={"TF_USE_LEGACY_KERAS": "0"})
    with pytest.raises(ConfigError, match=r"env sets TF_USE_LEGACY_KERAS='0' \(launcher: '1'\)"):
        p.plan(cfg, p.cluster_for(cfg), run_id="r", run_dir=Path("/tmp/r"))
    cfg = p.LaunchConfig(script=SCRIPT, workers=2, env={"OMP_NUM_THREADS": "8"})
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS"):
        p.plan(cfg, p.cluster_for(cfg), run_id="r", run_dir=Path("/tmp/r"), cores=(0, 1))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"cores": (0, 0)}, "not a list of distinct core numbers"),
        ({"cores": ()}, "not a list of distinct core numbers"),
        ({"cores": "0,1"}, "is a string"),
        ({"cores": (0,), "hosts": "10.0.0.7:2"}, "pins cores only on this machine"),
        ({"env": {"A": 1}}, "is not a string"),
        ({"env": "A=1"}, "is not a mapping"),
    ],
)
def test_bad_cores_or_env_is_one_clear_error(kw, message):
    with pytest.raises(ConfigError, match=message):
        p.LaunchConfig(script=SCRIPT, **kw)


def test_cores_this_process_may_not_use_are_refused():
    assert dev.check_cores((1,), (0, 1)) == (1,)
    with pytest.raises(ConfigError, match=r"asks for \[7\], which this process may not use"):
        dev.check_cores((1, 7), (0, 1))


def test_cli_passes_cores_and_env_to_start(tmp_path, capsys):
    from ddlkit.cli import _parser, main

    args = _parser().parse_args(
        ["launch", "--cores", "0,2-3", "--env", "A=1", "--env", "B=x=y", str(SCRIPT)]
    )
    assert args.cores == (0, 2, 3) and dict(args.env) == {"A": "1", "B": "x=y"}
    with pytest.raises(SystemExit):
        _parser().parse_args(["launch", "--cores", "0,a", str(SCRIPT)])
    assert "is not a core list" in capsys.readouterr().err
    runs = tmp_path / "runs"
    argv = ["launch", "--env", "TF_CONFIG={}", "--runs-dir", str(runs), str(SCRIPT)]
    assert main(argv) == 2
    assert "env sets TF_CONFIG, which the launcher sets" in capsys.readouterr().err
    assert not runs.exists()
