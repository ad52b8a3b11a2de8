"""One synchronous step as Horovod and NCCL run it: the backward pass hands gradients over as it
produces them; a background loop all-reduces whatever is ready, cycle after cycle (pure).

    t = timeline(dk.scale.model("vgg16"), hw, 512, Algorithm("ring"))
    t.end, t.calls, t.communication      # seconds from the backward pass's start; all-reduces

This is what :func:`ddlkit.scale.predict` runs by default (``overlap=None``). Every constant
is a library's own default or its own cost model, or a stated assumption:

- **The loop.** Horovod's background thread wakes every :data:`HOROVOD_CYCLE_TIME`, takes the
  gradients every rank has ready, packs them into fusion buffers of at most ``fusion_bytes``
  (a larger tensor goes alone) and runs the all-reduces one after another before its next cycle
  (``docs/tensor-fusion.rst``: "Repeat until there are no more tensors to reduce in this
  cycle"). ``cycle_time_ms = 5`` and ``tensor_fusion_threshold = 64 MiB`` are the defaults of
  ``HorovodGlobalState`` in ``horovod/common/operations.cc`` of the Horovod of the published
  runs (Horovod 0.28 wakes every 1 ms and fuses 128 MiB: ``BackgroundThreadLoop``).
- **When a gradient is ready.** The model's profile (:mod:`ddlkit.scale.gradients`): the share
  of the backward pass done when each gradient exists. Communication that runs while the
  backward pass runs is hidden; what is still running when it ends is exposed. This is the
  overlap, computed: VGG-16's dense layers (89% of its bytes) are ready in its first per cent,
  ResNet's bytes come spread over the whole pass.
- **One all-reduce call** of ``b`` bytes: NCCL's own cost model (``src/graph/tuning.cc`` of
  NVIDIA/nccl, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``), ``latency + b / bw``. A ring
  over ``n`` GPUs in ``m`` nodes pays :data:`NCCL_BASE_LATENCY` plus one hop latency for each
  of its ``2(n-1)`` steps, ``2(m-1)`` of them across the network (at least
  :data:`NCCL_NET_HOP` each: NCCL's figure for a network step of its ring), the rest inside a
  node; over several nodes, for large messages, NCCL multiplies that latency by
  :data:`NCCL_PLATEAU` (its "plateau effect of ring"). The double binary tree pays
  ``2((g-1) + log2 m)`` hops. The bytes: the algorithm's formula (:mod:`ddlkit.scale.comm`)
  at the links' *achieved* bandwidth: :data:`BANDWIDTH_SHARE` of line rate, and over a link
  with a per-connection limit (kernel TCP: :attr:`Link.stream`) at most that per port.
  Across nodes a ring runs at its slowest link, the node's way out
  (:attr:`~ddlkit.scale.hardware.Hardware.node_link`), shared by the node's GPUs.
- **A parameter server** (``ps``) sends each gradient as soon as it is ready (TensorFlow's
  send ops need no cycle) and pulls every parameter after the last push, before the next
  forward pass: the pull is never hidden.

What it leaves out is listed, with how far it moves a prediction, by
:func:`ddlkit.scale.sensitivity`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ddlkit.scale import comm
from ddlkit.scale.hardware import BANDWIDTH_SHARE, Hardware, Link

HOROVOD_CYCLE_TIME = 5e-3  # s; horovod/common/operations.cc, HorovodGlobalState.cycle_time_ms
NCCL_BASE_LATENCY = 8.4e-6  # s; NCCL src/graph/tuning.cc, baseLat[Ring][Simple]
NCCL_NET_HOP = 9.6e-6  # s; NCCL src/graph/tuning.cc, hwLat[NET][Ring][Simple]
NCCL_PLATEAU = 1.9  # NCCL src/graph/tuning.cc, ncclTopoGetAlgoTime: ring over nodes, large
NCCL_PLATEAU_BYTES = 65536 / 16  # ... from n x this many bytes (ncclTopoGetAlgoTime)


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def achieved(link: Link, ports: int = 1, share: float = BANDWIDTH_SHARE) -> Link:
    """``link`` (``ports`` of it) at the bandwidth an all-reduce reaches: ``share`` of line
    rate, and at most :attr:`Link.stream` per port; no latency (the hops carry it)."""
    bandwidth = share * ports * link.bandwidth
    if link.stream is not None:
        bandwidth = min(bandwidth, ports * link.stream)
    return replace(link, bandwidth=bandwidth, latency=0.0)


def hops(kind: str, n: int, hardware: Hardware, nbytes: float, across: str = "ring") -> float:
    """Seconds of latency one all-reduce call pays: NCCL's base plus each step's hop."""
    if n == 1:
        return 0.0
    g = min(hardware.per_node, n)
    m = hardware.nodes(n)
    intra = hardware.intra.latency
    net = max(hardware.inter.latency, NCCL_NET_HOP)
    if m == 1:
        steps = 2 * (n - 1) if kind == "ring" else 2 * _log2(n)
        if kind == "hierarchical":
            steps = 2 * (n - 1)
        return NCCL_BASE_LATENCY + steps * intra
    if kind == "ring":
        inter_steps = 2 * (m - 1)
        lat = (2 * (n - 1) - inter_steps) * intra + inter_steps * net
        if nbytes >= n * NCCL_PLATEAU_BYTES:
            lat *= NCCL_PLATEAU
        return NCCL_BASE_LATENCY + lat
    if kind in ("tree", "binary_tree"):
        return NCCL_BASE_LATENCY + 2 * ((g - 1) * intra + _log2(m) * net)
    if kind == "halving_doubling":
        return NCCL_BASE_LATENCY + 2 * (_log2(g) * intra + _log2(m) * net)
    # hierarchical: ring inside the node, then ``across`` between nodes
    between = 2 * (m - 1) if across == "ring" else 2 * _log2(m)
    return NCCL_BASE_LATENCY + 2 * (g - 1) * intra + between * net


def call_time(nbytes: float, n: int, hardware: Hardware, kind: str, across: str = "ring") -> float:
    """One all-reduce of ``nbytes`` over ``n`` workers: NCCL's latency plus the algorithm's
    bytes at the achieved bandwidths (:func:`achieved`)."""
    if n == 1:
        return 0.0
    g = min(hardware.per_node, n)
    intra = achieved(hardware.intra)
    out = achieved(hardware.inter, hardware.ports)
    if kind == "hierarchical":
        m = hardware.nodes(n)
        moved = comm.hierarchical(nbytes, g, m, intra, out, 1, across)
    else:
        moved = comm.flat(nbytes, n, hardware.per_node, intra, out, 1, kind)
    return hops(kind, n, hardware, nbytes, across) + moved


def push_time(nbytes: float, n: int, hardware: Hardware, servers: int, node_sum: bool) -> float:
    """A synchronous parameter server's push of ``nbytes`` (half of its push and pull)."""
    out = replace(achieved(hardware.inter, hardware.ports), latency=hardware.inter.latency)
    if node_sum:
        g, m = min(hardware.per_node, n), hardware.nodes(n)
        intra = replace(achieved(hardware.intra), latency=hardware.intra.latency)
        inside = comm.ring(nbytes, g, intra)
        return inside + (comm.ps_node_summed(nbytes, g, m, servers, intra, out) - inside) / 2
    return comm.parameter_server(nbytes, n, servers, hardware.per_node, out) / 2


