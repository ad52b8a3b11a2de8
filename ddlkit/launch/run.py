"""Run a strategy: plan it, start the collector and the workers, watch them.

This is the one place that puts the pieces together; the notebook call and
``ddlkit launch`` both come here::

    run = dk.launch.start("../launch/train_multi_worker.py", strategy="multi_worker",
                          workers=2, args=["--epochs", "1"])
    run.dashboard()        # live curves of every worker
    result = run.wait()    # raises WorkerFailedError if a worker fails

Across hosts (over SSH, checked first by `ddlkit.hosts.check_hosts`)::

    run = dk.launch.start(script, strategy="multi_worker", workers=2,
                          hosts="node1:1,node2:1", ssh=dk.hosts.SshOptions(identity=...),
                          collector_host="auto")
"""

from __future__ import annotations

import html
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlkit import contract, settings, strategies
from ddlkit.cluster import ClusterSpec
from ddlkit.environments import for_worker
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.hosts.preflight import Preflight, check_hosts
from ddlkit.hosts.ssh import SshOptions, write_ssh_shim
from ddlkit.launch import devices, plan, remote, runs, script_check
from ddlkit.launch.job import Job, JobResult, WorkerStatus
from ddlkit.launch.runs import new_run_id
from ddlkit.metrics import Collector, Record
from ddlkit.metrics.protocol import is_loopback

WILDCARDS = ("0.0.0.0", "::")


class Run:
    """A started job with its cluster, its metrics collector and (once asked) its dashboard."""

    def __init__(
        self,
        config: plan.LaunchConfig,
        cluster: ClusterSpec | None,
        job: Job,
        collector: Collector | None,
        preflight: Preflight | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.job = job
        self.collector = collector
        self.preflight = preflight  # what the hosts answered before the job started
        self.metric_workers: list[str] | None = None  # set: the dashboard's workers (Spark)
        self._dashboard = None

    # -- reading --------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.job.run_id

    @property
    def run_dir(self) -> Path:
        return self.job.run_dir

    def status(self) -> dict[str, WorkerStatus]:
        return self.job.status()

    def status_table(self):
        return self.job.status_table()

    def tail(self, worker: str, n: int = 20) -> str:
        if worker not in self.job.spec.names:  # a worker a scheduler started (Spark)
            return runs.tail(contract.log_path(self.run_dir, worker), n)
        return self.job.tail(worker, n)

    def records(self, worker: str | None = None) -> list[Record]:
        return self.collector.records(worker) if self.collector else []

    def results(self) -> dict[str, dict]:
        """What each worker saved with its final report (launch/_common.py)."""
        return contract.read_results(self.run_dir)

    def _process_status(self) -> dict[str, dict[str, object]]:
        return {
            name: {"state": s.state, "exit_code": s.exit_code}
            for name, s in self.job.status().items()
        }

    # -- acting ---------------------------------------------------------------------------
    def dashboard(self, title: str | None = None, **kwargs):
        """Show the live dashboard of this run (one per run; later calls return it)."""
        if self.collector is None:
            raise DdlkitError(
                f"run {self.run_id} was started with live=False, so no metrics reach this "
                f"notebook. Fix: start it with live=True, or plot its files afterwards with "
                f"dk.metrics.plot_run({str(self.run_dir)!r})."
            )
        if self._dashboard is None:
            from ddlkit.metrics import Dashboard

            title = title or f"{self.config.strategy} x{self.config.workers}: {self.run_id}"
            workers = self.metric_workers or self.config.strategy_impl.dashboard_workers(
                self.job.spec.names
            )
            if workers is not None:  # fixed colours, task order
                kwargs.setdefault("workers", workers)
            self._dashboard = Dashboard(title, run_dir=self.run_dir, **kwargs)
            self._dashboard.follow(self.collector, self._process_status)
        return self._dashboard

    def wait(self, timeout: float | None = None) -> JobResult:
        """Wait for the job; a failing worker stops the others and raises."""
        try:
            return self.job.wait(timeout=timeout)
        finally:
            if self.job.done:
                self._finish()

    def kill(self, worker: str, sig: int | None = None) -> None:
        """Kill one worker as a crash would (SIGKILL by default): see :meth:`Job.kill`."""
        if sig is None:
            self.job.kill(worker)
        else:
            self.job.kill(worker, sig)

    def stop(self) -> JobResult:
        try:
            return self.job.stop()
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._dashboard is not None:
            self._dashboard.finish()
        if self.collector is not None:
            self.collector.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _repr_html_(self) -> str:
        parts = [
            f"<b>run {html.escape(self.run_id)}</b> in <code>{html.escape(str(self.run_dir))}"
            "</code>",
            self.config._repr_html_(),
        ]
        if self.preflight is not None:
            parts.append(self.preflight._repr_html_())
        if self.cluster is not None:
            parts.append(self.cluster._repr_html_())
        parts.append(self.job.status_table()._repr_html_())
        return "<br>".join(parts)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, strategy={self.config.strategy!r}, state={self.job.state!r})"


