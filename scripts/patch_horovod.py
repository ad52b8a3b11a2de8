"""Five exact-text edits of Horovod 0.28.1's sources (four in Python, one in C++), made before
its wheel is built.

    python scripts/patch_horovod.py HOROVOD_SOURCE_DIR
    python scripts/patch_horovod.py --digest

scripts/build-horovod.sh runs this on the unpacked 0.28.1 sdist before it builds the wheel.

**1. `horovodrun` asks the compiled library, not TensorFlow, whether Gloo or MPI is built.**
Every `horovodrun` checks whether Gloo (or MPI) was compiled in before it starts a rank
(``horovod.common.util.gloo_built`` / ``mpi_built``). Horovod answers by importing
``horovod.tensorflow`` in a forked process, which imports TensorFlow: on a quiet 2-core
machine 3.7 s against 0.5 s for the library's way (medians of 6 paired runs of each check
in a fresh process; under ``python -m cProfile $(which horovodrun) -np 2 -H localhost:2
--gloo python -c pass``, 4.93 of its 5.55 s were spent waiting for that child). The answer
is a constant in the library (``horovod_gloo_built()``, ``horovod_mpi_built()``, the C
functions ``hvd.gloo_built()`` itself calls), so the patch asks the library directly:
the forked child loads TensorFlow's two shared libraries and Horovod's
``mpi_lib`` with ctypes without importing TensorFlow's Python package.

Where that cannot answer (a framework other than TensorFlow, a library that does not
load) it answers None and Horovod's own check runs as before, so the result is always
the library's own. The child's C-level stdout and stderr go to /dev/null unless
Horovod's verbosity is 2 or more, the level at which Horovod's own check prints.

**2. Horovod's Keras takes its backend from the Keras that ``tf.keras`` is.**
``horovod.tensorflow.keras`` and its ``callbacks`` import ``from keras import backend``:
the standalone ``keras`` package, Keras 3 on TensorFlow 2.21, even when ``tf.keras`` is
tf-keras (``TF_USE_LEGACY_KERAS=1``, what Horovod's Keras needs and the kit uses). So every
rank imported all of Keras 3: on a quiet 2-core machine a Horovod worker's imports took
3.22-3.45 s without it and 4.29-4.48 s with it (3 alternating pairs). And Horovod's
``MetricAverageCallback`` and ``LearningRateWarmupCallback`` failed on Keras 3's backend,
which lacks the functions they call (with this edit both work on tf-keras; the second, with
tf-keras' SGD, only with ``momentum_correction=False``, see ddlkit/horovod/callbacks.py). The
edit takes ``keras.backend`` from the ``from tensorflow import keras`` both files already have:
tf-keras's backend under tf-keras, Keras 3's otherwise, as before.

**3. Horovod's gradient all-reduce is traced without AutoGraph.**
AutoGraph rewrites the Python of every function a traced function calls, unless the
function is TensorFlow's, Keras's or marked ``do_not_convert``; Horovod's is none of
those. So the first step of every rank parsed and rewrote Horovod's own Python
(``allreduce_grads``, ``_allreduce_cond``, ``allreduce``, ...), by two roads:

- Keras's ``DistributedOptimizer`` (and ``broadcast_variables``): in eager TensorFlow
  Horovod wraps the all-reduce in ``tf.function(f)`` (``horovod.tensorflow.util.
  _make_subgraph``), with AutoGraph on by default. The edit passes ``autograph=False``.
- ``DistributedGradientTape`` inside the learner's ``@tf.function`` step: the step's
  AutoGraph reaches the tape's ``gradient`` and everything it calls. The edit marks that
  method ``@tf.autograph.experimental.do_not_convert``.

That code needs no AutoGraph: every ``if`` in it tests Python values (the op, the dtype,
how Horovod was built, a registered local variable), and it chooses between all-reduce
and identity with an explicit ``tf.cond``. Under cProfile, AutoGraph's transformations took
3.8 s of a 4-step ``launch/train_horovod.py``'s 10.9 s, 0.15 s with the edit; 5.3 s of
``launch/train_horovod_tape.py``'s 11.9 s, 0.6 s with it. ``horovodrun -np 2`` of
``train_horovod.py`` for 6 steps, 6 pairs on a quiet 2-core machine: CPU 14.5 s against
18.8 s (median ratio 0.76), wall 8.0 s against 10.3 s; of ``train_horovod_tape.py``
(the ``_make_subgraph`` edit in both): 13.8 s against 19.3 s (0.72), wall 7.9 s against
10.5 s. The ranks' weights were identical to the last digit in every run.

**4. Elastic Horovod's Keras state builds the optimizer's variables when it is made.**
``hvd.elastic.TensorFlowKerasState`` (and ``KerasState``) brings a joining rank up to date
by broadcasting ``model.variables`` and then ``optimizer.variables()`` from rank 0. Keras
optimizers create their slot variables at their first ``apply_gradients`` (tf-keras' Adam:
``iterations``, then one ``m`` and one ``v`` per weight), so after training the old ranks
broadcast all of them (9 for a two-layer Dense model) while a new rank, which has not
trained, broadcasts ``iterations`` alone and moves on to the state's ``broadcast_object``.
Horovod matches collectives by name: the old ranks wait in ``HorovodBroadcast_Adam_m_...``
for a rank that waits in ``dict.sz``, and the job hangs after the old ranks' reset
callbacks have run with the new size (a 2 -> 3 run of ``hvd.elastic.run`` + ``KerasState``
+ ``model.fit``: ``faulthandler.dump_traceback_later`` found an old rank in
``broadcast_variables(optimizer.variables())``, and the errors raised when it was stopped
named ``HorovodBroadcast_Adam_m_dense_1_kernel_0`` on rank 0 and ``dict.sz`` on the new
rank; the same run with ``ObjectState`` and plain all-reduces grows and shrinks without a
hang). With the edit the same ``KerasState`` run goes 2 -> 3 -> 2 ranks and exits 0, and a
``KerasState`` made before training names the optimizer's variables exactly as a training
step does (tf-keras' Adam and SGD, new and legacy).
horovod/horovod#2652 is this hang; Horovod's own elastic examples work around it in the
training script with one local training step before the state is made. The edit makes the
state do it without a step: ``optimizer.build(model.trainable_variables)`` (tf-keras'
optimizers, what their ``apply_gradients`` calls first) or
``optimizer._create_all_weights(...)`` (the legacy ones, likewise), both no-ops once built,
in eager TensorFlow only, so every rank's optimizer has the same variables before any sync.
It builds them in the optimizer's name scope, as ``apply_gradients`` does: Horovod names each
broadcast after its variable (``HorovodBroadcast_Adam_m_...``), and a ``build`` outside that
scope names them ``m/...`` where a training step names them ``Adam/m/...``.

**5. The ranks' background threads start their cycles together.**
Horovod's background thread runs one cycle every ``HOROVOD_CYCLE_TIME`` ms (1 by default):
it sleeps until ``last_cycle_start`` + the cycle time, sets ``last_cycle_start`` to now, and
agrees with the other ranks on what is ready in a collective (``RunLoopOnce`` in
``horovod/common/operations.cc``; the response cache's bitvector all-reduce,
``MPIController::CrossRankBitwiseAnd``, while no tensor is new). Each rank keeps its own
``last_cycle_start``, so a rank whose cycle began earlier waits in that collective for the
other until it starts its own, every cycle, and then sleeps less by as much: the offset the
ranks had when they started stays. Over Gloo the waiting rank blocks in a socket read;
Open MPI's progress loop polls instead, so it spins for the whole wait (with
``mpi_yield_when_idle`` it yields between polls, but keeps its core whenever nothing else
wants it). ``horovodrun -np 2 --mpi`` of a script that sleeps 8 s after ``hvd.init()`` and
one all-reduce, on a quiet 2-core machine: one rank used 7.1-8.0 CPU-s of those 8 s (gdb:
``ompi_sync_wait_mt`` under ``CacheCoordinator::sync``), the other 0.1-0.2, at cycle times
of 1 and 5 ms alike; over Gloo 0.2-0.7 each. horovod/horovod#2804 is this cost seen from a
CPU-bound job. Under MPI (``HOROVOD_CONTROLLER`` MPI, ``horovodrun --mpi``) the edit sets
``last_cycle_start`` again when the global process set's coordination returns, a moment all
ranks share within microseconds, so every rank's next cycle begins one cycle time after the
same instant and the waits shrink to the ranks' timer jitter: the same sleeping script's
ranks used 0.36 CPU-s each at 1 ms, 0.1 at 5 ms. A cycle's period becomes the cycle time
plus that coordination instead of the cycle time alone; the collective work
(``PerformOperation``) still counts inside it. Gloo keeps Horovod's timing: there the
offset costs nothing, and aligned ranks both wake twice a cycle (from the sleep, then from
the read), which doubled the sleeping ranks' CPU (0.9-1.9 CPU-s against 0.6-0.7, 3 pairs).

Each edit is exact-text: if Horovod's source differs from what it expects, the script
stops and says which text it did not find, and writes no file, rather than build something
half-patched.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

# 1. horovodrun's build check.
UTIL = Path("horovod/common/util.py")
MARKER = "# ddlkit patch: _library_flag"

# Added after Horovod's `_check_extension_lambda`, whose forking pattern it follows.
LIBRARY_FLAG = (
    """

