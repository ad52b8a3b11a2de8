"""A real Spark standalone cluster on this machine: one master and N workers on loopback
(or, as root, each worker on a namespaced host: ``local_cluster(hosts=...)``).

pip's pyspark ships ``bin/spark-class`` but no ``sbin/start-*.sh``, so each daemon is
started as Spark's own scripts would::

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P ...
    spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P -c 1 ...

Every daemon is a process of :mod:`ddlkit.launch.process` (its own process group, SIGKILL
when this process dies), so the executors and Python workers a Worker starts go with it:
:meth:`LocalCluster.close` stops the groups; an ``atexit`` hook does it at interpreter exit
and the kernel's death signal when a notebook kernel is shut down or killed.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddlkit import contract
from ddlkit._tables import html_table
from ddlkit.cluster.ports import free_ports
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.launch.spec import WorkerSpec

if TYPE_CHECKING:
    from ddlkit.hosts.netns import NetnsHost

# Spark 3.5 runs on Java 8, 11 or 17; the kit installs Debian's 17, which Spark 4 needs too.
JAVA_PACKAGE = "openjdk-17-jre-headless"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT = 60.0  # seconds for the master and every worker to be up
# The JVMs of a cluster on this machine share its few cores with the training they serve,
# and each lives for a few short jobs: C1 alone compiles enough (C2's compiler threads
# cost more CPU than they save here), and one serial collector runs instead of a GC thread
# per core. On 2 cores, Spark's run tests took 97 CPU-s with Java's defaults and 61 with
# these; notebook 10 in fast mode 103 and 64. A local cluster's daemons pass them to the
# executors they start (JAVA_TOOL_OPTIONS is inherited); a run's driver on a loopback
# master gets them from its session settings (ddlkit.spark.driver.session_conf).
LEAN_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
_CLUSTERS: dict[str, LocalCluster] = {}  # master URL -> a cluster this process started


def spark_home() -> Path:
    """pyspark's install directory (it holds ``bin/spark-class`` and ``jars/``)."""
    try:
        import pyspark
    except ImportError:
        raise ConfigError(
            "pyspark is not installed. Fix: pip install 'pyspark==3.5.9' (make lab does it)."
        ) from None
    return Path(pyspark.__file__).parent


def find_java(environ: dict[str, str] | None = None) -> str:
    """The ``java`` Spark will run (``JAVA_HOME/bin/java``, else on PATH); ConfigError if none."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java", path=env.get("PATH", os.defpath))
    if java is None:
        raise ConfigError(
            f"Spark needs Java (8, 11 or 17 for Spark 3.5), and there is no `java` on PATH "
            f"(JAVA_HOME {'is ' + repr(home) if home else 'is not set'}). Fix: apt-get install "
            f"-y {JAVA_PACKAGE} (it is in system-packages.txt; make lab installs it)."
        )
    return java


def daemon_env(python: str = sys.executable) -> dict[str, str]:
    """The environment of Spark's daemons and of the executors' Python workers: every JVM
    among them starts with LEAN_JVM_OPTIONS, then the user's own JAVA_TOOL_OPTIONS (the
    JVM takes the last of two settings, so the user's win)."""
    java_options = (*LEAN_JVM_OPTIONS, os.environ.get("JAVA_TOOL_OPTIONS", ""))
    return {
        **os.environ,
        "JAVA_TOOL_OPTIONS": " ".join(java_options).strip(),
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": python,  # else executors run another Python, without the kit
        "PYSPARK_DRIVER_PYTHON": python,
        "SPARK_NO_DAEMONIZE": "1",
    }


def master_state(ui_url: str, timeout: float = 2.0) -> dict:
    """The standalone master's own JSON status page (``<web UI>/json/``)."""
    with urllib.request.urlopen(f"{ui_url}/json/", timeout=timeout) as response:
        return json.load(response)


