"""Make `horovodrun` ask the compiled library, not TensorFlow, whether Gloo or MPI is built.

    python scripts/patch_horovod_launcher.py HOROVOD_SOURCE_DIR
    python scripts/patch_horovod_launcher.py --digest

scripts/build-horovod.sh runs this on the unpacked 0.28.1 sdist before it builds the wheel.

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

The edit is exact-text: if Horovod's source differs from what it expects, it stops
and says which text it did not find, rather than build something half-patched.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

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


def digest() -> str:
    """8 hex digits naming what the patch writes (build-horovod.sh's cache key): a change
    to the inserted code builds the wheel again, a change to this file's comments does not."""
    payload = LIBRARY_FLAG + "".join(_patched_call(k, v) for k, v in CHECKS.items())
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


class PatchError(RuntimeError):
    """Horovod's source is not the text this patch was written for."""


def patch_util(text: str) -> str:
    """util.py's text with the library check added (pure; raises PatchError on a mismatch)."""
    if MARKER in text:
        raise PatchError(f"{UTIL} is already patched ({MARKER!r} is in it)")
    if text.count(ANCHOR) != 1:
        raise PatchError(
            f"{UTIL}: expected the end of _check_extension_lambda once, found it "
            f"{text.count(ANCHOR)} times:\n{ANCHOR}"
        )
    text = text.replace(ANCHOR, ANCHOR + LIBRARY_FLAG, 1)
    for label, c_function in CHECKS.items():
        old = _check_call(label)
        if text.count(old) != 1:
            raise PatchError(
                f"{UTIL}: expected {label}'s check once, found it {text.count(old)} times:\n{old}"
            )
        text = text.replace(old, _patched_call(label, c_function), 1)
    return text


def main(argv: list[str]) -> int:
    if argv == ["--digest"]:
        print(digest())
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: patch_horovod_launcher.py HOROVOD_SOURCE_DIR | --digest", file=sys.stderr)
        return 2
    path = Path(argv[0]) / UTIL
    try:
        patched = patch_util(path.read_text())
    except (OSError, PatchError) as err:
        print(f"patch_horovod_launcher: {err}", file=sys.stderr)
        return 1
    path.write_text(patched)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