"""
    + MARKER
    + """
# horovodrun asks whether Gloo or MPI was built before every launch; Horovod's check
# imports TensorFlow in a forked process (3.7 s on 2 cores). The answer is a constant of the
# compiled library, so load it with ctypes (TensorFlow's shared libraries first, its
# Python package never) and call the C function hvd.gloo_built() itself calls.
# None (Horovod's own check then runs) for other frameworks or when the library does
# not load this way.
from queue import Empty

_FRAMEWORK_LIBRARIES = {
    'tensorflow': ('libtensorflow_framework.so.2', 'libtensorflow_cc.so.2'),
}


def _library_flag(ext_base_name, c_function, verbose):
    if ext_base_name not in _FRAMEWORK_LIBRARIES:
        return None

    def _target_fn(queue):
        import ctypes
        import importlib.util

        if not verbose:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        try:
            spec = importlib.util.find_spec(ext_base_name)
            framework_dir = list(spec.submodule_search_locations)[0]
            for name in _FRAMEWORK_LIBRARIES[ext_base_name]:
                ctypes.CDLL(os.path.join(framework_dir, name), mode=ctypes.RTLD_GLOBAL)
            horovod_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            lib_path = get_extension_full_path(
                os.path.join(horovod_dir, ext_base_name, '__init__.py'), 'mpi_lib')
            lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)
            result = bool(getattr(lib, c_function)())
        except Exception:
            result = None
        if verbose:
            print('Library check {} {}: {}'.format(ext_base_name, c_function, result))
        queue.put(result)

    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    p = ctx.Process(target=_target_fn, args=(queue,))
    p.daemon = True
    p.start()
    p.join()
    try:
        return queue.get_nowait()
    except Empty:  # the child died before it answered
        return None
