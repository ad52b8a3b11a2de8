"""The pure parts of live workers: the plan, the engine's arguments, the script, the messages,
and dk.where with launch.start's old keywords."""

from __future__ import annotations

import ast
import json
import threading
import time
import warnings
from pathlib import Path

import pytest

import ddlkit as dk
from ddlkit import where
from ddlkit.cluster import ClusterSpec
from ddlkit.errors import ConfigError
from ddlkit.interactive import plan
from ddlkit.interactive.engine import engine_argv, wait_for_connection_file
from ddlkit.interactive.engine import log_level as engine_log_level
from ddlkit.interactive.output import Labeller, hidden, label_lines, waiting_message
from ddlkit.interactive.script import Transcript
from ddlkit.launch.run import resolve_where

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "report_tf_config.py"


def test_engine_ids_follow_the_worker_names_and_a_stranger_is_refused():
    argv = engine_argv(["worker-0", "worker-1"], "worker-1", "/r/f.json", 5.0)
    assert "--IPEngine.id=1" in argv and "--file=/r/f.json" in argv
    with pytest.raises(ConfigError, match="not one of the live workers"):
        engine_argv(["worker-0"], "chief-0", "/r/f.json", 5.0)


def test_an_engine_waits_for_the_whole_connection_file_and_says_when_it_never_comes(tmp_path):
    path = tmp_path / "ipcontroller-engine.json"
    whole = json.dumps({"location": "127.0.0.1", "key": "k" * 64}, indent=2)

    def controller() -> None:  # as ipyparallel's writes it: created, then written in place
        time.sleep(0.2)
        with open(path, "w") as f:
            f.write(whole[:10])
            f.flush()
            time.sleep(0.3)
            f.write(whole[10:])

    writer = threading.Thread(target=controller)
    t0 = time.monotonic()
    writer.start()
    wait_for_connection_file(path, timeout=10.0, step=0.01)
    assert json.loads(path.read_text())["location"] == "127.0.0.1"  # whole when it returned
    assert time.monotonic() - t0 >= 0.5
    writer.join()
    path.write_text("")
    with pytest.raises(ConfigError, match="not written whole within 0 s.*ipcontroller.log"):
        wait_for_connection_file(path, timeout=0.2, step=0.01)


def test_engine_names_are_the_worker_tasks_or_the_ranks():
    cluster = ClusterSpec.local(workers=2, ps=1, chief=True)
    assert plan.engine_names("parameter_server", 2, cluster) == ("worker-0", "worker-1")
    assert plan.engine_names("horovod", 3, None) == ("rank-0", "rank-1", "rank-2")
    with pytest.raises(ConfigError, match="MirroredStrategy runs in this notebook"):
        plan.check_strategy("mirrored")


def test_the_controller_listens_where_asked_and_its_files_stay_in_the_run_dir(tmp_path):
    spec = plan.controller_spec(tmp_path, "/py", "127.0.0.1", 21000)
    assert spec.service and "--ip=127.0.0.1" in spec.argv
    assert "--IPController.ports=21000-21019" in spec.argv
    assert f"--profile-dir={tmp_path / 'ipython'}" in spec.argv
    assert plan.client_file(tmp_path).is_relative_to(tmp_path)


def test_the_script_is_the_cells_in_order_with_the_commands_that_run_it():
    text = Transcript("multi_worker", ["import tensorflow as tf", "print(1)"]).text("w.py")
    tree = ast.parse(text)
    assert 'dk.launch.start("w.py", strategy="multi_worker", workers=2)' in ast.get_docstring(tree)
    assert text.index("import tensorflow") < text.index("print(1)")
    assert 'os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")' in text
    assert "ddlkit" not in text.split('"""')[2]  # nothing of the kit outside the docstring


def test_a_cell_with_a_magic_or_none_at_all_is_refused_by_name():
    with pytest.raises(ConfigError, match="cell 2 run on the workers is not plain Python"):
        Transcript("horovod", ["x = 1", "!ls"]).text()
    with pytest.raises(ConfigError, match="no cell has run on every worker"):
        Transcript("horovod").text()
    with pytest.raises(ConfigError, match="this notebook is the coordinator"):
        Transcript("parameter_server", ["x = 1"]).text()


