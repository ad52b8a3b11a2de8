"""Where workers run, said one way for ``dk.launch.start`` and ``dk.workers``.

One typed object, checked when it is made and shown as a table in a notebook; each is
backed by one of :mod:`ddlkit.environments`:

- :class:`ThisMachine` (`environments.Local`): processes forked here, each compute worker
  pinned to its own cores (``cores``, ``pin_cores``);
- :class:`Hosts` (`environments.Ssh`): other hosts over SSH, checked first (preflight),
  with their SSH options, TF server ports and the collector's address on their network;
  :meth:`Hosts.demo` takes a demo cluster (`ddlkit.hosts.start_demo_cluster`);
- :class:`Slurm` (`environments.Slurm`): the tasks of a job step of this Slurm allocation,
  each reading who it is from ``SLURM_*`` (``dk.workers``; a script is run there by the
  templates in ``launch/slurm/``, which ``dk.launch.start(where=Slurm())`` names);
- :class:`Spark` (`environments.spark.Spark`): the tasks of a barrier stage on ``master``;
- :class:`Ray` (`environments.ray.Ray`): actors of one placement group on the Ray cluster at
  ``address``.

::

    run = dk.launch.start(script, strategy="multi_worker", workers=2,
                          where=dk.where.Hosts("node1:1,node2:1", collector_host="auto"))
    workers = dk.workers(2, strategy="multi_worker", where=dk.where.ThisMachine(cores=(0, 1)))

A `Where` is pure data: :meth:`Where.config` gives the ``LaunchConfig`` fields it sets.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from ddlkit._tables import html_table
from ddlkit.cluster import Host, format_hosts, parse_hosts
from ddlkit.cluster.ports import BASE_PORT as BASE_PORT  # re-exported
from ddlkit.errors import ConfigError
from ddlkit.hosts.ssh import SshOptions


@dataclass(frozen=True)
class Where:
    """Where a job's workers run (subclass it; see the module docstring)."""

    kind: ClassVar[str]
    environment: ClassVar[str]  # the ddlkit.environments class that backs it

    def config(self) -> dict[str, Any]:
        """The ``LaunchConfig`` fields this place sets (pure)."""
        return {}

    def rows(self) -> list[tuple[str, str]]:
        shown = [(f.name, getattr(self, f.name)) for f in fields(self)]
        return [("where", self.kind), ("environment", self.environment)] + [
            (name, _show(value)) for name, value in shown if value not in (None, False, ())
        ]

    def _repr_html_(self) -> str:
        return html_table(("setting", "value"), self.rows())


