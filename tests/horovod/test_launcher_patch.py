"""scripts/patch_horovod_launcher.py: the exact-text edit of Horovod's util.py, as data,
and what the patched install does (horovodrun's build check answers from the library)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit.launch import plan

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "patch_horovod_launcher", ROOT / "scripts" / "patch_horovod_launcher.py"
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


def test_main_edits_the_file_in_place_and_exits_1_with_the_reason(tmp_path, capsys):
    util = tmp_path / "horovod" / "common" / "util.py"
    util.parent.mkdir(parents=True)
    util.write_text(UTIL)
    assert patch.main([str(tmp_path)]) == 0
    assert patch.MARKER in util.read_text()
    assert patch.main([str(tmp_path)]) == 1
    assert "already patched" in capsys.readouterr().err
    assert patch.main([str(tmp_path / "missing")]) == 1


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


def test_the_cache_key_digest_names_the_inserted_code_not_the_comments(capsys):
    assert patch.main(["--digest"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == patch.digest() and len(printed) == 8 and int(printed, 16) >= 0
    saved = patch.LIBRARY_FLAG
    try:
        patch.LIBRARY_FLAG = saved.replace("return None", "return False", 1)
        assert patch.digest() != printed
    finally:
        patch.LIBRARY_FLAG = saved
    assert patch.main(["--bogus"]) == 2
