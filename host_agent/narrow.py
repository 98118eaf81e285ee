"""Narrow lanes on the host (docs/bits.md): a float call's values travel as 16- or 8-bit
integers (the job's `lane_bits`), each stochastically rounded with counter-based draws of
(job, rank, call), and what a lane did not carry stays in the caller's residual for the next
call (error feedback). int32 tensors always travel in int32 lanes.

The agent's compiled core rounds and decodes narrow rows in its answer loop
(host_agent/_core_rounds.c fill_round and deliver, the draws recomputed there per row);
`NumpyRounds` is their numpy reference, which Agent(datapath="python") runs (with the draws of
blocks.rounding_noise) and tests/test_narrow_lanes.py and tests/test_core.py compare bit for bit.
The quantization itself (the shift, stochastic_quantize, the error bound) is blocks.py's.
"""
from __future__ import annotations

import struct

import numpy as np

from host_agent.blocks import (
    dequantize,
    gather_blocks,
    rounding_noise,
    scatter_blocks,
    stochastic_quantize,
)
from spina import wire
from spina.config import JobConfig

# One big-endian struct per header field (a narrow round's own fields, written in numpy's path).
_FIELD_STRUCTS = {name: struct.Struct(">" + code) for name, code, _ in wire.HEADER_FIELDS}


def call_lane_bits(job: JobConfig, integer: bool) -> int:
    """The width of a call's values on the wire (int32 tensors: 32); ValueError when the job's
    lanes of that width would not fit one UDP datagram."""
    bits = 32 if integer else job.lane_bits
    k, B = job.nlanes, job.block_size
    if wire.packet_len(k, B, k, wire.LANE_FLAGS[bits]) > wire.MAX_UDP_PAYLOAD:
        raise ValueError(f"job {job.job}: an int32 tensor travels in int32 lanes, and "
                         f"{k} lanes of {B} exceed a UDP datagram (the job's "
                         f"{job.lane_bits}-bit lanes carry its float tensors only)")
    return bits


def with_residual(job: JobConfig, x, residual, refused: bool,
                  inplace: bool = False, compiled: bool = True) -> np.ndarray:
    """Agent.allreduce's `residual` checked, and x + residual: a float32 array of its own that
    the call sums in place, or with `inplace` x itself (a writeable, contiguous float32 numpy
    array) holding it: the sum then lands in x, as an in-place call's does, without a
    tensor-sized copy (the DDP hook's aligned bucket). `residual` then holds x + residual too
    (add_keep): what the call has not sent stays there, and each row sent replaces its own with
    its rounding error. `refused`: the call has a blocks hint or a torch tensor, which error
    feedback does not take. compiled: add_keep's one C pass (False: numpy's, the reference)."""
    if job.lane_bits == 32 or refused:
        raise ValueError("residual: error feedback needs a narrow-lane job (lane_bits 16 "
                         "or 8), a numpy tensor and no blocks hint")
    if not (isinstance(residual, np.ndarray) and residual.dtype == np.float32
            and residual.flags.c_contiguous and residual.flags.writeable
            and residual.size == np.size(x)):
        raise ValueError("residual: must be a writeable, contiguous float32 array of "
                         "x's size")
    if not inplace:
        x = np.asarray(x, np.float32)
        return add_keep(x, residual.reshape(x.shape), np.empty_like(x), compiled)
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous
            and x.flags.writeable):
        raise ValueError("inplace with residual: x must be a writeable, contiguous float32 "
                         "numpy array")
    return add_keep(x, residual.reshape(x.shape), x, compiled)


def add_keep(x: np.ndarray, residual: np.ndarray, out: np.ndarray,
             compiled: bool = True) -> np.ndarray:
    """out = x + residual (float32) and residual = out (out may be x): the values a call sums,
    kept in the residual until their rows are sent. Compiled: one pass over the three
    (_core.add_keep, the same float32 adds), where numpy's add and copy read x + residual
    twice."""
    if compiled:
        from host_agent import _core
        _core.add_keep(np.ascontiguousarray(x), residual, out)
    else:
        np.add(x, residual, out=out)
        np.copyto(residual, out)
    return out


