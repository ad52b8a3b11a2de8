"""ddlkit.scale.predict and .sweep: one step, term by term, computed by hand."""

from __future__ import annotations

import pytest

from ddlkit.scale import Accelerator, Hardware, Link, ModelSpec, curve, predict, presets

# 1e6 params (4 MB fp32), 1 GFLOP forward per example, batch 10 -> 3e10 FLOPs per step
SPEC = ModelSpec("hand", 1e6, 1e9, 10, tensors=5)
CHIP = Accelerator("1 TFLOP/s", 1e12, 16e9)  # compute 0.03 s, backward 0.02 s
NET = Link("1 GB/s", 1e9, 0.0)


def hw(per_node=1, link=NET):
    # jitter 0: these tests check the one-page formula's terms, without the straggler's wait
    return Hardware(CHIP, per_node, link, link, jitter=0.0)


def test_ring_step_is_compute_plus_the_half_of_communication_not_hidden():
    p = predict(SPEC, hw(), 2, overlap=0.5)  # ring of 2: 2*1/2 * 4 MB / 1 GB/s = 4 ms
    assert p.compute == pytest.approx(0.03)
    assert p.communication == pytest.approx(0.004)
    assert p.hidden == pytest.approx(0.002)  # overlap 0.5 of 4 ms, < 20 ms of backward
    assert p.step == pytest.approx(0.032)
    assert p.efficiency == pytest.approx(0.03 / 0.032)
    assert p.throughput == pytest.approx(2 * 10 / 0.032)
    assert p.speedup == pytest.approx(2 * 0.03 / 0.032)


def test_one_worker_has_nothing_to_communicate():
    p = predict(SPEC, hw(), 1)
    assert (p.communication, p.efficiency) == (0.0, 1.0)


def test_hidden_communication_is_capped_by_the_backward_pass():
    p = predict(SPEC, hw(), 64, overlap=1.0)  # 2*63/64*4 MB -> 7.875 ms < 20 ms: all hidden
    assert p.exposed == pytest.approx(0.0) and p.efficiency == pytest.approx(1.0)
    slow = Link("10 MB/s", 1e7, 0.0)
    p = predict(SPEC, hw(link=slow), 2, overlap=1.0)  # 0.4 s of comm, 0.02 s hidden
    assert p.hidden == pytest.approx(0.02) and p.exposed == pytest.approx(0.38)
    assert predict(SPEC, hw(link=slow), 2, overlap=0.0).exposed == pytest.approx(0.4)


def test_fp16_compression_halves_the_bytes():
    p = predict(SPEC, hw(), 2, compression="fp16", overlap=0.0)
    assert p.communication == pytest.approx(0.002)


def test_tensor_fusion_sets_how_many_latencies_are_paid():
    link = Link("1 GB/s, 100 us", 1e9, 1e-4)
    # ring of 2: 2 latencies per buffer. 4 MB in 1 MB buffers: 4 buffers -> 0.8 ms
    fused = predict(SPEC, hw(link=link), 2, fusion_bytes=1e6, overlap=0.0)
    assert fused.communication == pytest.approx(0.004 + 2 * 1e-4 * 4)
    # no fusion: one all-reduce per gradient tensor (5)
    each = predict(SPEC, hw(link=link), 2, fusion_bytes=None, overlap=0.0)
    assert each.communication == pytest.approx(0.004 + 2 * 1e-4 * 5)


def test_hierarchical_uses_the_bus_inside_a_node_and_the_network_across():
    bus = Link("10 GB/s", 1e10, 0.0)
    p = predict(SPEC, Hardware(CHIP, 4, bus, NET), 8, "hierarchical", overlap=0.0)
    # inside 4: 2*3/4 * 4 MB / 10 GB/s = 0.6 ms; across 2 nodes: 2*1/2 * 4 MB / 1 GB/s = 4 ms
    assert p.communication == pytest.approx(0.0006 + 0.004)


def test_synchronous_parameter_server_pushes_and_pulls():
    p = predict(SPEC, hw(), 4, "ps", servers=2, overlap=0.0)
    # 4 workers, 2 servers: each server gets 4 * 4 MB / 2 = 8 MB each way: 2 * 8 ms
    assert p.communication == pytest.approx(0.016)
    assert p.step == pytest.approx(0.046)


