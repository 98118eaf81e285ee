"""The compressor's pass over a bucket and its block selection: numpy definitions, compiled forms.

The compressors run the compiled forms (host_agent/compression/_kernels.c, built by `make
setup`); the `*_reference` functions here define what they compute, and
tests/test_compression.py checks both give identical bits on random inputs and edge cases.

- `accumulate`: one pass, per parameter piece of the (unaligned) bucket g at its block-aligned
  offset: DGC's momentum correction u = m u + g (optional), then the error feedback
  v += (u or g), and every block's squared L2 norm of the new v. Memory-bound: it reads g
  (and u) and v once and writes v (and u) once; numpy needed a pass for the sum and another
  for the norms (einsum).
- `top_blocks`: the k blocks of largest norm. A threshold from a stratified sample of the
  norms (DGC's estimate), the blocks at or above it as candidates, then the k largest among
  those (DGC's hierarchical selection), or among all blocks when the sample left fewer than
  k. The result is always exactly the k largest: the sample only shrinks what is partially
  sorted. Ties go to the lower block index, a NaN norm ranks above +inf (sent, so the agent's
  non-finite flag reaches every rank). Across steps (`Candidates`): the next `accumulate`
  collects the blocks at or above the last sample's threshold while it computes the norms,
  and `top_blocks` takes those as its candidates when there are between k and 4 k of them
  (else it draws a new sample): no sample and no scan of the norms after the pass, which
  has pushed them out of the caches. The result is the same exact top k.

- `unpack`: the hook's way back, the inverse of accumulate's layout: the summed aligned array
  into the bucket, divided by the ranks, and the blocks the sum wrote cleared in the same
  pass (a block of res is +0.0 again wherever it held any non-zero bit), so one send array
  per bucket serves every step: a fresh zeroed one per call cost 0.6-0.8 ms of page faults
  on the 5.3M model for about 1% of its blocks.

The norm's summation order is fixed so numpy can reproduce it: 8 lanes, lane l sums the
squares of elements l, l+8, ... of the block in order, then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
"""
from __future__ import annotations

import numpy as np

try:  # the compiled pass (host_agent/compression/_kernels.c)
    from host_agent.compression import _kernels
except ImportError as e:
    raise ImportError("host_agent.compression._kernels (host_agent/compression/_kernels.c) is "
                      "not built: run `make setup` (pip install -e .), or `make core` to rebuild "
                      "it in place") from e

LANES = 8
SAMPLE = 1024       # blocks sampled for the threshold (of 20,577 for the 5.3M model)
MIN_SAMPLE_RANK = 8  # the threshold is at least the sample's 8th largest (_kernels.c)
_NAN_KEY = np.uint32(0x7FC00000)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class Candidates:
    """One bucket's selection state, kept across steps (BlockTopK keeps one per layout).

    blocks: int64, one item per block: the blocks the pass found at or above `threshold`
        (`count` of them, in increasing order) as their rank keys (`rank_keys`: no norm is
        read again for them), and then top_blocks' workspace and result.
    threshold: the norm key the next pass collects at (-1: none; top_blocks sets it to the
        threshold of its last sample, kept while it leaves between k and 4 k candidates).
    """
    __slots__ = ("blocks", "count", "threshold")

    def __init__(self, nblocks: int):
        self.blocks = np.empty(nblocks, np.int64)
        self.count = -1
        self.threshold = -1


def accumulate(layout, grad: np.ndarray, v: np.ndarray, u: np.ndarray | None = None,
               momentum: float = 0.0, candidates: Candidates | None = None) -> np.ndarray:
    """v += g (u = momentum * u + g first, and v += u, when u is given), piece by piece at the
    layout's aligned offsets; returns the float32 squared norm of every block of the new v.

    Args:
        layout: a `BucketLayout` (src, dst, sizes, length, block_size).
        grad: the bucket as DDP packs it: float32, parameters back to back (read only).
        v, u: float32 arrays of layout.length (written in place); u None: no momentum.
        candidates: with a threshold, the blocks whose new norm's key is at or above it go
            into candidates.blocks (count: how many; -1 without a threshold).
    """
    norms = np.empty(layout.nblocks, np.float32)
    collect = candidates is not None and candidates.threshold >= 0
    count = _kernels.accumulate(grad, layout.src, layout.dst, layout.sizes, layout.block_size,
                                v, u, float(momentum), norms,
                                candidates.threshold if collect else -1,
                                candidates.blocks if collect else None)
    if candidates is not None:
        candidates.count = count if collect else -1
    return norms


def top_blocks(norms: np.ndarray, k: int, seed: int = 0, nsample: int = SAMPLE,
               candidates: Candidates | None = None) -> np.ndarray:
    """Sorted int64 indices of the min(k, len(norms)) blocks with the largest float32 `norms`
    (module docstring: the order, the sample). `seed` picks the sample, `candidates` (the
    pass's, from `accumulate`) may replace it; neither changes the result."""
    if candidates is None:
        out, given, given_thr = np.empty(len(norms), np.int64), -1, 0
    else:
        out, given, given_thr = candidates.blocks, candidates.count, candidates.threshold
    count, _, threshold = _kernels.top_blocks(norms, k, nsample, seed, out, given,
                                              max(given_thr, 0))
    if candidates is not None:
        candidates.threshold = threshold
    return out[:count].copy() if candidates is not None else out[:count]


