"""Seconds to synchronise ``nbytes`` of gradients among ``n`` workers: the formulas (pure).

Each link has a latency ``a`` (seconds per message) and a bandwidth ``B`` (bytes/s per
direction). ``buffers`` (``k``) is how many separate all-reduces the gradients take (tensor
fusion packs them into few; without it, one per gradient tensor): each pays the latency
term, the bytes are paid once. Across nodes ``B`` is the node's aggregate bandwidth, all
its network ports together (:attr:`ddlkit.scale.hardware.Hardware.node_link`).

==================  ==========================================================  =================
algorithm           seconds                                                     bytes per worker
==================  ==========================================================  =================
ring                ``2(n-1) a k + 2(n-1)/n x S / B``                           ``2(n-1)/n S``
halving_doubling    ``2 log2(n) a k + 2(n-1)/n x S / B`` (Thakur et al. 2005)   ``2(n-1)/n S``
tree                NCCL's double binary tree: ``2 log2(n) a k + 2 S / B``      ``2 S``
binary_tree         one pipelined binary tree: ``2 log2(n) a k + 3 S / B``      ``3 S`` (inner)
hierarchical        reduce-scatter in the node, all-reduce across nodes,
                    all-gather in the node: ``2(g-1) a_i k + 2(g-1)/g S / B_i
                    + across(S, m)``
parameter server    push then pull, k servers each holding S/k; a node's ports  ``2 S``
                    carry its g workers: ``2 (a k + max(g S, n S / k) / B)``
ps, node summed     the node's g gradients summed inside it first (one push
                    per node): ``ring(S, g, intra) + 2 (a k + max(S, m S / k)
                    / B)``
async PS worker     its own push and pull, no barrier: ``2 (a k + g S / B)``;   ``2 S``
                    the servers take at most ``k B / S`` updates/s
==================  ==========================================================  =================

(``S`` = bytes of one copy of the gradients, ``g`` accelerators per node, ``m`` nodes,
``log2`` rounded up.)

Trees. A binary tree reduces to the root and broadcasts back in ``log2 n`` steps each way,
pipelined in chunks; an inner node receives two children's buffers and sends one up, then
receives one and sends two down: ``3 S`` through its busiest direction. NCCL's double binary
tree (NCCL 2.4) runs two complementary trees on half the buffer each, every node inner in one
and a leaf in the other, so every node sends and receives ``2 S``: the cost above, which at
large ``n`` is the ring's bandwidth with ``log2 n`` instead of ``n`` latencies.

Hierarchical, as computed here: (1) a ring reduce-scatter inside each node over ``intra``
leaves each of its ``g`` accelerators one summed ``1/g`` of the gradients; (2) every
accelerator all-reduces its ``1/g`` with its counterparts in the other ``m`` nodes, all ``g``
at once, so a node sends ``S`` in all through its ports (``across`` picks ring, halving/doubling
or tree); (3) a ring all-gather inside each node. Stages (1) and (3) are the two halves of a
ring all-reduce of ``S`` over ``g``. Against a flat ring over all ``g m`` workers it moves the
same bytes through a node's ports and saves latency: ``2(m-1)`` messages per buffer instead
of ``2(gm-1)``. (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE`` is this pattern: NCCL
reduce-scatter, MPI all-reduce, NCCL all-gather. Goyal et al. reduce inside the server,
all-reduce across servers and broadcast inside, which has the same inter-node bytes.)
"""

from __future__ import annotations

import math

from ddlkit.errors import ConfigError
from ddlkit.scale.hardware import Link


def _check(n: int, buffers: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"workers={n!r} must be an int >= 1. Fix: e.g. workers=8")
    if isinstance(buffers, bool) or not isinstance(buffers, int) or buffers < 1:
        raise ConfigError(f"buffers={buffers!r} must be an int >= 1. Fix: e.g. buffers=1")


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def ring(nbytes: float, n: int, link: Link, buffers: int = 1) -> float:
    """Ring all-reduce: reduce-scatter then all-gather, ``2(n-1)`` steps per buffer."""
    _check(n, buffers)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.latency * buffers + 2 * (n - 1) / n * nbytes / link.bandwidth