class NumpyRounds:
    """A narrow-lane call's rounds in numpy (the reference of _core.fill_round and
    _core.deliver with a width flag): rows rounded with the draws of
    rounding_noise(job, rank, call), one row per plan row (pos_ext index - lane).

    Args:
        job, rank, call_id: whose call (the draws' seed, rank and step).
        lane_bits: the call's width (16 or 8).
        flat, out: the tensor and where its sums go.
        residual: error feedback (float32, flat's size), or None.
        pos_ext, nonfinite: the call's plan positions lane by lane with their sentinels, and
            per plan row 1 where the block holds NaN/Inf (or None); see agent._Call.
        next_end: where a datagram's data rows start (wire.data_offset(nlanes)).
    """

    def __init__(self, job: JobConfig, rank: int, call_id: int, lane_bits: int,
                 flat: np.ndarray, out: np.ndarray, residual: np.ndarray | None,
                 pos_ext: np.ndarray, nonfinite: np.ndarray | None, next_end: int):
        self.k, self.B = job.nlanes, job.block_size
        self.lane_bits, self.width_flag = lane_bits, wire.LANE_FLAGS[lane_bits]
        self.flat, self.out, self.residual = flat, out, residual
        self.pos_ext, self.nonfinite, self.next_end = pos_ext, nonfinite, next_end
        nrows = int((pos_ext >= 0).sum())
        self.noise = rounding_noise(job.job, rank, call_id, (nrows, self.B))

    def fill(self, st, buf, next_view, pos: np.ndarray, flags: int, priority: int,
             round_tag: int) -> int:
        """_core.fill_round's narrow rows: slot `st`'s rows at the agreed positions `pos`
        where this worker has them, stochastically rounded to the lane's width (with error
        feedback into the residual if any), the next positions (into `next_view`) and the
        round's header fields, into the slot's datagram `buf`; st.ptr steps past the blocks
        sent. Returns the rows written."""
        k, B = self.k, self.B
        own = self.pos_ext[st.ptr]
        send = (own >= 0) & (own == pos)
        lanes = np.flatnonzero(send)
        plan_rows = st.ptr[lanes] - (st.index * k + lanes)
        blocks = own[lanes]
        rows = gather_blocks(self.flat, blocks, B)
        nf = (self.nonfinite[plan_rows].astype(bool) if self.nonfinite is not None
              else np.zeros(len(lanes), bool))
        if nf.any():  # NaN/Inf count as 0; every rank's result is NaN there
            rows = np.where(np.isfinite(rows), rows, np.float32(0))
        q = stochastic_quantize(rows, st.shift, self.lane_bits, self.noise[plan_rows])
        if self.residual is not None and len(lanes):
            err = rows - dequantize(q, st.shift)
            err[nf] = 0  # a non-finite block's residual is dropped
            scatter_blocks(self.residual, blocks, err, B)
        st.ptr[lanes] += 1
        nxt = self.pos_ext[st.ptr]
        next_view[:] = np.where(nxt < 0, wire.END, nxt)
        data_at = self.next_end
        buf[data_at:data_at + q.nbytes] = q.astype(wire.data_dtype(self.width_flag)).tobytes()
        lane_bits = 1 << lanes.astype(np.uint64)
        present = int(np.bitwise_or.reduce(lane_bits)) if len(lanes) else 0
        nonfinite = int(np.bitwise_or.reduce(lane_bits[nf])) if nf.any() else 0
        last = wire.FLAG_LAST if (nxt < 0).all() else 0
        for name, value in (("flags", flags | last | self.width_flag), ("priority", priority),
                            ("round", round_tag), ("exponent", st.exponent),
                            ("bitmap", 0), ("present", present), ("nonfinite", nonfinite)):
            _FIELD_STRUCTS[name].pack_into(buf, wire.FIELD_OFFSET[name], value)
        return len(lanes)

    def deliver(self, view, pos: np.ndarray, present: int, nonfinite: int, shift: int) -> bool:
        """_core.deliver's narrow rows: the result's rows, dequantized, into their blocks (NaN
        for the non-finite lanes); pos becomes the next positions; True when every one is
        END."""
        k, B = self.k, self.B
        if present:
            lanes = wire.lane_indices(present, k)
            data = np.frombuffer(view, wire.data_dtype(self.width_flag), len(lanes) * B,
                                 self.next_end).reshape(-1, B)
            scatter_blocks(self.out, pos[lanes], dequantize(data, shift), B)
        if nonfinite:
            scatter_blocks(self.out, pos[wire.lane_indices(nonfinite, k)], np.float32("nan"), B)
        pos[:] = np.frombuffer(view, wire.NEXT_DTYPE, k, wire.HEADER_LEN)
        return bool((pos == wire.END).all())