def take(v: np.ndarray, blocks: np.ndarray, block_size: int, clear: bool = True,
         u: np.ndarray | None = None, send: np.ndarray | None = None) -> np.ndarray:
    """The rows (len(blocks), block_size) of v's `blocks` (int64), those blocks of v (if
    `clear`) and of u (if given) set to +0.0: the same as v2d[blocks], then v2d[blocks] = 0
    and u2d[blocks] = 0, in one call. `send` (float32, as long as v): the blocks go into the
    same blocks of it instead (send2d[blocks] = v2d[blocks]), no rows in between; returns
    send."""
    if send is None:
        dest = np.empty((len(blocks), block_size), np.float32)
    else:
        dest = send
    _kernels.take(v, blocks, block_size, dest, send is not None, clear, u)
    return dest


def unpack(layout, res: np.ndarray, out: np.ndarray, divisor: int = 1) -> None:
    """The summed aligned array `res` back into the bucket `out` (float32, parameters back to
    back), divided by `divisor`; then every block of `res` that held a non-zero bit is +0.0
    again, so the caller can hand the same array to the next call (module docstring)."""
    _kernels.unpack(res, layout.src, layout.dst, layout.sizes, layout.block_size, out,
                    int(divisor))


# ---------------------------------------------------------------- the numpy definitions
def accumulate_reference(layout, grad, v, u=None, momentum=0.0) -> np.ndarray:
    """What `accumulate` computes, in numpy: the same roundings, the same summation order."""
    m = np.float32(momentum)
    for s, d, k in layout.pieces():  # a loop per parameter
        x = grad[s:s + k]
        if u is not None:
            u[d:d + k] = m * u[d:d + k] + x
            x = u[d:d + k]
        v[d:d + k] += x
    return lane_norms_reference(v.reshape(layout.nblocks, layout.block_size))


def lane_norms_reference(v2d: np.ndarray) -> np.ndarray:
    """Squared L2 norm of every row of a float32 (blocks, B) array in the lane order."""
    nb, bs = v2d.shape
    padded = np.zeros((nb, -(-bs // LANES) * LANES), np.float32)  # + 0.0 changes no sum
    padded[:, :bs] = v2d
    sq = padded * padded
    acc = np.zeros((nb, LANES), np.float32)
    for j in range(0, padded.shape[1], LANES):  # a loop per lane group: each lane in order
        acc += sq[:, j:j + LANES]
    a = acc.T
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))


def norm_keys(norms: np.ndarray) -> np.ndarray:
    """uint32 sort keys of float32 norms: the bits without the sign, every NaN above +inf."""
    keys = norms.astype(np.float32).view(np.uint32) & np.uint32(0x7FFFFFFF)
    return np.where(keys > np.uint32(0x7F800000), _NAN_KEY, keys)


def rank_keys(norms: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """int64 keys of `blocks` that order them as top_blocks does: the norm key above, the
    lower block index first (key << 32 | 0xFFFFFFFF - block)."""
    keys = norm_keys(norms[blocks]).astype(np.uint64) << np.uint64(32)
    return (keys | (np.uint64(0xFFFFFFFF) - blocks.astype(np.uint64))).astype(np.int64)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_positions(n: int, nsample: int, seed: int = 0) -> np.ndarray:
    """The blocks `top_blocks` samples: one drawn by `seed` from each of nsample equal strata
    [i n / S, (i + 1) n / S) (0 < nsample < n)."""
    i = np.arange(nsample, dtype=np.uint64)
    n64, s64 = np.uint64(n), np.uint64(nsample)
    lo, hi = i * n64 // s64, (i + np.uint64(1)) * n64 // s64
    z = _splitmix64(np.uint64(seed & (2 ** 64 - 1)) + (i + np.uint64(1)) * _GOLDEN)
    return (lo + (((z >> np.uint64(32)) * (hi - lo)) >> np.uint64(32))).astype(np.int64)


def sample_threshold_reference(norms, k: int, seed: int = 0, nsample: int = SAMPLE):
    """The threshold key `top_blocks` derives from its sample, or None where it samples not
    (k > n / 2, no sample, or a rank above the sample size): the sampled blocks' r-th largest
    key, r = max(8, ceil(2 k S / n)), so that about 2k blocks (at least 8 n / S) are at or
    above it."""
    n = len(norms)
    if not (0 < k < n and 0 < nsample < n and 2 * k <= n):
        return None
    r = max(MIN_SAMPLE_RANK, -(-2 * k * nsample // n))
    if r > nsample:
        return None
    keys = norm_keys(norms[sample_positions(n, nsample, seed)])
    return int(np.sort(keys)[nsample - r])


def top_blocks_reference(norms, k: int, threshold: int | None = None):
    """What `_kernels.top_blocks` returns given the sample's threshold key: (the blocks, the
    candidate count, the threshold used or -1). Candidates are the blocks whose key is >=
    threshold; all blocks when None or fewer than k; then the k largest by (key, lower
    index first)."""
    n = len(norms)
    if k == 0 or k >= n:
        return np.arange(min(k, n), dtype=np.int64), n, -1
    keys = norm_keys(norms)
    cand = None if threshold is None else np.flatnonzero(keys >= threshold)
    if cand is None or len(cand) < k:
        cand, threshold = np.arange(n), -1
    rank = rank_keys(norms, cand).astype(np.uint64)
    top = np.sort(rank)[len(rank) - k:]
    blocks = np.sort(0xFFFFFFFF - (top & np.uint64(0xFFFFFFFF)).astype(np.int64))
    return blocks, len(cand), threshold


def unpack_reference(layout, res, out, divisor: int = 1) -> None:
    """What `unpack` computes, in numpy (float32 division by `divisor`, none when it is 1)."""
    B = layout.block_size
    for s, d, k in layout.pieces():  # a loop per parameter
        piece = res[d:d + k]
        out[s:s + k] = piece if divisor == 1 else piece / np.float32(divisor)
        blocks = res[d:d + -(-k // B) * B].reshape(-1, B)
        blocks[(blocks.view(np.uint32) != 0).any(axis=1)] = 0
