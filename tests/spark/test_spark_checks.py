"""Bad input for a Spark run: one ConfigError each, before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness.spark import refused

from ddlkit.cluster.ports import _pick_ports
from ddlkit.errors import ConfigError
from ddlkit.spark.cluster import find_java
from ddlkit.spark.driver import driver_host_conf, failure_report, session_conf
from ddlkit.spark.submit import master_slots
from ddlkit.where import Spark, from_keywords

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
SCRIPT = LAUNCH / "train_multi_worker.py"
PS_SCRIPT = LAUNCH / "train_parameter_server.py"


def test_an_unreachable_master_is_named(tmp_path):
    port = _pick_ports({"127.0.0.1": 1})["127.0.0.1"][0]  # free: nothing listens there
    message = refused(tmp_path, master=f"spark://127.0.0.1:{port}")
    assert f"cannot reach the Spark master spark://127.0.0.1:{port}" in message


def test_more_workers_than_local_slots(tmp_path):
    message = refused(tmp_path, master="local[1]")
    assert "2 workers need 2 task slots" in message and "local[1] has 1 free" in message
    assert "use master='local[2]'" in message, message


def test_too_few_slots_says_what_each_launcher_would_do():
    from ddlkit.spark.submit import too_few_slots

    barrier = too_few_slots("multi_worker", 3, "spark://node1:7077", 2)
    assert "barrier stage" in barrier and "maxConcurrentTasksCheck" in barrier, barrier
    assert "free 1 more slot" in barrier
    horovod = too_few_slots("horovod", 3, "local[2]", 2)
    assert "horovod.spark.run would start 2 of its tasks" in horovod, horovod
    assert "start_timeout (60 s here)" in horovod and "barrier" not in horovod


def test_executors_elsewhere_need_a_collector_address_they_reach(tmp_path):
    message = refused(tmp_path, master="yarn")
    assert "cannot send live metrics to 127.0.0.1" in message and "--collector-host" in message
    from ddlkit.spark.submit import collector_check, collector_host_for

    collector_check("yarn", None, None)  # live=False: nothing to reach
    collector_check("yarn", "10.0.0.5", None)  # an address the executors are told
    collector_check("local[2]", "127.0.0.1", None)  # executors on this machine
    with pytest.raises(ConfigError, match="cannot send live metrics to 127.0.0.1"):
        collector_check("spark://node1:7077", "0.0.0.0", "127.0.0.1")
    assert collector_host_for("spark://127.0.0.1:7077", "auto") == "auto"  # launch's own
    assert collector_host_for("yarn", "auto") == "auto"


def test_no_java_names_the_package(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="apt-get install -y openjdk-17-jre-headless"):
        find_java({"PATH": str(tmp_path)})
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without java
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert "openjdk-17-jre-headless" in refused(tmp_path, master="local[2]")


def test_a_missing_script(tmp_path):
    message = refused(tmp_path, master="local[2]", script=tmp_path / "nope.py")
    assert "nope.py" in message and "not found" in message


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"master": "mesos://x:5050"}, "is not one Spark knows"),
        ({"master": None}, "needs its master URL"),
        (
            {"master": "local[2]", "strategy": "parameter_server", "script": PS_SCRIPT},
            "does not run on Spark",
        ),
    ],
)
def test_other_bad_input(tmp_path, kwargs, says):
    assert says in refused(tmp_path, **kwargs)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"master": "local[2]", "engine": "flink"}, "engine='flink' is not one ddlkit knows"),
        ({"master": "local[2]", "engine": "local"}, "where=dk.where.Spark('local[2]')"),
        ({"master": "local[2]", "engine": "spark", "cores": (0,)}, "cores given with engine="),
        ({"master": "yarn", "engine": "spark", "python": "/opt/py"}, "python given with engine="),
    ],
)
def test_the_old_engine_keyword_refuses_what_it_cannot_say(given, says):
    with pytest.raises(ConfigError) as err:
        from_keywords(given)
    assert says in str(err.value) and "Fix:" in str(err.value)


def test_the_engine_keyword_passes_the_collector_host_on_to_spark():
    # `ddlkit launch --engine spark --master M --collector-host auto` as the CLI says it
    where = from_keywords(
        {"engine": "spark", "master": "spark://n1:7077", "collector_host": "auto"}
    )
    assert where == Spark("spark://n1:7077", collector_host="auto")
    assert from_keywords({"engine": "spark", "master": "yarn"}).collector_host is None


def test_slots_of_master_forms():
    assert master_slots("local") == 1 and master_slots("local[3]") == 3
    assert master_slots("local[*]") == os.cpu_count()
    assert master_slots("yarn") is None and master_slots("k8s://https://api:6443") is None


def test_the_drivers_failure_report_names_the_task_and_ends_with_sparks_reason(tmp_path):
    log = tmp_path / "logs" / "worker-1.log"
    log.parent.mkdir()
    log.write_text("step 1\nstep 2\n")
    spark_error = (
        "An error occurred\nJob aborted due to stage failure: barrier task ResultTask(0, 1) "
        "finished unsuccessfully.\n\tat org.apache.spark.Foo"
    )
    report = failure_report(RuntimeError(spark_error), str(tmp_path), ["worker-0", "worker-1"])
    assert report.splitlines()[0].startswith("--- worker-1 (") and "step 2" in report
    assert report.splitlines()[-1].endswith(
        "barrier task ResultTask(0, 1) finished unsuccessfully."
    )
    task_error = "x\nddlkit.spark.tasks.TaskFailed: worker-1 (Spark task 1) was killed\n\tat org"
    assert failure_report(RuntimeError(task_error), str(tmp_path), []) == (
        "Spark job failed: worker-1 (Spark task 1) was killed"
    )


def test_session_settings_fail_fast_and_stay_on_loopback():
    conf = session_conf("spark://127.0.0.1:7077", 2)
    assert conf["spark.task.maxFailures"] == "1" and conf["spark.cores.max"] == "2"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert "spark.driver.host" not in session_conf("spark://master.example:7077", 2)


def test_a_driver_for_a_master_elsewhere_names_its_address_towards_the_master():
    from ddlkit.launch.remote import address_towards

    master = "spark://127.0.0.9:7077"  # not the loopback master a local cluster has
    assert driver_host_conf(master, {}) == {"spark.driver.host": address_towards(["127.0.0.9"])}
    assert driver_host_conf(master, {"SPARK_LOCAL_IP": "127.0.0.9"}) == {}  # the user's word
    assert driver_host_conf("spark://127.0.0.1:7077", {}) == {}  # session_conf's loopback
    assert driver_host_conf("yarn", {}) == driver_host_conf("local[2]", {}) == {}


def test_jvms_on_this_machine_run_lean_and_the_users_java_options_come_last(monkeypatch):
    from ddlkit.spark.cluster import LEAN_JVM_OPTIONS, daemon_env

    lean = " ".join(LEAN_JVM_OPTIONS)
    assert "-XX:TieredStopAtLevel=1" in LEAN_JVM_OPTIONS
    assert session_conf("local[2]", 2)["spark.driver.extraJavaOptions"] == lean
    assert "spark.driver.extraJavaOptions" not in session_conf("spark://node1:7077", 2)
    monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
    assert daemon_env()["JAVA_TOOL_OPTIONS"] == lean
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=4")
    assert daemon_env()["JAVA_TOOL_OPTIONS"] == f"{lean} -XX:TieredStopAtLevel=4"


def test_horovod_keeps_to_loopback_on_a_loopback_master():
    from ddlkit.spark.driver import horovod_nics

    assert horovod_nics("local[2]") == horovod_nics("spark://127.0.0.1:7077") == ["lo"]
    assert horovod_nics("spark://node1:7077") is None and horovod_nics("yarn") is None
