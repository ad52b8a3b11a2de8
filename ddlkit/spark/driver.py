"""The Spark driver of one run: ``python -m ddlkit.spark driver ... -- SCRIPT ARGS``.

The launcher starts it as the run's one process (``spark-driver``), so the Run API
(status, wait, stop, kill, tail) is the same as for local jobs: stopping it stops its JVM,
which ends the application, whose executors end their tasks' workers. It connects to the
master, runs the workers (multi_worker: a barrier stage of N tasks; horovod:
``horovod.spark.run`` over Gloo, one rank per task of an ordinary stage), prints one line
per worker, and exits 0; on a failure it prints what Spark says failed (the task) and the
workers' log tails, and exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence

from ddlkit import backend, contract, strategies
from ddlkit.launch.remote import FORWARDED
from ddlkit.spark.cluster import LEAN_JVM_OPTIONS
from ddlkit.spark.tasks import TaskPlan, barrier_task, horovod_task, log_tails, report_lines

EXIT_FAILED = 1
# How long a run's driver lets Spark look for the slots of a barrier stage: it re-checks every
# BARRIER_CHECK_INTERVAL seconds and fails the job after BARRIER_CHECK_FAILURES failed checks
# (Spark's defaults: 15 s and 40, about 10 minutes).
BARRIER_CHECK_INTERVAL = 1
BARRIER_CHECK_FAILURES = 60
# horovod.spark.run's start_timeout: its driver service waits this long for every task to
# register (Horovod's default: HOROVOD_SPARK_START_TIMEOUT, else 600 s).
START_TIMEOUT = 60
_TASK_FAILED = re.compile(r"TaskFailed: (.*?)(?:\n\s*at |\n\tat |\nDriver stacktrace|\Z)", re.S)
_STAGE = re.compile(r"(Job aborted due to stage failure: [^\n]*|Could not recover[^\n]*)")
LOOPBACK_MASTER = re.compile(r"^(local(\[.*\])?|spark://(127\.0\.0\.1|localhost)(:\d+)?)$")
SPARK_MASTER = re.compile(r"^spark://([^:/\s]+):(\d+)$")


def session_conf(master: str, workers: int) -> dict[str, str]:
    """The SparkSession settings of a run (pure): fail fast, no retries of a worker."""
    conf = {
        "spark.ui.showConsoleProgress": "false",
        # A training task is not retried: a rank started again alone cannot rejoin its peers
        # (horovod.spark.run's tasks form an ordinary stage, which Spark retries by default).
        "spark.task.maxFailures": "1",
        "spark.stage.maxConsecutiveAttempts": "1",
        # Executors register a few seconds after the application starts: a barrier stage
        # waits up to BARRIER_CHECK_INTERVAL x BARRIER_CHECK_FAILURES s for its slots (the
        # launcher has checked that the cluster has them).
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": f"{BARRIER_CHECK_INTERVAL}s",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": str(BARRIER_CHECK_FAILURES),
        # A fresh Python worker per task: TensorFlow's collectives are set up once per process,
        # so a second training stage in a reused worker would wait on the first one's peers.
        "spark.python.worker.reuse": "false",
    }
    if master.startswith("spark://"):
        conf["spark.cores.max"] = str(workers)  # leave the other slots to other apps
    if LOOPBACK_MASTER.match(master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        # The driver's JVM shares this machine's cores with the training: it compiles and
        # collects lean, as a local cluster's daemons and executors do (see cluster.py)
        conf["spark.driver.extraJavaOptions"] = " ".join(LEAN_JVM_OPTIONS)
    return conf


def remote_master_host(master: str) -> str | None:
    """The HOST of a ``spark://HOST:PORT`` master not on this machine's loopback (pure);
    None for any other master."""
    found = SPARK_MASTER.match(master)
    return None if found is None or LOOPBACK_MASTER.match(master) else found.group(1)


def driver_host_conf(master: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``spark.driver.host`` for a ``spark://HOST`` master elsewhere: this machine's address
    towards HOST, the one its executors reach the driver by, unless ``SPARK_LOCAL_IP`` says
    otherwise. Left to itself, Spark takes the host name's address and, where that is
    loopback (Debian's /etc/hosts), the first other interface's, which on a machine with
    several networks may be one the executors cannot reach."""
    remote = remote_master_host(master)
    if remote is None or environ.get("SPARK_LOCAL_IP"):
        return {}
    from ddlkit.launch.remote import address_towards

    return {"spark.driver.host": address_towards([remote])}


