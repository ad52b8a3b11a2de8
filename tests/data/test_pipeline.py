"""ddlkit.data.pipeline: sharding, batching, scaling and shuffling on real tf.data pipelines.

Every image carries its own index in two pixels, so a test can tell exactly
which examples a pipeline yielded, and in which order.
"""

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
from ddlkit.backend import tf
from ddlkit.cluster.ports import free_ports
from ddlkit.data import pipeline as pl
from ddlkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def indexed(n: int, shape: tuple[int, ...] = (28, 28)) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images whose pixels [0, 0] and [0, 1] spell their index; labels i % 10."""
    x = np.zeros((n, *shape), dtype=np.uint8)
    x[:, 0, 0] = np.arange(n) // 256
    x[:, 0, 1] = np.arange(n) % 256
    x[:, -1, -1] = 255  # so every image reaches the top of the range
    return x, (np.arange(n) % 10).astype(np.uint8)


def decode(images: np.ndarray) -> list[int]:
    """Indices back from normalised float images of shape (B, H, W, C)."""
    hi = np.rint(images[:, 0, 0, 0] * 255).astype(int)
    lo = np.rint(images[:, 0, 1, 0] * 255).astype(int)
    return (hi * 256 + lo).tolist()


def epoch(ds) -> tuple[list[int], list[int]]:
    """(indices in order, batch sizes) of one pass over ``ds``."""
    indices: list[int] = []
    sizes: list[int] = []
    for images, labels in ds.as_numpy_iterator():
        got = decode(images)
        assert labels.tolist() == [i % 10 for i in got], "labels travel with their images"
        indices += got
        sizes.append(len(got))
    return indices, sizes


# -- pure helpers -----------------------------------------------------------------------------


def test_global_batch_size_multiplies_and_validates():
    assert pl.global_batch_size(64, 4) == 256
    assert pl.global_batch_size(1, 1) == 1
    for bad in [(0, 2), (64, 0), (-1, 2), (64, True), (2.5, 2)]:
        with pytest.raises(ConfigError, match="Fix:"):
            pl.global_batch_size(*bad)


def test_steps_per_epoch_counts_full_global_batches():
    assert pl.steps_per_epoch(60000, 256) == 234
    assert pl.steps_per_epoch(512, 256) == 2
    with pytest.raises(ConfigError, match="global_batch=256"):
        pl.steps_per_epoch(100, 256)


def test_config_rejects_bad_values_with_the_fix():
    with pytest.raises(ConfigError, match="shard_index=3 is outside 0..2"):
        pl.PipelineConfig(batch_size=8, num_shards=3, shard_index=3)
    with pytest.raises(ConfigError, match="batch_size=0"):
        pl.PipelineConfig(batch_size=0)
    with pytest.raises(ConfigError, match="seed='1'"):
        pl.PipelineConfig(batch_size=8, seed="1")
    assert pl.PipelineConfig(batch_size=8, num_shards=3, shard_index=1).shard_size(10) == 3
    html = pl.PipelineConfig(batch_size=8)._repr_html_()
    assert "<table>" in html and "batch_size" in html and "8" in html


# -- make_dataset -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [2, 3])
def test_shards_are_disjoint_and_cover_the_data_exactly_once(num_shards):
    n = 101  # not a multiple of 2 or 3: shards differ in size
    x, y = indexed(n)
    seen = []
    for shard in range(num_shards):
        ds = pl.make_dataset(
            x, y, batch_size=16, num_shards=num_shards, shard_index=shard, shuffle=True, seed=7
        )
        indices, _ = epoch(ds)
        assert len(indices) == len(set(indices)) == len(range(shard, n, num_shards))
        seen.append(set(indices))
    for a in range(num_shards):
        for b in range(a + 1, num_shards):
            assert not seen[a] & seen[b], f"shards {a} and {b} share examples"
    assert set().union(*seen) == set(range(n))


def test_batch_sizes_with_and_without_remainder_and_repeat():
    x, y = indexed(100)
    assert epoch(pl.make_dataset(x, y, batch_size=32))[1] == [32, 32, 32, 4]
    assert epoch(pl.make_dataset(x, y, batch_size=32, drop_remainder=True))[1] == [32, 32, 32]
    repeated = pl.make_dataset(x, y, batch_size=32, repeat=True)
    sizes = [len(labels) for _, labels in repeated.take(7).as_numpy_iterator()]
    assert sizes == [32] * 7, "a repeated pipeline never yields a short batch"


def test_images_are_float32_in_unit_range_with_a_channel_axis_and_labels_flat_int64():
    x, y = indexed(40)
    images, labels = next(iter(pl.make_dataset(x, y, batch_size=40, shuffle=False)))
    assert images.dtype == tf().float32 and images.shape == (40, 28, 28, 1)
    assert float(tf().reduce_min(images)) == 0.0 and float(tf().reduce_max(images)) == 1.0
    assert labels.dtype == tf().int64 and labels.shape == (40,)

    # CIFAR-10 layout: (N, 32, 32, 3) images, labels of shape (N, 1).
    rng = np.random.default_rng(0)
    cx = rng.integers(0, 256, size=(20, 32, 32, 3), dtype=np.uint8)
    cy = rng.integers(0, 10, size=(20, 1), dtype=np.uint8)
    images, labels = next(iter(pl.make_dataset(cx, cy, batch_size=20, shuffle=False)))
    assert images.shape == (20, 32, 32, 3)
    np.testing.assert_allclose(images.numpy(), cx / 255.0, rtol=1e-6)
    assert labels.numpy().tolist() == cy.ravel().tolist()


def test_normalize_false_keeps_raw_pixels():
    x, y = indexed(10)
    images, _ = next(iter(pl.make_dataset(x, y, batch_size=10, shuffle=False, normalize=False)))
    assert images.dtype == tf().uint8 and images.shape == (10, 28, 28, 1)
    np.testing.assert_array_equal(images.numpy()[..., 0], x)


def test_shuffling_changes_order_across_epochs_but_keeps_the_set():
    x, y = indexed(200)
    ds = pl.make_dataset(x, y, batch_size=50, seed=3)
    first, _ = epoch(ds)
    second, _ = epoch(ds)
    assert first != second, "each epoch is reshuffled"
    assert sorted(first) == sorted(second) == list(range(200))
    assert first != list(range(200))
    again, _ = epoch(pl.make_dataset(x, y, batch_size=50, seed=3))
    assert again == first, "the same seed gives the same order"
    other, _ = epoch(pl.make_dataset(x, y, batch_size=50, seed=4))
    assert other != first
    assert epoch(pl.make_dataset(x, y, batch_size=50, shuffle=False))[0] == list(range(200))


def test_repeated_stream_is_a_fresh_permutation_every_epoch():
    x, y = indexed(60)
    ds = pl.make_dataset(x, y, batch_size=20, repeat=True, seed=1)
    stream = [i for images, _ in ds.take(9).as_numpy_iterator() for i in decode(images)]
    epochs = [stream[k : k + 60] for k in (0, 60, 120)]
    assert all(sorted(e) == list(range(60)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_auto_shard_policy_is_off_when_sharded_by_hand():
    x, y = indexed(10)
    policy = tf().data.experimental.AutoShardPolicy

    def policy_of(ds):
        return ds.options().experimental_distribute.auto_shard_policy

    assert policy_of(pl.make_dataset(x, y, batch_size=2, num_shards=2)) == policy.OFF
    assert policy_of(pl.make_dataset(x, y, batch_size=2)) == policy.DATA


def test_kit_pipelines_leave_tf_data_autotuning_off_except_for_parameter_servers():
    x, y = indexed(10)
    horovod = pl.for_horovod(x, y, per_replica_batch=2, rank=0, size=2)
    for ds in (pl.make_dataset(x, y, batch_size=2), horovod):
        assert ds.options().autotune.enabled is pl.AUTOTUNE_MODEL is False
    ps = pl.dataset_fn(x, y, global_batch=2)(tf().distribute.InputContext())
    assert ps.options().autotune.enabled is True


def test_only_mirrored_strategy_on_cpus_gets_a_pipeline_per_replica():
    assert pl.per_replica_input(("CPU",), offered=True)
    assert pl.per_replica_input(("CPU", "CPU"), offered=True)
    # GPUs keep TensorFlow's prefetch to the device; TF has no per-replica input for MWMS.
    assert not pl.per_replica_input(("GPU", "GPU"), offered=True)
    assert not pl.per_replica_input(("CPU", "GPU"), offered=True)
    assert not pl.per_replica_input(("CPU",), offered=False)


def test_bad_data_is_refused_naming_the_fix():
    x, y = indexed(10)
    with pytest.raises(ConfigError, match="10 examples cannot be split into num_shards=11"):
        pl.make_dataset(x, y, batch_size=2, num_shards=11, shard_index=0)
    with pytest.raises(ConfigError, match="drop_remainder=True drops them all"):
        pl.make_dataset(x, y, batch_size=8, num_shards=2, drop_remainder=True)
    with pytest.raises(ConfigError, match="dtype float32"):
        pl.make_dataset(x.astype(np.float32), y, batch_size=2)
    with pytest.raises(ConfigError, match=r"y has shape \(9,\)"):
        pl.make_dataset(x, y[:9], batch_size=2)
    with pytest.raises(ConfigError, match="expected images"):
        pl.make_dataset(x.reshape(10, -1), y, batch_size=2)
    with pytest.raises(ConfigError, match="not one-hot"):
        pl.make_dataset(x, y.astype(np.float32), batch_size=2)


# -- Horovod and ParameterServerStrategy ------------------------------------------------------


def test_for_horovod_gives_each_rank_its_own_shard_and_repeats():
    x, y = indexed(30)
    size = 3
    firsts = []
    for rank in range(size):
        ds = pl.for_horovod(x, y, per_replica_batch=5, rank=rank, size=size, seed=0)
        stream = [i for images, _ in ds.take(4).as_numpy_iterator() for i in decode(images)]
        assert set(stream) == set(range(rank, 30, size)), "10 examples, seen twice in 4 batches"
        firsts.append(set(stream))
    assert set().union(*firsts) == set(range(30))
    with pytest.raises(ConfigError, match="shard_index=3 is outside 0..2"):
        pl.for_horovod(x, y, per_replica_batch=5, rank=3, size=3)


def test_dataset_fn_batches_per_replica_and_never_ends():
    x, y = indexed(40)
    fn = pl.dataset_fn(x, y, global_batch=16)
    context = tf().distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )
    ds = fn(context)
    stream = [decode(images) for images, _ in ds.take(6).as_numpy_iterator()]
    assert [len(b) for b in stream] == [8] * 6, "per-replica batch = 16 / 2"
    assert set(sum(stream, [])) == set(range(40)), "48 examples drawn from 40: it repeats"


def test_dataset_creator_wraps_the_dataset_fn_for_keras():
    x, y = indexed(20)
    creator = pl.dataset_creator(x, y, global_batch=4)
    assert isinstance(creator, tf().keras.utils.experimental.DatasetCreator)
    images, labels = next(iter(creator(tf().distribute.InputContext())))
    assert images.shape == (4, 28, 28, 1) and labels.shape == (4,)


# -- real strategies, in their own processes ---------------------------------------------------


def run_script(source: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    """Run ``source`` with the venv's Python; return the JSON of its last stdout line."""
    proc = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


