"""Podman and buildah as the kit runs them: their settings, a tool check, one way to call them.

Containers run here with three settings the machine needs (``containers.conf``, written to
the kit's cache and passed in ``CONTAINERS_CONF``, so nothing under ``/etc`` changes):

- ``default_ulimits``: podman raises each container's limits to its own defaults, which a VM
  may deny ("setrlimit ... operation not permitted"). The kit asks for this process's hard
  limits instead, the process count capped at ``kernel.pid_max`` (above it, ``setrlimit``
  fails here too).
- ``cgroup_manager = "cgroupfs"``: no systemd runs on the machine.
- ``runtime = "runc"``: crun refuses cgroups in hybrid mode.
- ``network_backend = "netavark"``: podman's current network stack, whose DNS server
  (aardvark-dns) makes containers on one network find each other by name, as Docker's do.
  Debian's podman falls back to CNI, without DNS, on a machine where podman ran before
  netavark was installed (it remembers its first backend in ``defaultNetworkBackend`` under
  its storage): a plain ``TF_CONFIG`` naming the containers would then never connect.

Every command is an argv list (no shell); a missing tool is one :class:`ConfigError` naming
the Debian packages.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlkit import settings
from ddlkit.errors import ConfigError

PACKAGES = ("podman", "buildah", "runc", "mmdebstrap", "netavark", "aardvark-dns")
# Where podman looks for its network helpers (containers.conf's helper_binaries_dir default).
HELPER_DIRS = ("/usr/local/libexec/podman", "/usr/local/lib/podman", "/usr/libexec/podman",
               "/usr/lib/podman")  # fmt: skip
HELPERS = ("netavark", "aardvark-dns")


def ulimits(nofile: int, nproc: int, pid_max: int) -> tuple[str, str]:
    """The containers' ``nofile`` and ``nproc`` limits (pure): the given hard limits, the
    process count no higher than ``pid_max``."""
    procs = min(nproc, pid_max)
    return f"nofile={nofile}:{nofile}", f"nproc={procs}:{procs}"


def conf_text(nofile: int, nproc: int, pid_max: int) -> str:
    """The ``containers.conf`` the kit runs podman and buildah with (pure)."""
    limits = ", ".join(f'"{u}"' for u in ulimits(nofile, nproc, pid_max))
    return (
        "# Written by ddlkit (ddlkit.image.podman): this machine's limits, cgroupfs, runc,\n"
        "# netavark (names resolve between containers).\n"
        f"[containers]\ndefault_ulimits = [{limits}]\n"
        '[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
        '[network]\nnetwork_backend = "netavark"\n'
    )


def _hard(limit: int) -> int:
    hard = resource.getrlimit(limit)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


def conf_path() -> Path:
    """Write (when it changed) and return the kit's ``containers.conf``."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    text = conf_text(_hard(resource.RLIMIT_NOFILE), _hard(resource.RLIMIT_NPROC), pid_max)
    path = settings.home() / "containers" / "containers.conf"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def missing_helpers(dirs: Sequence[str] = HELPER_DIRS) -> list[str]:
    """The network helpers podman needs for names to resolve that none of ``dirs`` holds."""
    return [h for h in HELPERS if not any(os.access(Path(d, h), os.X_OK) for d in dirs)]


def require(*tools: str, path: str | None = None, helper_dirs: Sequence[str] = HELPER_DIRS) -> None:
    """ConfigError naming the packages when one of ``tools`` is not on PATH, or podman's
    network helpers are missing."""
    missing = [t for t in tools if shutil.which(t, path=path) is None]
    if "podman" in tools:
        missing += missing_helpers(helper_dirs)
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not found: containers need podman and buildah. Fix: as root, "
            f"apt-get install {' '.join(PACKAGES)} (or run `make system`)."
        )
    if os.geteuid() != 0:
        raise ConfigError(
            "containers run here as root only (podman without root needs subordinate ids this "
            "machine does not give). Fix: run as root, or use the namespaced or user-mode hosts."
        )


def env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment podman and buildah run with: ours, plus the kit's containers.conf."""
    return {**(os.environ if base is None else base), "CONTAINERS_CONF": str(conf_path())}


def run(
    argv: Sequence[str], *, timeout: float = 120, check: bool = True, env_extra=None
) -> subprocess.CompletedProcess[str]:
    """Run one podman/buildah command and return it; ConfigError with its stderr if it fails
    (with ``check``)."""
    done = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env(), **(env_extra or {})},
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(
            f"{' '.join(argv[:3])} failed ({detail[-1] if detail else f'exit {done.returncode}'})."
            f" Fix: read the message; `podman ps -a` and `podman images` show what exists."
        )
    return done


def image_exists(name: str) -> bool:
    return run(["podman", "image", "exists", name], check=False).returncode == 0


def image_label(name: str, label: str) -> str | None:
    """A label of a local image, or None (no such image or label)."""
    done = run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', name],
        check=False,
    )
    value = done.stdout.strip()
    return value if done.returncode == 0 and value and value != "<no value>" else None