def test_async_parameter_server_has_no_barrier_and_staleness_n_minus_1():
    p = predict(SPEC, hw(), 4, "async_ps", servers=4)
    # each worker loops 30 ms + push/pull 2 * 4 MB / 1 GB/s = 38 ms; servers take 4 x
    # 1 GB/s / 4 MB = 1000 updates/s, more than 4 / 0.038 = 105: workers set the rate
    assert p.staleness == 3
    assert p.step == pytest.approx(0.038)
    assert p.efficiency == pytest.approx(0.03 / 0.038)
    capped = predict(SPEC, hw(), 64, "async_ps", servers=1)
    # 64 workers would make 64 / 0.038 = 1684 updates/s; one server takes 1 GB/s / 4 MB
    assert capped.step == pytest.approx(64 / 250)


def test_curve_finds_where_communication_overtakes_compute():
    slow = Link("100 MB/s", 1e8, 0.0)
    c = curve(SPEC, hw(link=slow), [1, 2, 4, 8], overlap=0.0)
    # ring: 2(n-1)/n * 4 MB / 100 MB/s = 40, 60, 70 ms for n = 2, 4, 8: >= 30 ms from n=2
    assert c.dominates_at == 2
    assert c.workers == (1, 2, 4, 8)
    assert c.efficiency[1] == pytest.approx(0.03 / 0.07)
    assert curve(SPEC, hw(), [1, 2, 1024], overlap=0.0).dominates_at is None


def test_tables_render():
    p = predict(SPEC, hw(), 2)
    assert "timeline" in str(p) and "<table>" in str(
        predict(SPEC, hw(), 2, overlap=0.5)._repr_html_()
    )
    assert "<table>" in p._repr_html_() and "efficiency" in str(p)
    assert "<table>" in curve(SPEC, hw(), [1, 2])._repr_html_()
    assert "<table>" in hw()._repr_html_() and "<table>" in SPEC._repr_html_()
    assert presets()._repr_html_().count("<table>") == 2


def test_a_parameter_server_hides_at_most_its_push_the_pull_feeds_the_next_forward():
    p = predict(SPEC, hw(), 4, "ps", servers=2, overlap=1.0)
    # 16 ms of push and pull; only the 8 ms push can leave during the 20 ms backward pass
    assert p.hidden == pytest.approx(0.008) and p.exposed == pytest.approx(0.008)
    ring = predict(SPEC, hw(), 4, "ring", overlap=1.0)
    assert ring.exposed == pytest.approx(0.0)  # an all-reduce can hide it all


def test_node_summed_parameter_server_pushes_once_per_node():
    bus = Link("bus", 1e10, 0.0)
    h = Hardware(CHIP, 4, bus, NET)
    p = predict(SPEC, h, 8, "ps", servers=2, node_sum=True, overlap=0.0)
    # inside 4: 2*3/4 * 4 MB / 10 GB/s = 0.6 ms; 2 nodes, 2 servers: 4 MB each way
    assert p.communication == pytest.approx(0.0006 + 2 * 0.004)
    each = predict(SPEC, h, 8, "ps", servers=2, overlap=0.0)  # every GPU pushes: 4 x 4 MB
    assert each.communication == pytest.approx(2 * 0.016)


def test_without_fusion_every_gradient_tensor_pays_its_latency():
    link = Link("1 GB/s, 100 us", 1e9, 1e-4)
    fused = predict(SPEC, hw(link=link), 8, overlap=0.0)
    unfused = predict(SPEC, hw(link=link), 8, fusion_bytes=None, overlap=0.0)
    # ring of 8: 14 latencies per buffer; 1 fused buffer against SPEC's 5 tensors
    assert unfused.communication - fused.communication == pytest.approx(14 * 1e-4 * 4)


def test_the_binary_tree_is_an_algorithm_too():
    tree = predict(SPEC, hw(), 8, "tree", overlap=0.0)
    single = predict(SPEC, hw(), 8, "binary_tree", overlap=0.0)
    assert single.communication == pytest.approx(tree.communication * 3 / 2)