HELPERS = textwrap.dedent(
    """
    import json
    import numpy as np

    def indexed(n):
        x = np.zeros((n, 28, 28), dtype=np.uint8)
        x[:, 0, 0] = np.arange(n) // 256
        x[:, 0, 1] = np.arange(n) % 256
        return x, (np.arange(n) % 10).astype(np.uint8)

    def decode(images):
        images = np.asarray(images)
        hi = np.rint(images[:, 0, 0, 0] * 255).astype(int)
        lo = np.rint(images[:, 0, 1, 0] * 255).astype(int)
        return (hi * 256 + lo).tolist()
    """
)

MIRRORED = (
    textwrap.dedent(
        """
    # Two logical CPUs must be configured before anything initialises devices.
    import ddlkit
    from ddlkit.backend import tf
    tf_ = tf()
    cpu = tf_.config.list_physical_devices("CPU")[0]
    tf_.config.set_logical_device_configuration(
        cpu, [tf_.config.LogicalDeviceConfiguration()] * 2
    )
    """
    )
    + HELPERS
    + textwrap.dedent(
        """
    from ddlkit.data import pipeline as pl
    from ddlkit import models

    strategy = tf_.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x, y = indexed(80)
    dist = pl.for_strategy(strategy, x, y, per_replica_batch=8, seed=0)
    shapes, indices = [], []
    for images, labels in dist:
        parts = strategy.experimental_local_results(images)
        shapes.append([list(p.shape) for p in parts])
        for p in parts:
            indices += decode(p)
    with strategy.scope():
        model = models.compile_classifier(models.mnist_cnn(seed=0))
    # tf-keras needs steps_per_epoch with a distributed data set, so it repeats.
    train = pl.for_strategy(strategy, x, y, per_replica_batch=8, seed=0, repeat=True)
    steps = pl.steps_per_epoch(len(x), pl.global_batch_size(8, strategy.num_replicas_in_sync))
    history = model.fit(train, epochs=2, steps_per_epoch=steps, verbose=0).history
    options = pl.input_options(strategy)
    # The strategy is left as it was: a data set of its own, without options, gets the
    # default one input pipeline (TensorFlow would keep PER_REPLICA for it otherwise).
    pipelines = []
    def count(ctx):
        pipelines.append([ctx.num_input_pipelines, ctx.input_pipeline_id])
        return tf_.data.Dataset.range(8).batch(ctx.get_per_replica_batch_size(4))
    strategy.distribute_datasets_from_function(count)
    from ddlkit.data import device_iterators
    print(json.dumps({
        "patched": device_iterators.installed(),
        "replicas": strategy.num_replicas_in_sync,
        "mode": options.experimental_replication_mode.value,
        "devices": [p.device[-5:] for p in strategy.experimental_local_results(images)],
        "global": pl.global_batch_size(8, strategy.num_replicas_in_sync),
        "shapes": shapes,
        "indices": indices,
        "losses": history["loss"],
        "pipelines_after": pipelines,
    }))
    """
    )
)


