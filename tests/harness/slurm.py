"""A private Slurm for tests: munged, slurmctld and slurmd started from scratch with their own
key, config, ports and directories (single node here, or one node per network namespace),
and everything they started ended afterwards.

    with slurm_cluster() as cluster:          # yields once every node is idle
        job_id, output = cluster.submit(template, args, output_file, env)

Needs root and the Slurm/munge programs (``skip_unless_slurm_can_run`` says which are
missing and how to install them). Used by tests/test_slurm.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddlkit import slurm
from ddlkit.cluster.ports import free_ports
from ddlkit.procs import pids_with_env

ROOT = Path(__file__).resolve().parents[2]
BINARIES = ("mungekey", "munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scontrol")
MARKER = "DDLKIT_SLURM_TEST"
INSTALL_FIX = (
    "Fix: as root, scripts/system-packages.sh installs munge, slurmctld, slurmd and "
    "slurm-client (listed in system-packages.txt)."
)


def first_job_id() -> int:
    """A first job id whose workers' default ports are free now, picked at random so that
    two test sessions on one machine do not give their jobs the same ports."""
    rng = random.Random()
    for _ in range(200):
        job = rng.randrange(1000, 1000 + slurm.PORT_SLOTS)
        base = slurm.default_port_base(job)
        try:
            for port in range(base, base + 8 * slurm.PORTS_PER_JOB):  # the test's 8 jobs
                with socket.socket() as sock:
                    sock.bind(("", port))
        except OSError:
            continue
        return job
    raise AssertionError("no free port range for the test's jobs")


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (``NAME=value``)."""
    name, _, value = marker.partition("=")
    return pids_with_env(name, value)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


@dataclass(frozen=True)
class Node:
    """A Slurm node of the test cluster: its name, the address slurmctld reaches it on, and
    the argv prefix that runs its slurmd where it lives (empty: right here)."""

    name: str
    address: str
    cpus: str
    prefix: tuple[str, ...] = ()


