"""The worker contract has one home: ddlkit/contract.py (names, worker-name rule, layout)."""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest

from ddlkit import contract, results
from ddlkit.cluster import ClusterSpec, horovod_slots, parse_hosts
from ddlkit.errors import ConfigError, RecordError
from ddlkit.launch import plan as p
from ddlkit.launch.spec import WorkerSpec
from ddlkit.metrics import records, store
from ddlkit.metrics.protocol import hello_line, parse_hello

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "ddlkit" / "contract.py"
# Spelled in one module only: the variables, and the layout's names where a path is built.
NAMES = frozenset({*contract.ENV_VARS, contract.JOB_FILE})
LAYOUT = frozenset(
    {contract.LOGS_DIR, contract.METRICS_DIR, contract.RESULTS_DIR, contract.WORK_DIR}
)
# Files of helper B's part of issue 13 (bench/, ps.py) that build run-directory paths by
# hand until B moves them to ddlkit.contract; each entry must still be there (else drop it).
PENDING: set[tuple[str, str]] = set()


def _sources():
    for top in ("ddlkit", "launch"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def _spellings(tree: ast.AST):
    """(line, what) for every contract name as a whole string constant and every layout
    name used as a path part (``x / "results"``, ``os.path.join(..., "results")``)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in docstrings:
            yield node.lineno, node.value
        parts = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.left, node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join":
            parts = list(node.args)
        for part in parts:
            if isinstance(part, ast.Constant) and part.value in LAYOUT:
                yield part.lineno, part.value


def test_the_contract_names_are_spelled_in_ddlkit_contract_only():
    found = {}
    for rel, tree in _sources():
        for line, what in _spellings(tree):
            found.setdefault((rel, what), []).append(line)
    assert {what for (rel, what) in found if rel == "ddlkit/contract.py"} == NAMES
    outside = {k: v for k, v in found.items() if k[0] != "ddlkit/contract.py"}
    assert set(outside) - PENDING == set(), "use ddlkit.contract's names and path builders"
    assert PENDING <= set(outside), "fixed: remove it from PENDING"


def test_the_scan_sees_a_name_and_a_path_built_by_hand():
    tree = ast.parse(
        'import os\nx = os.environ["DDLKIT_WORKER"]\ny = run_dir / "results"\n'
        'z = os.path.join(run_dir, "logs", "a.log")\n"""DDLKIT_TOKEN in a docstring is fine"""'
    )
    assert sorted(_spellings(tree)) == [(2, "DDLKIT_WORKER"), (3, "results"), (4, "logs")]


@pytest.mark.parametrize("name", ["worker-0", "chief-0", "rank-12", "main", "a.b_c", "x" * 64])
def test_one_worker_name_rule_for_the_launcher_and_the_records(name):
    WorkerSpec(name, ("python",), {}, Path("/tmp"), Path(f"/tmp/{name}.log"))
    assert records.Record(
        kind="event", worker=name, step=0, epoch=0, seq=0, wall_time=1.0, name="e"
    )
    assert parse_hello(hello_line(name, "t")) == (name, "t")
    assert store.metrics_path("/r", name) == Path(f"/r/metrics/{name}.jsonl")


@pytest.mark.parametrize("name", ["_x", "-x", ".x", "a b", "x" * 65, ""])
def test_a_name_the_launcher_refuses_is_refused_by_the_records_too(name):
    with pytest.raises(ConfigError, match="not a valid name"):
        WorkerSpec(name, ("python",), {}, Path("/tmp"), Path("/tmp/x.log"))
    with pytest.raises(RecordError):
        records.Record(kind="event", worker=name, step=0, epoch=0, seq=0, wall_time=1.0, name="e")
    with pytest.raises(RecordError):
        parse_hello(hello_line(name, "t"))
    with pytest.raises(ConfigError, match="cannot name a metrics file"):
        store.metrics_path("/r", name)


def test_names_are_built_by_the_contract_everywhere():
    cluster = ClusterSpec.local(workers=2, ps=1, chief=True)
    assert [t.name for t in cluster.tasks] == [
        contract.task_name(r, i) for r, i in (("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1))
    ]
    assert cluster.env("chief-0")[contract.WORKER_VAR] == "chief-0"
    slots = horovod_slots(parse_hosts("localhost:2"), 2)
    assert [s.name for s in slots.slots] == [contract.rank_name(0), contract.rank_name(1)]
    assert slots.slots[1].env()[contract.WORKER_VAR] == "rank-1"


def test_the_run_directory_layout():
    run = Path("/runs/r1")
    assert contract.log_path(run, "worker-0") == run / "logs" / "worker-0.log"
    assert contract.metrics_path(run, "rank-1") == run / "metrics" / "rank-1.jsonl"
    assert contract.result_path(run, "chief-0") == run / "results" / "chief-0.json"
    assert contract.work_dir(run, "ps-0") == run / "work" / "ps-0"
    assert contract.job_file(run) == run / "job.json"
    assert results.results_dir().name == contract.SAVED_RESULTS_DIR


def test_a_saved_result_is_read_back_by_worker_name(tmp_path):
    contract.write_result(tmp_path, "chief-0", json.dumps({"a": 1}))
    contract.write_result(tmp_path, "worker-0", json.dumps({"a": 2}))
    assert contract.read_results(tmp_path) == {"chief-0": {"a": 1}, "worker-0": {"a": 2}}
    assert not list(contract.results_dir(tmp_path).glob("*.tmp"))
    assert contract.read_results(tmp_path / "none") == {}


def _report(**over):
    base = dict(
        dataset="mnist", epochs=1, steps=40, global_batch=128, replicas=2,
        examples_per_sec=900.0, test_accuracy=0.5, train_seconds=5.7,
    )  # fmt: skip
    return {**base, **over}


@pytest.mark.parametrize("strategy", p.STRATEGIES)
def test_results_speak_with_the_worker_the_launcher_names(tmp_path, strategy):
    """The run's spokesman is one of the workers the plan starts (this caught "chief"
    where the launcher names the PS coordinator "chief-0")."""
    config = p.LaunchConfig(script=Path(__file__), strategy=strategy, workers=2)
    job = p.plan(config, p.cluster_for(config), run_id="r", run_dir=tmp_path, horovodrun="/h")
    names = list(job.names)
    if strategy == "horovod":  # horovodrun starts the ranks; each renames itself
        names = [contract.rank_name(r) for r in range(config.workers)]
    speaker = {"parameter_server": "chief-0", "mirrored": "main"}.get(strategy, names[0])
    speaker = speaker if strategy != "horovod" else "rank-0"
    assert speaker in names
    # every worker reports; the spokesman's report is the one that differs
    reports = {n: _report(test_accuracy=0.9 if n == speaker else 0.1) for n in names}
    run = types.SimpleNamespace(
        run_id="r",
        run_dir=tmp_path,
        config=config,
        results=lambda: reports,
        records=lambda: [],
    )
    assert results.from_run(run, "x", strategy).test_accuracy == 0.9
