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


def nonzero_blocks(flat: np.ndarray, block_size: int) -> np.ndarray:
    """Ascending indices of the blocks of `flat` (1-D, 4-byte items) with any non-zero bit.

    Compares an integer view with zero (-0.0 counts as non-zero, NaN too): cheaper than
    float comparisons, and a NaN block must travel so that every rank sees it.
    """
    ints = flat.view(np.int32)
    nfull = len(ints) // block_size
    full = ints[:nfull * block_size].reshape(nfull, block_size)
    idx = np.flatnonzero(full.any(axis=1))
    if nfull * block_size < len(ints) and ints[nfull * block_size:].any():
        idx = np.append(idx, nfull)
    return idx


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


@dataclass
class LanePlan:
    """Where each of this worker's non-zero blocks goes, grouped lane by lane.

    pos: block positions sorted by (lane, position); lane_start/lane_end: each lane's range
    in `pos` (L + 1 boundaries); rows of the quantized data follow the same order.
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

    def slot_rows(self, slot: int) -> slice:
        """Rows of slot `slot`'s blocks (its lanes are consecutive)."""
        return slice(int(self.lane_bounds[slot * self.nlanes]),
                     int(self.lane_bounds[(slot + 1) * self.nlanes]))

    def first_ptr(self, slot: int) -> np.ndarray:
        """Per lane of `slot`: index in `pos` of its first block (the lane's end if none)."""
        return self.lane_bounds[slot * self.nlanes:(slot + 1) * self.nlanes].copy()

    def lane_ends(self, slot: int) -> np.ndarray:
        return self.lane_bounds[slot * self.nlanes + 1:(slot + 1) * self.nlanes + 1]

    def next_at(self, ptr: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Block position at each pointer, END where the lane is exhausted."""
        live = ptr < ends
        out = np.full(len(ptr), wire.END, np.uint32)
        out[live] = self.pos[ptr[live]]
        return out


def exponent_of(maxabs: np.ndarray) -> np.ndarray:
    """Smallest e with |x| < 2**e for each maximum (EXPONENT_NONE for 0)."""
    e = np.frexp(maxabs)[1].astype(np.int32)
    e[maxabs == 0] = wire.EXPONENT_NONE
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


def quantize(rows: np.ndarray, shift: int) -> np.ndarray:
    """float32 rows -> int32, round to nearest, scaled by 2**shift (ldexp is exact)."""
    return np.rint(np.ldexp(rows, shift)).astype(np.int32)


def dequantize(data: np.ndarray, shift: int) -> np.ndarray:
    """int32 sums -> float32, one rounding (int -> float32), then an exact power-of-2 scale."""
    return np.ldexp(data.astype(np.float32), -shift)