@pytest.mark.slow
def test_for_strategy_under_mirrored_strategy_with_two_cpus():
    out = run_script(MIRRORED)
    assert out["replicas"] == 2 and out["global"] == 16
    # A pipeline per replica, on the replica's own device (pl.input_options).
    assert out["mode"] == "PER_REPLICA" and out["devices"] == ["CPU:0", "CPU:1"]
    assert out["patched"] is False, "no MultiDeviceIterator here, so nothing to patch"
    assert out["shapes"] == [[[8, 28, 28, 1], [8, 28, 28, 1]]] * 5, "80 / 16 = 5 steps"
    assert sorted(out["indices"]) == list(range(80)), "each example once per epoch"
    assert len(out["losses"]) == 2 and np.isfinite(out["losses"]).all(), "model.fit trains on it"
    assert out["pipelines_after"] == [[1, 0]], "for_strategy left PER_REPLICA on the strategy"


MULTI_WORKER = HELPERS + textwrap.dedent(
    """
    import ddlkit
    from ddlkit.backend import tf
    from ddlkit.data import device_iterators, pipeline as pl

    tf_ = tf()
    strategy = tf_.distribute.MultiWorkerMirroredStrategy()
    x, y = indexed(100)
    dist = pl.for_strategy(strategy, x, y, per_replica_batch=8, seed=0)
    sizes, indices = [], []
    for images, labels in dist:
        for p in strategy.experimental_local_results(images):
            sizes.append(int(p.shape[0]))
            indices += decode(p)

    def seen(dist):
        out = []
        for images, labels in dist:
            for p in strategy.experimental_local_results(images):
                out += decode(p)
        return out

    # Data sets handed to experimental_distribute_dataset: TF's auto-sharding
    # must leave the hand-sharded one alone and split the unsharded one.
    task = strategy.cluster_resolver.task_id
    by_hand = pl.make_dataset(x, y, batch_size=8, num_shards=2, shard_index=task, shuffle=False)
    whole = pl.make_dataset(x, y, batch_size=16, shuffle=False)
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "sizes": sizes,
                      "indices": indices, "task": task,
                      "default_input": pl.input_options(strategy) is None,
                      "device_datasets_untuned": device_iterators.installed(),
                      "by_hand": seen(strategy.experimental_distribute_dataset(by_hand)),
                      "whole": seen(strategy.experimental_distribute_dataset(whole))}))
    """
)


