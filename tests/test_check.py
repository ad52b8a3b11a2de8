"""dk.check: each check passes a right answer and names what is wrong in a wrong one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddlkit import check
from ddlkit.check import CheckFailed


def test_close_passes_within_tolerance_and_names_the_gap():
    assert "as expected" in str(check.close(2.01, 2.0, what="the ratio", rel=0.01))
    with pytest.raises(
        CheckFailed, match=r"the ratio is 2.5, expected 2 \(within 1%\); off by \+0.5"
    ):
        check.close(2.5, 2.0, what="the ratio", rel=0.01)
    with pytest.raises(CheckFailed, match="should be a number, got 'two'"):
        check.close("two", 2.0, what="the ratio")
    with pytest.raises(CheckFailed, match="Hint: halve it"):
        check.close(4, 2, what="x", abs=0.1, hint="Hint: halve it")


def test_between_and_equal_say_which_side_and_what_was_expected():
    assert check.between(0.5, 0, 1, what="share")
    with pytest.raises(CheckFailed, match=r"above the expected range \[0, 1\]"):
        check.between(1.5, 0, 1, what="share")
    with pytest.raises(CheckFailed, match="placement is 'ps-1', expected 'ps-0'"):
        check.equal("ps-1", "ps-0", what="placement")


def test_arrays_close_names_the_worst_element_and_shape_mismatch():
    a = np.zeros((2, 3))
    b = a.copy()
    b[1, 2] = 0.5
    with pytest.raises(CheckFailed, match=r"1 of 6 elements differ; the worst at index \(1, 2\)"):
        check.arrays_close(a, b, what="the gradient")
    with pytest.raises(CheckFailed, match=r"shape \(2, 3\), expected \(3, 2\)"):
        check.arrays_close(a, a.T, what="the gradient")
    assert "all 6 elements" in str(check.arrays_close(a, a.copy(), what="g"))


def test_same_weights_names_the_array_that_differs():
    w = [np.ones(3), np.zeros(2)]
    assert check.same_weights(w, [x.copy() for x in w])
    with pytest.raises(CheckFailed, match="array 1"):
        check.same_weights(w, [np.ones(3), np.ones(2)])
    with pytest.raises(CheckFailed, match="2 weight arrays against 1"):
        check.same_weights(w, w[:1])


def _cfgs(cluster, tasks):
    return [json.dumps({"cluster": cluster, "task": {"type": t, "index": i}}) for t, i in tasks]


def test_tf_config_accepts_one_job_and_rejects_each_kind_of_mistake():
    cluster = {"worker": ["10.0.0.1:29600", "10.0.0.2:29600"]}
    good = _cfgs(cluster, [("worker", 0), ("worker", 1)])
    assert "2 TF_CONFIGs" in str(check.tf_config(good, hosts=["10.0.0.1", "10.0.0.2"]))
    with pytest.raises(CheckFailed, match="both task worker:0"):
        check.tf_config(_cfgs(cluster, [("worker", 0), ("worker", 0)]))
    with pytest.raises(CheckFailed, match="1 TF_CONFIGs for a cluster of 2"):
        check.tf_config(good[:1])
    other = {"worker": ["10.0.0.1:29600", "10.0.0.2:29601"]}
    with pytest.raises(CheckFailed, match="TF_CONFIG 1's cluster"):
        check.tf_config([good[0], _cfgs(other, [("worker", 1)])[0]])
    local = {"worker": ["localhost:29600", "localhost:29601"]}
    with pytest.raises(CheckFailed, match="not on one of the hosts"):
        check.tf_config(_cfgs(local, [("worker", 0), ("worker", 1)]), hosts=["10.0.0.1"])
    assert check.tf_config(_cfgs(local, [("worker", 0), ("worker", 1)]))
    with pytest.raises(CheckFailed, match="index 2 is outside 'worker'"):
        check.tf_config(_cfgs(cluster, [("worker", 0), ("worker", 2)]))
    with pytest.raises(CheckFailed, match="not valid JSON"):
        check.tf_config(["{cluster"])
    with pytest.raises(CheckFailed, match="no 'task' key"):
        check.tf_config([{"cluster": cluster}])
    with pytest.raises(CheckFailed, match="is not host:port"):
        check.tf_config(_cfgs({"worker": ["10.0.0.1"]}, [("worker", 0)]))
