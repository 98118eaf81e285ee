"""The reduce-scatter's host side: which rank owns which part of the tensor, and which ranks
own a round's blocks (the `bitmap` of a reduce-scatter contribution: docs/protocol.md
"Reduce-scatter").

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
    with no block). A block across a shard boundary has two (or more) owners."""

    __slots__ = ("n", "block_size", "chunk")

    def __init__(self, n: int, nworkers: int, block_size: int):
        self.n, self.block_size = n, block_size
        self.chunk = max(1, shard_size(n, nworkers))

    def of(self, pos: np.ndarray) -> int:
        pos = pos[(pos >= 0) & (pos < wire.END)]
        if not len(pos):
            return 0
        first = pos * self.block_size
        lo = first // self.chunk
        hi = (np.minimum(first + self.block_size, self.n) - 1) // self.chunk
        return int(np.bitwise_or.reduce((np.int64(2) << hi) - (np.int64(1) << lo)))