def halving_doubling(nbytes: float, n: int, link: Link, buffers: int = 1) -> float:
    """Recursive halving (reduce-scatter) and doubling (all-gather): ring's bytes in
    ``2 log2(n)`` steps."""
    _check(n, buffers)
    if n == 1:
        return 0.0
    return 2 * _log2(n) * link.latency * buffers + 2 * (n - 1) / n * nbytes / link.bandwidth


def tree(nbytes: float, n: int, link: Link, buffers: int = 1) -> float:
    """NCCL's double binary tree: two pipelined trees on half the buffer each, every node
    inner in one of them; ``2 log2(n)`` steps, ``2 S`` through every node."""
    _check(n, buffers)
    if n == 1:
        return 0.0
    return 2 * _log2(n) * link.latency * buffers + 2 * nbytes / link.bandwidth


def binary_tree(nbytes: float, n: int, link: Link, buffers: int = 1) -> float:
    """One pipelined binary tree: an inner node takes in two buffers and sends one up,
    then takes one and sends two down: ``3 S`` through its busier direction."""
    _check(n, buffers)
    if n == 1:
        return 0.0
    inner = 3 if n > 2 else 1  # two workers: a root and one leaf, S each way
    return 2 * _log2(n) * link.latency * buffers + inner * nbytes / link.bandwidth


FLAT = {
    "ring": ring,
    "halving_doubling": halving_doubling,
    "tree": tree,
    "binary_tree": binary_tree,
}


def hierarchical(
    nbytes: float,
    per_node: int,
    nodes: int,
    intra: Link,
    inter: Link,
    buffers: int = 1,
    across: str = "ring",
) -> float:
    """Reduce-scatter within each node (ring over ``intra``), all-reduce of each
    accelerator's ``1/g`` across the nodes, all at once (``across`` over ``inter``, the
    node's ports: S bytes per node), all-gather within each node."""
    if across not in FLAT:
        raise ConfigError(f"across={across!r} is not one of {', '.join(FLAT)}. Fix: e.g. 'ring'")
    within = ring(nbytes, per_node, intra, buffers)  # its two halves are the two stages
    return within + FLAT[across](nbytes, nodes, inter, buffers)


def flat(
    nbytes: float,
    n: int,
    per_node: int,
    intra: Link,
    inter: Link,
    buffers: int = 1,
    kind: str = "ring",
) -> float:
    """A flat all-reduce over all n workers: inside one node it runs on ``intra``; across
    nodes its slowest hop (``inter``) sets every step's pace."""
    return FLAT[kind](nbytes, n, intra if n <= per_node else inter, buffers)


def parameter_server(
    nbytes: float, n: int, servers: int, per_node: int, link: Link, buffers: int = 1
) -> float:
    """Synchronous push (gradients) then pull (parameters) through ``servers`` servers on
    their own nodes; the busier side (a worker node's link or a server's) sets the time."""
    _check(n, buffers)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"servers={servers!r} must be an int >= 1. Fix: e.g. servers=2")
    busiest = max(min(per_node, n) * nbytes, n * nbytes / servers)
    return 2 * (link.latency * buffers + busiest / link.bandwidth)


def ps_node_summed(
    nbytes: float,
    per_node: int,
    nodes: int,
    servers: int,
    intra: Link,
    inter: Link,
    buffers: int = 1,
) -> float:
    """Synchronous parameter server whose workers sum their node's gradients first (TF's
    ``distributed_replicated``): a ring all-reduce inside the node, then one push and one
    pull per node; the busier side (a node's ports or a server's) sets the time."""
    _check(per_node, buffers)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"servers={servers!r} must be an int >= 1. Fix: e.g. servers=2")
    busiest = max(nbytes, nodes * nbytes / servers)
    inside = ring(nbytes, per_node, intra, buffers)
    return inside + 2 * (inter.latency * buffers + busiest / inter.bandwidth)


def ps_worker(nbytes: float, per_node: int, link: Link, buffers: int = 1) -> float:
    """One worker's own push and pull when workers are not synchronised (asynchronous
    PS): only its node's link, shared by the node's ``per_node`` workers, limits it."""
    _check(per_node, buffers)
    return 2 * (link.latency * buffers + per_node * nbytes / link.bandwidth)


def ps_capacity(nbytes: float, servers: int, link: Link) -> float:
    """Updates per second ``servers`` can take in (each receives and sends S/k per update,
    both directions at once): ``servers x B / S``."""
    return servers * link.bandwidth / nbytes
