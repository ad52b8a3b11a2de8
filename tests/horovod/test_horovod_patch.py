"""scripts/patch_horovod.py: its exact-text edits of Horovod's sources, as data, and what
the patched install does (horovodrun's build check answers from the library; Horovod's
Keras uses tf-keras's backend and never imports Keras 3; its all-reduce is traced without
AutoGraph; elastic Horovod's Keras state builds its optimizer before any sync)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.launch import plan

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "patch_horovod", ROOT / "scripts" / "patch_horovod.py"
)
patch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(patch)

# The parts of Horovod 0.28.1's horovod/common/util.py the patch edits, as they are there.
UTIL = """import multiprocessing
import os


def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    p = ctx.Process(target=_target_fn,
                    args=(ext_base_name, fn, fn_desc, queue, verbose))
    p.daemon = True
    p.start()
    p.join()
    return queue.get_nowait()


@_cache
def mpi_built(verbose=False):
    for ext_base_name in EXTENSIONS:
        built_fn = lambda ext: ext.mpi_built()
        result = _check_extension_lambda(
            ext_base_name, built_fn, 'built with MPI', verbose)
        if result is not None:
            return result
    return None


@_cache
def gloo_built(verbose=False):
    for ext_base_name in EXTENSIONS:
        built_fn = lambda ext: ext.gloo_built()
        result = _check_extension_lambda(
            ext_base_name, built_fn, 'built with Gloo', verbose)
        if result is not None:
            return result
    return None
"""


def test_the_patch_asks_the_library_first_and_keeps_horovods_check_behind_it():
    text = patch.patch_util(UTIL)
    assert patch.MARKER in text and "def _library_flag(" in text
    for c_function, label in (("horovod_gloo_built", "Gloo"), ("horovod_mpi_built", "MPI")):
        asked = text.index(f"_library_flag(ext_base_name, '{c_function}', verbose)")
        fallback = text.index(f"'built with {label}', verbose)")
        assert asked < fallback < asked + 200  # Horovod's own check only when None
    compile(text, "util.py", "exec")  # still Python


def test_a_second_run_or_a_different_horovod_stops_with_the_text_not_found():
    once = patch.patch_util(UTIL)
    with pytest.raises(patch.PatchError, match="already patched"):
        patch.patch_util(once)
    with pytest.raises(patch.PatchError, match="Gloo's check once, found it 0 times"):
        patch.patch_util(UTIL.replace("'built with Gloo'", "'compiled with Gloo'"))
    with pytest.raises(patch.PatchError, match="_check_extension_lambda once"):
        patch.patch_util(UTIL.replace("return queue.get_nowait()", "return queue.get()"))


# The part of Horovod 0.28.1's horovod/tensorflow/keras/callbacks.py (and __init__.py) the
# second edit changes, as it is there.
KERAS = """import tensorflow as tf
from tensorflow import keras

from horovod.common.util  import is_version_greater_equal_than

if is_version_greater_equal_than(tf.__version__, "2.6.0"):
    from keras import backend as K
else:
    from tensorflow.python.keras import backend as K
"""


def test_horovods_keras_takes_the_backend_of_tf_keras_not_the_keras_package():
    text = patch.patch_keras_backend(KERAS, patch.KERAS_FILES[1])
    assert "from keras import backend" not in text and "    K = keras.backend  " in text
    assert "from tensorflow.python.keras import backend as K" in text  # old TF: untouched
    namespace: dict = {}
    exec(
        compile(text.replace("from horovod.common.util ", "#"), "callbacks.py", "exec"),
        {"is_version_greater_equal_than": lambda a, b: True},
        namespace,
    )
    import tensorflow as tf

    assert namespace["K"] is tf.keras.backend  # whichever Keras tf.keras is in this process


def test_the_keras_edit_refuses_a_second_run_or_a_different_file():
    once = patch.patch_keras_backend(KERAS, patch.KERAS_FILES[0])
    with pytest.raises(patch.PatchError, match="already patched"):
        patch.patch_keras_backend(once, patch.KERAS_FILES[0])
    with pytest.raises(patch.PatchError, match="found it 0 times"):
        patch.patch_keras_backend(KERAS.replace("from tensorflow import keras\n", ""), "x.py")
    with pytest.raises(patch.PatchError, match="found it 0 times"):
        patch.patch_keras_backend(KERAS.replace("backend as K\nelse", "backend\nelse"), "x.py")


# The function of Horovod 0.28.1's horovod/tensorflow/util.py the third edit changes.
TF_UTIL = """import tensorflow as tf