def test_output_is_labelled_by_line_and_an_open_line_waits_for_its_end():
    import io

    out = io.StringIO()
    labeller = Labeller(["worker-0", "worker-1"], out)
    send = labeller.callback(1)
    for text in ("a\nb", "c\n", "tail"):
        send({"header": {"msg_type": "stream"}, "content": {"name": "stdout", "text": text}})
    labeller.drain()
    assert out.getvalue() == "[worker-1] a\n[worker-1] bc\n"
    labeller.finish()
    assert out.getvalue().endswith("[worker-1] tail\n")
    assert label_lines("rank-0", "x\ny") == "[rank-0] x\n[rank-0] y\n"


def test_tensorflows_cpp_start_up_lines_below_the_engines_level_are_not_shown():
    """TF 2.21 logs them through absl before it is set up, whatever TF_CPP_MIN_LOG_LEVEL says
    (seen on the engines: the oneDNN and CUDA lines, then the cuInit error at the first op)."""
    import io

    lines = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795712599.724945    4762 port.cc:153] oneDNN custom operations are on.",
        "W1126 16:57:17.148123   12 cpu_feature_guard.cc:3] a warning",
        "E0000 00:00:1795712611.881593    4762 cuda_platform.cc:52] failed call to cuInit",
        "I0000 is how my line starts",
        "INFO:tensorflow:Using MirroredStrategy",
    ]
    out = io.StringIO()
    labeller = Labeller(["rank-0"], out, level=engine_log_level({}))
    message = {"header": {"msg_type": "stream"}, "content": {"name": "stderr"}}
    labeller.callback(0)({**message, "content": {"name": "stderr", "text": "\n".join(lines)}})
    labeller.finish()
    assert out.getvalue().splitlines() == [f"[rank-0] {line}" for line in lines[3:]]
    assert [hidden(line, 0) for line in lines] == [False] * 6  # TF_CPP_MIN_LOG_LEVEL=0: all
    assert engine_log_level({"TF_CPP_MIN_LOG_LEVEL": "3"}) == 3 and hidden(lines[3], 3)


def test_the_lone_collective_message_names_who_waits_and_who_never_joined():
    said = waiting_message(["worker-0"], ["worker-1", "worker-2"], 30)
    assert said.startswith("worker-0 is still running this cell after 30 s; worker-1, worker-2")
    assert "%%px --targets 1,2" in said and "workers.restart()" in said


def test_where_is_one_typed_object_checked_when_made():
    assert where.ThisMachine(cores=[0, 1]).config() == {"cores": (0, 1), "pin_cores": True}
    hosts = where.Hosts("n1:1,n2:1", collector_host="auto")
    assert [h.name for h in hosts.config()["hosts"]] == ["n1", "n2"]
    with pytest.raises(ConfigError, match="exactly one"):
        where.Hosts()
    with pytest.raises(ConfigError, match="master URL"):
        where.Spark("")
    assert "Hosts over SSH" not in where.ThisMachine()._repr_html_()
    assert dk.where.Spark("local[2]").rows()[0] == ("where", "Spark")


