"""The Keras choice: made in one place, before TensorFlow loads, in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddlkit import backend
from ddlkit.errors import ConfigError

PROBE = (
    "import json, os, sys\n"
    "import ddlkit, ddlkit.backend as b\n"
    "before = 'tensorflow' in sys.modules\n"
    "print(json.dumps({'tf_loaded_by_import': before, 'flavour': b.active_flavour(),"
    " 'legacy': os.environ.get('TF_USE_LEGACY_KERAS')}))\n"
)


def _run(env_extra: dict[str, str], code: str = PROBE) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "DDLKIT_KERAS")}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_ddlkit_chooses_tf_keras_without_loading_tensorflow():
    got = _run({})
    assert got == {"tf_loaded_by_import": False, "flavour": "tf-keras", "legacy": "1"}


def test_keras3_can_be_chosen():
    got = _run({"DDLKIT_KERAS": "3"})
    assert got["flavour"] == "keras3" and got["legacy"] == "0"


def test_tensorflow_imported_first_gives_a_warning_with_the_fix():
    code = (
        "import warnings, json\n"
        "warnings.simplefilter('always')\n"
        "import tensorflow\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import ddlkit\n"
        "print(json.dumps({'messages': [str(x.message) for x in w]}))\n"
    )
    got = _run({}, code)
    assert any("import ddlkit" in m and "restart the kernel" in m for m in got["messages"])


def test_worker_env_is_pure_data():
    assert backend.keras_env("tf-keras") == {"TF_USE_LEGACY_KERAS": "1", "DDLKIT_KERAS": "tf-keras"}
    assert backend.keras_env("keras3") == {"TF_USE_LEGACY_KERAS": "0", "DDLKIT_KERAS": "keras3"}


def test_bad_choice_names_the_fix():
    with pytest.raises(ConfigError, match="DDLKIT_KERAS=2"):
        backend.wanted_flavour({"DDLKIT_KERAS": "banana"})