def _show(value: object) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], Host):
        return format_hosts(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


@dataclass(frozen=True)
class ThisMachine(Where):
    """This machine: ``cores`` the run may use (default: all of this process's), each
    compute worker pinned to its own slice of them unless ``pin_cores=False``."""

    cores: tuple[int, ...] | None = None
    pin_cores: bool = True

    kind = "this machine"
    environment = "environments.Local"

    def __post_init__(self) -> None:
        if self.cores is not None:
            if isinstance(self.cores, str | bytes):
                raise ConfigError(
                    f"ThisMachine(cores={self.cores!r}): a string. Fix: pass core numbers, "
                    f"e.g. cores=(0, 1)."
                )
            object.__setattr__(self, "cores", tuple(self.cores))
        if not isinstance(self.pin_cores, bool):
            raise ConfigError(f"ThisMachine(pin_cores={self.pin_cores!r}): pass True or False.")

    def config(self) -> dict[str, Any]:
        return {"cores": self.cores, "pin_cores": self.pin_cores}


@dataclass(frozen=True)
class Hosts(Where):
    """Other hosts, reached over SSH (BatchMode) with ``ssh``, checked before anything starts.

    ``hosts``: horovodrun's syntax (``"node1:1,node2:1"``) or `Host` objects; or ``hostfile``
    (``host slots=N`` lines). ``collector_host``: where live metrics go (``"auto"``: this
    machine's address on the hosts' network). ``base_port``/``distinct_ports``: the TF
    servers' ports (distinct across hosts sharing one network stack). ``network_interface``:
    horovodrun's. ``python``: the kit's Python on the hosts (default: this one's path).
    ``preflight_timeout``: seconds for each host's check.
    """

    hosts: str | tuple[Host, ...] | None = None
    ssh: SshOptions | None = None
    hostfile: Path | None = None
    collector_host: str | None = None
    network_interface: str | None = None
    base_port: int = BASE_PORT
    distinct_ports: bool = False
    python: str | None = None
    preflight_timeout: float | None = None

    kind = "hosts over SSH"
    environment = "environments.Ssh"

    def __post_init__(self) -> None:
        if (self.hosts is None) == (self.hostfile is None):
            raise ConfigError(
                "Hosts needs the hosts, as hosts='node1:1,node2:1' or hostfile=PATH (one of "
                "them). Fix: pass exactly one; for this machine use dk.where.ThisMachine()."
            )
        if isinstance(self.hosts, str):
            object.__setattr__(self, "hosts", parse_hosts(self.hosts))
        elif self.hosts is not None:
            object.__setattr__(self, "hosts", tuple(self.hosts))
        if self.hostfile is not None:
            object.__setattr__(self, "hostfile", Path(self.hostfile))
        if self.ssh is not None and not isinstance(self.ssh, SshOptions):
            raise ConfigError(
                f"Hosts(ssh={self.ssh!r}) is not SshOptions. "
                f"Fix: pass dk.hosts.SshOptions(identity=..., known_hosts=...)."
            )

    @classmethod
    def demo(cls, cluster: Any, slots: int = 1) -> Hosts:
        """The hosts of a demo cluster (`ddlkit.hosts.start_demo_cluster`), with its SSH
        options, its collector address and (user-mode hosts) ports free across them."""
        return cls(**cluster.launch_kwargs(slots))

    def config(self) -> dict[str, Any]:
        out = {
            "hosts": self.hosts,
            "hostfile": self.hostfile,
            "ssh": self.ssh,
            "network_interface": self.network_interface,
            "base_port": self.base_port,
            "distinct_ports": self.distinct_ports,
        }
        return out | ({"python": self.python} if self.python is not None else {})


@dataclass(frozen=True)
class Slurm(Where):
    """The tasks of a job step in this Slurm allocation (run from inside one: ``salloc``, or
    a batch script): ``srun`` starts them and each reads its rank, its TF_CONFIG
    (`ddlkit.cluster.ClusterSpec`) and its name from ``SLURM_*`` (``python -m ddlkit.slurm
    exec``). ``port_base``: the TF servers' first port on each node (default: from the job
    id). ``srun_args``: more of srun's options, e.g. ``("--cpus-per-task=1",)``.
    ``collector_host``: this machine's address that the tasks reach (live metrics, and
    ``dk.workers``' controller); default: loopback when every node of the allocation is this
    machine, else ``"auto"`` (this machine's address towards the nodes; a token is made).
    The run directory must be on a file system every node sees, as for ``ddlkit.slurm``."""

    port_base: int | None = None
    srun_args: tuple[str, ...] = ()
    collector_host: str | None = None

    kind = "a Slurm allocation"
    environment = "environments.Slurm"

    def __post_init__(self) -> None:
        if isinstance(self.srun_args, str):
            raise ConfigError(
                f"Slurm(srun_args={self.srun_args!r}) is a string. Fix: pass a list, e.g. "
                f"('--cpus-per-task=1',)."
            )
        object.__setattr__(self, "srun_args", tuple(str(a) for a in self.srun_args))
        if self.port_base is not None and (
            type(self.port_base) is not int or not 1024 <= self.port_base <= 65535 - 64
        ):
            raise ConfigError(
                f"Slurm(port_base={self.port_base!r}): TensorFlow servers need unprivileged "
                f"ports. Fix: pass a port from 1024 to {65535 - 64}, or None (from the job id)."
            )


@dataclass(frozen=True)
class Spark(Where):
    """The tasks of a Spark barrier stage (multi_worker) or of ``horovod.spark.run``
    (horovod) on ``master``: ``spark://HOST:PORT``, ``local[N]``, ``yarn``.
    ``collector_host``: this machine's address that the executors reach, for live metrics
    (``"auto"``: the one towards a ``spark://HOST`` master; a token is made); default:
    loopback, which only a master on this machine's loopback can use."""

    master: str = ""
    collector_host: str | None = None

    kind = "Spark"
    environment = "environments.spark.Spark"

    def __post_init__(self) -> None:
        if not isinstance(self.master, str) or not self.master:
            raise ConfigError(
                "Spark needs its master URL. Fix: pass e.g. "
                "dk.where.Spark(dk.spark.local_cluster().master_url) or Spark('local[2]')."
            )


RAY_PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def split_ray_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` of a Ray head's GCS (pure); ConfigError for anything else."""
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in address:
        raise ConfigError(
            f"Ray address {address!r} is not HOST:PORT. Fix: pass the head's GCS address, as "
            f"`ray start --head` prints it (e.g. '127.0.0.2:6379', or "
            f"dk.ray.local_cluster().address)."
        )
    return host, int(port)


@dataclass(frozen=True)
class Ray(Where):
    """Actors of one placement group on the Ray cluster whose head is at ``address``
    (``HOST:PORT``, as ``ray start --head`` prints it), one per worker, each given its
    TF_CONFIG (multi_worker; horovod goes through ``horovod.ray.RayExecutor``).
    ``placement``: the group's strategy, ``"PACK"`` (as few nodes as possible, Ray Train's
    default) or ``"STRICT_SPREAD"`` (one worker per node), ``SPREAD``, ``STRICT_PACK``; any of
    them reserves every bundle at once or none. ``token_path``: the
    file holding the cluster's token when it uses Ray's token authentication (a
    ``dk.ray.local_cluster()`` of this process is found by its address). ``collector_host``:
    this machine's address that the actors reach, for live metrics (``"auto"``: the one
    towards the head; a token is made); default: loopback, for nodes on this machine's
    loopback."""

    address: str = ""
    placement: str = "PACK"
    token_path: Path | None = None
    collector_host: str | None = None

    kind = "Ray"
    environment = "environments.ray.Ray"

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address:
            raise ConfigError(
                "Ray needs its head's address. Fix: pass e.g. "
                "dk.where.Ray(dk.ray.local_cluster().address) or Ray('127.0.0.2:6379')."
            )
        split_ray_address(self.address)
        if self.placement not in RAY_PLACEMENTS:
            raise ConfigError(
                f"Ray(placement={self.placement!r}) is not a Ray placement strategy. Fix: pass "
                f"one of {', '.join(RAY_PLACEMENTS)}."
            )
        if self.token_path is not None:
            object.__setattr__(self, "token_path", Path(self.token_path))


# -- the keywords launch.start took before `where` (one release with a warning) ----------
OLD_KEYWORDS: dict[str, str] = {
    "hosts": "Hosts",
    "hostfile": "Hosts",
    "ssh": "Hosts",
    "collector_host": "Hosts",
    "network_interface": "Hosts",
    "base_port": "Hosts",
    "distinct_ports": "Hosts",
    "python": "Hosts",
    "preflight_timeout": "Hosts",
    "cores": "ThisMachine",
    "pin_cores": "ThisMachine",
    "engine": "Spark",
    "master": "Spark",
}


def from_keywords(given: dict[str, Any]) -> Where:
    """The `Where` the old ``launch.start`` keywords say (pure); ConfigError for a mix."""
    engine = given.get("engine", "local")
    if engine not in ("local", "spark"):
        raise ConfigError(
            f"engine={engine!r} is not one ddlkit knows. Fix: pass where=dk.where.Spark(master) "
            f"for Spark, or where=dk.where.ThisMachine() / dk.where.Hosts(...)."
        )
    if engine == "local" and "master" in given:
        raise ConfigError(
            f"master={given['master']!r} was given with engine='local'. Fix: pass "
            f"where=dk.where.Spark({given['master']!r}) to run on that master, or drop master."
        )
    remote = given.get("hosts") is not None or given.get("hostfile") is not None
    if engine == "spark":
        if remote:
            raise ConfigError(
                "hosts were given with engine='spark': Spark places the workers. "
                "Fix: drop hosts (-H/--hostfile), or use where=dk.where.Hosts(...)."
            )
        placed = sorted(k for k in given if k not in ("engine", "master", "collector_host"))
        if placed:
            raise ConfigError(
                f"{', '.join(placed)} given with engine='spark': Spark places and starts the "
                f"workers. Fix: drop them (for Spark: master and collector_host)."
            )
        return Spark(given.get("master") or "", given.get("collector_host"))
    if remote:
        if given.get("cores") is not None:
            raise ConfigError(
                f"cores={tuple(given['cores'])!r} with other hosts: ddlkit pins cores only on "
                f"this machine. Fix: pass cores=None for other hosts."
            )
        keys = {f.name for f in fields(Hosts)}
        return Hosts(**{k: v for k, v in given.items() if k in keys})
    hosts_only = sorted(k for k in given if OLD_KEYWORDS[k] == "Hosts")
    if hosts_only:
        raise ConfigError(
            f"{', '.join(hosts_only)} given without hosts: they say how to reach other hosts. "
            f"Fix: pass where=dk.where.Hosts('node1:1,node2:1', ...), or drop them."
        )
    return ThisMachine(**{k: v for k, v in given.items() if k in ("cores", "pin_cores")})


def replacement(given: dict[str, Any]) -> str:
    """How to say the old keywords with ``where=`` (for the deprecation message)."""
    where = from_keywords(given)
    if isinstance(where, Spark):
        more = "" if where.collector_host is None else f", collector_host={where.collector_host!r}"
        return f"where=dk.where.Spark({where.master!r}{more})"
    names = [f.name for f in fields(where)]
    args = ", ".join(f"{k}={given[k]!r}" for k in names if k in given)
    return f"where=dk.where.{type(where).__name__}({args})"