@pytest.mark.slow
def test_for_strategy_shards_across_two_multi_worker_processes():
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", MULTI_WORKER],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
            )
        )
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-3000:]
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert [r["replicas"] for r in results] == [2, 2]
    assert all(r["default_input"] for r in results), "one pipeline per worker, TF's default"
    # ... whose per-device data sets the kit keeps from autotuning (ddlkit.data.device_iterators)
    assert all(r["device_datasets_untuned"] for r in results)
    # 50 examples per worker in batches of 8: six full batches and one of 2.
    assert [r["sizes"] for r in results] == [[8] * 6 + [2]] * 2
    a, b = (set(r["indices"]) for r in results)
    assert not a & b, "the two workers read disjoint shards"
    assert a | b == set(range(100))
    assert len(results[0]["indices"]) + len(results[1]["indices"]) == 100
    for r in results:
        assert r["by_hand"] == list(range(r["task"], 100, 2)), "sharded once, not twice"
    a, b = (r["whole"] for r in results)
    assert sorted(a + b) == list(range(100)), "TF splits an unsharded data set by element"


PS_SERVER = textwrap.dedent(
    """
    import ddlkit
    from ddlkit.backend import tf

    tf_ = tf()
    resolver = tf_.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf_.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol="grpc", start=True,
    )
    server.join()  # never returns: the test ends it
    """
)