def start(
    script: str | Path,
    *,
    strategy: str = "multi_worker",
    workers: int = 2,
    args: Sequence[str] = (),
    hosts: str | None = None,
    ps: int = 1,
    label: str = "",
    live: bool = True,
    pin_cores: bool = True,
    runs_dir: str | Path | None = None,
    collector_host: str | None = None,
    collector_port: int = 0,
    token: str | None = None,
    ssh: SshOptions | None = None,
    base_port: int = plan.BASE_PORT,
    distinct_ports: bool = False,
    network_interface: str | None = None,
    preflight_timeout: float | None = None,
    python: str | None = None,
    hostfile: str | Path | None = None,
    cores: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    engine: str = "local",
    master: str | None = None,
    horovod_transport: str = "auto",
) -> Run:
    """Start `script` under `strategy` with `workers` workers; returns at once.

    Everything is checked before anything starts: a bad argument raises one
    ConfigError and leaves nothing running. With ``hosts`` other than this machine,
    every host is checked first over SSH (`ddlkit.hosts.check_hosts`: reachable,
    Python and TensorFlow (and Horovod) at ``sys.executable``'s path, the script there,
    the TF server ports free); a failure raises one `HostError` naming each host and its
    fix. Live metrics from other hosts need ``collector_host``: ``"auto"`` (this machine's
    address on the hosts' network) or an address they reach; a token is then made with
    ``secrets`` unless ``token`` is given. ``python``: the kit's Python (default: this
    one's path, which every host must have too). ``hostfile``: a file of ``host slots=N``
    lines instead of ``hosts``. ``distinct_ports``: the TF server ports differ across
    hosts too, for hosts sharing one network stack (user-mode demo hosts); hosts that are
    all loopback addresses (127.0.0.2, ...) reach a collector on 127.0.0.1.

    ``cores``: the cores of this machine the run may use (default: all of this process's);
    given, every process of the run is confined to them, each compute worker to its own
    slice (``pin_cores``). ``env``: extra environment for every worker. Both are plain data
    in the `LaunchConfig` and each `WorkerSpec`; this process's affinity and ``os.environ``
    are left alone::

        run = dk.launch.start(script, workers=2, cores=(2, 3), env={"MY_FLAG": "1"})

    ``horovod_transport``: ``"auto"`` (MPI for the ranks of this machine when Horovod was
    built with it, else Gloo), ``"gloo"`` or ``"mpi"`` (`ddlkit.strategies.horovod`).

    ``engine="spark"`` with ``master`` (``spark://HOST:PORT``, ``local[N]``, ``yarn``):
    the workers run as Spark tasks (multi_worker: a barrier stage; horovod:
    ``horovod.spark.run``); the run's one process is the driver (:mod:`ddlkit.spark`).
    """
    _check_engine(engine, master)
    config = plan.LaunchConfig(
        script=Path(script),
        strategy=strategy,
        workers=workers,
        args=tuple(args),
        hosts=hosts,
        ps=ps,
        pin_cores=pin_cores,
        label=label,
        ssh=ssh,
        base_port=base_port,
        distinct_ports=distinct_ports,
        network_interface=network_interface,
        hostfile=None if hostfile is None else Path(hostfile),
        cores=None if cores is None else tuple(cores),
        env=dict(env or {}),
        horovod_transport=horovod_transport,
        **({"python": python} if python is not None else {}),
    )
    script_check.check(config.script, strategy)  # parses, and fits the strategy? else ConfigError
    if engine == "spark" and horovod_transport == "mpi":
        raise ConfigError(
            "horovod_transport='mpi' with engine='spark': horovod.spark.run starts the ranks "
            "as Spark tasks over Gloo. Fix: drop horovod_transport (or pass 'gloo')."
        )
    if engine == "spark":
        from ddlkit.spark.submit import start as spark_start

        return spark_start(config, master, live, runs_dir, collector_host, collector_port, token)
    if config.cores is not None:
        devices.check_cores(config.cores, devices.local_cores())
    bind, advertise = _collector_address(config, collector_host) if live else (None, None)
    if bind is not None and not is_loopback(bind) and token is None:
        token = secrets.token_hex(16)
    run_id = new_run_id(label or f"{strategy}-{workers}")
    run_dir = Path(runs_dir or settings.runs_dir()) / run_id
    impl = config.strategy_impl
    horovodrun = plan.find_horovodrun(config.python) if impl.needs_horovodrun else None
    no_mpi = "not asked for"
    if horovodrun is not None and config.horovod_transport != "gloo" and not config.remote:
        no_mpi = plan.mpi_unavailable(config.python)
    cluster = plan.cluster_for(config)
    checked = _preflight(config, cluster, preflight_timeout) if config.remote else None
    collector = (
        Collector(run_dir, host=bind, port=collector_port, token=token)
        if bind is not None
        else None
    )
    try:
        extra_env = collector.env(advertise) if collector else {}
        if config.remote and impl.needs_horovodrun:  # horovodrun reaches the hosts itself
            extra_env["PATH"] = _ssh_shim_path(config, run_dir)
        spec = plan.plan(
            config,
            cluster,
            run_id=run_id,
            run_dir=run_dir,
            extra_env=extra_env,
            cores=devices.local_cores() if config.cores is None else config.cores,
            gpus=devices.local_gpus(),
            horovodrun=horovodrun,
            mpi_unavailable=no_mpi,
        )
        for worker in spec.workers:  # a local worker's cwd here; a remote one's on its host
            for_worker(worker).prepare(worker)
        progress = _progress(collector, impl) if collector else None
        job = Job.start(spec, progress_fn=progress)
    except BaseException:
        if collector is not None:
            collector.close()
        raise
    return Run(config, cluster, job, collector, checked)


