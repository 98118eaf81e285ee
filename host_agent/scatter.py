"""The reduce-scatter's host side: which rank owns which part of the tensor, and which ranks
own a round's blocks (the `bitmap` of a reduce-scatter contribution: docs/protocol.md
"Reduce-scatter"), and which lanes carry which shard's blocks.

The split is FSDP2's (torch.chunk on the flat tensor, as FSDP2 shards a parameter with
`_chunk_with_empty`): each rank owns `ceil(n / N)` consecutive elements, in rank order, the
last ranks fewer or none when N does not divide n. FSDP2's reduce-scatter input is always a
multiple of N long (every shard padded to one size), where this is the even split.
"""
from __future__ import annotations

import numpy as np

from spina import wire


def shard_size(n: int, nworkers: int) -> int:
    """Elements per shard (the last ones may be shorter): ceil(n / nworkers)."""
    return -(-n // nworkers)


def shard_bounds(n: int, nworkers: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s shard of a flat tensor of `n` elements (torch.chunk's)."""
    c = shard_size(n, nworkers)
    return min(rank * c, n), min((rank + 1) * c, n)


class Owners:
    """The owners of a call's blocks: `of(pos)` is the bitmap of the ranks whose shards hold
    any element of the blocks at positions `pos` (a round's lanes; END or negative for a lane
    with no block). A block across a shard boundary has two (or more) owners.

    `lanes` and `used_lanes` give the call's lanes by shard (docs/aggregation.md "Lanes of a
    reduce-scatter"): with at least as many slots as ranks, shard q's blocks (a block is its
    first element's shard's) go to lanes [q L // N, (q+1) L // N) of the L = nslots * nlanes,
    interleaved there as an all-reduce's over all L, so a slot's rounds carry one shard's
    blocks whatever the density (two at a boundary inside a slot, when N does not divide
    nslots) and each round's sums go to one rank. The all-reduce's interleaving lets sparse
    lanes drift apart: each round then holds blocks of several shards, and every rank would
    receive about the union of all ranks' blocks. With fewer slots than ranks a slot would hold
    lanes of several shards: the all-reduce's lanes (None), whose dense rounds have one owner.
    """

    __slots__ = ("n", "block_size", "chunk", "nworkers")

    def __init__(self, n: int, nworkers: int, block_size: int):
        self.n, self.block_size, self.nworkers = n, block_size, nworkers
        self.chunk = max(1, shard_size(n, nworkers))

    def _groups(self, nslots: int, nlanes: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Per shard its first block and its first lane (N + 1 bounds each), or None for the
        all-reduce's lanes (fewer slots than ranks)."""
        N = self.nworkers
        if nslots < N:
            return None
        q = np.arange(N + 1, dtype=np.int64)
        nblocks = -(-self.n // self.block_size)
        first_block = np.minimum(-(-(q * self.chunk) // self.block_size), nblocks)
        return first_block, q * (nslots * nlanes) // N

    def lanes(self, nz: np.ndarray, nslots: int, nlanes: int) -> np.ndarray | None:
        """The lane of each block at (ascending) positions `nz`, or None: the all-reduce's,
        nz mod L."""
        groups = self._groups(nslots, nlanes)
        if groups is None:
            return None
        first_block, first_lane = groups
        q = np.searchsorted(first_block, nz, "right") - 1  # empty shards: the next one's
        return first_lane[q] + (nz - first_block[q]) % (first_lane[q + 1] - first_lane[q])

    def used_lanes(self, nslots: int, nlanes: int) -> np.ndarray:
        """Per lane, whether it holds any position of the tensor (a slot with none sends no
        round: docs/aggregation.md "Slots in use")."""
        L = nslots * nlanes
        groups = self._groups(nslots, nlanes)
        if groups is None:
            return np.arange(L) < -(-self.n // self.block_size)
        first_block, first_lane = groups
        lane = np.arange(L)
        q = np.searchsorted(first_lane, lane, "right") - 1
        return lane - first_lane[q] < first_block[q + 1] - first_block[q]

    def of(self, pos: np.ndarray) -> int:
        pos = pos[(pos >= 0) & (pos < wire.END)]
        if not len(pos):
            return 0
        first = pos * self.block_size
        lo = first // self.chunk
        hi = (np.minimum(first + self.block_size, self.n) - 1) // self.chunk
        return int(np.bitwise_or.reduce((np.int64(2) << hi) - (np.int64(1) << lo)))
