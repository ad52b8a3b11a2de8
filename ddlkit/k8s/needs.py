"""What a manifest's pods need from their image, and the probe that asks the image for it.

A pod's container runs its ``command``: the program must be on the image's ``PATH`` (or at
its absolute path), a ``python -m PACKAGE`` command needs that package, every pod imports
TensorFlow, a ``horovodrun`` launcher needs Horovod (and ``mpirun`` when it passes ``--mpi``),
and the script is a path below the image's working directory. :func:`needs` reads these
from the manifest's own objects (pure); :func:`check` runs :data:`PROBE`, one Python program,
in one short container of the image with the needs as a JSON argument, and it prints what is
missing.
An image built from the kit's ``Containerfile`` has all of it; another image (a plain
``python:3.11``, a TensorFlow image without Horovod) fails here with one line, before any
network or container of the job exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ddlkit.errors import ConfigError
from ddlkit.image import podman
from ddlkit.k8s.manifest import Manifest

# Run as `python -c PROBE NEEDS_JSON` in the image: find_spec finds a package without
# importing it (TensorFlow's import would take seconds).
PROBE = (
    "import importlib.util, json, os, shutil, sys\n"
    "need = json.loads(sys.argv[1])\n"
    "gone = [m for m in need['modules'] if importlib.util.find_spec(m) is None]\n"
    "gone += [p for p in need['programs']\n"
    "         if not (os.access(p, os.X_OK) if os.sep in p else shutil.which(p))]\n"
    "gone += [f for f in need['files'] if not os.path.isfile(f)]\n"
    "print(json.dumps(gone))\n"
)
PYTHON = "python"  # the interpreter the probe runs: the one the pods' commands name


@dataclass(frozen=True)
class Needs:
    """Modules, programs and files a manifest's pods use from their image."""

    modules: tuple[str, ...]
    programs: tuple[str, ...]
    files: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({"modules": self.modules, "programs": self.programs, "files": self.files})


def _containers(node) -> list[dict]:
    """Every container of every pod template below ``node`` (pure)."""
    found: list[dict] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "containers" and isinstance(value, list):
                found += [c for c in value if isinstance(c, dict)]
            else:
                found += _containers(value)
    elif isinstance(node, list):
        for item in node:
            found += _containers(item)
    return found


def needs(manifest: Manifest) -> Needs:
    """What the pods of ``manifest`` need from their image (pure), each once, in the order
    the pods' commands name them."""
    modules = dict.fromkeys(["tensorflow"])  # ordered sets
    programs = dict.fromkeys([PYTHON])
    for container in _containers(list(manifest.objects)):
        command = list(container.get("command") or [])
        if command:
            programs[command[0]] = None
        if command[1:2] == ["-m"] and len(command) > 2:
            modules[command[2].split(".")[0]] = None  # python -m PACKAGE.module
        if command[:1] == ["horovodrun"]:
            modules["horovod"] = None  # horovodrun is the horovod package's command
        if "--mpi" in command:
            programs["mpirun"] = None  # horovodrun --mpi runs it
    return Needs(tuple(modules), tuple(programs), (manifest.plan.script,))


def lacking(image: str, manifest: Manifest, missing: list[str]) -> str:
    """The one-line error for an image that lacks ``missing`` (pure)."""
    what = f"a {manifest.plan.strategy} {manifest.kind}"
    where = ""
    if manifest.plan.script in missing:
        where = " (the script's path is read in the image's working directory)"
    return (
        f"image {image!r} lacks what {what}'s pods run: {', '.join(missing)}{where}. Fix: "
        f"build the kit's image (make image) and pass it as image=, or add them to your "
        f"image (the kit's Containerfile installs each)."
    )


def check(image: str, manifest: Manifest) -> None:
    """ConfigError naming what the pods of ``manifest`` would miss in ``image``, found by
    :data:`PROBE` in one short container of it (no network, removed when it ends)."""
    want = needs(manifest)
    probe = podman.run(
        ["podman", "run", "--rm", "--network", "none", "--entrypoint", PYTHON, image,
         "-c", PROBE, want.to_json()], timeout=120, check=False,
    )  # fmt: skip
    if probe.returncode == 0:
        missing = json.loads(probe.stdout.strip().splitlines()[-1])
    elif "not found" in probe.stderr and PYTHON in probe.stderr:
        missing = [f"{PYTHON} (so nothing else was looked for)"]
    else:
        raise ConfigError(
            f"could not look inside image {image!r} (podman run exited {probe.returncode}: "
            f"{probe.stderr.strip()[-300:]}). Fix: check that it runs "
            f"(podman run --rm {image} true)."
        )
    if missing:
        raise ConfigError(lacking(image, manifest, missing))
