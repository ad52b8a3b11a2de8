"""The worker scripts in launch/ keep the kit's conventions."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
SCRIPTS = sorted(p for p in LAUNCH.glob("*.py") if not p.name.startswith("_"))


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return sorted(found)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_ddlkit_is_imported_before_tensorflow(script):
    names = [name for _, name in _imports(ast.parse(script.read_text()))]
    if "ddlkit" in names and "tensorflow" in names:
        assert names.index("ddlkit") < names.index("tensorflow"), (
            f"{script.name} imports tensorflow before ddlkit, so ddlkit cannot choose tf-keras"
        )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_docstring_lists_how_to_launch_it(script):
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    assert "ddlkit launch" in doc or "python launch/" in doc, f"{script.name}: no launch command"


def test_distribution_lines_are_marked():
    text = (LAUNCH / "train_multi_worker.py").read_text()
    marked = [line for line in text.splitlines() if "# [dist]" in line]
    assert any("MultiWorkerMirroredStrategy()" in line for line in marked)
    assert any("strategy.scope()" in line for line in marked)
    assert "# [dist]" not in (LAUNCH / "train_single.py").read_text()


@pytest.mark.slow
def test_eval_every_reports_held_out_evals_with_training_time_only(data_env, tmp_path):
    import os
    import subprocess
    import sys

    from ddlkit.metrics.store import read_jsonl

    env = {**os.environ, "DDLKIT_RUNS": str(tmp_path / "runs"), "TF_NUM_INTRAOP_THREADS": "1"}
    env.pop("DDLKIT_RUN_DIR", None)
    argv = [sys.executable, str(LAUNCH / "train_single.py"), "--steps-per-epoch", "12"]
    argv += ["--eval-every", "5", "--eval-examples", "300", "--test-examples", "250"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(result.removeprefix("RESULT "))["test_examples"] == 250
    (path,) = (tmp_path / "runs").glob("*/metrics/*.jsonl")
    records, _ = read_jsonl(path)
    evals = [r.info for r in records if r.kind == "event" and r.name == "eval"]
    assert [e["step"] for e in evals] == [0, 5, 10, 12]  # the start, every 5, the end
    assert [e["examples"] for e in evals] == [0, 320, 640, 768]
    assert all(0.0 <= e["accuracy"] <= 1.0 and e["loss"] > 0 for e in evals)
    seconds = [e["train_seconds"] for e in evals]
    assert seconds[0] < 0.05 and seconds == sorted(seconds) and seconds[-1] > 0
    assert evals[-1]["accuracy"] > evals[0]["accuracy"]  # 12 steps of Adam beat random init


def test_eval_every_defaults_to_off_in_the_strategy_scripts():
    for name in ("train_single.py", "train_mirrored.py", "train_multi_worker.py"):
        text = (LAUNCH / name).read_text()
        assert "held_out_evals(" in text and "add_eval_flags" in text, name
    import sys

    sys.path.insert(0, str(LAUNCH))
    try:
        from _common import add_eval_flags, parse_args

        args = parse_args([], "x", extra=add_eval_flags)
    finally:
        sys.path.remove(str(LAUNCH))
    assert (args.eval_every, args.eval_examples) == (0, 2000)


def test_model_flag_in_the_scripts_that_build_with_it_and_rejected_elsewhere():
    import sys

    sys.path.insert(0, str(LAUNCH))
    try:
        from _common import parse_args

        assert parse_args([], "x", model_flag=True).model == "cnn"  # today's default
        assert parse_args(["--model", "small_resnet"], "x", model_flag=True).model == "small_resnet"
        assert parse_args([], "x").model == "cnn"  # scripts that always build the CNN
        with pytest.raises(SystemExit):  # ... say so instead of ignoring the flag
            parse_args(["--model", "small_resnet"], "x")
    finally:
        sys.path.remove(str(LAUNCH))
    for name in (
        "train_single.py",
        "train_mirrored.py",
        "train_multi_worker.py",
        "train_horovod.py",
    ):
        text = (LAUNCH / name).read_text()
        assert "model_flag=True" in text and "models.build(args.model, args.dataset" in text, name
        assert "test_accuracy(model, args, x_test, y_test)" in text, (
            name
        )  # test_accuracy rebuilds the same model


def _parse(argv: list[str]):
    sys.path.insert(0, str(LAUNCH))
    try:
        from _common import parse_args

        return parse_args(argv, "x")
    finally:
        sys.path.remove(str(LAUNCH))


def test_the_final_accuracy_uses_every_test_image_unless_fast_mode_or_asked(monkeypatch):
    monkeypatch.delenv("DDLKIT_FAST", raising=False)
    assert _parse([]).test_examples == 0  # 0: all of them
    monkeypatch.setenv("DDLKIT_FAST", "1")
    assert _parse([]).test_examples == 1000
    assert _parse(["--test-examples", "0"]).test_examples == 0  # asked for: all, even in CI
    assert _parse(["--test-examples", "300"]).test_examples == 300


def test_a_negative_test_examples_is_refused_naming_the_fix(capsys):
    with pytest.raises(SystemExit) as ended:
        _parse(["--test-examples", "-5"])
    assert ended.value.code == 2
    assert "--test-examples -5: need >= 0 (0: every test image)" in capsys.readouterr().err
