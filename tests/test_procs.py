"""ddlkit.procs on real processes: a tree of sleeping children, some of it pruned."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ddlkit.procs import alive, descendants, pids_with_env

# A child that starts a grandchild, prints its pid, then sleeps: a two-level tree.
TREE = (
    "import subprocess, sys, time\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(g.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _tree():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


def _end(*procs):
    for proc, grandchild in procs:
        os.kill(grandchild, 9)
        proc.kill()
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while any(alive(g) for _, g in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_descendants_follow_the_tree_and_prune_whole_subtrees():
    kept, pruned = _tree(), _tree()
    try:
        found = dict(descendants(os.getpid()))
        assert {kept[0].pid, kept[1], pruned[0].pid, pruned[1]} <= set(found)
        assert "time.sleep(60)" in found[kept[1]]
        order = list(found)
        assert order.index(kept[0].pid) < order.index(kept[1])  # parents first

        left = {pid for pid, _ in descendants(os.getpid(), prune=[pruned[0].pid])}
        assert {kept[0].pid, kept[1]} <= left
        assert not {pruned[0].pid, pruned[1]} & left  # the pruned child and its own
    finally:
        _end(kept, pruned)


def test_pids_with_env_finds_the_tagged_processes_and_not_their_zombies():
    tag = f"t{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "DDLKIT_PROCS_TEST": tag}
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    tagged = [subprocess.Popen(sleeper, env=env) for _ in range(2)]
    other = subprocess.Popen(sleeper, env={**env, "DDLKIT_PROCS_TEST": tag + "x"})
    try:
        assert sorted(pids_with_env("DDLKIT_PROCS_TEST", tag)) == sorted(p.pid for p in tagged)
        tagged[0].kill()
        deadline = time.monotonic() + 10
        while alive(tagged[0].pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # killed but not yet reaped: a zombie, which the search leaves out
        assert pids_with_env("DDLKIT_PROCS_TEST", tag) == [tagged[1].pid]
        assert pids_with_env("DDLKIT_PROCS_TEST", "nobody") == []
    finally:
        for p in [*tagged, other]:
            p.kill()
            p.wait()
