"""ddlkit.cpu: TensorFlow's CPU-dependent choices, as data and against real TensorFlow.

The pure rules are checked on the ``/proc/cpuinfo`` of CPUs this machine is not (an AMD EPYC
without AVX-512, Arm cores); then real TensorFlow processes, under each setting that differs
between machines (oneDNN forced on and off, the BFC allocator set and not), report whether
oneDNN is on and whether ``get_memory_info`` answers for the CPU, and the rules must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddlkit import cpu

INTEL_SPR = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: something else
"""
AMD_MILAN = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx avx2 fma bmi2
"""
AMD_GENOA = "model name : AMD EPYC 9B14\nflags : avx2 avx512f avx512_vnni avx512_bf16\n"
NEOVERSE_V1 = (
    "processor : 0\nFeatures : fp asimd sve bf16\nCPU implementer : 0x41\nCPU part : 0xd40\n"
)
NEOVERSE_N1 = "processor : 0\nFeatures : fp asimd\nCPU implementer : 0x41\nCPU part : 0xd0c\n"


def test_cpuinfo_is_read_from_the_first_processor():
    c = cpu.Cpu.parse(INTEL_SPR)
    assert c.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx512_vnni", "amx_bf16"} <= c.flags
    assert cpu.Cpu.parse(NEOVERSE_V1).arm_part == ("0x41", "0xd40")
    assert cpu.Cpu.parse(NEOVERSE_V1).model == "Arm part 0xd40"


@pytest.mark.parametrize(
    ("text", "default", "bf16"),
    [
        (INTEL_SPR, True, "AMX"),
        (AMD_MILAN, False, "none"),  # AVX2 only: oneDNN stays off, as on the machine that failed
        (AMD_GENOA, True, "AVX512-BF16"),
        (NEOVERSE_V1, True, "none"),
        (NEOVERSE_N1, False, "none"),
    ],
)
def test_onednn_default_follows_tensorflows_cpu_policy(text, default, bf16):
    c = cpu.Cpu.parse(text)
    assert c.onednn_by_default is default
    assert c.bfloat16_hardware == bf16


def test_the_environment_overrides_the_default_as_tensorflow_reads_it():
    milan, spr = cpu.Cpu.parse(AMD_MILAN), cpu.Cpu.parse(INTEL_SPR)
    assert cpu.onednn_on(milan, {"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert cpu.onednn_on(milan, {"TF_ENABLE_ONEDNN_OPTS": "TRUE"})
    assert not cpu.onednn_on(spr, {"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert cpu.onednn_on(spr, {"TF_ENABLE_ONEDNN_OPTS": "yes"})  # not a boolean: the default
    assert cpu.allocator(milan, {}) == "plain" and not cpu.has_memory_stats(milan, {})
    assert cpu.allocator(milan, {"TF_CPU_ALLOCATOR_USE_BFC": "true"}) == "BFC"
    assert cpu.allocator(spr, {}) == "oneDNN" and cpu.has_memory_stats(spr, {})
    assert cpu.allocator(spr, {"TF_ENABLE_ONEDNN_OPTS": "0"}) == "plain"


def test_the_report_says_what_this_cpu_does_and_the_fix():
    milan = cpu.Cpu.parse(AMD_MILAN)
    report = cpu.Report(milan, False, False, "plain", False)
    rows = dict(report.lines())
    assert rows["oneDNN"] == "off (TensorFlow's default for this CPU)"
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in rows["CPU allocator"]
    forced = dict(cpu.Report(milan, True, False, "oneDNN", True).lines())
    assert forced["oneDNN"] == "on (set by TF_ENABLE_ONEDNN_OPTS)"


PROBE = """
import json
import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port

x = tf.ones((512, 512))
_ = (x @ x).numpy()
try:
    tf.config.experimental.get_memory_info("CPU:0")
    stats = True
except ValueError:
    stats = False
print(json.dumps({"onednn": bool(_pywrap_util_port.IsMklEnabled()), "stats": stats}))
"""

VARIANTS = [
    {"TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPU_ALLOCATOR_USE_BFC": bfc}
    for onednn in ("0", "1")
    for bfc in (None, "true")
]


@pytest.mark.parametrize(
    "variant", VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items())
)
def test_real_tensorflow_agrees_with_the_rules(variant):
    env = {k: v for k, v in os.environ.items() if k not in variant}
    env.update({k: v for k, v in variant.items() if v is not None}, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    report = cpu.read(env)
    assert seen == {"onednn": report.onednn, "stats": report.memory_stats}, (variant, report)