def free_slots(state: dict) -> int:
    """Task slots (cores) not in use on the master's ALIVE workers."""
    workers = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
    return sum(int(w["cores"]) - int(w["coresused"]) for w in workers)


@dataclass(frozen=True)
class ClusterInfo:
    """What a notebook shows of a running local cluster."""

    master_url: str
    ui_url: str
    workers: int
    cores_per_worker: int
    memory_per_worker: str

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("master URL", self.master_url),
            ("web UI", self.ui_url),
            (
                "workers",
                f"{self.workers} x {self.cores_per_worker} core(s), {self.memory_per_worker} each",
            ),
            ("task slots", str(self.workers * self.cores_per_worker)),
        ]

    def _repr_html_(self) -> str:
        return html_table(("Spark standalone", ""), self.rows())


@dataclass
class LocalCluster:
    """A running standalone master and its workers (see the module docstring)."""

    info: ClusterInfo
    procs: list = field(default_factory=list)  # launch.process.WorkerProcess, master first
    work_dir: Path | None = None
    _owned_dir: bool = False

    @property
    def master_url(self) -> str:
        return self.info.master_url

    @property
    def ui_url(self) -> str:
        return self.info.ui_url

    def state(self) -> dict:
        return master_state(self.ui_url)

    def executor_pids(self) -> list[int]:
        """Running executor JVMs (``CoarseGrainedExecutorBackend``) of this cluster."""
        from ddlkit.procs import descendants

        pids = []
        for worker in self.procs[1:]:
            for pid, cmdline in descendants(worker.pid):
                if "CoarseGrainedExecutorBackend" in cmdline:
                    pids.append(pid)
        return pids

    def close(self, grace: float = 5.0) -> None:
        """Stop every worker, then the master (their executors with them). Idempotent."""
        for proc in reversed(self.procs):
            proc.signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            if proc.wait_ended(grace) is None:
                proc.signal(signal.SIGKILL)
                proc.wait_ended(grace)
        _CLUSTERS.pop(self.master_url, None)
        if self._owned_dir and self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repr_html_(self) -> str:
        return self.info._repr_html_()

    def __repr__(self) -> str:
        return f"LocalCluster({self.master_url!r}, ui={self.ui_url!r})"


def find(master_url: str) -> LocalCluster | None:
    """The running local cluster of this process with ``master_url``, if any."""
    return _CLUSTERS.get(master_url)


def daemon_specs(
    workers: int,
    cores_per_worker: int,
    memory: str,
    work_dir: Path,
    ports: list[int],
    hosts: Sequence[NetnsHost] = (),
) -> list[WorkerSpec]:
    """The master's and each worker's command (pure; ``ports``: 2 + workers free ports).

    With ``hosts`` (namespaced hosts, one per worker), each worker runs inside its host's
    namespace on the host's address, and the master on the hosts' gateway, this machine's
    address on their network; else all on 127.0.0.1."""
    spark_class = str(spark_home() / "bin" / "spark-class")
    master_port, ui_port, *worker_ui = ports
    master_host = hosts[0].gateway if hosts else "127.0.0.1"
    master_url = f"spark://{master_host}:{master_port}"
    specs = [
        WorkerSpec(
            name="spark-master",
            argv=(
                spark_class,
                MASTER_CLASS,
                "--host",
                master_host,
                "--port",
                str(master_port),
                "--webui-port",
                str(ui_port),
            ),
            env={"SPARK_LOCAL_IP": master_host},
            cwd=work_dir,
            log_path=contract.log_path(work_dir, "spark-master"),
        )
    ]
    for i in range(workers):
        argv = (
            spark_class,
            WORKER_CLASS,
            master_url,
            "--host",
            hosts[i].address if hosts else "127.0.0.1",
            "--cores",
            str(cores_per_worker),
            "--memory",
            memory,
            "--webui-port",
            str(worker_ui[i]),
            "--work-dir",
            str(work_dir / f"worker-{i}"),
        )
        specs.append(
            WorkerSpec(
                name=f"spark-worker-{i}",
                argv=tuple(hosts[i].exec_argv(argv)) if hosts else argv,
                env={"SPARK_LOCAL_IP": hosts[i].address if hosts else "127.0.0.1"},
                cwd=work_dir,
                log_path=contract.log_path(work_dir, f"spark-worker-{i}"),
            )
        )
    return specs


