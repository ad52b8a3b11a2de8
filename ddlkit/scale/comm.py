"""Seconds to synchronise ``nbytes`` of gradients among ``n`` workers: the formulas (pure).

Each link has a latency ``a`` (seconds per message) and a bandwidth ``B`` (bytes/s per
direction). ``buffers`` is how many separate all-reduces the gradients take (tensor
fusion packs them into few; without it, one per gradient tensor): each pays the
latency term, the bytes are paid once.

==================  ==========================================================  =================
algorithm           seconds                                                     bytes per worker
==================  ==========================================================  =================
ring                ``2(n-1) a k + 2(n-1)/n x S / B``                           ``2(n-1)/n S``
halving_doubling    ``2 log2(n) a k + 2(n-1)/n x S / B`` (Thakur et al. 2005)   ``2(n-1)/n S``
tree                ``2 log2(n) a k + 2 S / B`` (reduce up, broadcast down,      ``2 S``
                    pipelined)
hierarchical        ring within each node of g (reduce-scatter, later
                    all-gather) + across the m nodes: ``2(g-1) a_i k +
                    2(g-1)/g S / B_i + inter(S, m)``
parameter server    push then pull, k servers each holding S/k; a node's NIC    ``2 S``
                    carries its g workers: ``2 (a + max(g S, n S / k) / B)``
async PS worker     its own push and pull, no barrier: ``2 (a + g S / B)``;     ``2 S``
                    the servers take at most ``k B / S`` updates/s
==================  ==========================================================  =================

(``k`` = buffers, ``S`` = bytes of one copy of the gradients, ``log2`` rounded up.)
In the hierarchical all-reduce every one of a node's g accelerators all-reduces its 1/g
of the gradients across nodes at the same time, through the node's one network link,
so the inter-node stage carries S per node, as a flat ring would; what it saves is
latency: ``2(m-1)`` messages per buffer instead of ``2(gm-1)``.
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
    """Binary tree, pipelined: reduce to the root and broadcast back, ``2 log2(n)`` steps;
    every inner node sends the whole buffer up and down."""
    _check(n, buffers)
    if n == 1:
        return 0.0
    return 2 * _log2(n) * link.latency * buffers + 2 * nbytes / link.bandwidth


FLAT = {"ring": ring, "halving_doubling": halving_doubling, "tree": tree}


def hierarchical(
    nbytes: float,
    per_node: int,
    nodes: int,
    intra: Link,
    inter: Link,
    buffers: int = 1,
    across: str = "ring",
) -> float:
    """Reduce-scatter within each node (ring over ``intra``), all-reduce across the nodes
    (``across`` over ``inter``, S bytes per node), all-gather within each node."""
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


def ps_worker(nbytes: float, per_node: int, link: Link, buffers: int = 1) -> float:
    """One worker's own push and pull when workers are not synchronised (asynchronous
    PS): only its node's link, shared by the node's ``per_node`` workers, limits it."""
    _check(per_node, buffers)
    return 2 * (link.latency * buffers + per_node * nbytes / link.bandwidth)


def ps_capacity(nbytes: float, servers: int, link: Link) -> float:
    """Updates per second ``servers`` can take in (each receives and sends S/k per update,
    both directions at once): ``servers x B / S``."""
    return servers * link.bandwidth / nbytes