def _make_subgraph(f):
    return tf.function(f)


def _cache(f):
    return f
"""


def test_horovods_subgraphs_are_traced_without_autograph():
    text = patch.patch_subgraph(TF_UTIL)
    assert "return tf.function(f, autograph=False)" in text and "def _cache(f)" in text
    horovods, patched = {}, {}
    exec(compile(TF_UTIL, "util.py", "exec"), horovods)
    exec(compile(text, "util.py", "exec"), patched)
    import tensorflow as tf

    def python_if(x):  # AutoGraph turns this if into a tf.cond; without it, refused
        return x + 1 if x > 0 else x - 1

    assert float(horovods["_make_subgraph"](python_if)(tf.constant(1.0))) == 2.0
    with pytest.raises(TypeError, match="symbolic `tf.Tensor` as a Python `bool`"):
        patched["_make_subgraph"](python_if)(tf.constant(1.0))
    assert float(patched["_make_subgraph"](tf.math.square)(tf.constant(3.0))) == 9.0
    with pytest.raises(patch.PatchError, match="already patched"):
        patch.patch_subgraph(text)
    with pytest.raises(patch.PatchError, match="found it 0 times"):
        patch.patch_subgraph(TF_UTIL.replace("tf.function(f)", "tf.function(f, jit_compile=True)"))


# The method of Horovod 0.28.1's _DistributedGradientTape the third edit marks, as it is
# there (its body shortened), in a stand-in class.
TAPE = """import tensorflow as tf


class Tape(tf.GradientTape):
        def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
            gradients = super(self.__class__, self).gradient(target, sources, output_gradients)
            return [g * 2 if g is not None else g for g in gradients]
"""


def test_the_tapes_gradient_runs_as_written_inside_a_traced_step():
    text = patch.patch_tape_gradient(TAPE)
    assert "@tf.autograph.experimental.do_not_convert" in text
    namespace: dict = {}
    exec(compile(text.replace("\n        ", "\n    "), "tape.py", "exec"), namespace)
    import tensorflow as tf

    gradient = namespace["Tape"].gradient
    assert hasattr(gradient, "__wrapped__")  # do_not_convert's wrapper around the method
    x = tf.Variable(3.0)

    @tf.function
    def step():
        with namespace["Tape"]() as tape:
            y = x * x
        return tape.gradient(y, [x])[0]

    assert float(step()) == 12.0  # the method still works in a traced step
    with pytest.raises(patch.PatchError, match="already patched"):
        patch.patch_tape_gradient(text)
    with pytest.raises(patch.PatchError, match="found it 0 times"):
        patch.patch_tape_gradient(TAPE.replace("use_generic_names=False", "names=False"))


# The parts of Horovod 0.28.1's horovod/tensorflow/elastic.py the patch edits.
ELASTIC = """def _model_built(model):
    return model.built if hasattr(model, 'build') else True


class TensorFlowKerasState(ObjectState):
    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        if not _model_built(model):
            raise ValueError('Model must be built first. Run `model.build(input_shape)`.')

        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        self._save_model()
