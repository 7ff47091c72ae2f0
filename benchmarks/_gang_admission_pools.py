"""Node pools of the gang-admission replay: which nodes form each pool, and which pool a gang is pinned to.

A pool is what an operator would make a guard scope (annotation
``raygpu.io/guard-scope`` on the RayClusters pinned to it by a nodeSelector):

* **Nodes**: round-robin over the trace's node order (``openb-node-0000``,
  ``-0001``, ... already sorted by name): node ``i`` is in pool ``i % P``, so
  every pool gets the same mix of 1/2/4/8-GPU nodes.
* **Gangs**: pool ``crc32(job name) % P`` (the job name carries its index in
  the replay, so a trace task cycled twice may land in two pools), in every
  policy: a RayCluster pinned to a node pool by a nodeSelector, for ``pods``
  and ``raycluster-gang`` as for raygpu. Singles go anywhere (``pool = -1``).

With ``P = 1`` every gang is in pool 0, whose mask is every node: the replay is
the same as before pools existed (checked by tests/unit/test_bench_gang_pools.py).
"""

from __future__ import annotations

import zlib

import numpy as np

ANYWHERE = -1


def node_pools(n_nodes: int, n_pools: int) -> np.ndarray:
    """Pool of each node: round-robin over the node order."""
    if n_pools < 1 or n_pools > n_nodes:
        raise ValueError(f"pools must be in 1..{n_nodes} (nodes), got {n_pools}")
    return np.arange(n_nodes, dtype=np.int64) % n_pools


def gang_pool(name: str, n_pools: int) -> int:
    """Pool a gang is pinned to: crc32 of its job name, modulo the number of pools."""
    return zlib.crc32(name.encode()) % n_pools


class PoolMasks:
    """Which nodes a job may use: its pool's nodes for a pinned gang, every node otherwise."""

    def __init__(self, pools: np.ndarray) -> None:
        self.of_node = pools
        self.count = int(pools.max()) + 1 if pools.size else 1
        self.masks = [pools == p for p in range(self.count)]

    def nodes(self, pool: int) -> np.ndarray | None:
        """The boolean mask of ``pool``'s nodes; None when the job may go anywhere (or there is one pool)."""
        if pool == ANYWHERE or self.count == 1:
            return None
        return self.masks[pool]

    def only(self, pool: int, per_node: np.ndarray) -> np.ndarray:
        """``per_node`` with the nodes outside ``pool`` set to 0 (the same array when nothing is masked)."""
        mask = self.nodes(pool)
        return per_node if mask is None else np.where(mask, per_node, 0)