"""
)

ANCHOR = """    p.join()
    return queue.get_nowait()
"""

# The C function of the library that each of gloo_built and mpi_built asks.
CHECKS = {
    "Gloo": "horovod_gloo_built",
    "MPI": "horovod_mpi_built",
}


def _check_call(label: str) -> str:
    return (
        "        result = _check_extension_lambda(\n"
        f"            ext_base_name, built_fn, 'built with {label}', verbose)\n"
    )


def _patched_call(label: str, c_function: str) -> str:
    return (
        f"        result = _library_flag(ext_base_name, '{c_function}', verbose)\n"
        "        if result is None:\n"
        "            result = _check_extension_lambda(\n"
        f"                ext_base_name, built_fn, 'built with {label}', verbose)\n"
    )


# 2. The two files of Horovod's Keras, and the import each has once.
KERAS_FILES = (
    Path("horovod/tensorflow/keras/__init__.py"),
    Path("horovod/tensorflow/keras/callbacks.py"),
)
KERAS_MARKER = "# ddlkit patch: tf.keras's backend"
KERAS_IMPORT = """if is_version_greater_equal_than(tf.__version__, "2.6.0"):
    from keras import backend as K
"""
KERAS_BACKEND = (
    """if is_version_greater_equal_than(tf.__version__, "2.6.0"):
    K = keras.backend  """
    + KERAS_MARKER
    + """ (tf-keras's under TF_USE_LEGACY_KERAS, not Keras 3's)
"""
)


# 3. Horovod's tf.function wrapper, without AutoGraph.
TF_UTIL = Path("horovod/tensorflow/util.py")
SUBGRAPH_MARKER = "# ddlkit patch: no AutoGraph"
SUBGRAPH = """def _make_subgraph(f):
    return tf.function(f)