def test_the_old_launch_keywords_warn_with_the_where_that_replaces_them():
    with pytest.warns(DeprecationWarning, match=r"where=dk.where.Hosts\(hosts='n1:1,n2:1'"):
        got = resolve_where(None, {"hosts": "n1:1,n2:1", "ssh": None})
    assert isinstance(got, where.Hosts)
    with pytest.warns(DeprecationWarning, match=r"where=dk.where.Spark\('local\[2\]'\)"):
        assert resolve_where(None, {"engine": "spark", "master": "local[2]"}).master == "local[2]"
    with pytest.warns(DeprecationWarning, match=r"ThisMachine\(cores=\(0,\)"):
        assert resolve_where(None, {"cores": (0,)}).cores == (0,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_where(None, {}) == where.ThisMachine()
    with pytest.raises(ConfigError, match="both given"):
        resolve_where(where.ThisMachine(), {"cores": (0,)})
    with pytest.raises(TypeError, match="unexpected keyword argument 'hots'"):
        resolve_where(None, {"hots": "x"})
    with pytest.raises(ConfigError, match="without hosts"):
        where.from_keywords({"ssh": dk.hosts.SshOptions()})


def test_launch_start_refuses_a_bad_where_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="is not a dk.where.Where"):
        dk.launch.start(SCRIPT, workers=1, where="localhost", runs_dir=tmp_path)
    with pytest.raises(ConfigError, match="started by srun"):
        dk.launch.start(SCRIPT, workers=1, where=where.Slurm(), runs_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_in_a_slurm_allocation_the_workers_are_the_tasks_of_one_srun(tmp_path):
    names = ("worker-0", "worker-1")
    spec = plan.srun_spec(tmp_path, "/py", names, {"K": "v"}, 21000, ("--cpus-per-task=1",))
    argv = list(spec.argv)
    assert spec.name == "srun" and spec.env == {"K": "v"} and spec.cpus is None
    assert argv[:5] == [
        "srun", "--ntasks=2", "--kill-on-bad-exit=1", "--distribution=block", "--cpus-per-task=1"
    ]  # fmt: skip
    wrapper = argv[5 : argv.index("--")]
    assert wrapper == ["/py", "-m", "ddlkit.slurm", "exec", "--port-base", "21000",
                       "--run-dir", str(tmp_path)]  # fmt: skip
    assert argv[argv.index("--") + 1 :] == [str(plan.ENGINE), *plan.engine_args(tmp_path, names)]
    nodes = (("n1", 1), ("n2", 1))
    plan.check_slurm("multi_worker", 2, nodes)
    with pytest.raises(ConfigError, match=r"2 task\(s\) on n1, n2.*salloc -n 3"):
        plan.check_slurm("multi_worker", 3, nodes)
    with pytest.raises(ConfigError, match="sbatch launch/slurm/horovod.sbatch"):
        plan.check_slurm("horovod", 2, nodes)
    with pytest.raises(ConfigError, match="port_base=80"):
        where.Slurm(port_base=80)


def test_dk_workers_on_slurm_outside_an_allocation_is_one_error_and_starts_nothing(
    tmp_path, monkeypatch
):
    for name in [n for n in __import__("os").environ if n.startswith("SLURM")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DDLKIT_RUNS", str(tmp_path))
    with pytest.raises(ConfigError, match="not inside a Slurm allocation.*salloc -n 2"):
        dk.workers(2, strategy="multi_worker", where=where.Slurm())
    with pytest.raises(ConfigError, match=r"Spark runs scripts.*where=dk.where.Spark\(master\)"):
        dk.workers(2, strategy="multi_worker", where=where.Spark("local[2]"))
    assert not list(tmp_path.iterdir())


def test_a_dead_workers_message_names_it_with_the_log_of_what_started_it():
    from ddlkit.interactive.output import death_message

    said = death_message(
        ["rank-0", "rank-1"], ["rank-0", "rank-1"], {"rank-1": "SIGKILL sent by workers.kill"},
        None, lambda name: f"(last lines of horovodrun's log)\nbye from {name}",
    )  # fmt: skip
    assert said.startswith("live worker rank-1 (SIGKILL sent by workers.kill) died.")
    assert "--- rank-1 ---\n(last lines of horovodrun's log)\nbye from rank-1" in said
    assert said.endswith("(then run the cells again from the first).")


def test_a_cell_that_raised_on_one_worker_while_others_wait_is_one_message():
    from ddlkit.interactive.output import stuck_message

    said = stuck_message({"worker-1": ("ValueError", "no")}, ["worker-0"], 30)
    assert said.startswith("the cell raised on worker-1 (worker-1: ValueError: no;")
    assert "worker-0 is still running it 30 s later" in said and "workers.restart()" in said