PS_CHIEF = textwrap.dedent(
    """
    import json
    import numpy as np
    import ddlkit
    from ddlkit import models
    from ddlkit.backend import tf
    from ddlkit.data import pipeline as pl
    from ddlkit.errors import ConfigError

    tf_ = tf()
    resolver = tf_.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf_.distribute.experimental.ParameterServerStrategy(resolver)
    # Learnable images: a fixed template per class plus noise.
    rng = np.random.default_rng(0)
    templates = rng.integers(0, 256, (10, 28, 28))
    y = rng.integers(0, 10, 640)
    noise = rng.integers(0, 256, (640, 28, 28))
    x = np.clip(0.7 * templates[y] + 0.3 * noise, 0, 255).astype(np.uint8)
    try:
        pl.for_strategy(strategy, x, y, per_replica_batch=32)
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    with strategy.scope():
        model = models.compile_classifier(
            models.mnist_cnn(seed=0), optimizer=models.make_optimizer("adam", 3e-3, legacy=True)
        )
    history = model.fit(
        pl.dataset_creator(x, y, global_batch=32), epochs=3, steps_per_epoch=10, verbose=0
    )
    print(json.dumps({"refused": refused, "losses": history.history["loss"]}))
    """
)


@pytest.mark.slow
def test_dataset_creator_trains_under_a_real_parameter_server_cluster():
    chief, worker, ps = (f"127.0.0.1:{port}" for port in free_ports(3))
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}

    def env(task_type: str) -> dict[str, str]:
        task = {"type": task_type, "index": 0}
        return {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}

    servers = [
        subprocess.Popen(
            [sys.executable, "-c", PS_SERVER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
            env=env(task_type),
        )
        for task_type in ("worker", "ps")
    ]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PS_CHIEF],
            capture_output=True,
            text=True,
            timeout=150,
            cwd=REPO,
            env=env("chief"),
        )
    finally:
        for server in servers:  # tf.distribute.Server never exits by itself
            server.kill()
            server.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "dataset_creator(x, y, global_batch=...)" in out["refused"]
    losses = out["losses"]
    assert len(losses) == 3 and np.isfinite(losses).all()
    assert losses[-1] < losses[0], f"the PS cluster trains on the pipeline: {losses}"
