"""Block top-k compression with error feedback, and GDTopK's per-group ratio controller.

`BlockTopK` is deliberately minimal (what GDTopK needs): blocks of `block_size` elements,
scored by their squared L2 norm, the best ceil(ratio * nblocks) sent, the rest kept in a
residual that is added to the next gradient (error feedback, so nothing is dropped for good,
only delayed). The selection is host_agent/compression's, `kernels.top_blocks` (the DDP
compressors' block top-k, compiled): the exact k largest, ties to the lower block index.
"""
from __future__ import annotations

import math

import numpy as np

from host_agent.compression import kernels


class BlockTopK:
    """Per-worker block top-k with error feedback.

    Args:
        n: length of the flat gradient.
        block_size: elements per block (the last block may be shorter).

    Example:
        >>> c = BlockTopK(8, 2)
        >>> idx, vals = c.compress(np.array([0, 0, 5, 5, 1, 0, 0, 0], np.float32), 0.25)
        >>> idx.tolist(), vals.tolist()
        ([1], [5.0, 5.0])
    """

    def __init__(self, n: int, block_size: int):
        self.n, self.B = n, block_size
        self.nblocks = -(-n // block_size)
        self.residual = np.zeros(self.nblocks * block_size, np.float32)  # padded to whole blocks

    def compress(self, grad: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
        """(sorted block indices int32, their values float32 of len(idx) * block_size)."""
        r = self.residual
        r[:self.n] += grad
        blocks = r.reshape(self.nblocks, self.B)
        k = min(self.nblocks, max(1, math.ceil(ratio * self.nblocks)))
        if k == self.nblocks:  # every block: no scores needed
            idx = np.arange(self.nblocks, dtype=np.int32)
        else:
            score = np.einsum("ij,ij->i", blocks, blocks)
            idx = kernels.top_blocks(score, k).astype(np.int32)
        vals = blocks[idx].reshape(-1).copy()
        blocks[idx] = 0.0
        return idx, vals


def scatter(n: int, block_size: int, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """The dense vector of length `n` that (idx, vals) stands for."""
    nb = -(-n // block_size)
    out = np.zeros(nb * block_size, np.float32)
    out.reshape(nb, block_size)[idx] = vals.reshape(len(idx), block_size)
    return out[:n]


def gdtopk_ratios(groups: dict[int, dict], ratios: dict[int, float], lo: float, hi: float,
                  smoothing: float = 0.5) -> dict[int, float]:
    """GDTopK: the next top-k ratio of each group.

    Each group reports its mean iteration time `t`, the part of it spent pushing `push`, and
    the ratio `ratio` those pushes used. A push costs about ratio * b (b = push / ratio: the
    dense push time), the rest a = t - push does not depend on the ratio. The fastest group
    (smallest t) sends at `hi`; every other group g gets the ratio that would bring its
    iteration time to the fastest group's, r = (t_fast - a_g) / b_g, clipped to [lo, hi],
    and moves half-way there (`smoothing`) so one noisy measurement cannot swing it.

    Args:
        groups: group -> {"t": seconds, "push": seconds, "ratio": fraction}.
        ratios: the current ratio per group (the starting point of the smoothing).
    Returns:
        group -> new ratio.
    """
    fast = min(groups, key=lambda g: groups[g]["t"])
    t_fast = groups[fast]["t"]
    out = {}
    for g, m in groups.items():
        if g == fast:
            target = hi
        else:
            b = m["push"] / max(m["ratio"], 1e-9)
            a = m["t"] - m["push"]
            target = (t_fast - a) / b if b > 0 else hi
        target = min(hi, max(lo, target))
        cur = ratios.get(g, hi)
        out[g] = min(hi, max(lo, cur + smoothing * (target - cur)))
    return out


def group_by_speed(times: list[float], ngroups: int, split_ratio: float) -> list[int]:
    """Group workers of similar speed: sort their iteration times and cut at the (at most
    ngroups - 1) largest jumps between neighbours that exceed `split_ratio`.

    Returns the group of each worker, 0 the fastest.

    >>> group_by_speed([0.1, 0.31, 0.11, 0.1], 2, 1.5)
    [0, 1, 0, 0]
    """
    order = sorted(range(len(times)), key=lambda w: times[w])
    jumps = [(times[order[i + 1]] / max(times[order[i]], 1e-12), i) for i in range(len(order) - 1)]
    cuts = sorted(i for j, i in sorted(jumps, reverse=True)[:ngroups - 1] if j > split_ratio)
    groups = [0] * len(times)
    g = 0
    for pos, w in enumerate(order):
        groups[w] = g
        if cuts and pos == cuts[0]:
            cuts.pop(0)
            g += 1
    return groups
