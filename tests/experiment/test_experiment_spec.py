"""The experiment as data: the user's file named, its cases planned, its costs and memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit.errors import ConfigError
from ddlkit.experiments import run as erun
from ddlkit.experiments.spec import GradientTensor, ModelCosts, UserModel, plan

MODELS = Path(__file__).parent / "models"
USER = UserModel.of(MODELS / "text_encoder.py")


def costs(**changes) -> ModelCosts:
    grads = (
        GradientTensor("k:0", (1568, 10), "float32"),
        GradientTensor("e:0", (50, 4), "float16"),
    )
    base = dict(name="m", batch=32, params=15880, gradients=grads, forward_flops=1e5,
                train_flops=3e5, activation_bytes=6e3, weight_bytes=63520, optimizer_bytes=8,
                peak_rss=700_000_000)  # fmt: skip
    return ModelCosts(**(base | changes))


def test_a_plan_has_the_baseline_and_the_ceiling_beside_the_strategies_asked():
    cases = plan(USER, ["multi_worker", "horovod"], [1, 2], steps=20, cores=2,
                 horovod_available=True)  # fmt: skip
    assert [c.name for c in cases] == [
        "single-x1", "independent-x2", "multi_worker-x1", "multi_worker-x2", "horovod-x1",
        "horovod-x2",
    ]  # fmt: skip
    assert {c.steps for c in cases} == {20} and {c.model for c in cases} == {"text_encoder"}
    args = cases[3].args()
    assert args[args.index("--file") + 1] == str(USER.path) and "multi_worker" in args
    assert cases[3].launch_strategy == "multi_worker" and cases[0].launch_strategy == "mirrored"


def test_horovod_without_horovodrun_is_kept_with_its_reason():
    cases = plan(USER, ["horovod"], [2], steps=5, cores=2, horovod_available=False)
    assert [c.name for c in cases if c.skip] == ["horovod-x2"]
    assert "horovodrun" in cases[-1].skip


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(strategies=["ring"]), "pick from"),
        (dict(strategies=[]), "pick from"),
        (dict(workers=[0]), "ints >= 1"),
        (dict(workers=[4]), "this machine has 2 cores"),
    ],
)
def test_a_bad_plan_is_one_error_naming_the_fix(kwargs, words):
    args = dict(strategies=["multi_worker"], workers=[1, 2]) | kwargs
    with pytest.raises(ConfigError, match=words):
        plan(USER, args["strategies"], args["workers"], steps=5, cores=2, horovod_available=True)


def test_a_user_model_is_a_python_file_with_function_names(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        UserModel.of(tmp_path / "missing.py")
    with pytest.raises(ConfigError, match="imports a Python file"):
        UserModel.of(tmp_path)
    with pytest.raises(ConfigError, match="not a Python function name"):
        UserModel.of(USER.path, model="build model()")
    with pytest.raises(ConfigError, match="give both"):
        UserModel.of(USER.path, loss="mse")


def test_costs_add_gradient_bytes_by_dtype_and_survive_json():
    c = costs()
    assert c.gradient_bytes == {"float32": 1568 * 10 * 4, "float16": 50 * 4 * 2}
    assert c.total_gradient_bytes == 62720 + 400
    assert ModelCosts.from_json(c.to_json()) == c
    assert c.train_to_forward == 3.0


def test_a_model_that_does_not_fit_the_memory_each_worker_gets_is_refused_before_it_starts():
    cases = plan(USER, ["parameter_server"], [2], steps=5, cores=2, horovod_available=True)
    assert erun.processes("parameter_server", 2) == 4  # 2 workers, a ps and the chief
    erun.check_memory(costs(), cases, available=4 * 700_000_000)  # fits exactly
    with pytest.raises(ConfigError, match=r"parameter_server-x2's 4 processes need about 2\.8 GB"):
        erun.check_memory(costs(), cases, available=2_000_000_000)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("A100:8", "is not GPU:PER_NODE:INTRA:NICSxGBPS"),
        ("A100:8:NVLink3:4", "is not GPU:PER_NODE:INTRA:NICSxGBPS"),
        ("Z9:8:NVLink3:4x200", "unknown accelerator preset 'Z9'"),
        ("A100:8:NVLink3:4x200:udp", "transport='udp' is not 'rdma' or 'tcp'"),
    ],
)
def test_a_described_cluster_that_does_not_parse_is_one_error(text, words):
    from ddlkit.experiments.cli import described

    with pytest.raises(ConfigError, match=words):
        described(text)


def test_a_described_cluster_is_the_hardware_dk_scale_builds():
    from ddlkit.experiments.cli import described
    from ddlkit.scale import cluster

    assert described("A100:8:NVLink3:4x200:tcp") == cluster(
        "A100", gpus_per_node=8, intra="NVLink3", nics_per_node=4, nic_gbps=200, transport="tcp"
    )
