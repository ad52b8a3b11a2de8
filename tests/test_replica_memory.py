"""ddlkit.lessons.memory, and notebook 04b's counts against real variables: one replica, mirrored
replicas, the stages of a split model and the ps tasks of a parameter-server cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ddlkit  # noqa: F401  (chooses Keras before TensorFlow is imported)
from ddlkit import models
from ddlkit.backend import keras
from ddlkit.errors import ConfigError
from ddlkit.lessons import memory

REPO = Path(__file__).resolve().parent.parent


# -- the arithmetic ---------------------------------------------------------------------------


def test_shard_rounds_up_and_rejects_bad_replica_counts():
    assert memory.shard(10, 3) == 4
    assert memory.shard(9, 3) == 3
    assert memory.shard(0, 8) == 0
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ConfigError, match="replicas"):
            memory.shard(10, bad)


def test_zero_stages_shard_one_more_part_each():
    state = memory.ModelState(weights=1000, trainable=900, slots=1800, scalars=8)
    table = memory.zero(state, 4)
    got = [(r.weights, r.gradients, r.optimizer) for r in table.rows]
    assert got == [
        (1000, 900, 1808),
        (1000, 900, 450 + 8),
        (1000, 225, 450 + 8),
        (250, 225, 450 + 8),
    ]
    assert [r.holder for r in table.rows] == list(memory.STAGES)
    assert table.row(memory.STAGES[3]).total == 250 + 225 + 458
    # one replica: nothing to shard
    assert all(r.total == state.replica().total for r in memory.zero(state, 1).rows)


def test_stage_one_never_halves_with_adam():
    # S = 2 G: stage 1's limit W + G + 8 stays above half of W + G + S + 8
    state = memory.ModelState(weights=4000, trainable=4000, slots=8000, scalars=8)
    big = memory.zero(state, 10**6)
    assert big.rows[1].total > big.rows[0].total / 2
    assert big.rows[3].total < big.rows[0].total / 1000


def test_tables_check_themselves():
    with pytest.raises(ConfigError, match="bytes"):
        memory.Holding("r", -1, 0, 0)
    with pytest.raises(ConfigError, match="holder name"):
        memory.Holding("", 1, 0, 0)
    with pytest.raises(ConfigError, match="twice"):
        memory.Holdings("t", (memory.Holding("a", 1, 1, 1), memory.Holding("a", 2, 2, 2)))
    with pytest.raises(ConfigError, match="no rows"):
        memory.Holdings("t", ())
    with pytest.raises(ConfigError, match="exceeds"):
        memory.ModelState(weights=1, trainable=2, slots=0, scalars=0)
    table = memory.Holdings("t", (memory.Holding("a<b>", 1024, 0, 0),))
    assert "a&lt;b&gt;" in table._repr_html_() and "1,024" in str(table)
    with pytest.raises(KeyError):
        table.row("nobody")


def test_short_device_names():
    assert memory.short_device("/job:ps/replica:0/task:1/device:CPU:0") == "ps:1 CPU:0"
    assert memory.short_device("/job:localhost/replica:0/task:0/device:CPU:1") == "CPU:1"
    assert memory.short_device("/device:GPU:0") == "GPU:0"


# -- real variables -----------------------------------------------------------------------------


def _params(model) -> tuple[int, int]:
    return model.count_params(), int(sum(np.prod(v.shape) for v in model.trainable_weights))


@pytest.mark.parametrize("build", [models.mnist_cnn, models.small_resnet])
def test_one_replica_with_adam_holds_four_bytes_twice_and_eight(build):
    model = build(seed=0)
    P, T = _params(model)
    state = memory.ModelState.of(model, keras().optimizers.Adam())
    assert (state.weights, state.trainable, state.slots, state.scalars) == (4 * P, 4 * T, 8 * T, 8)
    if build is models.small_resnet:  # batch norm's moving statistics: weights, not trainable
        assert P > T


def test_sgd_keeps_a_slot_per_weight_even_without_momentum_and_legacy_does_not():
    model = models.mnist_cnn(seed=0)
    _, T = _params(model)
    opt = keras().optimizers
    assert memory.ModelState.of(model, opt.SGD()).slots == 4 * T  # tf-keras' SGD.build
    assert memory.ModelState.of(model, opt.SGD(momentum=0.9)).slots == 4 * T
    legacy = opt.legacy.SGD()
    zeros = [np.zeros(v.shape, np.float32) for v in model.trainable_weights]
    legacy.apply_gradients(zip(zeros, model.trainable_weights, strict=True))
    assert memory.nbytes(legacy.variables()) == 8


def test_by_device_of_plain_variables():
    model = models.mnist_cnn(seed=0)
    sizes = memory.by_device(model.weights)
    assert sum(sizes.values()) == 4 * model.count_params()
    assert all(memory.components(v) == [v] for v in model.weights)


# A fresh interpreter: two logical CPUs must be made before TensorFlow starts, and the
# parameter-server cluster renames this process's devices (it must come last).
LAYOUTS = textwrap.dedent(
    """
    import json
    import numpy as np
    import ddlkit as dk
    import tensorflow as tf
    from ddlkit.lessons import memory

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    out = {"params": dk.models.mnist_cnn(seed=0).count_params()}

    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = dk.models.mnist_cnn(seed=0)
        adam = tf.keras.optimizers.Adam()
        adam.build(model.trainable_weights)

    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(y, logits, True)
            loss = tf.nn.compute_average_loss(per_example)
        return tape.gradient(loss, model.trainable_weights)

    x, y = tf.zeros((4, 28, 28, 1)), tf.zeros((4,), tf.int64)
    grads = strategy.run(step, args=(x, y))
    local = [g for grad in grads for g in strategy.experimental_local_results(grad)]
    out["mirrored"] = [memory.by_device(model.weights), memory.by_device(local),
                       memory.by_device(adam.variables)]

    with tf.device(devices[0]):
        stage0 = tf.keras.Sequential([tf.keras.layers.Conv2D(32, 3), tf.keras.layers.Flatten()])
        stage0.build((None, 28, 28, 1))
    with tf.device(devices[1]):
        stage1 = tf.keras.Sequential([tf.keras.layers.Dense(10)])
        stage1.build((None, 26 * 26 * 32))
    split_adam = tf.keras.optimizers.Adam()
    split_adam.build(stage0.trainable_weights + stage1.trainable_weights)
    out["split"] = [[stage0.count_params(), stage1.count_params()],
                    memory.by_device(stage0.weights + stage1.weights),
                    memory.by_device(split_adam.variables),
                    memory.short_device(split_adam.iterations.device)]

    ports = dk.cluster.ports.free_ports(3)
    cluster = tf.train.ClusterSpec({"worker": [f"localhost:{ports[0]}"],
                                    "ps": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"]})
    servers = [tf.distribute.Server(cluster, job_name=j, task_index=i, protocol="grpc")
               for j, n in (("worker", 1), ("ps", 2)) for i in range(n)]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=2)
    ps = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner)
    with ps.scope():
        ps_model = dk.models.mnist_cnn(seed=0)
        ps_adam = tf.keras.optimizers.Adam()
        ps_adam.build(ps_model.trainable_weights)
    kernel = ps_model.get_layer("dense").kernel
    out["ps"] = [memory.by_device(ps_model.weights), memory.by_device(ps_adam.variables),
                 memory.short_device(ps_adam.iterations.device),
                 [list(c.shape) for c in memory.components(kernel)], type(kernel).__name__,
                 tf.distribute.experimental.partitioners.MinSizePartitioner(
                     min_shard_bytes=256 << 10, max_shards=4)(kernel.shape, kernel.dtype)]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def layouts() -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", LAYOUTS],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_mirrored_replica_holds_a_whole_replica(layouts):
    P = layouts["params"]
    weights, grads, adam = layouts["mirrored"]
    assert weights == {"CPU:0": 4 * P, "CPU:1": 4 * P}
    assert grads == {"CPU:0": 4 * P, "CPU:1": 4 * P}
    assert adam == {"CPU:0": 8 * P + 8, "CPU:1": 8 * P + 8}


@pytest.mark.slow
def test_each_stage_device_holds_its_stage_and_its_slots(layouts):
    (p0, p1), weights, adam, counter = layouts["split"]
    assert weights == {"CPU:0": 4 * p0, "CPU:1": 4 * p1}
    assert adam == {
        "CPU:0": 8 * p0 + (8 if counter == "CPU:0" else 0),
        "CPU:1": 8 * p1 + (8 if counter == "CPU:1" else 0),
    }


@pytest.mark.slow
def test_ps_tasks_hold_the_shards_and_their_slots_and_workers_nothing(layouts):
    P = layouts["params"]
    weights, adam, counter, shards, kind, wider = layouts["ps"]
    assert kind == "ShardedVariable" and shards == [[800, 128], [800, 128]]
    # 1600 x 128 float32 is 3.125 x 256 KiB: MinSizePartitioner rounds up (4 shards of
    # 200 KiB, each below min_shard_bytes), as notebook 04b says, and max_shards caps it
    assert wider == [4, 1]
    assert set(weights) == set(adam) == {"ps:0 CPU:0", "ps:1 CPU:0"}
    assert sum(weights.values()) == 4 * P
    for task, w in weights.items():
        assert adam[task] == 2 * w + (8 if task == counter else 0)