def local_cluster(
    workers: int = 2,
    cores_per_worker: int = 1,
    memory_per_worker: str = "2g",
    work_dir: str | Path | None = None,
    timeout: float = START_TIMEOUT,
    hosts: Sequence[NetnsHost] = (),
) -> LocalCluster:
    """Start a standalone master and ``workers`` workers on 127.0.0.1 (free ports); wait
    until every worker has registered. ConfigError (nothing started) without Java or
    pyspark; DdlkitError with the daemons' log tails if they do not come up.

    ``hosts``: namespaced hosts (``ddlkit.hosts.netns.namespaced_hosts``, root), one worker
    on each, the master on their gateway: executors then run on other hosts as on a real
    cluster, reaching the driver and a collector only through this machine's address on
    their network."""
    hosts = tuple(hosts)
    if hosts and workers != len(hosts):
        raise ConfigError(
            f"workers={workers!r} but {len(hosts)} hosts: one worker runs on each host. "
            f"Fix: workers={len(hosts)}."
        )
    if type(workers) is not int or workers < 1:
        raise ConfigError(f"workers={workers!r}: a cluster needs at least one. Fix: workers=2.")
    if type(cores_per_worker) is not int or cores_per_worker < 1:
        raise ConfigError(
            f"cores_per_worker={cores_per_worker!r}. Fix: pass 1 or more (one task slot each)."
        )
    find_java()
    env = daemon_env()
    owned = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="ddlkit-spark-")) if owned else Path(work_dir)
    contract.logs_dir(root).mkdir(parents=True, exist_ok=True)
    master_host = hosts[0].gateway if hosts else "127.0.0.1"
    ports = free_ports(2 + workers, master_host)
    specs = daemon_specs(workers, cores_per_worker, memory_per_worker, root, ports, hosts)
    info = ClusterInfo(
        f"spark://{master_host}:{ports[0]}",
        f"http://{master_host}:{ports[1]}",
        workers,
        cores_per_worker,
        memory_per_worker,
    )
    from ddlkit.launch.process import start_workers

    procs = start_workers(specs, {s.name: {**env, **s.env} for s in specs})
    cluster = LocalCluster(info, procs, root, owned)
    _CLUSTERS[info.master_url] = cluster
    try:
        _wait_up(cluster, specs, timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _wait_up(cluster: LocalCluster, specs: list[WorkerSpec], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        dead = [s for s, p in zip(specs, cluster.procs, strict=True) if p.poll() is not None]
        if dead:
            raise DdlkitError(_daemon_failure(dead[0], "exited while starting"))
        try:
            state = cluster.state()
            alive = sum(w.get("state") == "ALIVE" for w in state.get("workers", []))
            if alive >= cluster.info.workers:
                return
        except OSError:
            pass  # the master's web UI is not up yet
        time.sleep(0.25)
    raise DdlkitError(
        _daemon_failure(
            specs[0], f"had {alive} of {cluster.info.workers} workers after {timeout:.0f} s"
        )
    )


def _daemon_failure(spec: WorkerSpec, what: str) -> str:
    from ddlkit.launch.runs import tail

    return (
        f"Spark {spec.name} {what}. Its log ({spec.log_path}) ends:\n{tail(spec.log_path, 15)}\n"
        f"Fix: read the log; a busy port or too little memory are the usual causes."
    )


@atexit.register
def _close_all() -> None:
    for cluster in list(_CLUSTERS.values()):
        cluster.close(grace=2.0)