"""
SUBGRAPH_PLAIN = (
    """def _make_subgraph(f):
    """
    + SUBGRAPH_MARKER
    + """: the code it wraps tests only Python values in its ifs
    return tf.function(f, autograph=False)
"""
)


TF_INIT = Path("horovod/tensorflow/__init__.py")
TAPE_GRADIENT = (
    "        def gradient(self, target, sources, output_gradients=None, "
    "use_generic_names=False):\n"
    "            gradients = super(self.__class__, self).gradient(target, sources, "
    "output_gradients)\n"
)
TAPE_GRADIENT_PLAIN = (
    """        @tf.autograph.experimental.do_not_convert  """
    + SUBGRAPH_MARKER
    + """ (its ifs test Python values)
"""
    + TAPE_GRADIENT
)


# 4. Elastic Horovod's Keras state, with the optimizer built before any sync.
TF_ELASTIC = Path("horovod/tensorflow/elastic.py")
STATE_MARKER = "# ddlkit patch: build the optimizer"
MODEL_BUILT = """def _model_built(model):
    return model.built if hasattr(model, 'build') else True
"""
OPTIMIZER_BUILT = (
    MODEL_BUILT
    + """

"""
    + STATE_MARKER
    + """: a new rank's optimizer has no slots until its first step,
# the old ranks' have them all, and broadcasting two different lists of variables hangs.
# Built as apply_gradients builds it (in the optimizer's name scope), so a rank that has
# trained and one that has not name their variables, and Horovod their broadcasts, alike.
def _build_optimizer(model, optimizer):
    if optimizer is None or not _executing_eagerly():
        return
    var_list = model.trainable_variables
    if hasattr(optimizer, '_create_all_weights'):  # tf-keras' legacy optimizers
        with tf.name_scope(optimizer._name), tf.init_scope():
            optimizer._create_all_weights(var_list)
    elif hasattr(optimizer, 'build'):  # tf-keras' optimizers
        with tf.name_scope(optimizer.name or 'optimizer'), tf.init_scope():
            optimizer.build(var_list)
"""
)
STATE_INIT = """        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        self._save_model()
"""
STATE_INIT_BUILT = (
    """        self.optimizer = optimizer or model.optimizer
        self.backend = backend
        _build_optimizer(self.model, self.optimizer)  """
    + STATE_MARKER
    + """
        self._save_model()
"""
)

# 5. The ranks' cycles start together (C++: the background thread's loop).
OPERATIONS = Path("horovod/common/operations.cc")
CYCLE_MARKER = "// ddlkit patch: cycles start together"
CYCLE_MARK = """    if (process_set_id == 0) {
      state.mark_cycles_in_timeline =
          state.timeline_controller.MarkCyclesInTimelinePending();
    }
"""
CYCLE_ALIGNED = (
    """    if (process_set_id == 0) {
      state.mark_cycles_in_timeline =
          state.timeline_controller.MarkCyclesInTimelinePending();
      """
    + CYCLE_MARKER
    + """
#if HAVE_MPI
      // Every rank has just left the same collective: the next cycle is timed from here on
      // all of them, so no rank spins in MPI waiting for another's cycle to start.
      if (state.control_operation == LibType::MPI) {
        state.last_cycle_start = std::chrono::steady_clock::now();
      }
#endif // HAVE_MPI
    }
