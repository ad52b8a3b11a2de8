"""dk.where.Ray and the Ray environment as plain data, and the refusals that need no cluster."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ddlkit.environments.ray import Ray as RayEnv
from ddlkit.errors import ConfigError
from ddlkit.launch import run as run_mod
from ddlkit.ray.submit import check_state
from ddlkit.where import Ray

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "train_multi_worker.py"


def test_each_actor_gets_its_own_tf_config():
    addresses = ["127.0.0.3:12001", "127.0.0.2:12002"]
    configs = [json.loads(RayEnv(i, addresses).task_env("/tmp/r")["TF_CONFIG"]) for i in (0, 1)]
    assert [c["cluster"] for c in configs] == [{"worker": addresses}] * 2
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert RayEnv(1, addresses).worker_name() == "worker-1"
    with pytest.raises(ConfigError, match="outside the placement group's 2 bundles"):
        RayEnv(2, addresses)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({}, "Ray needs its head's address"),
        ({"address": "ray://127.0.0.2:10001"}, "is not HOST:PORT"),
        ({"address": "127.0.0.2"}, "is not HOST:PORT"),
        ({"address": "127.0.0.2:6379", "placement": "spread"}, "not a Ray placement strategy"),
    ],
)
def test_bad_where_is_one_error(kwargs, said):
    with pytest.raises(ConfigError, match=said):
        Ray(**kwargs)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: nothing listens there


def test_no_cluster_at_the_address_starts_nothing(tmp_path):
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError) as refused:
        run_mod.start(SCRIPT, strategy="multi_worker", workers=2, where=Ray(address),
                      runs_dir=tmp_path)  # fmt: skip
    text = str(refused.value)
    assert f"no Ray cluster at {address}" in text and "ray start --head" in text, text
    assert list(tmp_path.iterdir()) == []  # no run directory: nothing started


def test_a_strategy_ray_does_not_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not run on dk.where.Ray"):
        run_mod.start(
            SCRIPT.with_name("train_parameter_server.py"),
            strategy="parameter_server",
            workers=2,
            where=Ray("127.0.0.2:6379"),
            runs_dir=tmp_path,
        )


def test_version_mismatch_names_both_fixes():
    # What `python -m ddlkit.ray check` reports when ray.init raises Ray's own mismatch error
    # (ray._private.utils.check_version_info), read back into one ConfigError.
    state = {"kind": "version", "error": "Version mismatch: The cluster was started with:\n"
             "    Ray: 2.59.0\n    Python: 3.11.7\n"}  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        check_state(state, "127.0.0.2:6379", 2)
    text = str(refused.value)
    assert "Ray: 2.59.0" in text and "2.60.0" in text and "ray start" in text, text


def test_dk_workers_on_ray_is_one_error():
    import ddlkit as dk

    with pytest.raises(ConfigError, match=r"Ray runs scripts as actors.*where=dk.where.Ray"):
        dk.workers(2, strategy="multi_worker", where=Ray("127.0.0.2:6379"))


def test_cli_ray_without_a_cluster_exits_2_naming_it(tmp_path, capsys):
    from ddlkit.cli import main

    address = f"127.0.0.1:{_closed_port()}"
    code = main(["launch", "--ray", address, "--runs-dir", str(tmp_path), "-n", "2", str(SCRIPT)])
    assert code == 2
    assert f"no Ray cluster at {address}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
