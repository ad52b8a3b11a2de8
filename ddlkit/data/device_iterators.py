"""tf.data autotuning off in TensorFlow's per-device iterators, on CPU workers.

A MultiWorkerMirroredStrategy worker hands each batch to its devices through a
``MultiDeviceIterator`` (so do MirroredStrategy's default input and Keras' ``evaluate``
under a strategy). TensorFlow 2.21 builds one small data set per device for it (the
batch handed over, then a prefetch of fixed size) with default ``tf.data.Options``: no
option a script sets reaches it, so tf.data's autotuning runs there with nothing to tune.
Its thread takes time from a worker's only core while it trains, and when ``model.fit``
frees the iterator, the destructor waits out that thread's sleep (gdb:
``RootDataset::Iterator::~Iterator`` waiting for ``Model::OptimizeLoop``).

:func:`without_autotune` makes TensorFlow's builder of those per-device data sets
(the private ``multi_device_iterator_ops._create_device_dataset``) add
``options.autotune.enabled = False`` to what it returns. It checks that the function is
there and raises, naming the TensorFlow version, if it is not: the kit does not go on
without it silently. It applies to the whole process, only where every device is a CPU
(:func:`applies`): with GPUs, TensorFlow's own behaviour stays, untested here.

What it changes is measured by running ``launch/train_multi_worker.py`` with and without
it: how long ``fit`` takes to return after its last step (the pause above), and, with the
workers unpinned, their examples/s (the autotuning thread competes with the training for the
cores). Pinned to a core each, only the pause differs.
"""

from __future__ import annotations

import threading
from typing import Any

from ddlkit.backend import tf
from ddlkit.errors import DdlkitError

_LOCK = threading.Lock()
_MARK = "_ddlkit_without_autotune"


def applies(device_types: tuple[str, ...]) -> bool:
    """Whether the per-device data sets get autotuning off: every device a CPU (pure).

    >>> applies(("CPU", "CPU")), applies(("CPU", "GPU")), applies(())
    (True, False, False)
    """
    return bool(device_types) and all(t == "CPU" for t in device_types)


def _module() -> Any:
    tf()  # TensorFlow loaded the kit's way (ddlkit.backend picks the Keras first)
    from tensorflow.python.data.ops import multi_device_iterator_ops

    return multi_device_iterator_ops


def installed() -> bool:
    """Whether :func:`without_autotune` has patched this process's TensorFlow."""
    return getattr(getattr(_module(), "_create_device_dataset", None), _MARK, False)


def without_autotune() -> None:
    """Per-device data sets of every later ``MultiDeviceIterator`` in this process get
    ``options.autotune.enabled = False`` (idempotent)."""
    module = _module()
    with _LOCK:
        original = getattr(module, "_create_device_dataset", None)
        if original is None:
            raise DdlkitError(
                f"TensorFlow {tf().__version__} has no multi_device_iterator_ops."
                "_create_device_dataset, which ddlkit.data.device_iterators patches to turn "
                "off autotuning in per-device data sets. Fix: use the TensorFlow the kit pins "
                "(pyproject.toml), or update ddlkit/data/device_iterators.py for this version."
            )
        if getattr(original, _MARK, False):
            return

        def create_device_dataset(*args: Any, **kwargs: Any) -> Any:
            options = tf().data.Options()
            options.autotune.enabled = False
            return original(*args, **kwargs).with_options(options)

        setattr(create_device_dataset, _MARK, True)
        create_device_dataset.__wrapped__ = original  # type: ignore[attr-defined]
        module._create_device_dataset = create_device_dataset
