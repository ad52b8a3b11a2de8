"""A real Ray cluster on this machine: a head node and N-1 worker nodes, each on its own
loopback address (``127.0.0.2``, ``127.0.0.3``, ...), so a "node" is another network address.

Each node is Ray's own command, started as a notebook or a shell would::

    ray start --head --block --node-ip-address 127.0.0.2 --port P --num-cpus 1 ...
    ray start --block --address 127.0.0.2:P --node-ip-address 127.0.0.3 --num-cpus 1

``--block`` keeps each ``ray start`` in the foreground as the parent of its node's daemons
(GCS, raylet, ...), under a small wrapper (:mod:`ddlkit.ray.node`) that is a process of
:mod:`ddlkit.launch.process` (its own process group, ended when this process dies) and takes
the node's whole group down with it: Ray's agents outlive a killed ``ray start``.
:meth:`LocalCluster.close` sends SIGTERM to every node, then SIGKILL to whatever of theirs is
left (Ray starts its worker processes in process groups of their own, so they are found by
their parent). ``ray stop`` is not used: it stops every Ray process of the user on the
machine, other people's clusters included.

Not 127.0.0.1: ``ray start`` replaces a loopback ``--node-ip-address`` of ``localhost`` or
``127.0.0.1`` by the machine's outward address (``ray._private.services.resolve_ip_for_localhost``);
other 127.x addresses are kept. Ray's gRPC servers listen on every interface whatever the
node's address (the GCS binary's "Failed to add 0.0.0.0 listener"), so the cluster uses
Ray's token authentication (``RAY_AUTH_MODE=token``, the token in a 0600 file named by
``RAY_AUTH_TOKEN_PATH``, never on a command line): a process without the token is refused.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
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

START_TIMEOUT = 90.0  # seconds for the head and every node to be up
# `ray start` gives a raylet a fixed 30 s to register (ray._private.node.Node.__init__), then
# exits with this; at load average 8 on 2 cores it did, so a node is started once more.
SLOW_START = "timed out during startup"
START_ATTEMPTS = 2
READY_LINE = "This command will now block forever"  # what `ray start --block` prints when up
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # per node; Ray's default is 30% of memory
WORKER_PORTS = (20000, 29999)  # Ray's worker processes' ports (its default: 10002-19999)
FIRST_ADDRESS = 2  # 127.0.0.2: Ray rewrites 127.0.0.1 (see the module docstring)
_CLUSTERS: dict[str, LocalCluster] = {}  # address -> a cluster this process started


def ray_bin(python: str = sys.executable) -> str:
    """The ``ray`` command beside ``python`` (the kit's venv); ConfigError if Ray is missing.
    Ray is looked up, not imported: Ray reads its settings (``RAY_AUTH_MODE``) when first
    imported, so this process may still import it later with a cluster's token variables."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "Ray is not installed. Fix: pip install 'ray[train]==2.60.0' (make lab does it)."
        ) from None
    path = Path(python).parent / "ray"
    if not path.exists():
        found = shutil.which("ray")
        if found is None:
            raise ConfigError(f"no `ray` command beside {python} or on PATH. Fix: make lab.")
        return found
    return str(path)


def auth_env(token_path: str | Path | None) -> dict[str, str]:
    """The variables that make a Ray process use the token in ``token_path`` (pure)."""
    if token_path is None:
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}


def node_env(token_path: Path | None) -> dict[str, str]:
    return {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        **auth_env(token_path),
    }


@dataclass(frozen=True)
class ClusterInfo:
    """What a notebook shows of a running local Ray cluster."""

    address: str
    nodes: tuple[str, ...]
    cpus_per_node: int
    started_in: float  # seconds from the first `ray start` to every node up

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("address", self.address),
            ("nodes", ", ".join(self.nodes)),
            ("CPUs", f"{len(self.nodes)} x {self.cpus_per_node}"),
            ("started in", f"{self.started_in:.1f} s"),
        ]

    def _repr_html_(self) -> str:
        return html_table(("Ray cluster", ""), self.rows())


