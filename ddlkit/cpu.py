"""What TensorFlow does differently on this machine's CPU, read before it starts.

Two of TensorFlow's choices depend on the CPU it meets:

- **oneDNN** (its optimised CPU kernels): on Linux it is on by default only where the CPU
  has AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX, or is an Arm Neoverse V1
  (``tensorflow/core/util/port.cc``, ``DefaultOneDnnPolicy``); ``TF_ENABLE_ONEDNN_OPTS=0|1``
  overrides it. With it off, numbers round differently and convolutions run other kernels.
- **the CPU allocator**: ``TF_CPU_ALLOCATOR_USE_BFC=true`` makes it TensorFlow's BFC
  allocator; otherwise oneDNN's allocator where oneDNN is on (``threadpool_device.cc``,
  ``MklCPUAllocatorFactory``: it outranks the plain one then), and the plain one where it is
  off. The plain one keeps no statistics: ``tf.config.experimental.get_memory_info("CPU:0")``
  raises ``ValueError: Allocator stats not available`` there.

The rules are pure functions of ``/proc/cpuinfo`` and the environment, so they are tested as
data; :func:`read` applies them to this machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# CPU flags (as /proc/cpuinfo names them) for which TensorFlow turns oneDNN on by default.
ONEDNN_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
NEOVERSE_V1 = ("0x41", "0xd40")  # Arm's implementer code and Neoverse V1's part number
_TRUE, _FALSE = ("1", "true"), ("0", "false")


@dataclass(frozen=True)
class Cpu:
    """The facts of ``/proc/cpuinfo`` that TensorFlow's CPU choices depend on."""

    model: str
    flags: frozenset[str]
    arm_part: tuple[str, str] | None = None  # (implementer, part) on Arm

    @classmethod
    def parse(cls, text: str) -> Cpu:
        """From the text of ``/proc/cpuinfo`` (pure; its first processor's entry)."""
        fields: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                if fields:
                    break  # the first processor is enough: they are alike
                continue
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
        flags = fields.get("flags") or fields.get("features") or ""
        model = fields.get("model name") or fields.get("cpu model") or ""
        implementer, part = fields.get("cpu implementer"), fields.get("cpu part")
        arm = (implementer.lower(), part.lower()) if implementer and part else None
        return cls(
            model or (f"Arm part {arm[1]}" if arm else "unknown"), frozenset(flags.split()), arm
        )

    @property
    def onednn_by_default(self) -> bool:
        """Whether TensorFlow turns oneDNN on for this CPU when nothing says otherwise."""
        return any(f in self.flags for f in ONEDNN_FLAGS) or self.arm_part == NEOVERSE_V1

    @property
    def bfloat16_hardware(self) -> str:
        """The bfloat16 arithmetic this CPU has: "AMX", "AVX512-BF16" or "none"."""
        if "amx_bf16" in self.flags:
            return "AMX"
        return "AVX512-BF16" if "avx512_bf16" in self.flags else "none"


def _flag(environ: Mapping[str, str], name: str) -> bool | None:
    """A boolean variable as TensorFlow reads it: True, False, or None when unset or not one
    of 0/1/true/false (TensorFlow then keeps its default)."""
    value = environ.get(name, "").strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def onednn_on(cpu: Cpu, environ: Mapping[str, str]) -> bool:
    """Whether TensorFlow's oneDNN operations are on (pure)."""
    chosen = _flag(environ, "TF_ENABLE_ONEDNN_OPTS")
    return cpu.onednn_by_default if chosen is None else chosen


def allocator(cpu: Cpu, environ: Mapping[str, str]) -> str:
    """TensorFlow's CPU allocator: "BFC", "oneDNN" or "plain" (pure)."""
    if _flag(environ, "TF_CPU_ALLOCATOR_USE_BFC"):
        return "BFC"
    return "oneDNN" if onednn_on(cpu, environ) else "plain"


def has_memory_stats(cpu: Cpu, environ: Mapping[str, str]) -> bool:
    """Whether ``get_memory_info`` answers for a CPU device (pure): not with the plain one."""
    return allocator(cpu, environ) != "plain"


@dataclass(frozen=True)
class Report:
    """This machine's CPU and what TensorFlow will do on it, in the environment given."""

    cpu: Cpu
    onednn: bool
    onednn_default: bool
    allocator: str
    memory_stats: bool

    def lines(self) -> list[tuple[str, str]]:
        """(name, value) rows, as ``dk.env.check()`` shows them."""
        onednn = "on" if self.onednn else "off"
        why = (
            "TensorFlow's default for this CPU"
            if self.onednn == self.onednn_default
            else "set by TF_ENABLE_ONEDNN_OPTS"
        )
        stats = (
            "kept"
            if self.memory_stats
            else ("none (set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts to get them)")
        )
        return [
            ("CPU", f"{self.cpu.model} (bfloat16 hardware: {self.cpu.bfloat16_hardware})"),
            ("oneDNN", f"{onednn} ({why})"),
            ("CPU allocator", f"{self.allocator}; memory statistics: {stats}"),
        ]


def read(environ: Mapping[str, str] | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> Report:
    """This machine's :class:`Report` (reads ``/proc/cpuinfo``; an empty CPU where it cannot)."""
    environ = os.environ if environ is None else environ
    try:
        cpu = Cpu.parse(cpuinfo.read_text())
    except OSError:
        cpu = Cpu("unknown", frozenset())
    return Report(
        cpu,
        onednn_on(cpu, environ),
        cpu.onednn_by_default,
        allocator(cpu, environ),
        has_memory_stats(cpu, environ),
    )
