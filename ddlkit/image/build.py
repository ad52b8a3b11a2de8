"""Build the kit's image here: a Debian base from Debian's packages, then the Containerfile.

    ddlkit image build            # or: make image
    python -m ddlkit.image build --tag localhost/ddlkit:dev

This machine reaches no image registry, so the Containerfile's ``BASE`` is built from
Debian's packages (``mmdebstrap``: bookworm, whose Python is 3.11) and imported into podman
as ``localhost/ddlkit-base:bookworm``; a label holds the digest of what went in, so it is
built again only when that changes. The kit's image is then built by ``buildah bud`` with
its layer cache (a rebuild with nothing changed reuses every layer) and the caches this
machine has mounted into the build stage (uv's, the kit's Horovod wheel and data sets):
nothing is downloaded or compiled that was already here. Elsewhere the same Containerfile
builds from a public Python image with ``podman build`` or ``docker build``, no mounts.

The build is one function of a pure :class:`BuildPlan` (argv lists, no shell).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ddlkit import settings
from ddlkit.errors import ConfigError
from ddlkit.image import KIT_IMAGE, podman
from ddlkit.locks import file_lock

SUITE = "bookworm"
# What the base has: Python 3.11 with venv (the image's /opt/venv), Open MPI and ssh (an
# MPI launcher and its workers), CA certificates. Everything else is the Containerfile's.
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "openmpi-bin",
    "libopenmpi3",
    "openssh-server",
    "openssh-client",
    "ca-certificates",
)
BASE_IMAGE = f"localhost/ddlkit-base:{SUITE}"
BASE_LABEL = "io.ddlkit.base"
CONTEXT_LABEL = "io.ddlkit.context"  # the digest of what the image was built from
# What the Containerfile copies from the repository (the digest covers exactly these).
CONTEXT = ("Containerfile", "pyproject.toml", "README.md", "scripts", "ddlkit", "launch",
           "benchmarks", "notebooks")  # fmt: skip
_SKIP = {"__pycache__", ".ipynb_checkpoints", "runs"}
# Where the notebooks write their scripts (%%writefile; git-ignored, like .containerignore):
# what a run made, not the kit. Left out, a notebook run changes neither image nor digest.
GENERATED = ("notebooks/workers", "notebooks/solutions/workers")


def in_context(rel: Path) -> bool:
    """Whether the build copies the file at ``rel`` (below the repository) (pure)."""
    if _SKIP & set(rel.parts) or rel.suffix == ".pyc":
        return False
    return not (rel.parent.as_posix() in GENERATED and rel.suffix == ".py")


DEFAULT_TAG = KIT_IMAGE
CONTAINERFILE = settings.REPO_ROOT / "Containerfile"
BUILD_TIMEOUT = 3600.0  # a cold build with Horovod compiled in it takes minutes, not an hour


def base_digest(suite: str = SUITE, packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """What the base is made of, as a short digest (pure): its label."""
    return hashlib.sha256(" ".join((suite, *packages)).encode()).hexdigest()[:16]


def mmdebstrap_argv(tarball: Path, suite: str = SUITE, packages=BASE_PACKAGES) -> list[str]:
    return [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        suite,
        str(tarball),
    ]


def import_argv(tarball: Path, digest: str, image: str = BASE_IMAGE) -> list[str]:
    return ["podman", "import", "--quiet", "--change", f"LABEL {BASE_LABEL}={digest}",
            str(tarball), image]  # fmt: skip


def context_digest(root: Path, base: str, extra: str = "") -> str:
    """A digest of every file the build copies (paths and bytes), the base and ``extra``.

    An image labelled with it was built from exactly these: :func:`build` then runs nothing,
    as buildah's layer cache would rebuild nothing (it hashes the same files, in ~30 s).
    """
    h = hashlib.sha256(f"{base}\0{extra}\0".encode())
    for top in CONTEXT:
        path = root / top
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in files:
            rel = f.relative_to(root)
            if f.is_file() and in_context(rel):
                h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class BuildPlan:
    """One ``buildah bud`` of the Containerfile: what it is given and where its caches are."""

    tag: str
    base: str
    context: Path
    mounts: tuple[tuple[str, str, str], ...]  # (host path, path in the build, options)
    digest: str = ""  # context_digest(): the image's label

    def argv(self) -> list[str]:
        # --force-rm: a failed step leaves no working container behind (a full disk, say).
        # --network host: the steps only fetch packages, and on a machine where podman first
        # ran with CNI its stale bridge (cni-podman0) keeps the default network's subnet, which
        # leaves a container on that network no way out.
        argv = ["buildah", "bud", "--isolation", "oci", "--network", "host", "--layers",
                "--force-rm", "--tag", self.tag]  # fmt: skip
        if self.digest:
            argv += ["--label", f"{CONTEXT_LABEL}={self.digest}"]
        argv += ["--build-arg", f"BASE={self.base}", "--file", str(self.context / "Containerfile")]
        for host, inside, options in self.mounts:
            argv += ["--volume", f"{host}:{inside}:{options}" if options else f"{host}:{inside}"]
        return [*argv, str(self.context)]


PRUNE_REPLACED = ["podman", "image", "prune", "--force", "--filter", f"label={CONTEXT_LABEL}"]


def _ca_bundle(environ) -> Path | None:
    for var in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if environ.get(var) and Path(environ[var]).is_file():
            return Path(environ[var])
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    return system if system.is_file() else None


def cache_mounts(environ=None) -> tuple[tuple[str, str, str], ...]:
    """The caches of this machine the build stage may use, where they exist."""
    environ = os.environ if environ is None else environ
    xdg = Path(environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    uv_cache = Path(environ.get("UV_CACHE_DIR", xdg / "uv"))
    uv = shutil.which("uv") or str(Path(sys.prefix) / "bin" / "uv")
    mounts = []
    if uv_cache.is_dir():
        mounts.append((str(uv_cache), "/cache/uv", ""))
    if settings.home().is_dir():
        mounts.append((str(settings.home()), "/cache/ddlkit", ""))
    if Path(uv).is_file():
        # the directory holding uv, read-only (a venv's bin: only uv is looked for)
        mounts.append((str(Path(uv).parent), "/cache/bin", "ro"))
    ca = _ca_bundle(environ)
    if ca is not None:
        mounts.append((str(ca.resolve()), "/cache/ca.crt", "ro"))
    return tuple(mounts)


def plan(tag: str = DEFAULT_TAG, base: str = BASE_IMAGE) -> BuildPlan:
    if not CONTAINERFILE.is_file():
        raise ConfigError(f"no Containerfile at {CONTAINERFILE}. Fix: restore it from git.")
    root = CONTAINERFILE.parent
    base_id = podman.run(["podman", "image", "inspect", "--format", "{{.Id}}", base]).stdout
    digest = context_digest(root, base_id.strip())
    return BuildPlan(tag=tag, base=base, context=root, mounts=cache_mounts(), digest=digest)


def _log_path(name: str) -> Path:
    path = settings.home() / "containers" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _run_logged(argv: list[str], log: Path, what: str, fix: str) -> None:
    with open(log, "w") as out:
        done = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, env=podman.env(),
            stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT,
        )  # fmt: skip
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
        raise ConfigError(f"{what} failed: {tail[0]} (log: {log}). Fix: {fix}.")


def _build_lock():
    """One build at a time on this machine (a second caller waits, then finds it done)."""
    path = settings.home() / "containers" / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(path)


def build_base(echo=print) -> str:
    """Import the Debian base into podman unless it is there with this digest; its name."""
    podman.require("podman", "mmdebstrap")
    digest = base_digest()
    if podman.image_label(BASE_IMAGE, BASE_LABEL) == digest:
        echo(f"base {BASE_IMAGE}: up to date")
        return BASE_IMAGE
    echo(f"base {BASE_IMAGE}: building from Debian {SUITE}'s packages (mmdebstrap)...")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddlkit-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        _run_logged(
            mmdebstrap_argv(tarball), _log_path("base"), "mmdebstrap",
            "check that Debian's mirror is reachable (apt-get update)",
        )  # fmt: skip
        podman.run(import_argv(tarball, digest), timeout=600)
    echo(f"base {BASE_IMAGE}: built in {time.monotonic() - start:.0f} s")
    return BASE_IMAGE


def image_size(tag: str) -> int:
    return int(podman.run(["podman", "image", "inspect", "--format", "{{.Size}}", tag]).stdout)


def build(tag: str = DEFAULT_TAG, base: str | None = None, echo=print) -> str:
    """Build (or find up to date) the kit's image; returns its tag. ``base``: an image to
    build on instead of the kit's Debian base (e.g. a public python:3.11-slim-bookworm)."""
    podman.require("podman", "buildah")
    with _build_lock():
        if base is None:
            base = build_base(echo)
        elif not podman.image_exists(base):
            raise ConfigError(
                f"base image {base!r} is not in podman's store and no registry is reachable. "
                f"Fix: leave --base out (the kit builds a Debian base), or `podman pull` it."
            )
        p = plan(tag, base)
        if podman.image_label(tag, CONTEXT_LABEL) == p.digest:
            echo(f"image {tag}: up to date ({image_size(tag) / 1e9:.2f} GB)")
            return tag
        echo(f"image {tag}: buildah bud (log: {_log_path('build')})...")
        start = time.monotonic()
        _run_logged(p.argv(), _log_path("build"), "buildah bud", "read the log's last step")
        # The image this build replaced lost its tag: remove it (and any older one), not the
        # layers the next build may reuse, which carry no label.
        podman.run(PRUNE_REPLACED, timeout=300)
    size = image_size(tag)
    echo(
        f"image {tag}: ready in {time.monotonic() - start:.0f} s, {size / 1e9:.2f} GB.\n"
        f"To run it on a cluster, push it to a registry the cluster pulls from:\n"
        f"  podman tag {tag} REGISTRY/ddlkit:0.1.0 && podman push REGISTRY/ddlkit:0.1.0\n"
        f"then pass --image REGISTRY/ddlkit:0.1.0 to `ddlkit k8s manifest`."
    )
    return tag
