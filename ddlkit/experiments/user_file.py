"""The user's model file, imported and called the same way in the probe and in every worker.

    module = load(path)                                   # imported once, unchanged
    model = build(module, "build_model", loss=None, optimizer=None)
    ds = train_data(module, "dataset", batch_size=64, input_context=None)

Each failure is a :class:`UserFileError` naming the file, the function and the fix: the
probe prints it as the experiment's one error, and a worker's traceback carries it.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

from ddlkit.errors import ConfigError


class UserFileError(ConfigError):
    """The user's model file cannot be used as it is: what is wrong, and the fix."""


def load(path: str | Path) -> ModuleType:
    """Import ``path`` as a module (its directory first on ``sys.path``, for its own imports)."""
    path = Path(path).resolve()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(f"user_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UserFileError(f"{path}: cannot be imported. Fix: pass a Python source file (.py)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any error is theirs to see
        raise UserFileError(
            f"{path.name}: importing it raised {type(exc).__name__}: {exc}. Fix: run "
            f"`python {path}` and correct the error"
        ) from exc
    return module


def function(module: ModuleType, name: str, *, required: bool = True):
    """The function ``name`` of the user's module (None when absent and not required)."""
    fn = getattr(module, name, None)
    if fn is None:
        if not required:
            return None
        defined = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
        )
        raise UserFileError(
            f"{Path(module.__file__).name} defines no {name}(). Fix: define it, or name yours "
            f"(functions found: {', '.join(defined) or 'none'})"
        )
    if not callable(fn):
        raise UserFileError(f"{Path(module.__file__).name}: {name} is not a function")
    return fn


def _call(where: str, fn, *args):
    """``fn(*args)``; whatever the user's code raises becomes one error naming ``where``."""
    try:
        return fn(*args)
    except Exception as exc:  # the user's code: any error is theirs to see
        raise UserFileError(
            f"{where} raised {type(exc).__name__}: {exc}. Fix: call it in a Python shell "
            f"and correct the error"
        ) from exc


def build(module: ModuleType, name: str, *, loss: str | None, optimizer: str | None):
    """Call the user's model builder; compile with ``loss`` and ``optimizer`` if given."""
    import tensorflow as tf

    where = f"{Path(module.__file__).name}: {name}()"
    model = _call(where, function(module, name))
    if not isinstance(model, tf.keras.Model):
        raise UserFileError(
            f"{where} returned {type(model).__name__}, not a tf-keras model. Fix: return the "
            f"tf.keras.Model (with TF_USE_LEGACY_KERAS=1, `import tf_keras` or `tf.keras`; "
            f"Keras 3's keras.Model is another class)"
        )
    if loss is not None:
        model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled_loss", None):
        raise UserFileError(
            f"{where} returned an uncompiled model. Fix: model.compile(optimizer=..., "
            f"loss=...) in {name}(), or give loss= and optimizer= to the experiment"
        )
    return model


def train_data(module: ModuleType, name: str, batch_size: int, input_context=None):
    """The user's ``dataset(batch_size, input_context)``, checked to be a tf.data.Dataset."""
    import tensorflow as tf

    where = f"{Path(module.__file__).name}: {name}({batch_size}, input_context)"
    fn = function(module, name)
    try:
        accepts = len(inspect.signature(fn).parameters) >= 2
    except (TypeError, ValueError):
        accepts = True
    ds = _call(where, fn, batch_size, input_context) if accepts else _call(where, fn, batch_size)
    if not isinstance(ds, tf.data.Dataset):
        raise UserFileError(
            f"{where} returned {type(ds).__name__}, not a tf.data.Dataset. Fix: return "
            f"tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size) or similar"
        )
    spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise UserFileError(
            f"{where} gives elements of {spec}, not (features, labels) pairs. Fix: map each "
            f"element to a tuple (features, labels), e.g. ds.map(lambda d: (d['x'], d['y']))"
        )
    first = tf.nest.flatten(spec[0])[0]
    if first.shape.rank is None or first.shape.rank < 1 or first.shape[0] not in (None, batch_size):
        raise UserFileError(
            f"{where} gives features of shape {first.shape}: not batches of {batch_size}. "
            f"Fix: end the pipeline with .batch(batch_size)"
        )
    return ds


def eval_data(module: ModuleType, name: str | None, batch_size: int):
    """The user's held-out ``eval_dataset(batch_size)``, or None if the file has none."""
    fn = function(module, name or "eval_dataset", required=name is not None)
    if fn is None:
        return None
    return train_data(module, name or "eval_dataset", batch_size)
