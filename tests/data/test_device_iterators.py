"""ddlkit.data.device_iterators: autotuning off in TensorFlow's per-device data sets."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddlkit.data import device_iterators

REPO = Path(__file__).resolve().parents[2]


def test_only_processes_whose_devices_are_all_cpus_are_patched():
    assert device_iterators.applies(("CPU",)) and device_iterators.applies(("CPU", "CPU"))
    assert not device_iterators.applies(("GPU",)) and not device_iterators.applies(("CPU", "GPU"))
    assert not device_iterators.applies(())


# TensorFlow patched in a process of its own: the patch lasts as long as the process.
SCRIPT = textwrap.dedent(
    """
    import json
    import ddlkit
    from ddlkit.backend import tf
    from ddlkit.data import device_iterators
    from ddlkit.errors import DdlkitError
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

    tf_ = tf()
    tf_.config.set_logical_device_configuration(
        tf_.config.list_physical_devices("CPU")[0], [tf_.config.LogicalDeviceConfiguration()] * 2
    )
    before = device_iterators.installed()
    original = mdi._create_device_dataset
    device_iterators.without_autotune()
    device_iterators.without_autotune()  # a second call changes nothing
    patched = mdi._create_device_dataset
    seen = []

    def spy(*args, **kwargs):
        ds = patched(*args, **kwargs)
        seen.append(ds.options().autotune.enabled)
        return ds

    mdi._create_device_dataset = spy
    it = mdi.MultiDeviceIterator(tf_.data.Dataset.range(8).batch(2), ["/cpu:0", "/cpu:1"])
    batches = [[t.numpy().tolist() for t in it.get_next()] for _ in range(2)]
    mdi._create_device_dataset = patched
    del mdi._create_device_dataset  # a TensorFlow without the function
    try:
        device_iterators.without_autotune()
        error = ""
    except DdlkitError as exc:
        error = str(exc)
    print(json.dumps({"before": before, "wraps_original": patched.__wrapped__ is original,
                      "seen": seen, "batches": batches, "error": error}))
    """
)


@pytest.mark.slow
def test_the_patch_turns_autotuning_off_per_device_once_and_fails_loudly_without_tf_support():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] is False and out["wraps_original"] is True  # wrapped once, not twice
    assert out["seen"] == [False, False], "each device's data set has autotuning off"
    assert out["batches"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], "the data still flows"
    assert "_create_device_dataset" in out["error"] and "Fix:" in out["error"]