def _check_engine(engine: str, master: str | None) -> None:
    if engine not in ("local", "spark"):
        raise ConfigError(
            f"engine={engine!r} is not one ddlkit knows. Fix: use 'local' (processes started "
            f"here or over SSH) or 'spark' (with master=URL)."
        )
    if engine == "local" and master is not None:
        raise ConfigError(
            f"master={master!r} was given with engine='local'. Fix: pass engine='spark' "
            f"(--engine spark) to run on that Spark master, or drop master."
        )


def _used_hosts(config: plan.LaunchConfig, cluster: ClusterSpec | None) -> dict[str, list[int]]:
    """The hosts the job uses and the ports it needs free on each."""
    return config.strategy_impl.used_hosts(config, cluster)


def _preflight(
    config: plan.LaunchConfig, cluster: ClusterSpec | None, timeout: float | None
) -> Preflight:
    """Check every host the job uses (in parallel); raise one HostError for the failures."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for host, ports in _used_hosts(config, cluster).items():
        groups.setdefault(tuple(ports), []).append(host)
    rows = []
    for ports, hosts in groups.items():
        rows += check_hosts(
            hosts,
            config.ssh,
            python=config.python,
            ports=ports,
            timeout=timeout,
            files=[str(config.script)],
            horovod=config.strategy_impl.needs_horovodrun,
        ).rows
    checked = Preflight(tuple(rows))
    checked.raise_for_failures()
    return checked


def _collector_address(
    config: plan.LaunchConfig, collector_host: str | None
) -> tuple[str, str | None]:
    """(address the collector binds, address workers are told, None: the same)."""
    remote_hosts = [h.name for h in config.hosts or ()] if config.remote else []
    on_loopback = all(is_loopback(h) for h in remote_hosts)  # user-mode hosts: 127.0.0.k
    if remote_hosts and not on_loopback and (collector_host is None or is_loopback(collector_host)):
        raise ConfigError(
            f"workers on {', '.join(remote_hosts)} cannot send live metrics to "
            f"{collector_host or '127.0.0.1'} on this machine. Fix: pass "
            f"collector_host='auto' (ddlkit launch --collector-host auto: this machine's "
            f"address on the hosts' network; a token is made for you) or an address of this "
            f"machine they reach, or live=False (--no-live)."
        )
    if collector_host is None:
        return "127.0.0.1", None
    if collector_host == "auto":
        return (remote.address_towards(remote_hosts), None) if remote_hosts else ("127.0.0.1", None)
    if collector_host in WILDCARDS:
        if not remote_hosts:
            return collector_host, "127.0.0.1"
        return collector_host, remote.address_towards(remote_hosts)
    return collector_host, None


def _ssh_shim_path(config: plan.LaunchConfig, run_dir: Path) -> str:
    """PATH for horovodrun: our ssh shim (BatchMode, the job's SshOptions) first."""
    shim_dir = run_dir / "ssh"
    shim_dir.mkdir(parents=True, exist_ok=True)
    write_ssh_shim(shim_dir, config.ssh or SshOptions())
    return os.pathsep.join([str(shim_dir), os.environ.get("PATH", os.defpath)])


def _progress(collector: Collector, strategy: strategies.Strategy):
    """A launched process's step: the slowest of the metric workers it stands for."""

    def step(worker: str) -> int | None:
        names = strategy.progress_workers(worker, collector.workers())
        steps = [collector.latest(w) for w in names]
        return min((r.step for r in steps if r is not None), default=None)

    return step
