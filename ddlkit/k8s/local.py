"""The pod side without a cluster: namespaced hosts named as Kubernetes names the pods.

No Kubernetes API runs on this machine, so the Job controller's part is played here, and
only that part: each pod of a :class:`~ddlkit.k8s.manifest.Manifest` is a namespaced host
(:mod:`ddlkit.hosts.netns`, root) whose ``/etc/hosts`` names every pod
``<job>-<index>.<service>`` (what the headless Service's DNS gives), and the manifest's own
container command runs in it with ``JOB_COMPLETION_INDEX`` set and the container's ``env``
(a ``secretKeyRef`` read from ``secrets``; the checkpoint volume is a local directory)::

    with dk.k8s.local.pod_hosts(m) as pods:
        procs = pods.start(m, mount=tmp / "volume", secrets={"tok": {"token": t}})
        codes = pods.wait(procs, timeout=300)

What is not played: image pulls, scheduling, restarts, the Service's DNS server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit.environments.kubernetes import INDEX_VAR, pod_host
from ddlkit.errors import ConfigError
from ddlkit.hosts import netns
from ddlkit.hosts.netns import NetnsHost
from ddlkit.k8s.manifest import Manifest
from ddlkit.k8s.plan import MOUNT


@dataclass(frozen=True)
class PodHosts:
    """Namespaced hosts standing for the pods ``<job>-0 .. <job>-<n-1>`` of one job."""

    job: str
    service: str
    hosts: tuple[NetnsHost, ...]
    started: list[subprocess.Popen] = field(default_factory=list)  # by start(), pod order
    log_dirs: list[Path] = field(default_factory=list)  # start()'s logs=, if given

    @property
    def gateway(self) -> str:
        """This machine's address on the pods' network (e.g. for a metrics collector)."""
        return self.hosts[0].gateway

    def names(self) -> list[str]:
        return [pod_host(self.job, self.service, i) for i in range(len(self.hosts))]

    def hosts_lines(self) -> str:
        """``/etc/hosts`` lines: each pod's address, its DNS name and its host name."""
        return "".join(
            f"{h.address} {name} {name.split('.')[0]}\n"
            for h, name in zip(self.hosts, self.names(), strict=True)
        )

    def etc_hosts(self, index: int) -> str:
        """Pod ``index``'s ``/etc/hosts``, as its processes read it."""
        return (netns.NETNS_ETC / self.hosts[index].name / "hosts").read_text()

    def closed(self) -> bool:
        """Whether every pod host is gone (after :func:`pod_hosts` has ended)."""
        return not {h.name for h in self.hosts} & set(netns.existing())

    def pod_env(self, manifest: Manifest, index: int, mount: Path, secrets: Mapping) -> dict:
        """Pod ``index``'s variables: the container's ``env`` (the volume's path as the
        directory here) and its completion index."""
        env = {INDEX_VAR: str(index)}
        for name, value in container_env(_container(manifest), secrets).items():
            if value == MOUNT or value.startswith(f"{MOUNT}/"):
                value = str(mount) + value[len(MOUNT) :]  # the volume, as a directory here
            env[name] = value
        return env

    def argv(self, manifest: Manifest, index: int) -> list[str]:
        """Pod ``index``'s container command, inside its host; ``python`` is this Python."""
        command = list(_container(manifest)["command"])
        if command[0] == "python":
            command[0] = sys.executable  # the image's Python: this venv, shared by the hosts
        return self.hosts[index].exec_argv(command)

    def start(
        self,
        manifest: Manifest,
        mount: str | os.PathLike,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
        cwd: str | os.PathLike | None = None,
        logs: str | os.PathLike | None = None,
    ) -> list[subprocess.Popen]:
        """Start every pod's command (the one place this module starts processes); with
        ``logs``, each pod's output goes to ``<logs>/<job>-<i>.log`` (see :meth:`logs`)."""
        mount = Path(mount).absolute()
        envs = [self.pod_env(manifest, i, mount, secrets or {}) for i in range(len(self.hosts))]
        argvs = [self.argv(manifest, i) for i in range(len(self.hosts))]  # all checked first
        mount.mkdir(parents=True, exist_ok=True)
        procs = []
        for i, (argv, env) in enumerate(zip(argvs, envs, strict=True)):
            out = subprocess.DEVNULL
            if logs is not None:
                Path(logs).mkdir(parents=True, exist_ok=True)
                out = open(Path(logs) / f"{self.names()[i].split('.')[0]}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    argv, env={**os.environ, **env}, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
                )
            )
            if out is not subprocess.DEVNULL:
                out.close()
        self.started[:] = procs
        self.log_dirs[:] = [] if logs is None else [Path(logs)]
        return procs

    def wait(self, procs: list[subprocess.Popen] | None = None, timeout: float = 600) -> list[int]:
        """Every pod's exit code (``procs``: those :meth:`start` returned, by default); past
        ``timeout`` s all are killed and ConfigError says so."""
        procs = self.started if procs is None else procs
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(max(0.1, deadline - time.monotonic())) for p in procs]
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"the pods of {self.job} did not finish within {timeout:.0f} s and were killed. "
                f"Fix: read their logs, or give them longer."
            ) from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def logs(self) -> dict[str, str]:
        """Every pod's output, by its host name (what :meth:`start` wrote under ``logs``)."""
        if not self.log_dirs:
            raise ConfigError("no logs were kept. Fix: pass logs=DIRECTORY to start().")
        hosts = [n.split(".")[0] for n in self.names()]
        return {h: (self.log_dirs[0] / f"{h}.log").read_text(errors="replace") for h in hosts}


def unavailable() -> str:
    """Why pods cannot be played on this machine ('' when they can): namespaced hosts need
    Linux, root and ``ip``, and a machine that lets root make network namespaces."""
    return netns.unavailable(try_it=True)


def container_env(container: dict, secrets: Mapping) -> dict[str, str]:
    """A container's ``env``, each ``secretKeyRef`` read from ``secrets`` (ConfigError names a
    missing one): what the pod's process sees, on namespaced hosts or in containers."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
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


def _container(manifest: Manifest) -> dict:
    jobs = [o for o in manifest.objects if o["kind"] == "Job"]
    if not jobs:
        raise ConfigError(
            f"a {manifest.kind} manifest has no Job whose pods could be played here. "
            f"Fix: make it with kind='job' (Kubeflow's operator runs the TFJob form)."
        )
    return jobs[0]["spec"]["template"]["spec"]["containers"][0]


@contextmanager
def pod_hosts(manifest: Manifest) -> Iterator[PodHosts]:
    """One namespaced host per pod of ``manifest``, each named as Kubernetes names it.

    Every host's ``/etc/hosts`` (``/etc/netns/<host>/hosts``, made by
    :func:`ddlkit.hosts.netns.namespaced_hosts`) gets every pod's lines. Needs root; on exit
    everything inside the hosts is stopped and they are deleted.
    """
    _container(manifest)
    plan = manifest.plan
    with netns.namespaced_hosts(plan.pods) as hosts:
        pods = PodHosts(plan.name, plan.service, hosts)
        for h in hosts:
            path = netns.NETNS_ETC / h.name / "hosts"
            path.write_text(path.read_text() + pods.hosts_lines())
        yield pods