@dataclass
class LocalCluster:
    """A running head node and its worker nodes (see the module docstring)."""

    info: ClusterInfo
    procs: list = field(default_factory=list)  # launch.process.WorkerProcess, head first
    temp_dir: Path | None = None
    token_path: Path | None = None
    specs: list = field(default_factory=list)  # each node's WorkerSpec, head first

    @property
    def address(self) -> str:
        return self.info.address

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to join this cluster as a driver (``ray.init``)."""
        return {"RAY_ADDRESS": self.address, **auth_env(self.token_path)}

    def commands(self) -> list[str]:
        """Each node's ``ray start`` command line, as one would type it on that node."""
        out = []
        for spec in self.specs:
            argv = list(spec.argv)
            start = argv.index("start") - 1  # from the `ray` program on
            out.append(" ".join(["ray", *argv[start + 1 :]]))
        return out

    def pids(self) -> list[int]:
        """Every living process of the cluster: the nodes and all they started."""
        from ddlkit.procs import descendants

        out = []
        for proc in self.procs:
            if proc.poll() is None:
                out.append(proc.pid)
            out += [pid for pid, _ in descendants(proc.pid)]
        return out

    def kill_node(self, index: int) -> None:
        """Kill node ``index`` (0 is the head) and everything it started, as a crashed
        machine would: for the fault-tolerance lessons."""
        from ddlkit.procs import descendants

        proc = self.procs[index]
        below = [pid for pid, _ in descendants(proc.pid)]
        proc.signal(signal.SIGKILL)
        _kill_all(below)
        proc.wait_ended(5.0)

    def restart_node(self, index: int, timeout: float = START_TIMEOUT) -> None:
        """Start node ``index`` (not the head) again after :meth:`kill_node`, and wait until
        it has joined: a new raylet with the same address and CPUs."""
        from ddlkit.launch.process import start_workers

        if index == 0:
            raise ConfigError("restart_node(0): the head cannot rejoin. Fix: a new cluster.")
        spec = self.specs[index]
        if self.procs[index].poll() is None:
            raise ConfigError(f"node {index} is running. Fix: kill_node({index}) first.")
        spec.log_path.unlink(missing_ok=True)  # _wait_up reads it for the ready line
        self.procs[index] = start_workers([spec], {spec.name: node_env(self.token_path)})[0]
        _wait_up(self.procs[index], spec, timeout)

    def close(self, grace: float = 5.0) -> None:
        """Stop the worker nodes, then the head; SIGKILL what is left. Idempotent."""
        from ddlkit.procs import descendants

        below = [pid for proc in self.procs for pid, _ in descendants(proc.pid)]
        for proc in reversed(self.procs):
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in reversed(self.procs):
            if proc.wait_ended(max(0.1, deadline - time.monotonic())) is None:
                proc.signal(signal.SIGKILL)
                proc.wait_ended(grace)
        _kill_all(below)
        _CLUSTERS.pop(self.address, None)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

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
        return f"LocalCluster({self.address!r}, nodes={len(self.info.nodes)})"


def _kill_all(pids: list[int]) -> None:
    from ddlkit.procs import alive

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def find(address: str) -> LocalCluster | None:
    """The running local cluster of this process at ``address``, if any."""
    return _CLUSTERS.get(address)


def node_specs(
    nodes: int,
    cpus_per_node: int,
    temp_dir: Path,
    ports: list[int],
    ray: str,
    hosts: Sequence[NetnsHost] = (),
) -> list[WorkerSpec]:
    """Each node's ``ray start`` (pure): the head on 127.0.0.2, node i on 127.0.0.(2+i); with
    ``hosts`` (namespaced hosts, one per node after the head), the head on their gateway (this
    machine's address on their network) and node i inside ``hosts[i-1]`` on its address.
    ``ports``: 3 + nodes free ports (GCS, client server, dashboard, one agent port per node);
    Ray's own fixed defaults (10001, 8265, 52365) would clash with a second cluster, and its
    worker ports go above the range the kit picks TF servers' ports from."""
    head = hosts[0].gateway if hosts else f"127.0.0.{FIRST_ADDRESS}"
    port, client, dashboard, *agents = ports

    def common(i: int) -> tuple[str, ...]:
        return ("--block", "--num-cpus", str(cpus_per_node), "--disable-usage-stats",
                "--object-store-memory", str(OBJECT_STORE_BYTES),
                "--min-worker-port", str(WORKER_PORTS[0]), "--max-worker-port",
                str(WORKER_PORTS[1]), "--dashboard-agent-listen-port", str(agents[i]))  # fmt: skip

    wrap = (sys.executable, "-m", "ddlkit.ray.node")  # ends the node's whole group with it
    specs = [
        WorkerSpec(
            name="ray-head",
            argv=(
                *wrap,
                ray,
                "start",
                "--head",
                "--node-ip-address",
                head,
                "--port",
                str(port),
                "--ray-client-server-port",
                str(client),
                "--dashboard-port",
                str(dashboard),
                "--include-dashboard",
                "false",
                "--temp-dir",
                str(temp_dir),
                *common(0),
            ),  # fmt: skip
            env={},
            cwd=temp_dir,
            log_path=contract.log_path(temp_dir, "ray-head"),
        )
    ]
    for i in range(1, nodes):
        address = hosts[i - 1].address if hosts else f"127.0.0.{FIRST_ADDRESS + i}"
        argv = (*wrap, ray, "start", "--address", f"{head}:{port}", "--node-ip-address", address,
                *common(i))  # fmt: skip
        specs.append(
            WorkerSpec(
                name=f"ray-node-{i}",
                argv=tuple(hosts[i - 1].exec_argv(argv)) if hosts else argv,
                env={},
                cwd=temp_dir,
                log_path=contract.log_path(temp_dir, f"ray-node-{i}"),
            )
        )
    return specs


