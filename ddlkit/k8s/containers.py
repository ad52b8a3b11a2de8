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
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddlkit.environments.kubernetes import INDEX_VAR, pod_host
from ddlkit.errors import ConfigError, DdlkitError
from ddlkit.image import podman
from ddlkit.k8s.local import _container
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
class PodContainers:
    """The containers standing for the pods ``<job>-0 .. <job>-<n-1>`` of one job."""

    job: str
    service: str
    run: str  # this block's id: in the container and network names, and their label
    network: str
    gateway: str  # this machine's address on the pods' network (e.g. for a collector)
    addresses: tuple[str, ...]

    def names(self) -> list[str]:
        return [pod_host(self.job, self.service, i) for i in range(len(self.addresses))]

    def container(self, index: int) -> str:
        return f"{self.job}-{index}-{self.run}"

    def hosts_lines(self) -> list[str]:
        """``--add-host`` values: every pod's DNS name and host name, with its address."""
        out = []
        for address, name in zip(self.addresses, self.names(), strict=True):
            out += [f"{name}:{address}", f"{name.split('.')[0]}:{address}"]
        return out

    def pod_env(self, manifest: Manifest, index: int, secrets: Mapping) -> dict[str, str]:
        """Pod ``index``'s variables: the container's ``env`` and its completion index."""
        env = {INDEX_VAR: str(index)}
        for item in _container(manifest).get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                ref = item["valueFrom"]["secretKeyRef"]
                try:
                    env[item["name"]] = secrets[ref["name"]][ref["key"]]
                except KeyError:
                    raise ConfigError(
                        f"the pods read {item['name']} from Secret {ref['name']!r} key "
                        f"{ref['key']!r}, which secrets= lacks. Fix: pass secrets="
                        f"{{{ref['name']!r}: {{{ref['key']!r}: ...}}}}."
                    ) from None
        return env

    def run_argv(self, manifest: Manifest, index: int, mount: Path, env_names) -> list[str]:
        """``podman run`` for pod ``index`` (pure): names, address, volume, env by name only."""
        container = _container(manifest)
        argv = ["podman", "run", "--detach", "--name", self.container(index)]
        argv += ["--hostname", self.names()[index].split(".")[0], "--label", f"{LABEL}={self.run}"]
        argv += ["--network", self.network, "--ip", self.addresses[index]]
        argv += [f"--add-host={h}" for h in self.hosts_lines()]
        argv += ["--volume", f"{mount}:{MOUNT}"]
        argv += [f"--env={name}" for name in sorted(env_names)]  # values: podman's environment
        argv += [container["image"], *container["command"]]
        return argv

    def start(
        self,
        manifest: Manifest,
        mount: str | os.PathLike,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Start every pod's container (all checked first); the volume is ``mount``."""
        _check_image(_container(manifest)["image"])
        mount = Path(mount).absolute()
        envs = [self.pod_env(manifest, i, secrets or {}) for i in range(len(self.addresses))]
        mount.mkdir(parents=True, exist_ok=True)
        os.chown(mount, IMAGE_UID, IMAGE_UID)  # the image's user writes the run directory
        for i, env in enumerate(envs):
            podman.run(self.run_argv(manifest, i, mount, env), env_extra=env, timeout=60)

    def wait(self, timeout: float) -> list[int]:
        """Every pod's exit code, once all have ended.

        A pod that ends with a non-zero code fails the job as a failed worker does under the
        kit's launcher: the other pods are killed and :class:`PodFailedError` names it (a real
        Job would replace it up to its ``backoffLimitPerIndex``; that is not played). Past
        ``timeout`` s every pod is killed and ConfigError says so.
        """
        deadline = time.monotonic() + timeout
        codes: dict[int, int] = {}
        while len(codes) < len(self.addresses):
            for i in range(len(self.addresses)):
                if i in codes:
                    continue
                state = self.state(i)
                if state["Status"] in ("exited", "stopped"):
                    codes[i] = int(state["ExitCode"])
                    if codes[i] != 0:
                        self.kill()
                        raise PodFailedError(self.names()[i].split(".")[0], codes[i])
            if len(codes) < len(self.addresses):
                if time.monotonic() > deadline:
                    self.kill()
                    raise ConfigError(
                        f"the pods of {self.job} did not finish within {timeout:.0f} s and were "
                        f"killed. Fix: read their logs (pods.logs()), or give them longer."
                    )
                time.sleep(0.5)
        return [codes[i] for i in range(len(self.addresses))]

    def state(self, index: int) -> dict:
        done = podman.run(["podman", "container", "inspect", self.container(index)])
        return json.loads(done.stdout)[0]["State"]

    def logs(self) -> dict[str, str]:
        """Every pod's output, by its host name."""
        out = {}
        for i in range(len(self.addresses)):
            done = podman.run(["podman", "logs", self.container(i)], check=False)
            out[f"{self.job}-{i}"] = done.stdout + done.stderr
        return out

    def kill(self, index: int | None = None) -> None:
        """SIGKILL one pod's container (a node lost), or all of them."""
        which = range(len(self.addresses)) if index is None else [index]
        for i in which:
            podman.run(["podman", "kill", self.container(i)], check=False)

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


def unavailable() -> str:
    """Why pods cannot run as containers here ('' when they can)."""
    try:
        podman.require("podman")
    except ConfigError as e:
        return str(e)
    return ""


@contextmanager
def pod_containers(manifest: Manifest) -> Iterator[PodContainers]:
    """A podman network for the pods of ``manifest``; on exit its containers and it are gone.

    The network's bridge, and so this machine's address on it (``gateway``, where a
    collector can listen), exists once a container has joined it: a container of the
    manifest's image that runs ``true`` joins it first.
    """
    image = _container(manifest)["image"]
    podman.require("podman")
    _check_image(image)
    plan = manifest.plan
    run = _secrets.token_hex(4)
    network = f"ddlkit-{run}"
    podman.run(["podman", "network", "create", "--label", f"{LABEL}={run}", network])
    try:
        info = json.loads(podman.run(["podman", "network", "inspect", network]).stdout)[0]
        subnet = info["subnets"][0]["subnet"]
        gateway, pods = addresses(subnet, plan.pods)
        gateway = info["subnets"][0].get("gateway", gateway)
        podman.run(["podman", "run", "--rm", "--network", network, "--label", f"{LABEL}={run}",
                    "--entrypoint", "true", image], timeout=60)  # fmt: skip
        yield PodContainers(plan.name, plan.service, run, network, gateway, pods)
    finally:
        names = podman.run(
            ["podman", "ps", "--all", "--filter", f"label={LABEL}={run}", "--format",
             "{{.Names}}"], check=False,
        ).stdout.split()  # fmt: skip
        if names:
            podman.run(["podman", "rm", "--force", "--time", "0", *names], check=False)
        podman.run(["podman", "network", "rm", "--force", network], check=False)