def horovod_nics(master: str) -> list[str] | None:
    """The network interfaces Horovod's ranks use: ``lo`` when every executor runs here on
    loopback (``local[N]``, ``spark://127.x``). Left to itself, horovod.spark.run has every
    task list its interfaces and fails on one that another program adds or removes
    meanwhile (seen: the bridge of namespaced demo hosts, "Spark job failed: 'dk102dc0br'").
    None elsewhere: Horovod finds the interfaces the executors share."""
    return ["lo"] if LOOPBACK_MASTER.match(master) else None


def worker_names(strategy: str, workers: int) -> list[str]:
    if strategies.get(strategy).needs_horovodrun:  # Horovod's ranks name themselves rank-N
        return [contract.rank_name(i) for i in range(workers)]
    return [contract.task_name("worker", i) for i in range(workers)]


def failure_report(error: BaseException, run_dir: str, names: Sequence[str]) -> str:
    """What failed, from Spark's error: the worker's own report (TaskFailed, with its log
    tail), else Spark's reason (the lost task) and every worker's log tail."""
    text = str(error)
    found = _TASK_FAILED.search(text)
    if found:
        return f"Spark job failed: {found.group(1).strip()}"
    stage = _STAGE.search(text)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("An error occurred while calling")]
    reason = stage.group(1) if stage else (said or lines or [repr(error)])[0][:500]
    # the tails first, Spark's reason last: the launcher's error shows the log's last lines
    tails = log_tails(run_dir, names, n=6)
    return "\n".join(part for part in (tails, f"Spark job failed: {reason}") if part)


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    run_dir = os.environ[contract.RUN_DIR_VAR]
    forward = {*contract.ENV_VARS, *backend.keras_env(), *FORWARDED, *args.forward}
    plan = TaskPlan(
        python=args.python,
        script=args.script,
        args=tuple(args.script_args),
        run_dir=run_dir,
        env={k: v for k, v in os.environ.items() if k in forward and k != contract.WORKER_VAR},
        threads=args.threads,
    )
    builder = SparkSession.builder.master(args.master).appName(f"ddlkit {args.app_name}")
    conf = session_conf(args.master, args.workers)
    conf.update(driver_host_conf(args.master, os.environ))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    names = worker_names(args.strategy, args.workers)
    print(
        f"driver: {args.strategy} x{args.workers} on {args.master} "
        f"(application {spark.sparkContext.applicationId})",
        flush=True,
    )
    error: BaseException | None = None
    reports: list[dict] = []
    try:
        if strategies.get(args.strategy).needs_horovodrun:  # Horovod: horovod.spark.run
            import horovod.spark

            # use_gloo: Gloo's rendezvous on this driver and the ranks started through
            # Horovod's task services. Without it a build with MPI takes the MPI path, which
            # starts `mpirun` here through processes made with multiprocessing's spawn.
            reports = horovod.spark.run(
                horovod_task,
                args=(plan,),
                num_proc=args.workers,
                use_gloo=True,
                nics=horovod_nics(args.master),
                start_timeout=args.start_timeout,
                env=dict(os.environ),
                verbose=1,
            )
        else:
            rdd = spark.sparkContext.parallelize(range(args.workers), args.workers)
            import json

            reports = [
                json.loads(r) for r in rdd.barrier().mapPartitions(barrier_task(plan)).collect()
            ]
    except Exception as exc:  # reported below, after Spark has stopped
        error = exc
    finally:
        spark.stop()
    if error is not None:
        print(failure_report(error, run_dir, names), file=sys.stderr, flush=True)
        return EXIT_FAILED
    print("\n".join(report_lines(reports)), flush=True)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddlkit.spark driver")
    p.add_argument("--master", required=True)
    p.add_argument("--strategy", choices=("multi_worker", "horovod"), required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--start-timeout", type=int, default=START_TIMEOUT)
    p.add_argument("--app-name", default="run")
    p.add_argument("--forward", action="append", default=[], help="a variable for the workers")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.script_args[:1] == ["--"]:
        args.script_args = args.script_args[1:]
    return run(args)