def local_cluster(
    nodes: int = 2,
    cpus_per_node: int = 1,
    timeout: float = START_TIMEOUT,
    hosts: Sequence[NetnsHost] = (),
) -> LocalCluster:
    """Start a Ray head and ``nodes - 1`` worker nodes on loopback addresses, each with
    ``cpus_per_node`` CPUs, and wait until all have joined. The head first (the others
    join it), so the start-up time is the sum of both. DdlkitError with the node's log
    tail if one does not come up (nothing left running).
    ``hosts``: namespaced hosts (``ddlkit.hosts.netns.namespaced_hosts``, root), one worker
    node in each, the head on their gateway: actors then run on other hosts as on a real
    cluster, reaching this machine (a collector) only through its address on their network
    (``dk.where.Ray(address, collector_host="auto")``)."""
    hosts = tuple(hosts)
    if hosts and nodes != len(hosts) + 1:
        raise ConfigError(
            f"nodes={nodes!r} but {len(hosts)} hosts: the head runs here and one node on each "
            f"host. Fix: nodes={len(hosts) + 1}."
        )
    if type(nodes) is not int or not 1 <= nodes <= 200:
        raise ConfigError(f"nodes={nodes!r}: a cluster needs 1 to 200 nodes. Fix: nodes=2.")
    if type(cpus_per_node) is not int or cpus_per_node < 1:
        raise ConfigError(f"cpus_per_node={cpus_per_node!r}. Fix: pass 1 or more.")
    ray = ray_bin()
    # Ray's Unix sockets live under --temp-dir: a short path keeps them under the 107-byte limit
    temp_dir = Path(tempfile.mkdtemp(prefix="dkray-", dir="/tmp"))
    contract.logs_dir(temp_dir).mkdir(parents=True, exist_ok=True)
    token_path = temp_dir / "auth_token"
    token_path.touch(mode=0o600)
    token_path.write_text(secrets.token_hex(32))
    head = hosts[0].gateway if hosts else f"127.0.0.{FIRST_ADDRESS}"
    ports = free_ports(3 + nodes, head)
    port = ports[0]
    specs = node_specs(nodes, cpus_per_node, temp_dir, ports, ray, hosts)
    address = f"{head}:{port}"
    from ddlkit.launch.process import start_workers

    env = node_env(token_path)
    started = time.monotonic()
    cluster = LocalCluster(
        ClusterInfo(
            address,
            tuple(s.argv[s.argv.index("--node-ip-address") + 1] for s in specs),
            cpus_per_node,
            0.0,
        ),  # fmt: skip
        [],
        temp_dir,
        token_path,
        specs,
    )
    _CLUSTERS[address] = cluster
    try:
        for spec in specs:  # one at a time: a node joins a head that is up
            for attempt in range(1, START_ATTEMPTS + 1):
                spec.log_path.unlink(missing_ok=True)
                cluster.procs.append(start_workers([spec], {spec.name: env})[0])
                try:
                    _wait_up(cluster.procs[-1], spec, timeout)
                    break
                except DdlkitError as exc:
                    if attempt == START_ATTEMPTS or SLOW_START not in str(exc):
                        raise
                    cluster.procs.pop().signal(signal.SIGKILL)  # its group; start it again
    except BaseException:
        cluster.close()
        raise
    cluster.info = ClusterInfo(
        address, cluster.info.nodes, cpus_per_node, round(time.monotonic() - started, 1)
    )
    return cluster


def _wait_up(proc, spec: WorkerSpec, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DdlkitError(_node_failure(spec, "exited while starting"))
        try:
            if READY_LINE in spec.log_path.read_text(errors="replace"):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise DdlkitError(_node_failure(spec, f"was not up after {timeout:.0f} s"))


def _node_failure(spec: WorkerSpec, what: str) -> str:
    from ddlkit.launch.runs import tail

    return (
        f"Ray {spec.name} {what}. Its log ({spec.log_path}) ends:\n{tail(spec.log_path, 15)}\n"
        f"Fix: read the log; a busy port or too little memory (/dev/shm) are the usual causes."
    )


@atexit.register
def _close_all() -> None:
    for cluster in list(_CLUSTERS.values()):
        cluster.close(grace=2.0)
