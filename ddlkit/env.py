"""Check the environment a notebook runs in, and show it as one table.

`check()` gathers facts (versions, devices, cores, Horovod, data sets) into an
`EnvReport`; nothing is printed or decided while gathering, so the report can
be shown in a notebook, printed by the CLI, or asserted on in tests.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field

from ddlkit import backend, cpu
from ddlkit._tables import html_table


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, what was found, and whether it is fine."""

    name: str
    value: str
    ok: bool = True
    fix: str = ""
    optional: bool = False


@dataclass(frozen=True, repr=False)
class EnvReport:
    checks: tuple[Check, ...]
    facts: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        """True when every required check passed (optional ones only inform)."""
        return all(c.ok or c.optional for c in self.checks)

    def __getitem__(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = []
        for c in self.checks:
            mark = "ok " if c.ok else ("-- " if c.optional else "!! ")
            line = f"{mark}{c.name.ljust(width)}  {c.value}"
            if c.fix:
                line += f"  -> {c.fix}"
            lines.append(line)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        def mark(c: Check) -> str:
            return "\u2705" if c.ok else ("optional" if c.optional else "\u26a0\ufe0f")

        rows = [(c.name, c.value, mark(c), c.fix) for c in self.checks]
        return html_table(("check", "found", "", "fix"), rows)


def usable_cores() -> int:
    """CPU cores this process may run on (respects affinity masks and cgroups' cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def horovod_status(timeout: float = 60.0) -> dict:
    """Probe Horovod in a child process, so a broken build cannot crash this one."""
    probe = (
        "import json, os\n"
        "import horovod, horovod.tensorflow as hvd\n"
        "print(json.dumps({'version': horovod.__version__, 'gloo': bool(hvd.gloo_built()),"
        " 'mpi': bool(hvd.mpi_built()), 'nccl': bool(hvd.nccl_built())}))\n"
    )
    env = dict(os.environ, **backend.keras_env())
    try:
        proc = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"usable": False, "error": f"importing horovod took over {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {proc.returncode}"
        return {"usable": False, "error": last}
    out = proc.stdout.strip().splitlines()[-1]
    return {"usable": True, **json.loads(out)}


def _device_summary(tf) -> tuple[str, int]:
    gpus = tf.config.list_physical_devices("GPU")
    cpus = tf.config.list_physical_devices("CPU")
    text = f"{len(cpus)} CPU"
    if gpus:
        names = []
        for gpu in gpus:
            try:
                details = tf.config.experimental.get_device_details(gpu)
                names.append(details.get("device_name", "GPU"))
            except Exception:  # noqa: BLE001 - details are cosmetic
                names.append("GPU")
        text += f", {len(gpus)} GPU ({', '.join(names)})"
    else:
        text += ", no GPU"
    return text, len(gpus)


def check(*, horovod: bool = True, data: bool = True) -> EnvReport:
    """Gather the environment facts into an `EnvReport` (imports TensorFlow)."""
    tf = backend.tf()
    flavour = backend.active_flavour()
    wanted = backend.wanted_flavour()
    devices, n_gpus = _device_summary(tf)
    cores = usable_cores()
    checks = [
        Check("Python", platform.python_version()),
        Check("TensorFlow", tf.__version__),
        Check(
            "Keras",
            f"{flavour} {backend.keras_version()} ({backend.LEGACY_VAR}="
            f"{os.environ.get(backend.LEGACY_VAR, 'unset')})",
            ok=flavour == wanted,
            fix=""
            if flavour == wanted
            else "restart the kernel and run `import ddlkit` before importing TensorFlow",
        ),
        Check("devices", devices),
        Check(
            "CPU cores",
            str(cores),
            ok=cores >= 2,
            fix="" if cores >= 2 else "multi-worker notebooks want >= 2 cores to show a speed-up",
        ),
    ]
    machine = cpu.read()
    checks += [Check(name, value) for name, value in machine.lines()]
    facts = {"gpus": n_gpus, "cores": cores, "keras": flavour, "cpu": machine}
    if horovod:
        hv = horovod_status()
        facts["horovod"] = hv
        if hv["usable"]:
            ops = [k for k in ("gloo", "mpi", "nccl") if hv.get(k)]
            summary = f"{hv['version']} ({', '.join(ops) or 'no controller'})"
            checks.append(Check("Horovod", summary))
        else:
            checks.append(
                Check(
                    "Horovod",
                    f"not usable: {hv['error']}",
                    ok=False,
                    fix="only Horovod runs need it: scripts/build-horovod.sh .venv/bin/python "
                    "(make lab does it; docs/horovod.md)",
                    optional=True,
                )
            )
    if data:
        from ddlkit import data as data_mod

        for row in data_mod.status():
            usable = row.source in ("keras", "kit-cache", "synthetic")
            where = {"keras": "Keras' cache", "kit-cache": "kit's offline cache"}.get(
                row.source, row.source
            )
            fix = "" if usable else row.detail
            if row.source == "synthetic":
                where = "synthetic stand-in (real CIFAR-10 is not on this machine)"
            checks.append(Check(f"data: {row.name}", where, ok=usable, fix=fix))
    return EnvReport(tuple(checks), facts)