"""
)


def digest() -> str:
    """8 hex digits naming what the patch writes (build-horovod.sh's cache key): a change
    to the inserted code builds the wheel again, a change to this file's comments does not."""
    payload = LIBRARY_FLAG + "".join(_patched_call(k, v) for k, v in CHECKS.items())
    payload += KERAS_BACKEND + SUBGRAPH_PLAIN + TAPE_GRADIENT_PLAIN
    payload += OPTIMIZER_BUILT + STATE_INIT_BUILT + CYCLE_ALIGNED
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


class PatchError(RuntimeError):
    """Horovod's source is not the text this patch was written for."""


def _unpatched(text: str, name: Path, marker: str) -> str:
    """``text``, or PatchError if an earlier run of this edit left ``marker`` in it (pure)."""
    if marker in text:
        raise PatchError(f"{name} is already patched ({marker!r} is in it)")
    return text


def _once(text: str, name: Path, needed: str, what: str = "this text") -> None:
    """PatchError unless ``needed`` is in ``text`` exactly once (pure)."""
    if text.count(needed) != 1:
        raise PatchError(
            f"{name}: expected {what} once, found it {text.count(needed)} times:\n{needed}"
        )


def _replace_once(text: str, name: Path, old: str, new: str, what: str = "this text") -> str:
    """``text`` with its one ``old`` replaced by ``new`` (pure; PatchError otherwise)."""
    _once(text, name, old, what)
    return text.replace(old, new, 1)


def patch_util(text: str) -> str:
    """util.py's text with the library check added (pure; raises PatchError on a mismatch)."""
    text = _unpatched(text, UTIL, MARKER)
    end = "the end of _check_extension_lambda"
    text = _replace_once(text, UTIL, ANCHOR, ANCHOR + LIBRARY_FLAG, end)
    for label, c_function in CHECKS.items():
        new = _patched_call(label, c_function)
        text = _replace_once(text, UTIL, _check_call(label), new, f"{label}'s check")
    return text


def patch_keras_backend(text: str, name: Path) -> str:
    """One file of Horovod's Keras with its backend taken from tf.keras (pure; raises
    PatchError on a mismatch). ``keras`` is the file's own ``from tensorflow import keras``."""
    text = _unpatched(text, name, KERAS_MARKER)
    _once(text, name, "from tensorflow import keras\n")
    return _replace_once(text, name, KERAS_IMPORT, KERAS_BACKEND)


def patch_subgraph(text: str) -> str:
    """horovod/tensorflow/util.py with _make_subgraph tracing without AutoGraph."""
    text = _unpatched(text, TF_UTIL, SUBGRAPH_MARKER)
    return _replace_once(text, TF_UTIL, SUBGRAPH, SUBGRAPH_PLAIN)


def patch_tape_gradient(text: str) -> str:
    """horovod/tensorflow/__init__.py with DistributedGradientTape.gradient marked
    do_not_convert."""
    text = _unpatched(text, TF_INIT, SUBGRAPH_MARKER)
    return _replace_once(text, TF_INIT, TAPE_GRADIENT, TAPE_GRADIENT_PLAIN)


def patch_keras_state(text: str) -> str:
    """horovod/tensorflow/elastic.py with TensorFlowKerasState building its optimizer's
    variables before it saves or syncs them (pure; raises PatchError on a mismatch)."""
    text = _unpatched(text, TF_ELASTIC, STATE_MARKER)
    text = _replace_once(text, TF_ELASTIC, MODEL_BUILT, OPTIMIZER_BUILT)
    return _replace_once(text, TF_ELASTIC, STATE_INIT, STATE_INIT_BUILT, "KerasState's set-up")


def patch_cycle_start(text: str) -> str:
    """horovod/common/operations.cc with every rank's next cycle timed from the end of the
    ranks' coordination (pure; raises PatchError on a mismatch)."""
    text = _unpatched(text, OPERATIONS, CYCLE_MARKER)
    return _replace_once(text, OPERATIONS, CYCLE_MARK, CYCLE_ALIGNED, "RunLoopOnce's cycle mark")


def patched_files(source: Path) -> dict[Path, str]:
    """Every file the patch edits under ``source``, with its new text (reads only)."""
    files = {source / UTIL: patch_util((source / UTIL).read_text())}
    for name in KERAS_FILES:
        files[source / name] = patch_keras_backend((source / name).read_text(), name)
    files[source / TF_UTIL] = patch_subgraph((source / TF_UTIL).read_text())
    files[source / TF_INIT] = patch_tape_gradient((source / TF_INIT).read_text())
    files[source / TF_ELASTIC] = patch_keras_state((source / TF_ELASTIC).read_text())
    files[source / OPERATIONS] = patch_cycle_start((source / OPERATIONS).read_text())
    return files


def main(argv: list[str]) -> int:
    if argv == ["--digest"]:
        print(digest())
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: patch_horovod.py HOROVOD_SOURCE_DIR | --digest", file=sys.stderr)
        return 2
    try:
        files = patched_files(Path(argv[0]))  # every edit checked before any file is written
    except (OSError, PatchError) as err:
        print(f"patch_horovod: {err}", file=sys.stderr)
        return 1
    for path, text in files.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