@dataclass(frozen=True)
class Timeline:
    """The background loop's step: when its last all-reduce ended, counted from the backward
    pass's start, and what it ran."""

    backward: float  # seconds of the backward pass
    end: float  # when the last call (and a parameter server's pull) ended
    communication: float  # seconds of all calls (and pull) together
    calls: int  # all-reduce calls (fused buffers); a PS: pushes

    @property
    def exposed(self) -> float:
        """What the step waits for after the backward pass."""
        return max(0.0, self.end - self.backward)

    @property
    def hidden(self) -> float:
        return max(0.0, self.communication - self.exposed)


def _buffers(ready, fusion: float | None):
    """Fusion of the gradients ready in one cycle: consecutive ones up to ``fusion`` bytes
    each buffer (a larger one alone); ``None``: one call per gradient tensor."""
    out, current = [], 0.0
    for nbytes, tensors in ready:
        if fusion is None:
            out += [nbytes / max(1, tensors)] * max(1, tensors)
            continue
        if current and current + nbytes > fusion:
            out.append(current)
            current = 0.0
        current += nbytes
    if current:
        out.append(current)
    return out


def timeline(model, hardware: Hardware, workers: int, algo, backward: float) -> Timeline:
    """Run the loop for one step of ``workers`` (pure): see the module's docstring."""
    profile = model.profile()  # float32 bytes of the trainable weights
    nbytes = model.param_bytes(algo.bytes_per_param)
    factor = nbytes / (sum(b for _, b, _ in profile) or 1.0)
    entries = [(s * backward, b * factor, t) for s, b, t in profile]
    if algo.kind == "ps":

        def cost(b):
            return push_time(b, workers, hardware, algo.servers, algo.node_sum)

        cycle = 0.0  # TensorFlow sends each gradient when it is ready
    else:

        def cost(b):
            return call_time(b, workers, hardware, algo.kind, algo.across)

        cycle = algo.cycle_time
    t, start, i, spent, calls = 0.0, -cycle, 0, 0.0, 0
    while i < len(entries):
        start = max(start + cycle, t)
        if entries[i][0] > start:  # nothing ready: sleep until the next cycle that has some
            wait = entries[i][0] - start
            start += math.ceil(wait / cycle) * cycle if cycle else wait
        t = start
        ready = []
        while i < len(entries) and entries[i][0] <= t + 1e-15:
            ready.append(entries[i][1:])
            i += 1
        for b in _buffers(ready, algo.fusion_bytes if algo.kind != "ps" else None):
            d = cost(b)
            t += d
            spent += d
            calls += 1
    if algo.kind == "ps":  # the pull of every parameter, after the last push and the
        pull = cost(nbytes)  # backward pass: the next forward pass reads what it brings
        t = max(t, backward) + pull
        spent += pull
    return Timeline(backward, t, spent, calls)
