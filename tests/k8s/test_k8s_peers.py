"""The bounded wait for Pending peer pods (ddlkit.k8s.peers), on a fake clock and on the
machine's own resolver."""

from __future__ import annotations

import pytest

from ddlkit.errors import ConfigError
from ddlkit.k8s import manifest
from ddlkit.k8s.objects import exec_command
from ddlkit.k8s.peers import PeersPendingError, resolves, wait_for_peers


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_wait_ends_when_the_last_peer_gets_an_address():
    clock = Clock()
    scheduled_at = {"j-1.s": 0.0, "j-2.s": 4.0}  # j-2 is Pending for 4 s
    waited = wait_for_peers(
        "worker-0", ["j-1.s", "j-2.s"], 10, resolve=lambda h: clock.now >= scheduled_at[h],
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert waited == 4.0 and clock.sleeps == [1.0] * 4


def test_a_peer_pending_past_the_wait_is_named_with_the_fix():
    clock = Clock()
    with pytest.raises(PeersPendingError) as info:
        wait_for_peers(
            "chief-0", ["j-1.s", "j-2.s", "j-3.s"], 2.5, resolve=lambda h: h == "j-1.s",
            clock=clock, sleep=clock.sleep,
        )  # fmt: skip
    assert info.value.pending == ["j-2.s", "j-3.s"] and info.value.waited == 2.5
    assert clock.sleeps == [1.0, 1.0, 0.5]  # the last sleep ends at the bound, not past it
    text = str(info.value)
    assert text.startswith("chief-0 waited 2 s for pod(s) j-2, j-3 to get an address")
    assert "kubectl describe pod j-2" in text and "Kueue, JobSet or Volcano" in text


def test_no_wait_checks_once():
    clock = Clock()
    with pytest.raises(PeersPendingError):
        wait_for_peers("w", ["a"], 0, resolve=lambda h: False, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []
    assert wait_for_peers("w", [], 0, resolve=lambda h: False, clock=clock) == 0.0


def test_the_resolver_is_the_machines_own():
    assert resolves("localhost")
    assert not resolves("ghost-0.nowhere.invalid")  # .invalid never resolves (RFC 2606)


def test_the_manifest_puts_the_wait_on_every_pods_command():
    m = manifest("t.py", strategy="multi_worker", workers=2, image="i", peer_wait=90)
    command = exec_command(m.plan)
    assert command[command.index("--peer-wait") + 1] == "90"
    default = exec_command(manifest("t.py", image="i").plan)
    assert default[default.index("--peer-wait") + 1] == "600"


@pytest.mark.parametrize("bad", [-1, float("nan"), "10", True])
def test_a_wait_that_is_not_seconds_is_refused(bad):
    with pytest.raises(ConfigError, match=r"peer_wait=.* is not a number of seconds >= 0"):
        manifest("t.py", image="i", peer_wait=bad)
