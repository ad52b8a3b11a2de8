"""Logical CPU devices for in-process strategies, each case in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddlkit.errors import ConfigError
from ddlkit.lessons.replicas import devices, split_cpu


def run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", "import ddlkit as dk, json, tensorflow as tf\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "-1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_devices_splits_the_cpu_and_a_mirrored_strategy_uses_them():
    got = run(
        "plan = dk.replicas.devices(3)\n"
        "again = dk.replicas.devices(3)\n"
        "s = tf.distribute.MirroredStrategy(list(plan))\n"
        "print(json.dumps({'names': list(plan), 'kind': plan.kind, 'again': list(again),\n"
        "                  'replicas': s.num_replicas_in_sync}))"
    )
    names = [f"/device:CPU:{i}" for i in range(3)]
    assert got == {"names": names, "kind": "logical CPU", "again": names, "replicas": 3}


def test_a_different_count_after_tensorflow_started_is_a_clear_error():
    got = run(
        "dk.replicas.devices(2)\n"
        "tf.constant(1.0) + 1\n"
        "try:\n"
        "    dk.replicas.devices(4)\n"
        "except dk.errors.ConfigError as e:\n"
        "    print(json.dumps({'error': str(e)}))\n"
    )
    assert "restart the kernel" in got["error"] and "(2 logical CPU)" in got["error"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_bad_counts_are_refused_before_tensorflow_is_touched(bad):
    with pytest.raises(ConfigError, match="at least one device"):
        devices(bad)
    with pytest.raises(ConfigError, match="at least one device"):
        split_cpu(bad)
