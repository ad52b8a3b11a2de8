"""The one place where ddlkit chooses which Keras TensorFlow uses.

On TensorFlow >= 2.16, ``tf.keras`` is Keras 3 (TensorFlow 2.16 release notes,
https://github.com/tensorflow/tensorflow/releases/tag/v2.16.1). Keras 3's ``model.fit`` fails
under MultiWorkerMirroredStrategy (https://github.com/keras-team/keras/issues/20585, confirmed
there by Keras' author; https://github.com/tensorflow/tensorflow/issues/72388), Keras 3 does
not support ParameterServerStrategy (https://github.com/keras-team/keras/issues/18624), and
Horovod's Keras API needs Keras 2. MirroredStrategy works with both. The kit therefore runs on
tf-keras (the Keras 2 API), chosen by ``TF_USE_LEGACY_KERAS=1``. TensorFlow reads that
variable when it is imported (to pick the module ``tf.keras`` loads) and again at the first
use of ``tf.keras`` (``tensorflow/__init__.py``, ``python/util/lazy_loader.py``), so it must
be set before the import: ``import ddlkit`` does it for the notebook kernel, and the launcher
puts :func:`keras_env` into every worker's environment.

Set ``DDLKIT_KERAS=3`` before importing ddlkit to run on Keras 3 instead.
"""

from __future__ import annotations

import os
import sys
import warnings

from ddlkit.errors import ConfigError

LEGACY_VAR = "TF_USE_LEGACY_KERAS"
CHOICE_VAR = "DDLKIT_KERAS"


def wanted_flavour(environ: dict[str, str] | None = None) -> str:
    """Which Keras the kit should use: ``"tf-keras"`` (default) or ``"keras3"``."""
    environ = os.environ if environ is None else environ
    choice = environ.get(CHOICE_VAR, "2").strip().lower()
    if choice in ("2", "tf-keras", "tf_keras", "legacy"):
        return "tf-keras"
    if choice in ("3", "keras3", "keras"):
        return "keras3"
    raise ConfigError(
        f"{CHOICE_VAR}={choice!r} is not a Keras choice. Fix: set {CHOICE_VAR}=2 for tf-keras "
        f"(the default, needed for multi-worker and parameter-server training) or "
        f"{CHOICE_VAR}=3 for Keras 3."
    )


def keras_env(flavour: str | None = None) -> dict[str, str]:
    """Environment variables a worker process needs for ``flavour`` (pure)."""
    flavour = flavour or wanted_flavour()
    return {LEGACY_VAR: "1" if flavour == "tf-keras" else "0", CHOICE_VAR: flavour}


def select() -> None:
    """Set the Keras choice in this process before TensorFlow is imported.

    If TensorFlow was imported first, the choice can no longer take effect;
    ddlkit then warns once, naming the fix, instead of failing later with an
    obscure error inside a distributed run.
    """
    flavour = wanted_flavour()
    want = keras_env(flavour)[LEGACY_VAR]
    if "tensorflow" in sys.modules:
        have = os.environ.get(LEGACY_VAR, "0")
        if (have in ("1", "true", "True")) != (want == "1"):
            warnings.warn(
                f"TensorFlow was imported before ddlkit, so {LEGACY_VAR} could not be set to "
                f"{want} and tf.keras is not {flavour}. Fix: restart the kernel and run "
                f"`import ddlkit` before `import tensorflow`.",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    os.environ[LEGACY_VAR] = want
    os.environ[CHOICE_VAR] = flavour


def tf():
    """Import and return TensorFlow, with a clear error when it is missing."""
    try:
        import tensorflow
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "TensorFlow is not installed in this environment. Fix: run `make lab` from the "
            "repository, or `pip install 'ddlkit[cpu]'` (or 'ddlkit[gpu]' on a CUDA machine)."
        ) from exc
    return tensorflow


def keras():
    """The Keras module the kit uses (``tf.keras``, tf-keras by default)."""
    return tf().keras


def active_flavour() -> str:
    """Which Keras ``tf.keras`` really is in this process (imports TensorFlow)."""
    return "tf-keras" if keras().__name__.startswith("tf_keras") else "keras3"


def keras_version() -> str:
    """The version of the Keras behind ``tf.keras``."""
    if active_flavour() == "tf-keras":
        import tf_keras

        return tf_keras.__version__
    import keras as keras3

    return keras3.__version__
