"""The pod side as real containers: a manifest's pods run as podman containers of the kit's image.

No Kubernetes API runs on this machine, so the Job controller's part is played here, and
only that part (as :mod:`ddlkit.k8s.local` does with namespaced hosts): every pod of the
Indexed Job is a container of the image the manifest names, on one podman network of its
own, with the pod's host name ``<job>-<i>``, every pod's name ``<job>-<i>.<service>`` in its
``/etc/hosts`` (what the headless Service's DNS gives), ``JOB_COMPLETION_INDEX``, the
container's ``env`` and its own ``command``; the checkpoint claim is a directory of this
machine mounted at the claim's path::

    with dk.k8s.containers.pod_containers(m) as pods:
        pods.start(m, mount=tmp / "volume", secrets={"tok": {"token": t}})
        codes = pods.wait(timeout=300)

A Secret's value reaches a container through podman's environment (``--env NAME``), never
its argv. What is not played: image pulls, scheduling, restarts, resource limits, the
Service's DNS server. Needs root (see :mod:`ddlkit.image.podman`); on exit every container
and the network are removed, whatever happened.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets as _secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit.environments.kubernetes import INDEX_VAR, pod_host
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.hosts.sshd import keygen_argv
from ddlkit.image import podman
from ddlkit.k8s import mpijob, needs
from ddlkit.k8s.local import _container, container_env
from ddlkit.k8s.manifest import Manifest
from ddlkit.k8s.plan import MOUNT


class PodFailedError(DdlkitError):
    """A pod's container ended with a non-zero code; the job's other pods were killed."""

    def __init__(self, pod: str, exit_code: int) -> None:
        self.pod, self.exit_code = pod, exit_code
        how = " (137: killed, SIGKILL)" if exit_code == 137 else ""
        super().__init__(
            f"pod {pod} exited with code {exit_code}{how}; the job's other pods were killed. "
            f"Fix: read its log (pods.logs()[{pod!r}]), then start the job again."
        )


LABEL = "io.ddlkit.pods"  # on every container and network of one pod_containers block
IMAGE_UID = 1000  # the image's user (Containerfile: useradd --uid 1000): owns the volume


@dataclass(frozen=True)
class Pod:
    """One pod to play (pure data): what its container runs, with what, where."""

    host: str  # its DNS name: <job>-<i>.<service>, or the MPI operator's <job>-worker-<i>...
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]  # values reach the container through podman's environment
    mounts: tuple[tuple[str, str, str], ...] = ()  # (path here, path inside, options)
    ends: bool = True  # ends by itself; False: a server, killed once the others have ended

    @property
    def name(self) -> str:
        return self.host.split(".")[0]


def _volume(mount: Path) -> tuple[str, str, str]:
    return (str(mount), MOUNT, "")


def job_pods(manifest: Manifest, mount: Path, secrets: Mapping) -> list[Pod]:
    """The Indexed Job's pods: the container's command with ``JOB_COMPLETION_INDEX`` = i."""
    container, plan = _container(manifest), manifest.plan
    env = container_env(container, secrets)
    return [
        Pod(pod_host(plan.name, plan.service, i), container["image"],
            tuple(container["command"]), {INDEX_VAR: str(i), **env}, (_volume(mount),))
        for i in range(plan.pods)
    ]  # fmt: skip


def mpijob_hosts(job: str, workers: int) -> list[str]:
    """The launcher's and the workers' names, as the MPI operator names them (pure)."""
    svc = f"{job}.{mpijob.NAMESPACE}.svc"
    return [f"{job}-launcher.{svc}"] + [f"{job}-worker-{i}.{svc}" for i in range(workers)]


def mpijob_pods(manifest: Manifest, mount: Path, secrets: Mapping, etc: Path) -> list[Pod]:
    """The MPIJob's pods as the operator makes them: the SSH Secret (``etc/ssh``) mounted at
    ``sshAuthMountPath`` in each, the hostfile (``etc/mpi/hostfile``) in the launcher."""
    spec = manifest.objects[-1]["spec"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    hosts = mpijob_hosts(manifest.plan.name, manifest.plan.workers)
    ssh = (str(etc / "ssh"), spec["sshAuthMountPath"], "ro")
    mpi_env = {"OMPI_MCA_orte_default_hostfile": mpijob.HOSTFILE,
               "OMPI_MCA_orte_keep_fqdn_hostnames": "true"}  # fmt: skip
    pods = [Pod(hosts[0], launcher["image"], tuple(launcher["command"]),
                {**container_env(launcher, secrets), **mpi_env},
                (_volume(mount), ssh, (str(etc / "mpi"), "/etc/mpi", "ro")))]  # fmt: skip
    pods += [
        Pod(h, worker["image"], tuple(worker["command"]), container_env(worker, secrets),
            (_volume(mount), ssh), ends=False)
        for h in hosts[1:]
    ]  # fmt: skip
    return pods


@dataclass(frozen=True)
class PodContainers:
    """The containers standing for the pods of one job, on a podman network of its own."""

    job: str
    kind: str  # the manifest's: "job" (Indexed Job) or "mpijob"
    run: str  # this block's id: in the container and network names, and their label
    network: str
    gateway: str  # this machine's address on the pods' network (e.g. for a collector)
    addresses: tuple[str, ...]
    hosts: tuple[str, ...]  # every pod's DNS name, in pod order
    etc: Path  # the MPIJob's Secret and hostfile, as the operator would mount them
    pending: set[int] = field(default_factory=set)  # pods left Pending by start(pending=)

    def names(self) -> list[str]:
        return list(self.hosts)

    def container(self, index: int) -> str:
        return f"{self.hosts[index].split('.')[0]}-{self.run}"

    def started(self) -> list[int]:
        """The indices of the pods that run (all but the ones left Pending)."""
        return [i for i in range(len(self.hosts)) if i not in self.pending]

    def hosts_lines(self) -> list[str]:
        """``--add-host`` values: every started pod's DNS name and host name, with its address.

        A Pending pod has no address, so the headless Service gives its name no record.
        """
        out = []
        for i in self.started():
            name = self.hosts[i]
            out += [f"{name}:{self.addresses[i]}", f"{name.split('.')[0]}:{self.addresses[i]}"]
        return out

    def pods(self, manifest: Manifest, mount: Path, secrets: Mapping) -> list[Pod]:
        if self.kind == "mpijob":
            return mpijob_pods(manifest, mount, secrets, self.etc)
        return job_pods(manifest, mount, secrets)

    def run_argv(self, pod: Pod, index: int) -> list[str]:
        """``podman run`` for pod ``index`` (pure): names, address, volumes, env by name only."""
        argv = ["podman", "run", "--detach", "--name", self.container(index)]
        argv += ["--hostname", pod.name, "--label", f"{LABEL}={self.run}"]
        argv += ["--network", self.network, "--ip", self.addresses[index]]
        argv += [f"--add-host={h}" for h in self.hosts_lines()]
        for here, inside, options in pod.mounts:
            argv += ["--volume", f"{here}:{inside}:{options}" if options else f"{here}:{inside}"]
        argv += [f"--env={name}" for name in sorted(pod.env)]  # values: podman's environment
        return [*argv, pod.image, *pod.command]

    def start(
        self,
        manifest: Manifest,
        mount: str | os.PathLike,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
        pending: Collection[int] = (),
    ) -> None:
        """Start every pod's container (all checked first); the volume is ``mount``.

        Servers (an MPIJob's sshd workers) first, each listening before the next pod starts:
        the launcher's first ssh finds them up. The pods in ``pending`` are not started, as
        pods the scheduler has found no room for, and their names resolve nowhere.
        """
        last = len(self.hosts) - 1
        if not set(pending) <= set(range(last + 1)) or len(set(pending)) > last:
            raise ConfigError(
                f"pending={sorted(pending)} must name some, not all, of pods 0..{last}. Fix: "
                f"leave at least one pod to start."
            )
        self.pending.update(pending)
        mount = Path(mount).absolute()
        pods = self.pods(manifest, mount, secrets or {})
        for image in {p.image for p in pods}:
            _check_image(image)
        mount.mkdir(parents=True, exist_ok=True)
        os.chown(mount, IMAGE_UID, IMAGE_UID)  # the image's user writes the run directory
        if self.kind == "mpijob":
            _ssh_secret(self.etc / "ssh", manifest.plan.name)
            (self.etc / "mpi").mkdir(exist_ok=True)
            hostfile = mpijob.hostfile_of(list(self.hosts[1:]), manifest.objects[-1])
            (self.etc / "mpi" / "hostfile").write_text(hostfile)
        order = sorted(self.started(), key=lambda i: pods[i].ends)  # servers first
        for i in order:
            podman.run(self.run_argv(pods[i], i), env_extra=dict(pods[i].env), timeout=60)
            if not pods[i].ends:
                self._wait_listening(i, "Server listening on", timeout=60)

    def _wait_listening(self, index: int, line: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.logs_of(index):
            if self.state(index)["Status"] != "running" or time.monotonic() > deadline:
                raise ConfigError(
                    f"pod {self.hosts[index].split('.')[0]} did not start its server "
                    f"({self.logs_of(index).strip()[-300:]!r}). Fix: read its log."
                )
            time.sleep(0.2)

    def wait(self, timeout: float) -> list[int]:
        """The exit codes of the pods that end by themselves, once all have ended; then the
        servers (an MPIJob's workers) are killed, as ``cleanPodPolicy: Running`` deletes them.

        A pod that ends with a non-zero code fails the job as a failed worker does under the
        kit's launcher: the other pods are killed and :class:`PodFailedError` names it (a real
        Job would replace it up to its ``backoffLimitPerIndex``; that is not played). Past
        ``timeout`` s every pod is killed and ConfigError says so.
        """
        deadline = time.monotonic() + timeout
        started = self.started()
        servers = {i for i in started if self._is_server(i)}
        codes: dict[int, int] = {}
        while len(codes) < len(started) - len(servers):
            for i in started:
                if i in codes:
                    continue
                state = self.state(i)
                if state["Status"] in ("exited", "stopped"):
                    code = int(state["ExitCode"])
                    if code != 0:
                        self.kill()
                        raise PodFailedError(self.hosts[i].split(".")[0], code)
                    if i not in servers:
                        codes[i] = code
            if len(codes) < len(started) - len(servers):
                if time.monotonic() > deadline:
                    self.kill()
                    raise ConfigError(
                        f"the pods of {self.job} did not finish within {timeout:.0f} s and were "
                        f"killed. Fix: read their logs (pods.logs()), or give them longer."
                    )
                time.sleep(0.5)
        for i in servers:
            self.kill(i)
        return [codes[i] for i in sorted(codes)]

    def _is_server(self, index: int) -> bool:
        return self.kind == "mpijob" and index > 0

    def state(self, index: int) -> dict:
        done = podman.run(["podman", "container", "inspect", self.container(index)])
        return json.loads(done.stdout)[0]["State"]

    def logs_of(self, index: int) -> str:
        done = podman.run(["podman", "logs", self.container(index)], check=False)
        return done.stdout + done.stderr

    def logs(self) -> dict[str, str]:
        """Every started pod's output, by its host name."""
        return {self.hosts[i].split(".")[0]: self.logs_of(i) for i in self.started()}

    def kill(self, index: int | None = None) -> None:
        """SIGKILL one pod's container (a node lost), or all of them."""
        which = self.started() if index is None else [index]
        for i in which:
            podman.run(["podman", "kill", self.container(i)], check=False)

    def closed(self) -> bool:
        """Whether every container and the network are gone (after the block has ended)."""
        return not self.leftovers()

    def leftovers(self) -> list[str]:
        """Containers and networks of this block that still exist (none after it ends)."""
        done = podman.run(
            ["podman", "ps", "--all", "--filter", f"label={LABEL}={self.run}", "--format",
             "{{.Names}}"]
        )  # fmt: skip
        nets = podman.run(["podman", "network", "ls", "--format", "{{.Name}}"]).stdout.split()
        return done.stdout.split() + [n for n in nets if n == self.network]


def addresses(subnet: str, count: int) -> tuple[str, tuple[str, ...]]:
    """The gateway (first host address) and ``count`` pod addresses after it (pure)."""
    hosts = ipaddress.ip_network(subnet).hosts()
    gateway = str(next(hosts))
    pods = tuple(str(next(hosts)) for _ in range(count))
    return gateway, pods


def _check_image(image: str) -> None:
    if not podman.image_exists(image):
        raise ConfigError(
            f"image {image!r} is not in podman's store. Fix: build it (make image, or "
            f"ddlkit image build --tag {image}), or name an image that exists (podman images)."
        )


def kit_image(echo=print) -> str:
    """The kit's image (``make image``): built here, or found up to date; its tag."""
    from ddlkit.image.build import build

    return build(echo=echo)


def unavailable() -> str:
    """Why pods cannot run as containers here ('' when they can)."""
    try:
        podman.require("podman")
    except ConfigError as e:
        return str(e)
    return ""


def _image(manifest: Manifest) -> str:
    if manifest.kind == "mpijob":
        return manifest.plan.image
    return _container(manifest)["image"]


def _ssh_secret(directory: Path, job: str) -> None:
    """The SSH Secret the MPI operator makes: one key pair, its public key authorized, under
    the names it mounts (``id_rsa``, ``id_rsa.pub``, ``authorized_keys``); the image's user
    owns them. The same key is every worker sshd's host key (the image's ``.sshd_config``)."""
    directory.mkdir(mode=0o700)
    key = directory / "id_rsa"
    subprocess.run(keygen_argv(key, f"{job}-mpijob"), check=True, capture_output=True, timeout=30)
    (directory / "authorized_keys").write_bytes((directory / "id_rsa.pub").read_bytes())
    for path in (directory, *directory.iterdir()):
        os.chown(path, IMAGE_UID, IMAGE_UID)


@contextmanager
def pod_containers(manifest: Manifest) -> Iterator[PodContainers]:
    """A podman network for the pods of ``manifest`` (an Indexed Job or an MPIJob); on exit
    its containers, the network and the MPIJob's Secret and hostfile are gone.

    The network's bridge, and so this machine's address on it (``gateway``, where a
    collector can listen), exists only while a container is on it (netavark removes it when
    the last one leaves): a container of the manifest's image that only sleeps holds it for
    the block, as a pod's pause container holds its network on Kubernetes.
    """
    if manifest.kind not in ("job", "mpijob"):
        _container(manifest)  # the ConfigError that names the kinds that can be played
    image = _image(manifest)
    podman.require("podman")
    _check_image(image)
    needs.check(image, manifest)
    plan = manifest.plan
    if manifest.kind == "mpijob":
        hosts = mpijob_hosts(plan.name, plan.workers)
    else:
        hosts = [pod_host(plan.name, plan.service, i) for i in range(plan.pods)]
    run = _secrets.token_hex(4)
    network = f"ddlkit-{run}"
    podman.run(["podman", "network", "create", "--label", f"{LABEL}={run}", network])
    etc = Path(tempfile.mkdtemp(prefix="ddlkit-pods-"))
    try:
        info = json.loads(podman.run(["podman", "network", "inspect", network]).stdout)[0]
        subnet = info["subnets"][0]["subnet"]
        gateway, ips = addresses(subnet, len(hosts) + 1)
        gateway = info["subnets"][0].get("gateway", gateway)
        pods, holder = ips[:-1], ips[-1]  # the pods' addresses, then the holder's
        podman.run(["podman", "run", "--detach", "--name", f"{network}-holder", "--network",
                    network, "--ip", holder, "--label", f"{LABEL}={run}", "--entrypoint", "sleep",
                    image, "infinity"], timeout=60)  # fmt: skip
        yield PodContainers(
            plan.name, manifest.kind, run, network, gateway, pods, tuple(hosts), etc
        )
    finally:
        names = podman.run(
            ["podman", "ps", "--all", "--filter", f"label={LABEL}={run}", "--format",
             "{{.Names}}"], check=False,
        ).stdout.split()  # fmt: skip
        if names:
            podman.run(["podman", "rm", "--force", "--time", "0", *names], check=False)
        podman.run(["podman", "network", "rm", "--force", network], check=False)
        shutil.rmtree(etc, ignore_errors=True)
