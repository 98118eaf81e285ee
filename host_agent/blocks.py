"""Tensor -> blocks -> lanes, non-zero detection and int32 quantization, all vectorised.

Block b (B elements; the last block is zero-padded) belongs to lane l = b mod L of the job's
L = nslots * nlanes lanes: slot l // nlanes, position l % nlanes in that slot's packets.
Interleaving spreads a run of non-zero blocks (an embedding's hot rows) over every lane, so
all slots carry about the same number of rounds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spina import wire


def block_bits_or(flat: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block of `flat` (1-D, 4-byte items; the last block may be partial): the OR of its
    elements' bits, and the same without the float sign bits (ints; non-zero = not all zero).

    An OR-reduction over 8-byte words where blocks allow (even block size, 8-byte aligned):
    a memory-bound pass, about twice as fast as a per-block max of |x| (docs/profile.md).
    """
    ints = flat.view(np.int32)
    nfull = len(ints) // block_size
    body = ints[:nfull * block_size]
    if block_size % 2 == 0 and body.ctypes.data % 8 == 0:
        words, signless = body.view(np.int64).reshape(nfull, block_size // 2), _SIGNLESS64
    else:
        words, signless = body.reshape(nfull, block_size), _SIGNLESS32
    bits = np.bitwise_or.reduce(words, axis=1)
    masked = bits & signless
    if nfull * block_size < len(ints):  # the partial last block, as a 32-bit word
        tail = np.bitwise_or.reduce(ints[nfull * block_size:])
        bits, masked = np.append(bits, tail), np.append(masked, tail & _SIGNLESS32)
    return bits, masked


def nonzero_blocks(flat: np.ndarray, block_size: int) -> np.ndarray:
    """Ascending indices of the blocks of `flat` (1-D, 4-byte items) with any non-zero bit
    (a float block of -0.0 counts: this is the int32 notion, and the `blocks` hint's)."""
    return np.flatnonzero(block_bits_or(flat, block_size)[0])


def scan_float_blocks(flat: np.ndarray, block_size: int, dense: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of float32 `flat` the agent sends: (indices of the blocks holding a value
    other than +-0.0, their largest |x| as raw bits (block_absmax_bits), indices of the blocks
    of zeros with some -0.0). NaN and Inf are values: a non-finite block is sent so that
    every rank sees it. A block of zeros is not sent, whatever the signs of its zeros.

    dense: expect most blocks to hold values: one max-|x| pass finds them, and only the
    other blocks are looked at for -0.0 (same results, no OR pass).
    """
    if dense:
        absmax = block_absmax_bits(flat, block_size)
        zero = np.flatnonzero(absmax == 0)
        negzero = zero[gather_blocks(flat, zero, block_size).view(np.int32).any(axis=1)]
        nz = np.flatnonzero(absmax)
        return nz, absmax[nz], negzero
    bits, masked = block_bits_or(flat, block_size)
    nz = np.flatnonzero(masked)
    negzero = np.flatnonzero((bits != 0) & (masked == 0))
    if 2 * len(nz) > len(masked):  # dense: one pass over every block beats a gather
        absmax = block_absmax_bits(flat, block_size)[nz]
    else:
        absmax = _gathered_absmax_bits(flat, nz, block_size)
    return nz, absmax, negzero


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
    def build(cls, nz: np.ndarray, nslots: int, nlanes: int) -> tuple["LanePlan", np.ndarray]:
        """Plan for non-zero block indices `nz`; also returns the order that sorts them."""
        L = nslots * nlanes
        lane = nz % L
        order = np.argsort(lane, kind="stable")
        bounds = np.searchsorted(lane[order], np.arange(L + 1))
        return cls(nslots, nlanes, nz[order], bounds), order


ABS_MASK = 0x7FFFFFFF       # float32 bits without the sign: ordered like |x|
NONFINITE_BITS = 0x7F800000  # |x| bits at or above this: Inf or NaN
_SIGNLESS32 = np.int32(ABS_MASK)
_SIGNLESS64 = np.int64(0x7FFFFFFF7FFFFFFF)  # two float32 in one word, signs masked


def block_absmax_bits(flat: np.ndarray, block_size: int, chunk: int = 256) -> np.ndarray:
    """Per block of float32 `flat`: the largest |x| as its raw bits (0 for an all-zero block).

    One cache-friendly pass gives the non-zero mask (> 0), the exponent and the non-finite
    blocks (>= NONFINITE_BITS): float32 magnitudes order like their bits with the sign masked.
    The chunk's masked copy (256 blocks of 256: 256 KiB) stays in the core's L2 between the
    two steps; 4096 blocks (4 MiB) did not, and took 20-30% longer here.
    """
    ints = flat.view(np.int32)
    nfull = len(ints) // block_size
    full = ints[:nfull * block_size].reshape(nfull, block_size)
    out = np.empty(nfull + (nfull * block_size < len(ints)), np.int32)
    tmp = np.empty((min(chunk, nfull), block_size), np.int32)
    for i in range(0, nfull, chunk):  # a loop over chunks of blocks, vectorised inside
        part = full[i:i + chunk]
        t = tmp[:len(part)]
        np.bitwise_and(part, ABS_MASK, out=t)
        t.max(axis=1, out=out[i:i + len(part)])
    if len(out) > nfull:
        out[-1] = (ints[nfull * block_size:] & ABS_MASK).max()
    return out


def _gathered_absmax_bits(flat: np.ndarray, idx: np.ndarray, block_size: int,
                          chunk: int = 256) -> np.ndarray:
    """block_absmax_bits of the blocks `idx` only (the partial last block included)."""
    nfull = len(flat) // block_size
    full = flat.view(np.int32)[:nfull * block_size].reshape(nfull, block_size)
    out = np.empty(len(idx), np.int32)
    tmp = np.empty((min(chunk, len(idx)), block_size), np.int32)
    for i in range(0, len(idx), chunk):  # chunks stay in the core's L2 (block_absmax_bits)
        part = idx[i:i + chunk]
        t = tmp[:len(part)]
        np.take(full, part, axis=0, out=t, mode="clip")
        np.bitwise_and(t, ABS_MASK, out=t)
        t.max(axis=1, out=out[i:i + len(part)])
    if len(idx) and idx[-1] == nfull:  # ascending: the partial last block comes last
        out[-1] = (flat[nfull * block_size:].view(np.int32) & ABS_MASK).max()
    return out


def exponent_of_bits(bits: np.ndarray) -> np.ndarray:
    """Smallest e with |x| < 2**e, from absmax bits (EXPONENT_NONE for 0)."""
    e = (bits >> 23).astype(np.int32) - 126
    e[bits >> 23 == 0] = -126  # subnormals: below 2**-126
    e[bits == 0] = wire.EXPONENT_NONE
    return e


def headroom_bits(nworkers: int) -> int:
    """Bits kept free so that the sum of `nworkers` quantized values fits int32."""
    return math.ceil(math.log2(nworkers)) if nworkers > 1 else 0


def quant_shift(exponent: int, nworkers: int) -> int:
    """Shift S with |x| * 2**S < 2**(30 - headroom): N such values sum below 2**30.

    The float error of a dequantized sum is at most nworkers * 2**(-S-1) plus the float32
    rounding of the result (docs/aggregation.md).
    """
    if exponent == wire.EXPONENT_NONE:
        return 0
    return 30 - headroom_bits(nworkers) - exponent


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
