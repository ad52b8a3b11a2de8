"""Which cores and GPUs each worker of a local job gets (pure, plus one probe).

Fair comparisons on a small machine need each worker on its own cores with
TensorFlow's thread pools sized to match; on a GPU machine each worker gets its
own GPU(s) through ``CUDA_VISIBLE_DEVICES``, as TensorFlow's device discovery
expects, and no core pinning (that would starve the GPU's input pipeline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from ddlkit.errors import ConfigError


@dataclass(frozen=True)
class Devices:
    """What one worker may use: cores to pin to, thread count, GPU ids."""

    cpus: tuple[int, ...] | None
    threads: int | None
    gpus: tuple[str, ...] | None

    def env(self) -> dict[str, str]:
        if self.gpus is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus), "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def assign(n: int, cores: tuple[int, ...], gpus: tuple[str, ...] = ()) -> list[Devices]:
    """Split `cores` or `gpus` among `n` compute workers (pure).

    - GPUs present: contiguous slices, at least one GPU each; with more workers
      than GPUs they share round-robin (memory growth on, so they fit).
    - CPU only, n <= cores: contiguous disjoint core slices, threads = slice size.
    - CPU only, n > cores: no pinning, one compute thread each (oversubscribed;
      the numbers will show it).
    """
    if n < 1:
        raise ValueError(f"need at least one worker, got {n}")
    if gpus:
        if n <= len(gpus):
            per = len(gpus) // n
            return [Devices(None, None, gpus[i * per : (i + 1) * per]) for i in range(n)]
        return [Devices(None, None, (gpus[i % len(gpus)],)) for i in range(n)]
    if cores and n <= len(cores):
        per = len(cores) // n
        return [Devices(tuple(cores[i * per : (i + 1) * per]), per, None) for i in range(n)]
    return [Devices(None, 1, None) for _ in range(n)]


def parse_visible_gpus(value: str | None) -> tuple[str, ...] | None:
    """GPU ids from a CUDA_VISIBLE_DEVICES value; None when it is unset."""
    if value is None:
        return None
    value = value.strip()
    if value in ("", "-1"):
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def local_gpus() -> tuple[str, ...]:
    """GPU ids this machine offers, without importing TensorFlow.

    CUDA_VISIBLE_DEVICES wins when set; otherwise ``nvidia-smi`` is asked; no
    driver means no GPUs.
    """
    visible = parse_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return visible
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    return tuple(line.strip() for line in out.stdout.splitlines() if line.strip())


def check_cores(cores: tuple[int, ...], available: tuple[int, ...]) -> tuple[int, ...]:
    """``cores`` if this process may use every one of them (``available``), else ConfigError."""
    missing = sorted(set(cores) - set(available))
    if missing:
        raise ConfigError(
            f"cores={list(cores)} asks for {missing}, which this process may not use (it may "
            f"use {list(available)}). Fix: pass cores from {list(available)}, or cores=None."
        )
    return cores


def local_cores() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return tuple(range(os.cpu_count() or 1))
