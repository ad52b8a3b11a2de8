"""Published scaling results: checks that a model without communication fails.

Sources and setups: ddlkit/scale/runs.py. The tolerance is 10 percentage points of
efficiency for one run, 5 for every size of a series (test_trends.py); a setup the model
misses must say which assumption fails, and only those may miss. Every number a run is built
from is the source's (images/s, GPUs, network).
"""

from __future__ import annotations

import pytest

from ddlkit.errors import ConfigError
from ddlkit.scale import published, runs
from ddlkit.scale.hardware import BANDWIDTH_SHARE, STEP_JITTER, SUSTAINED_SHARE, TCP_STREAM
from ddlkit.scale.predict import DEFAULT_OVERLAP, FUSION_BYTES
from ddlkit.scale.timeline import HOROVOD_CYCLE_TIME

CHECKS = published.check()
MISSES: set[str] = set()  # every run within 10 points (Inception V3 over TCP at 64: +9.8)


def test_the_assumptions_are_the_stated_ones():
    assert (SUSTAINED_SHARE, DEFAULT_OVERLAP, published.TOLERANCE) == (0.5, None, 0.10)
    assert (BANDWIDTH_SHARE, TCP_STREAM, STEP_JITTER) == (0.85, 15e9 / 8, 0.03)
    assert (HOROVOD_CYCLE_TIME, FUSION_BYTES, published.TREND_TOLERANCE) == (5e-3, 2**26, 0.05)


@pytest.mark.parametrize("key", [s.key for s in runs.SETUPS if s.key not in MISSES])
def test_published_efficiency_is_predicted_within_10_points(key):
    c = CHECKS[key]
    assert abs(c.predicted - c.setup.published) <= 0.10, (key, c.predicted, c.setup.published)


def test_only_setups_with_a_stated_reason_miss():
    missed = {c.setup.key for c in CHECKS if not c.within}
    assert missed == MISSES
    assert all(CHECKS[k].setup.known_miss for k in missed)
    assert CHECKS.hits == len(runs.SETUPS) - len(MISSES)


def test_a_model_without_communication_fails_at_least_half_of_the_checks():
    free = published.ignoring_communication()
    assert all(c.predicted == 1.0 for c in free)
    failed = len(free) - free.hits
    assert failed >= len(free) / 2, failed
    card = published.scorecard()
    hits = card.hits()
    assert hits["dk.scale"] - hits["no communication"] >= 6, hits
    assert hits["full overlap"] < hits["dk.scale"], hits  # hiding it all is not the answer
    assert "<table>" in card._repr_html_() and "within 10 points" in str(card)


def test_the_discriminating_kinds_are_all_there():
    by = {s.key: s for s in runs.SETUPS}
    ps = [s for s in runs.SETUPS if s.algorithm == "ps"]
    assert len(ps) >= 4 and all(s.inter is None and s.node == "p2.8xlarge" for s in ps)  # 10 GbE
    assert any(s.batch == 32 for s in ps)  # small per-GPU batches
    assert by["horovod-512-vgg16"].published == 0.68
    tcp = [s for s in runs.SETUPS if s.inter in ("25GbE", "40GbE")]
    assert len(tcp) == 6
    # each of these is far from 90%: where communication, not compute, decides
    far = [s for s in runs.SETUPS if s.published < 0.85]
    assert len(far) >= 7, [s.key for s in far]


def test_compute_comes_from_published_single_gpu_rates_where_they_exist():
    for s in runs.SETUPS:
        if s.key.startswith(("horovod", "tf-")):
            assert s.rate and s.rate_source, s.key
            # the run's step is the source's batch / images/s, not a FLOP count
            hw = s.hardware()
            step = s.spec().train_flops / hw.accelerator.sustained_flops
            assert step == pytest.approx(s.batch / s.rate)
        else:
            assert s.rate is None and "FLOPs" in s.compute_from
    # VGG-16's published rate is more than twice what its FLOPs at half of peak give
    vgg = CHECKS["horovod-512-vgg16"].setup
    by_flops = published.Setup(**{**vgg.__dict__, "rate": None}).hardware()
    flops_step = vgg.spec().train_flops / by_flops.accelerator.sustained_flops
    assert flops_step > 2 * vgg.batch / vgg.rate


def test_published_efficiencies_are_the_sources_images_per_second():
    assert CHECKS["horovod-16-tcp-vgg16"].setup.published == pytest.approx(1308.7 / (16 * 130.9))
    assert CHECKS["tf-64-k80-resnet50-b32"].setup.published == pytest.approx(2315 / (64 * 48.4))
    goyal = CHECKS["goyal-256-resnet50"].setup
    assert (goyal.base, goyal.workers, goyal.published) == (8, 256, 0.90)


def test_sensitivity_moves_only_flop_counted_runs_with_the_share():
    s = published.sensitivity(shares=(0.4, 0.6), overlaps=(0.5,))
    for setup, (low, high) in s.table:
        if setup.rate is not None:
            assert low == pytest.approx(high), setup.key
        else:
            assert low != pytest.approx(high), setup.key
    s = published.sensitivity(shares=(0.5,), overlaps=(None, 1.0))
    for setup, (default, perfect) in s.table:
        assert default == pytest.approx(CHECKS[setup.key].predicted)
        assert perfect >= default
    assert s.hits()[0] == CHECKS.hits
    assert "<table>" in s._repr_html_()


def test_a_setup_checks_itself():
    from dataclasses import replace

    good = CHECKS["goyal-256-resnet50"].setup
    with pytest.raises(ConfigError, match="published=90"):
        replace(good, published=90)
    with pytest.raises(ConfigError, match="base=512"):
        replace(good, base=512)
    with pytest.raises(ConfigError, match="rate=0"):
        replace(good, rate=0)
    with pytest.raises(ConfigError, match="unknown node preset 'DGX-1'"):
        replace(good, node="DGX-1")
    with pytest.raises(ConfigError, match="algorithm='gossip'"):
        replace(good, algorithm="gossip")


def test_a_setup_of_your_own_is_checked_like_the_others():
    mine = published.Setup(
        "mine", "resnet50", 32, "DGX-A100", 64, 8, "hierarchical", 0.9, "my paper, Table 2"
    )
    res = published.check(runs.SETUPS + (mine,))
    assert len(res) == len(runs.SETUPS) + 1 and res["mine"].predicted > 0
    assert published.SETUPS is runs.SETUPS
    # servers of your own: a Hardware instead of a preset's name
    from ddlkit.scale import hardware

    dgx1 = hardware("P100", per_node=8, intra="NVLink1", inter="IB-EDR", nics=4)
    own = published.Setup("own", "vgg16", 32, dgx1, 8, 1, "ring", 0.71, "x", rate=144)
    assert own.machine() is dgx1 and "8/server" in str(published.check((own,)))