"""


def test_the_keras_state_builds_its_optimizer_before_it_saves_or_syncs():
    text = patch.patch_keras_state(ELASTIC)
    assert patch.STATE_MARKER in text and "def _build_optimizer(" in text
    built = text.index("_build_optimizer(self.model, self.optimizer)")
    assert text.index("self.optimizer = optimizer") < built < text.index("self._save_model()")
    compile(text, "elastic.py", "exec")
    with pytest.raises(patch.PatchError, match="already patched"):
        patch.patch_keras_state(text)
    with pytest.raises(patch.PatchError, match="KerasState's set-up once, found it 0 times"):
        patch.patch_keras_state(ELASTIC.replace("        self._save_model()\n", ""))


# The part of Horovod 0.28.1's horovod/common/operations.cc (RunLoopOnce) the patch edits.
OPERATIONS = """bool RunLoopOnce(HorovodGlobalState& state) {
  auto start_time = std::chrono::steady_clock::now();
  auto sleep_duration = state.last_cycle_start +
                        std::chrono::microseconds(long(
                            state.parameter_manager.CycleTimeMs() * 1000.)) -
                        start_time;
  if (sleep_duration > std::chrono::steady_clock::duration::zero()) {
    std::this_thread::sleep_for(sleep_duration);
  }
  state.last_cycle_start = std::chrono::steady_clock::now();
  for (auto process_set_id : state.process_set_table.Ids()) {
    auto response_list =
        process_set.IsCurrentProcessIncluded()
            ? process_set.controller->ComputeResponseList(
                  this_process_requested_shutdown, state, process_set)
            : ResponseList();

    if (process_set_id == 0) {
      state.mark_cycles_in_timeline =
          state.timeline_controller.MarkCyclesInTimelinePending();
    }
    PerformOperation(response, process_set);
  }
}
"""


def test_each_ranks_next_cycle_is_timed_from_the_end_of_the_coordination():
    text = patch.patch_cycle_start(OPERATIONS)
    reset = "        state.last_cycle_start = std::chrono::steady_clock::now();\n"
    assert text.count("state.last_cycle_start = std::chrono::steady_clock::now();") == 2
    # after the ranks' collective, for the global process set only, before the work
    assert text.index("ComputeResponseList(") < text.index(reset) < text.index("PerformOperation")
    assert text.rindex("if (process_set_id == 0) {", 0, text.index(reset)) > text.index(
        "ComputeResponseList("
    )
    assert text.count("{") == text.count("}")
    # over MPI only, where a waiting rank polls; Gloo's cycles are timed as before
    guard = "      if (state.control_operation == LibType::MPI) {\n"
    assert text.index("#if HAVE_MPI") < text.index(guard) < text.index(reset)
    assert text.index(reset) < text.index("#endif // HAVE_MPI")
    with pytest.raises(patch.PatchError, match="already patched"):
        patch.patch_cycle_start(text)
    with pytest.raises(patch.PatchError, match="cycle mark once, found it 0 times"):
        patch.patch_cycle_start(OPERATIONS.replace("MarkCyclesInTimelinePending", "Other"))


def _source_tree(root: Path) -> None:
    files = {
        patch.UTIL: UTIL,
        patch.TF_UTIL: TF_UTIL,
        patch.TF_INIT: TAPE,
        patch.TF_ELASTIC: ELASTIC,
        patch.OPERATIONS: OPERATIONS,
        **{name: KERAS for name in patch.KERAS_FILES},
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_main_edits_the_files_in_place_and_exits_1_with_the_reason(tmp_path, capsys):
    _source_tree(tmp_path)
    assert patch.main([str(tmp_path)]) == 0
    assert patch.MARKER in (tmp_path / patch.UTIL).read_text()
    for name in patch.KERAS_FILES:
        assert patch.KERAS_MARKER in (tmp_path / name).read_text()
    assert patch.SUBGRAPH_MARKER in (tmp_path / patch.TF_UTIL).read_text()
    assert patch.SUBGRAPH_MARKER in (tmp_path / patch.TF_INIT).read_text()
    assert patch.STATE_MARKER in (tmp_path / patch.TF_ELASTIC).read_text()
    assert patch.CYCLE_MARKER in (tmp_path / patch.OPERATIONS).read_text()
    assert patch.main([str(tmp_path)]) == 1
    assert "already patched" in capsys.readouterr().err
    assert patch.main([str(tmp_path / "missing")]) == 1


def test_a_file_that_does_not_match_leaves_every_file_unwritten(tmp_path, capsys):
    _source_tree(tmp_path)
    (tmp_path / patch.KERAS_FILES[1]).write_text("import tensorflow as tf\n")  # not Horovod's
    assert patch.main([str(tmp_path)]) == 1
    assert "callbacks.py: expected this text once" in capsys.readouterr().err
    assert (tmp_path / patch.UTIL).read_text() == UTIL  # not half-patched
    assert (tmp_path / patch.KERAS_FILES[0]).read_text() == KERAS
    assert (tmp_path / patch.TF_UTIL).read_text() == TF_UTIL
    assert (tmp_path / patch.TF_INIT).read_text() == TAPE
    assert (tmp_path / patch.TF_ELASTIC).read_text() == ELASTIC
    assert (tmp_path / patch.OPERATIONS).read_text() == OPERATIONS


def _probe(tmp_path: Path, code: str) -> list[str]:
    """The words ``code`` prints, run as a file (AutoGraph reads functions' source) in a
    fresh tf-keras process against the installed wheel."""
    (tmp_path / "probe.py").write_text(code)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "probe.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


@pytest.mark.slow
def test_the_installed_horovod_keras_never_imports_keras_3_under_tf_keras(tmp_path):
    code = (
        "import sys\n"
        "import horovod.tensorflow.keras as hvd\n"
        "import tensorflow as tf\n"
        "print('keras.src' in sys.modules, hvd.callbacks.K is tf.keras.backend,\n"
        "      hvd.callbacks.K.__name__.startswith('tf_keras.'))\n"
    )
    assert _probe(tmp_path, code) == ["False", "True", "True"]


@pytest.mark.slow
def test_the_installed_horovod_traces_its_allreduce_without_autograph(tmp_path):
    """The built wheel carries the third edit: a function Horovod wraps is traced as
    written, so a Python if on a tensor is refused instead of rewritten into a tf.cond;
    the tape's gradient carries do_not_convert's wrapper."""
    code = (
        "import tensorflow as tf\n"
        "from horovod.tensorflow.util import _make_subgraph\n"
        "def python_if(x):\n"
        "    return x if x > 0 else -x\n"
        "try:\n"
        "    _make_subgraph(python_if)(tf.constant(1.0))\n"
        "    print('converted')\n"
        "except TypeError as err:\n"
        "    print('as written' if 'Python `bool`' in str(err) else err)\n"
        "import horovod.tensorflow as hvd\n"
        "print(hasattr(hvd._DistributedGradientTape.gradient, '__wrapped__'))\n"
    )
    assert _probe(tmp_path, code) == ["as", "written", "True"]


@pytest.mark.slow
def test_the_installed_horovodrun_checks_gloo_without_importing_tensorflow(tmp_path):
    """The built wheel carries the patch: the check answers from the library, and no
    process of this horovodrun loads TensorFlow (the ranks print and exit), so none of
    TensorFlow's start-up lines reach the output. Unpatched, the check's child printed
    them ('Could not find cuda drivers ...')."""
    horovodrun = plan.find_horovodrun(sys.executable)
    assert horovodrun, "Horovod is not installed. Fix: scripts/build-horovod.sh .venv/bin/python"
    from horovod.common import util

    assert util._library_flag("tensorflow", "horovod_gloo_built", False) is True
    assert util._library_flag("torch", "horovod_gloo_built", False) is None
    proc = subprocess.run(
        [
            horovodrun,
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--gloo",
            sys.executable,
            "-c",
            "print('rank up')",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("rank up") == 2, out
    assert "cuda" not in out and "absl" not in out, out


@pytest.mark.parametrize(
    "inserted, old, new",
    [
        ("LIBRARY_FLAG", "return None", "return False"),
        ("KERAS_BACKEND", "keras.backend", "tf.keras.backend"),
        ("SUBGRAPH_PLAIN", "autograph=False", "autograph=True"),
        ("TAPE_GRADIENT_PLAIN", "do_not_convert", "do_not_convert()"),
        ("OPTIMIZER_BUILT", "optimizer.build(var_list)", "optimizer.build(var_list[:1])"),
        ("CYCLE_ALIGNED", "steady_clock::now()", "system_clock::now()"),
    ],
)
def test_the_cache_key_digest_names_the_inserted_code_not_the_comments(
    capsys, monkeypatch, inserted, old, new
):
    assert patch.main(["--digest"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == patch.digest() and len(printed) == 8 and int(printed, 16) >= 0
    monkeypatch.setattr(patch, inserted, getattr(patch, inserted).replace(old, new, 1))
    assert patch.digest() != printed
    monkeypatch.undo()
    assert patch.digest() == printed
    assert patch.main(["--bogus"]) == 2
