"""Tensor -> blocks -> lanes, non-zero detection and int32 quantization, all vectorised.

Block b (B elements; the last block is zero-padded) belongs to lane l = b mod L of the job's
L = nslots * nlanes lanes: slot l // nlanes, position l % nlanes in that slot's packets.
Interleaving spreads a run of non-zero blocks (an embedding's hot rows) over every lane, so
all slots carry about the same number of rounds. A reduce-scatter may lay its lanes out by
shard instead (host_agent/scatter.py `Owners.lanes`, LanePlan.build's `lane`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spina import wire

try:  # the scan (host_agent/_core_blocks.c)
    from host_agent import _core
except ImportError as e:
    raise ImportError("host_agent._core (host_agent/_core.c) is not built: run `make setup` "
                      "(pip install -e .), or `make core` to rebuild it in place") from e


def block_scan(flat: np.ndarray, block_size: int, blocks: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per block of `flat` (1-D, 4-byte items; the last block may be partial), or per index of
    `blocks` only: (the largest item's bits with the sign bit cleared, the OR of every item's
    bits), both int32. For float32 the first is the bits of the block's largest |x| (0: all
    +-0.0; >= NONFINITE_BITS: a NaN or Inf); the second is non-zero where any bit is set
    (an int32 block with a value, a float block with a value or a -0.0).

    One compiled, memory-bound pass (host_agent/_core_blocks.c block_scan; docs/profile.md).
    """
    if blocks is not None:
        blocks = np.ascontiguousarray(blocks, np.int64)
    nsel = -(-len(flat) // block_size) if blocks is None else len(blocks)
    maxabs, orbits = np.empty(nsel, np.int32), np.empty(nsel, np.int32)
    _core.block_scan(flat, block_size, maxabs, orbits, blocks)
    return maxabs, orbits


def nonzero_blocks(flat: np.ndarray, block_size: int, blocks: np.ndarray | None = None
                   ) -> np.ndarray:
    """Ascending indices of the blocks of `flat` (1-D, 4-byte items) with any non-zero bit
    (a float block of -0.0 counts: this is the int32 notion, and the `blocks` hint's); only
    the (ascending) `blocks` are looked at if given."""
    found = np.flatnonzero(block_scan(flat, block_size, blocks)[1])
    return found if blocks is None else np.asarray(blocks, np.int64)[found]


def scan_float_blocks(flat: np.ndarray, block_size: int, blocks: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of float32 `flat` the agent sends: (indices of the blocks holding a value
    other than +-0.0, their largest |x| as raw bits (block_scan), indices of the blocks
    of zeros with some -0.0). NaN and Inf are values: a non-finite block is sent so that
    every rank sees it. A block of zeros is not sent, whatever the signs of its zeros.
    Only the (ascending) `blocks` are looked at if given; the indices returned are theirs.
    """
    maxabs, orbits = block_scan(flat, block_size, blocks)
    nz = np.flatnonzero(maxabs)
    negzero = np.flatnonzero((maxabs == 0) & (orbits != 0))
    bits = maxabs[nz]
    if blocks is not None:
        blocks = np.asarray(blocks, np.int64)
        nz, negzero = blocks[nz], blocks[negzero]
    return nz, bits, negzero


def gather_blocks(flat: np.ndarray, idx: np.ndarray, block_size: int) -> np.ndarray:
    """Rows (len(idx), block_size) of the blocks `idx`, the last one zero-padded."""
    nfull = len(flat) // block_size
    full = flat[:nfull * block_size].reshape(nfull, block_size)
    tail = np.flatnonzero(idx == nfull)  # the partial last block, wherever it is in idx
    if len(tail):
        rows = np.zeros((len(idx), block_size), flat.dtype)
        body = idx != nfull
        rows[body] = full[idx[body]]
        rest = flat[nfull * block_size:]
        rows[tail[0], :len(rest)] = rest
        return rows
    return full[idx]


def scatter_blocks(flat: np.ndarray, idx: np.ndarray, rows, block_size: int) -> None:
    """Write `rows` (len(idx) x block_size, or a scalar) into blocks `idx` of `flat` (1-D);
    the partial last block takes its first elements."""
    nfull = len(flat) // block_size
    full = flat[:nfull * block_size].reshape(nfull, block_size)
    tail = idx == nfull
    if not tail.any():
        full[idx] = rows
        return
    rows = np.broadcast_to(rows, (len(idx), block_size))
    body = ~tail
    full[idx[body]] = rows[body]
    rest = flat[nfull * block_size:]
    rest[:] = rows[np.flatnonzero(tail)[0], :len(rest)]


@dataclass
class LanePlan:
    """Where each of this worker's non-zero blocks goes, grouped lane by lane.

    pos: block positions sorted by (lane, position); lane_bounds: each lane's range in `pos`
    (L + 1 boundaries).
    """
    nslots: int
    nlanes: int
    pos: np.ndarray
    lane_bounds: np.ndarray  # (L + 1,) boundaries into pos

    @classmethod
    def build(cls, nz: np.ndarray, nslots: int, nlanes: int, lane: np.ndarray | None = None
              ) -> tuple["LanePlan", np.ndarray]:
        """Plan for non-zero block indices `nz` (ascending); also returns the order that sorts
        them. `lane`: each block's lane if not b mod L (a reduce-scatter's: scatter.Owners)."""
        L = nslots * nlanes
        if lane is None:
            lane = nz % L
        order = np.argsort(lane, kind="stable")
        bounds = np.searchsorted(lane[order], np.arange(L + 1))
        return cls(nslots, nlanes, nz[order], bounds), order


NONFINITE_BITS = 0x7F800000  # |x| bits at or above this: Inf or NaN


def block_absmax_bits(flat: np.ndarray, block_size: int) -> np.ndarray:
    """Per block of float32 `flat`: the largest |x| as its raw bits (0 for an all-zero block);
    float32 magnitudes order like their bits with the sign masked (block_scan)."""
    return block_scan(flat, block_size)[0]


def exponent_of_bits(bits: np.ndarray) -> np.ndarray:
    """Smallest e with |x| < 2**e, from absmax bits (EXPONENT_NONE for 0)."""
    e = (bits >> 23).astype(np.int32) - 126
    e[bits >> 23 == 0] = -126  # subnormals: below 2**-126
    e[bits == 0] = wire.EXPONENT_NONE
    return e


def headroom_bits(nworkers: int) -> int:
    """Bits kept free so that the sum of `nworkers` quantized values fits int32."""
    return math.ceil(math.log2(nworkers)) if nworkers > 1 else 0


LANE_DTYPES = {32: np.int32, 16: np.int16, 8: np.int8}  # a lane's width -> its values' type


def quant_shift(exponent: int, nworkers: int, lane_bits: int = 32) -> int:
    """Shift S with |x| * 2**S < 2**(lane_bits - 2 - headroom): N such values, rounded, sum
    to at most 2**(lane_bits - 2) in magnitude, so the sum fits the lane's own width.

    int32 lanes round to nearest: the float error of a dequantized sum is at most
    nworkers * 2**(-S-1) plus the float32 rounding of the result (docs/aggregation.md).
    Narrow lanes (16, 8) round stochastically (`stochastic_quantize`): below nworkers * 2**-S.
    """
    if exponent == wire.EXPONENT_NONE:
        return 0
    return lane_bits - 2 - headroom_bits(nworkers) - exponent


def _scale(x: np.ndarray, shift: int, out: np.ndarray) -> np.ndarray:
    """out = x * 2**shift in float32, exact: a multiply where 2**shift is a normal float32
    (always, in practice), else ldexp."""
    if -126 <= shift <= 127:
        return np.multiply(x, np.float32(2.0 ** shift), out=out, dtype=np.float32)
    out[...] = x  # to float32 first (one rounding for int32 sums), then the exact ldexp
    return np.ldexp(out, shift, out=out)


def quantize(rows: np.ndarray, shift: int, out: np.ndarray | None = None,
             scratch: np.ndarray | None = None) -> np.ndarray:
    """round(rows * 2**shift) into `out` (int32 of any byte order: the wire's, for a
    datagram), else into `rows`. float32 `rows` (n, B) are scaled into `scratch` (n, B)
    if given (rows untouched: a view of the tensor), else in place. Exact up to the one
    rounding to an integer: the scale is a power of two and |value| < 2**30 (quant_shift).
    Returns `out`, else `rows`.
    """
    scaled = _scale(rows, shift, rows if scratch is None else scratch)
    return np.rint(scaled, out=rows if out is None else out, casting="unsafe")


def dequantize(data: np.ndarray, shift: int, out: np.ndarray | None = None) -> np.ndarray:
    """int32 sums (n, B) -> float32: one rounding (int -> float32), then the exact scale by
    2**-shift. Into `out` if given."""
    if out is None:
        out = np.empty(data.shape, np.float32)
    return _scale(data, -shift, out)


# ---------------------------------------------------------------- narrow lanes (docs/bits.md)
# The host's half of 16- and 8-bit lanes: what a rank sends, and the bound on the sum it gets
# back (the agent's narrow calls use these: host_agent/agent.py, docs/bits.md).
_M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    """splitmix64's output function of z + its increment (Steele, Lea, Flood 2014)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 (C. Wellons' integer hash search), on uint32 arrays (products wrap)."""
    x = x ^ (x >> np.uint32(16))
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def rounding_noise(seed: int, rank: int, step: int, shape) -> np.ndarray:
    """Uniform [0, 1) float32 draws for stochastic rounding, a function of (seed, rank,
    step) only: a rerun sends the same values, and no two ranks or steps share draws.

    Counter-based: draw i (in C order of `shape`) is (h >> 8) * 2**-24 with
    h = mix32(mix32(i + k0) ^ k1) in 32-bit words, (k0, k1) the halves of
    splitmix64(splitmix64(splitmix64(seed) ^ rank) ^ step). The agent's compiled core computes
    each row's draws where it sends the row (host_agent/_core_blocks.c, the same function:
    compared in tests/test_core.py); 32-bit integer operations vectorise there.
    """
    key = _splitmix64(_splitmix64(_splitmix64(seed & _M64) ^ rank) ^ step)
    k0, k1 = np.uint32(key & 0xFFFFFFFF), np.uint32(key >> 32)
    i = np.arange(int(np.prod(shape)), dtype=np.uint32)
    h = _mix32(_mix32(i + k0) ^ k1)
    return ((h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)).reshape(shape)


def stochastic_quantize(rows: np.ndarray, shift: int, lane_bits: int,
                        noise: np.ndarray) -> np.ndarray:
    """floor(rows * 2**shift + noise) as the lane's integer type (LANE_DTYPES): unbiased
    (E[q] = rows * 2**shift for noise uniform on [0, 1), as QSGD's rounding), each value off
    by less than one unit. With shift from quant_shift(.., lane_bits) every value, and the
    sum of nworkers of them, fits the lane's width (|q| <= 2**(lane_bits - 2 - headroom))."""
    # In float32, as the compiled core (_core_blocks.c stochastic_floor): s = rows * 2**shift
    # is exact (a power-of-two scaling; |s| < 2**15), and s + u reaches floor(s) + 1 iff
    # u >= floor(s) + 1 - s, compared where both sides are exact: s - t >= 1 - u for s >= 0,
    # u >= (t + 1) - s below it. So q is the exact floor(s + u): unbiased (but where s is
    # subnormal, |rows * 2**shift| < 2**-126, and lost bits far below the lane's unit).
    s = np.ldexp(rows.astype(np.float32, copy=False), shift)
    t = np.floor(s)
    up = np.where(s >= 0, s - t >= 1 - noise, noise >= (t + 1) - s)
    t += up
    return t.astype(LANE_DTYPES[lane_bits])


def stochastic_error_bound(nworkers: int, shift: int) -> float:
    """The bound on |dequantized sum - true sum| of nworkers stochastically rounded values,
    before the float32 rounding of the result: each rank's value is off by less than 2**-S."""
    return nworkers * 2.0 ** -shift


def quantize_with_feedback(rows: np.ndarray, residual: np.ndarray, shift: int, lane_bits: int,
                           noise: np.ndarray) -> np.ndarray:
    """Error feedback around stochastic_quantize: rows + residual is what is quantized, and
    `residual` (float32, rows' shape, updated in place) keeps what the lane could not carry,
    so that over any number of steps sum(sent) = sum(rows) - residual: no gradient is lost,
    only delayed. The shift must be the one for rows + residual (their block maximum)."""
    target = rows + residual
    q = stochastic_quantize(target, shift, lane_bits, noise)
    np.subtract(target, dequantize(q, shift), out=residual)
    return q


def rescale_nonfinite(flat: np.ndarray, nz: np.ndarray, bits: np.ndarray,
                      block_size: int) -> np.ndarray:
    """Which of the blocks `nz` hold NaN/Inf (their `bits` from scan_float_blocks at or above
    NONFINITE_BITS); their `bits` are replaced in place by the largest |x| of their finite
    values, the scale a NaN/Inf block is sent with (the block is reported non-finite apart)."""
    nonfinite = bits >= NONFINITE_BITS
    if nonfinite.any():
        rows = gather_blocks(flat, nz[nonfinite], block_size)
        rows = np.where(np.isfinite(rows), rows, np.float32(0))
        bits[nonfinite] = block_absmax_bits(rows.reshape(-1), block_size)
    return nonfinite
