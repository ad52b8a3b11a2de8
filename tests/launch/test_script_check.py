"""A script that does not parse, or fits another strategy, is refused before anything starts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from harness.procutil import marked_pids

from ddlkit.errors import ConfigError
from ddlkit.launch import script_check
from ddlkit.launch.plan import STRATEGIES

REPO = Path(__file__).resolve().parents[2]

#: Every script in launch/ and the strategy it is made for (None: generic, any strategy).
KIT_SCRIPTS = [
    ("train_single.py", None),
    ("report_tf_config.py", None),
    ("_common.py", None),
    ("train_mirrored.py", "mirrored"),
    ("train_multi_worker.py", "multi_worker"),
    ("train_sync_eval.py", "multi_worker"),
    ("train_mwms_ft.py", "multi_worker"),
    ("tf_tutorial_mwms.py", "multi_worker"),
    ("train_parameter_server.py", "parameter_server"),
    ("train_ps_modes.py", "parameter_server"),
    ("train_horovod.py", "horovod"),
    ("train_horovod_tape.py", "horovod"),
]

MWMS = """
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
"""
HOROVOD = """
import horovod.tensorflow.keras as hvd

def main():
    hvd.init()
"""


def _strategies(source: str) -> list[str]:
    return [c.strategy for c in script_check.api_calls(ast.parse(source))]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (MWMS, ["multi_worker"]),
        (HOROVOD, ["horovod"]),
        ("import tensorflow as tf\ns = tf.distribute.MirroredStrategy(['/cpu:0'])", ["mirrored"]),
        ("from tensorflow.distribute import MirroredStrategy\nMirroredStrategy()", ["mirrored"]),
        (
            "import tensorflow as tf\n"
            "s = tf.distribute.experimental.ParameterServerStrategy(resolver)",
            ["parameter_server"],
        ),
        ("import horovod.tensorflow as hvd\nhvd.init()", ["horovod"]),
        ("import horovod.tensorflow\nhorovod.tensorflow.init()", ["horovod"]),
        ("from horovod.tensorflow import init\ninit()", ["horovod"]),
        ("from horovod.tensorflow import keras as hk\nhk.init()", ["horovod"]),
        ("import ddlkit.horovod as dkh\nhvd = dkh.init()", ["horovod"]),
        # Names that merely look alike are not distribution calls.
        ("import numpy as np\nnp.random.init()\nmodel.init()", []),
        ("import tensorflow as tf\nisinstance(s, tf.distribute.MirroredStrategy)", []),
        ("print('no strategy at all')", []),
    ],
)
def test_the_distribution_api_is_read_from_the_syntax_tree(source, expected):
    assert _strategies(source) == expected


def test_a_script_that_does_not_parse_names_the_line_and_the_fix():
    source = "import tensorflow as tf\n\ndef main(:\n    pass\n"
    with pytest.raises(ConfigError) as err:
        script_check.check_source(source, "multi_worker", path="workers/mwms_worker.py")
    message = str(err.value)
    assert "script workers/mwms_worker.py does not parse" in message
    assert "line 3" in message and "`def main(:`" in message
    assert "Fix: correct line 3 of workers/mwms_worker.py" in message
    assert "\n" not in message


def test_a_horovod_script_under_multi_worker_is_refused_naming_both():
    with pytest.raises(ConfigError) as err:
        script_check.check_source(HOROVOD, "multi_worker", path="hvd_worker.py")
    message = str(err.value)
    assert "hvd.init() (line 5)" in message
    assert "strategy='horovod'" in message and "strategy='multi_worker'" in message
    assert "Fix: launch it with strategy='horovod'" in message
    assert "tf.distribute.MultiWorkerMirroredStrategy()" in message  # the other way out
    assert "\n" not in message


def test_a_script_calling_several_apis_passes_under_any_of_them():
    both = MWMS + "\nevaluation = tf.distribute.MirroredStrategy()\n"
    assert len(script_check.check_source(both, "mirrored")) == 2
    assert len(script_check.check_source(both, "multi_worker")) == 2
    with pytest.raises(ConfigError, match="strategy='mirrored' or 'multi_worker'"):
        script_check.check_source(both, "horovod")


def test_a_script_without_any_distribution_api_passes_every_strategy():
    for strategy in STRATEGIES:
        assert script_check.check_source("import tensorflow as tf\nprint(1)\n", strategy) == []


@pytest.mark.parametrize(("script", "strategy"), KIT_SCRIPTS)
def test_the_kits_own_scripts_pass_under_their_strategy_only(script, strategy):
    path = REPO / "launch" / script
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    passes = []
    for each in STRATEGIES:
        try:
            script_check.check(path, each)
            passes.append(each)
        except ConfigError:
            pass
    assert passes == (list(STRATEGIES) if strategy is None else [strategy])


def test_every_script_in_launch_passes_under_some_strategy():
    for path in sorted((REPO / "launch").glob("*.py")):
        fits = []
        for strategy in STRATEGIES:
            try:
                script_check.check(path, strategy)
                fits.append(strategy)
            except ConfigError:
                pass
        assert fits, f"{path.name} is refused under every strategy"


def test_a_non_utf8_script_is_refused(tmp_path):
    path = tmp_path / "latin1.py"
    path.write_bytes(b"# caf\xe9\nprint(1)\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        script_check.check(path, "multi_worker")


# -- through the real launcher: nothing is created, nothing runs ----------------------------


def _refused_start(tmp_path, source: str, strategy: str) -> str:
    from ddlkit import launch

    script = tmp_path / "bad_worker_8c1f.py"  # a unique name: its processes would carry it
    script.write_text(source)
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as err:
        launch.start(script, strategy=strategy, workers=2, runs_dir=runs)
    assert not runs.exists(), "a run directory was made for a refused script"
    assert marked_pids(str(script)) == []
    return str(err.value)


def test_start_refuses_a_broken_script_before_anything_starts(tmp_path):
    message = _refused_start(
        tmp_path, "import tensorflow as tf\nif True\n    pass\n", "multi_worker"
    )
    assert "does not parse" in message and "line 2" in message and "Fix:" in message


def test_start_refuses_a_horovod_script_under_multi_worker(tmp_path):
    message = _refused_start(tmp_path, HOROVOD, "multi_worker")
    assert "hvd.init()" in message and "strategy='horovod'" in message


def test_ddlkit_launch_exits_2_with_one_line(tmp_path, capsys):
    from ddlkit.cli import main

    script = tmp_path / "broken.py"
    script.write_text("def main(:\n")
    runs = tmp_path / "runs"
    argv = ["launch", "--strategy", "horovod", "-n", "2", "--runs-dir", str(runs), str(script)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddlkit: error: script ") and "does not parse" in err
    assert "\n" not in err and not runs.exists()