@dataclass
class MiniSlurm:
    """A private Slurm: its files, its environment, the daemons it started."""

    root: Path
    nodes: list[Node]
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def marker(self) -> str:
        return f"{MARKER}={self.root}"

    def logs(self) -> str:
        parts = []
        for name in ("munged", "slurmctld", *(f"slurmd-{n.name}" for n in self.nodes)):
            parts.append(f"--- {name} (last lines) ---\n{tail(self.root / 'log' / f'{name}.log')}")
        return "\n".join(parts)

    @property
    def node(self) -> str:
        return self.nodes[0].name

    def run(self, argv: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env, **kw.pop("env", {})}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)

    def idle(self) -> bool:
        proc = self.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=20)
        return proc.returncode == 0 and proc.stdout.split() == ["idle"] * len(self.nodes)

    def job_fields(self, job_id: int) -> dict[str, str]:
        proc = self.run(["scontrol", "-o", "show", "job", str(job_id)], timeout=20)
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}

    def submit(
        self,
        template: Path,
        args: list[str],
        output: Path,
        env: dict,
        timeout: float = 600,
        options: tuple[str, ...] = (),
    ) -> tuple[int, str]:
        """sbatch ``template`` from the repository root; wait (bounded) until it ends."""
        sbatch = ["sbatch", "--parsable", f"--output={output}", "--time=15", *options]
        proc = self.run([*sbatch, str(template), *args], env=env, cwd=ROOT)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}\n{self.logs()}"
        job_id = int(proc.stdout.strip().split(";")[0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job_fields(job_id)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                break
            time.sleep(1)
        else:
            self.run(["scancel", str(job_id)], timeout=20)
            pytest.fail(
                f"job {job_id} still running after {timeout} s; cancelled.\n"
                f"--- job output ---\n{tail(output, 60)}\n{self.logs()}"
            )
        text = output.read_text(errors="replace") if output.exists() else ""
        state = (fields.get("JobState"), fields.get("ExitCode"))
        assert state == ("COMPLETED", "0:0"), f"job {job_id}: {state}\n{text[-6000:]}"
        return job_id, text


def start(name: str, argv: list[str], cluster: MiniSlurm) -> None:
    log = open(cluster.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 (kept by Popen)
    cluster.procs[name] = subprocess.Popen(
        argv,
        env={**os.environ, **cluster.env},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()


def wait(what: str, predicate, cluster: MiniSlurm, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
        if dead:
            break
        if predicate():
            return
        time.sleep(0.5)
    outs = "\n".join(
        f"--- {n} stdout ---\n{tail(cluster.root / 'log' / f'{n}.out', 15)}" for n in cluster.procs
    )
    status = {n: p.poll() for n, p in cluster.procs.items()}
    pytest.fail(f"{what}: not within {timeout} s (exit codes {status})\n{outs}\n{cluster.logs()}")


def stop(cluster: MiniSlurm) -> list[int]:
    """Cancel jobs, stop the daemons (TERM, then KILL), then anything still marked."""
    if "slurmctld" in cluster.procs and cluster.procs["slurmctld"].poll() is None:
        jobs = cluster.run(["squeue", "-h", "-o", "%i"], timeout=20).stdout.split()
        if jobs:
            cluster.run(["scancel", *jobs], timeout=20)
            end = time.monotonic() + 30
            while time.monotonic() < end and cluster.run(["squeue", "-h"], timeout=20).stdout:
                time.sleep(0.5)
    daemons = [n for n in cluster.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
    for name in daemons:
        proc = cluster.procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
    left = marked_pids(cluster.marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def skip_unless_slurm_can_run() -> None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm/munge programs not installed: {', '.join(missing)}. {INSTALL_FIX}")
    if os.geteuid() != 0:
        pytest.skip("this test runs munged, slurmctld and slurmd as root (SlurmUser=root)")


def write_conf(root: Path, nodes: list[Node], controller: str) -> Path:
    ctld_port, slurmd_port = free_ports(2)
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.address} CPUs={n.cpus} State=UNKNOWN" for n in nodes
    )
    names = ",".join(n.name for n in nodes)
    conf = root / "slurm.conf"
    conf.write_text(
        textwrap.dedent(f"""\
        ClusterName=ddlkit-test
        FirstJobId={first_job_id()}
        SlurmctldHost={socket.gethostname()}({controller})
        SlurmUser=root
        SlurmdUser=root
        AuthType=auth/munge
        AuthInfo=socket={root}/run/munge.sock
        CredType=cred/munge
        SlurmctldPort={ctld_port}
        SlurmdPort={slurmd_port}
        StateSaveLocation={root}/state
        SlurmdSpoolDir={root}/spool-%n
        SlurmctldPidFile={root}/run/slurmctld.pid
        SlurmdPidFile={root}/run/slurmd-%n.pid
        SlurmctldLogFile={root}/log/slurmctld.log
        SlurmdLogFile={root}/log/slurmd-%n.log
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        JobAcctGatherType=jobacct_gather/none
        AccountingStorageType=accounting_storage/none
        SelectType=select/cons_tres
        SelectTypeParameters=CR_CPU
        MpiDefault=none
        SwitchType=switch/none
        ReturnToService=2
        MinJobAge=600
        PartitionName=test Nodes={names} Default=YES MaxTime=60 State=UP
        """)
        + node_lines
        + "\n"
    )
    return conf


def this_node() -> Node:
    """This machine as one node, as ``slurmd -C`` sees it."""
    probe = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30)
    fields = dict(re.findall(r"(\w+)=(\S+)", probe.stdout.splitlines()[0]))
    return Node(fields["NodeName"], "127.0.0.1", fields["CPUs"])


@contextlib.contextmanager
def slurm_cluster(
    nodes: list[Node] | None = None,
    controller: str = "127.0.0.1",
    start_slurmd: bool = True,
    idle_timeout: float = 90,
):
    """munged, slurmctld and one slurmd per node (foreground) with their own key, config,
    ports and directories. Yields once every node is idle; on leaving, nothing the cluster
    started is running."""
    nodes = nodes or [this_node()]
    # munged wants every directory above its socket searchable by all, which pytest's
    # own temporary directories (0700) are not: so a directory of its own in /tmp.
    root = Path(tempfile.mkdtemp(prefix="ddlkit-slurm-"))
    root.chmod(0o755)
    for sub, mode in (("key", 0o700), ("run", 0o755), ("log", 0o755), ("state", 0o700)):
        (root / sub).mkdir(mode=mode)
    for n in nodes:
        (root / f"spool-{n.name}").mkdir(mode=0o755)
    conf = write_conf(root, nodes, controller)
    cluster = MiniSlurm(root, nodes, {"SLURM_CONF": str(conf), MARKER: str(root)})
    key = root / "key" / "munge.key"
    sock = root / "run" / "munge.sock"
    try:
        made = cluster.run(["mungekey", "--create", f"--keyfile={key}"], timeout=30)
        assert made.returncode == 0, made.stderr
        start(
            "munged",
            ["munged", "--foreground", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={root}/run/munged.pid", f"--log-file={root}/log/munged.log",
             f"--seed-file={root}/key/munged.seed"],
            cluster,
        )  # fmt: skip
        wait("munged's socket", sock.exists, cluster, timeout=30)
        start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)], cluster)
        for n in nodes if start_slurmd else []:
            argv = [*n.prefix, "slurmd", "-D", "-N", n.name, "-f", str(conf)]
            start(f"slurmd-{n.name}", argv, cluster)
        wait("every node to be idle", cluster.idle, cluster, idle_timeout)
        yield cluster
    finally:
        left = stop(cluster)
        assert not left, f"processes left running after the test (killed now): {left}"
        assert not marked_pids(cluster.marker)
        shutil.rmtree(root, ignore_errors=True)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def netns_prefix(namespace: str, hosts_file: Path) -> tuple[str, ...]:
    """Run a command in ``namespace``'s network with ``hosts_file`` as its /etc/hosts.

    Not `ip netns exec`: it also remounts /sys, which hides /sys/fs/cgroup, and slurmd
    22.05 then stops ("No filesystem mounted on /sys/fs/cgroup ... Unable to initialize
    cgroup plugin") even with proctrack/linuxproc and task/none.
    """
    bind = 'mount --bind "$1" /etc/hosts && shift && exec "$@"'
    return (
        "nsenter", f"--net=/run/netns/{namespace}",
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", bind, "sh", str(hosts_file),
    )  # fmt: skip
