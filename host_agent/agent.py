"""The host agent: sparse all-reduce of one tensor through a SpINA switch.

One call, per slot of the job's window (all slots run at once, one packet outstanding each):

  setup round   every worker sends, per lane, the position of its first non-zero block and
                its largest exponent; the result gives the union's first position per lane
                and the exponent every worker quantizes with (agreed before any data moves,
                so the sum of N workers can never overflow int32).
  data rounds   every worker sends the block at the agreed position of each lane if it has
                one (no payload bytes otherwise) plus its next non-zero position; the switch
                sums, takes the minimum of the next positions, and multicasts the result,
                which also names the next round's positions. A position that is zero at
                every worker is never visited.

Lost packets are resent (host_agent/recovery.py decides which and when); the switch
recognises a resend (worker bitmap) and answers with the stored result or with a status
naming who is still missing.
docs/aggregation.md has the details.
"""
from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import select
import socket
import struct
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np

from host_agent import allgather as gather, dlcp, narrow, scatter
from host_agent.blocks import (
    LanePlan,
    exponent_of_bits,
    nonzero_blocks,
    quant_shift,
    rescale_nonfinite,
    scan_float_blocks,
    scatter_blocks,
)
from host_agent.recovery import MIN_RTO, Recovery, RttEstimator, Timer, flusher_rank
from spina import log as spina_log, rendezvous, wire
from spina.config import LOSS_DEADLINE_AUTO, JobConfig
from spina.net import bind_own_address, grow_buffers

try:  # the per-datagram work and the socket calls (host_agent/_core.c)
    from host_agent import _core
except ImportError as e:
    raise ImportError("host_agent._core (host_agent/_core.c) is not built: run `make setup` "
                      "(pip install -e .), or `make core` to rebuild it in place") from e

log = logging.getLogger("spina.agent")

_UNPACK, _PACK_INTO = wire.HEADER_STRUCT.unpack_from, wire.HEADER_STRUCT.pack_into
# An answer as _core.recv_answers gives it: (ring index, slot index within the window,
# msg_type, flags, round, exponent, bitmap, present, nonfinite, length, nbytes)
(_A_INDEX, _A_SLOT, _A_MSG_TYPE, _A_FLAGS, _A_ROUND, _A_EXPONENT, _A_BITMAP, _A_PRESENT,
 _A_NONFINITE, _A_LENGTH, _A_NBYTES) = range(11)
_FLAGS_AT = wire.FIELD_OFFSET["flags"]  # byte offset: a resend sets its flags in place
_BITMAP_AT, _BITMAP_STRUCT = wire.FIELD_OFFSET["bitmap"], struct.Struct(">I")
_RING_STRIDE = 1 << 16  # > wire.MAX_UDP_PAYLOAD: each answer of a batch has its own 64 KiB
_RING_SLOTS = 32        # answers read per recvmmsg at most
DATAPATHS = ("compiled", "python")  # Agent(datapath=...): who handles the common answers
# ICMP errors (Linux IP_RECVERR, <linux/in.h>; Python's socket module does not name it): the
# socket reports them, and queues each with its errno (struct sock_extended_err first).
_IP_RECVERR = 11
_ERRQUEUE_CMSG = 512


class SpinaError(RuntimeError):
    """An all-reduce that could not complete; the message says why."""


class SpinaTimeout(SpinaError):
    """Some workers never contributed; `.missing` lists their ranks."""

    def __init__(self, msg: str, missing: list[int]):
        super().__init__(msg)
        self.missing = missing


class LengthMismatch(SpinaError):
    """Workers called all-reduce (or all-gather) with tensors of different lengths."""


@dataclass
class CallStats:
    """What one call put on the wire (this worker) and got back."""
    length: int = 0
    nonzero_blocks: int = 0
    packets_sent: int = 0
    bytes_sent: int = 0          # whole UDP payloads (resends included)
    payload_bytes_sent: int = 0  # block data only
    resends: int = 0
    bytes_resent: int = 0        # the resends' share of bytes_sent
    fast_resends: int = 0        # resends by trigger: fast retransmit, timeout, a round the
    timeout_resends: int = 0     # switch may hold after a partial one (the rest: bounded-loss
    hold_resends: int = 0        # flushes)
    spurious_resends: int = 0    # resends found unnecessary (host_agent/recovery.py)
    packets_received: int = 0
    bytes_received: int = 0
    rounds: int = 0
    partial_rounds: int = 0      # rounds the switch completed without every worker (bounded loss)
    partial_fraction: float = 0.0  # their blocks / the tensor's blocks: an upper bound of the
                                   # fraction of blocks that miss some worker's contribution
    loss_tolerant_packets: int = 0  # first transmissions flagged loss-tolerant (host_agent/dlcp.py)
    loss_deadline: float = 0.0   # bounded loss: the flush deadline at the call's end (the job's
                                 # seconds, or `auto`'s from the round latency; slowest group)
    blocks_lost: int = 0         # own blocks missing from the result: sent in a round completed
                                 # without this worker, or skipped by such a round's positions
    foreign_packets: int = 0     # datagrams from anyone but the switch: dropped unread
    malformed_packets: int = 0   # datagrams from the switch failing the header checks: dropped
    seconds: float = 0.0
    # The call's timeline (docs/profile.md "A sparse call's timeline"): seconds since the call
    # began at which each phase ended (PHASES), and how long the loop slept in select.
    phases: dict = field(default_factory=dict)


# A call's phases in order, each ending at the time CallStats.phases gives it: the scan of the
# tensor (and its NaN/Inf check), the call's plan (lanes, classes, buffers), the setup rounds
# written and sent, the last setup result received, the last answer received, the call
# returned. "waited": seconds spent asleep in select for an answer; "cpu": this thread's CPU
# seconds for the whole call; "batches": answer batches received.
PHASES = ("scan", "plan", "setup_sent", "setup_done", "answers", "end")


@dataclass
class _Slot:
    """Per-slot progress within one call."""
    slot: int                     # absolute pool index
    index: int                    # index within the job's window
    ptr: np.ndarray = None        # per lane: index in the call's pos_ext of the first own
                                  # block not yet sent (the lane's sentinel if none)
    lanes: np.ndarray = None      # the slot's global lane numbers
    pos: np.ndarray = None        # positions of the round in flight, int64 (_core.deliver
                                  # overwrites them with the next round's)
    setup: bool = True            # the round in flight is the setup round
    round: int = 0
    shift: int = 0
    exponent: int = 0
    packet: memoryview = None     # the round's datagram (in the agent's per-slot buffer)
    view: memoryview = None       # the whole per-slot buffer
    done: bool = False
    timer: Timer = None           # transmissions and answers of the round in flight


class _Buffers:
    """Memory an agent reuses across calls: per slot, the datagram a round is built in (it
    stays there for resends)."""

    def __init__(self):
        self._key = None
        self.slots: list = []

    def get(self, W: int, k: int, B: int) -> list:
        """Per slot (datagram buffer, its next view (k,) >u4)."""
        if self._key != (W, k, B):
            self.slots = []
            for _ in range(W):
                b = bytearray(wire.packet_len(k, B, k))
                self.slots.append((b, np.frombuffer(b, wire.NEXT_DTYPE, k, wire.HEADER_LEN)))
            self._key = (W, k, B)
        return self.slots


class _Call:
    """The state of one all-reduce call at one worker.

    Args:
        job, rank, call_id: whose call this is (the job with its run's epoch).
        rounds: the last round tag used per slot (the agent's, kept across calls; updated).
        flat, integer, inplace, blocks: the tensor and how to sum it (Agent.allreduce).
        buffers: the agent's reused datagram buffers.
        rtt: the agent's latency estimator (kept across calls).
        check_blocks: verify a `blocks` hint against a full scan.
        layer: the call's (i, n) layer position for DLCP priorities (host_agent/dlcp.py).
        slot_exponents: per slot, the least exponent this worker announces (Agent.allreduce).
        compiled: answers take _core.answer_batch where it handles them (Agent's datapath).
        residual: error feedback of a narrow-lane call (Agent.allreduce), or None.

    Narrow lanes (job.lane_bits 16 or 8, a float tensor; host_agent/narrow.py): with
    `compiled`, their rows are stochastically rounded in _core.fill_round (the draws recomputed
    there from `draws`, (seed, rank, step)) and their results decoded by _core.deliver, in the
    answer loop as int32 rows are; otherwise in numpy (narrow.NumpyRounds, the reference).
    """

    def __init__(self, job: JobConfig, rank: int, call_id: int, rounds: np.ndarray,
                 flat: np.ndarray, integer: bool, inplace: bool, blocks: np.ndarray | None,
                 buffers: _Buffers, rtt: RttEstimator, check_blocks: bool = False,
                 layer: tuple[int, int] | None = None, compiled: bool = False,
                 residual: np.ndarray | None = None, slot_exponents: np.ndarray | None = None,
                 owners: scatter.Owners | None = None):
        self.job, self.rank, self.call_id, self.rounds = job, rank, call_id, rounds
        self.owners = owners  # a reduce-scatter: each data round names its blocks' owners
        # Ranks and bitmaps on the wire are the worker's own switch's: in a two-level job its
        # rack's leaf knows ranks rack_first.. as 0..rack_size-1 (flat: the job's ranks).
        self.rack_first, self.rack_size = job.rack_of(rank)
        self.wire_rank = rank - self.rack_first
        self.outbox: list = []  # datagrams to send (the agent sends them in one batch)
        self.flat, self.integer = flat, integer
        self.B, self.k, W = job.block_size, job.nlanes, job.nslots
        # The values' width on the wire: int32 tensors always travel as int32.
        self.lane_bits = narrow.call_lane_bits(job, integer)
        self.width_flag = wire.LANE_FLAGS[self.lane_bits]
        self.row_bytes = wire.row_bytes(self.B, self.width_flag)
        # error feedback: the residual holds flat already (narrow.with_residual), so what is
        # not sent stays; a sent row keeps its rounding error there
        self.residual = residual
        n = len(flat)
        self.stats = CallStats(length=n)
        if blocks is not None and check_blocks:
            _check_block_hint(flat, blocks, self.B)
        self.inplace = inplace
        nz, bits, nonfinite = self._scan(blocks)
        self.t_scan = time.monotonic()
        self.t_setup_done = 0.0
        self.stats.nonzero_blocks = len(nz)
        self.plan, order = LanePlan.build(
            nz, W, self.k, None if owners is None else owners.lanes(nz, W, self.k))
        # per plan row, 1 where the block holds NaN/Inf (_core.fill_round sends those as 0)
        self.nonfinite = nonfinite[order].view(np.uint8) if nonfinite.any() else None
        flusher = flusher_rank(call_id, len(job.workers)) == rank  # bounded loss: who flushes
        self.classes = dlcp.classify(job, self.plan, None if integer else bits[order],
                                     self.nonfinite, layer, flusher)  # per packet: queue, flags
        slot_exp = np.full(W, 0 if integer else wire.EXPONENT_NONE, np.int32)
        if not integer and len(nz):
            starts = self.plan.lane_bounds[:-1:self.k]
            has = starts < self.plan.lane_bounds[self.k::self.k]
            # One sentinel past the end so that empty trailing slots index a valid row.
            exps = np.append(exponent_of_bits(bits[order]), wire.EXPONENT_NONE)
            slot_exp[has] = np.maximum.reduceat(exps, starts)[has]
        if slot_exponents is not None and not integer:
            slot_exp = np.maximum(slot_exp, slot_exponents)
        self.slot_exp = slot_exp
        self.nblocks = -(-n // self.B)
        self.out = flat if inplace else np.zeros(n, flat.dtype)
        # Data-path layout. pos_ext: the plan's positions lane by lane, each lane followed by
        # a sentinel -1 (never a position, and END once cast to the wire's u32), so a lane's
        # pointer can step past its last block without a bounds check.
        plan, k, B = self.plan, self.k, self.B
        L = W * k
        nnz = len(plan.pos)
        per_lane = np.diff(plan.lane_bounds)
        self.pos_ext = np.full(nnz + L, -1, np.int64)
        self.pos_ext[np.arange(nnz) + np.repeat(np.arange(L), per_lane)] = plan.pos
        first_ext = plan.lane_bounds[:-1] + np.arange(L)
        self.keys_ext = None  # searchsorted keys (lane << 32 | position): bounded loss only
        if job.bounded_loss:
            lane_ext = np.repeat(np.arange(L, dtype=np.int64), per_lane + 1)
            self.keys_ext = (lane_ext << 32) + np.where(self.pos_ext < 0, wire.END, self.pos_ext)
        self.bufs = buffers.get(W, k, B)
        for s, (buf, _) in enumerate(self.bufs):
            # The call's header template; _core.fill_round writes each round's own fields.
            _PACK_INTO(buf, 0, wire.VERSION, wire.MSG_CONTRIB, 0, 0, job.job, job.epoch, call_id,
                       s + job.slot_base, self.wire_rank, k, 0, n, B, 0, 0, 0, 0)
        self.next_end = wire.data_offset(k)  # the next positions' bytes end here in a datagram
        groups = job.slot_groups or (0,) * job.nslots
        timers = [Timer(group=groups[s]) for s in range(W)]
        # Bounded loss: each partial round counts its nlanes blocks against the budget.
        self.recovery = Recovery(rtt, timers, time.monotonic(), job.bounded_loss,
                                 None if job.loss_deadline == LOSS_DEADLINE_AUTO
                                 else job.loss_deadline, job.bounded_loss * self.nblocks / k,
                                 flusher=flusher)
        self.slots = [_Slot(s + job.slot_base, s, ptr=first_ext[s * k:(s + 1) * k].copy(),
                            lanes=np.arange(s * k, (s + 1) * k, dtype=np.int64),
                            pos=np.zeros(k, np.int64), timer=timers[s],
                            view=memoryview(self.bufs[s][0]))
                      for s in range(W)]
        # Slots whose lanes hold no position of the tensor (lane l holds positions l, l + W*k,
        # ...: slot s is empty when s*k >= nblocks; a reduce-scatter's lanes: Owners.used_lanes)
        # have nothing to sum at any worker of the same length: they send nothing, not even a
        # setup round (a 16 KiB call: 1 datagram per worker and round instead of 16). Slot 0
        # always runs, so a length mismatch is still found. A skipped slot's round tag still
        # advances by one, as if its setup round had run, so every worker's tags stay equal
        # even when workers disagree on the length (they each sent or skipped that one round),
        # and a slot's next round is newer than every round it stored (docs/aggregation.md).
        used = (np.arange(L) < self.nblocks if owners is None
                else owners.used_lanes(W, k)).reshape(W, k).any(axis=1)
        used[0] = True
        self.active = [st for st, u in zip(self.slots, used) if u]  # the slots in use
        self.setups = len(self.active)  # setup results to come
        for st, u in zip(self.slots, used):
            if not u:
                self._new_round(st)
                st.done = True
        # The compiled answer loop's context (_core.answer_batch): its common case has no
        # bounded loss (searchsorted skips, flushes) and no droppable packets (DLCP); else
        # every answer takes the Python path.
        self.compiled = None
        # Stochastic rounding's draws (narrow lanes), one row per plan row (pos_ext index -
        # lane), from (seed = job id, rank, step = call id): a rerun of the job sends the same
        # values. Compiled: _core.fill_round computes each row's where it sends it; else numpy
        # draws them all (narrow.NumpyRounds).
        self.draws = self.narrow = None
        if self.width_flag and compiled:
            self.draws = (job.job, rank, call_id)
        elif self.width_flag:
            self.narrow = narrow.NumpyRounds(job, rank, call_id, self.lane_bits, flat, self.out,
                                             residual, self.pos_ext, self.nonfinite,
                                             self.next_end)
        if compiled and self.keys_ext is None and self.classes.droppable is None:
            rec = self.recovery
            self.compiled = (self.slots, self.stats, rec, rec.rtt, rec.flying, rec.rack,
                             rec.rtt.group_srtt, rounds, flat, self.out, self.pos_ext,
                             self.nonfinite, k, B, integer, self.next_end,
                             self.classes.priority, self.outbox, self.bufs, self.width_flag,
                             self.draws, self.residual,
                             None if owners is None else (owners.n, owners.chunk, B))

    def _scan(self, blocks: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The blocks this worker sends (ascending), their largest |x| as bits (floats), and
        which of them hold NaN/Inf. Only the hinted `blocks` are looked at if given. In place,
        blocks of zeros with some -0.0 (not sent) become +0.0, as every rank's sum reads."""
        flat, B = self.flat, self.B
        if self.integer:
            nz = nonzero_blocks(flat, B, blocks)
            return nz, None, np.zeros(len(nz), bool)
        nz, bits, negzero = scan_float_blocks(flat, B, blocks)
        if self.inplace and len(negzero):
            scatter_blocks(flat, negzero, 0, B)
        return nz, bits, rescale_nonfinite(flat, nz, bits, B)

    def send_setup(self, st: _Slot) -> None:
        """The slot's setup round: first positions per lane and the slot's exponent."""
        _, _, nrows, _ = _core.fill_round(
            self.bufs[st.index][0], self.flat, self.pos_ext, st.ptr, None, self.nonfinite,
            st.index * self.k, 0, self.integer, self.B, self._new_round(st), self.width_flag,
            self.classes.priority, int(self.slot_exp[st.index]))
        self._queue(st, 0, nrows, time.monotonic())

    def answers(self, views: list, answers: list, now: float) -> int:
        """Handle a batch of answers (_core.recv_answers' tuples, the datagrams in `views`,
        received by `now`) in arrival order; returns how many slots' streams are done. The
        compiled loop takes the common case and hands back at the first other answer."""
        done = i = 0
        n = len(answers)
        while i < n:
            if self.compiled is not None:
                i, finished = _core.answer_batch(self.compiled, answers, views, i, now)
                done += finished
                if i == n:
                    break
            a = answers[i]
            done += self.answer(views[a[_A_INDEX]], a, now)
            i += 1
        return done

    def answer(self, view, a: tuple, now: float | None = None) -> bool:
        """Handle answer `a` (_core.recv_answers' fields) in `view`, received by `now` (None:
        the time now), if it answers its slot's round in flight; True when the slot's stream
        is done."""
        st = self.slots[a[_A_SLOT]]
        if st.done or a[_A_ROUND] != st.round:  # an answer to an earlier round (duplicate result)
            if a[_A_MSG_TYPE] == wire.MSG_RESULT:
                self.recovery.late_result(st.timer, a[_A_ROUND])
            return False
        return self.on_answer(view, a, st, time.monotonic() if now is None else now)

    def on_answer(self, view, a: tuple, st: _Slot, now: float) -> bool:
        """Handle a result or status (`a`, _core.recv_answers' fields) to slot `st`'s round in
        flight, received by `now`; True when the slot's stream is done."""
        stats = self.stats
        stats.packets_received += 1
        stats.bytes_received += a[_A_NBYTES]
        if a[_A_MSG_TYPE] == wire.MSG_STATUS:
            self.recovery.status(st.timer, a[_A_BITMAP], now)
            return False
        flags = a[_A_FLAGS]
        if flags & wire.FLAG_MISMATCH or flags & wire.FLAGS_LANE_WIDTH != self.width_flag:
            raise LengthMismatch(
                f"job {self.job.job} call {self.call_id}: workers disagree on the tensor length "
                f"or the lane width: rank {self.rank} has {len(self.flat)} elements in "
                f"{self.lane_bits}-bit lanes, the result says {a[_A_LENGTH]} elements")
        partial = bool(flags & wire.FLAG_PARTIAL)
        ours_in = bool(a[_A_BITMAP] >> self.wire_rank & 1)
        self.recovery.result(st.timer, st.round, now,
                             multicast=not flags & wire.FLAG_RESEND, partial=partial,
                             held_for=(~a[_A_BITMAP] & ((1 << self.rack_size) - 1)
                                       if partial and ours_in else 0))
        if partial and not ours_in:  # ours never arrived
            stats.blocks_lost += (len(st.packet) - self.next_end) // self.row_bytes
        if st.setup:  # setup result: the exponent every worker quantizes with
            self.setups -= 1
            if not self.setups:
                self.t_setup_done = now
            st.shift = 0 if self.integer else quant_shift(a[_A_EXPONENT], self.job.nworkers,
                                                          self.lane_bits)
            st.exponent = a[_A_EXPONENT]
            st.setup = False
            present = nonfinite = 0
        else:
            present, nonfinite = a[_A_PRESENT], a[_A_NONFINITE]
        # the sums into their blocks (NaN where a worker reported NaN/Inf); st.pos becomes the
        # next round's positions
        if self.narrow is not None:  # narrow lanes, numpy's path
            done = self.narrow.deliver(view, st.pos, present, nonfinite, st.shift)
        else:
            done = _core.deliver(view, self.out, st.pos, present, nonfinite, st.shift,
                                 self.integer, self.B, self.width_flag)
        stats.rounds += 1
        if done:  # every lane is done
            st.done = True
            return True
        self._next_round(st, now)
        return False

    def _next_round(self, st: _Slot, now: float) -> None:
        """Send this worker's blocks at the positions st.pos (int64, where it has them) and its
        next ones."""
        pos = st.pos
        if self.keys_ext is not None:
            # Bounded loss: a round completed without this worker may have skipped some of its
            # blocks; find each lane's first block at or after `pos`.
            ptr = np.searchsorted(self.keys_ext, (st.lanes << 32) + pos)
            self.stats.blocks_lost += int((ptr - st.ptr).sum())
            if self.inplace and (ptr > st.ptr).any():
                # Skipped blocks are not in any result, so they must read zero here as at
                # every other rank.
                skipped = np.concatenate([self.pos_ext[a:b] for a, b in zip(st.ptr, ptr) if b > a])
                scatter_blocks(self.out, skipped, 0, self.B)
            st.ptr = ptr
        priority, tolerant = self.classes.packet_class(self.pos_ext, st.ptr, pos)  # DLCP
        # gather, quantize and write the rows, next positions and header fields into the
        # datagram; st.ptr steps past the blocks sent
        if self.narrow is not None:  # narrow lanes, numpy's path
            buf, next_view = self.bufs[st.index]
            nrows = self.narrow.fill(st, buf, next_view, pos, tolerant, priority,
                                     self._new_round(st))
        else:
            _, _, nrows, _ = _core.fill_round(
                self.bufs[st.index][0], self.flat, self.pos_ext, st.ptr, pos, self.nonfinite,
                st.index * self.k, st.shift, self.integer, self.B, self._new_round(st),
                tolerant | self.width_flag, priority, st.exponent, self.draws, self.residual)
        if self.owners is not None:  # reduce-scatter: the ranks the round's sums go to
            _BITMAP_STRUCT.pack_into(self.bufs[st.index][0], _BITMAP_AT, self.owners.of(pos))
        self._queue(st, tolerant, nrows, now)

    def _new_round(self, st: _Slot) -> int:
        """The round tag of slot `st`'s next round (also st.round)."""
        r = int(self.rounds[st.index]) + 1
        self.rounds[st.index] = r
        st.round = r & 0xFFFFFFFF
        return st.round

    def _queue(self, st: _Slot, flags: int, nrows: int, now: float) -> None:
        """Queue the round of slot `st` just written into its buffer (`nrows` data rows) for
        sending (its first transmission: at `now`)."""
        n = self.next_end + self.row_bytes * nrows
        st.packet = st.view[:n]
        # a setup round is never flushed: a missing exponent could overflow its worker's blocks
        self.recovery.sent(st.timer, now, flushable=not st.setup)
        self.outbox.append(st.packet)
        stats = self.stats
        if flags & wire.FLAG_LOSS_TOLERANT:
            stats.loss_tolerant_packets += 1
        stats.packets_sent += 1
        stats.bytes_sent += n
        stats.payload_bytes_sent += self.row_bytes * nrows

    def resend_due(self, idle: bool, longest: float, timeout: float, switch) -> float:
        """Resend the rounds host_agent/recovery.py finds due; fail if a slot made no progress
        for `timeout` seconds. `idle`: the socket is empty now. Returns how long to wait at
        most."""
        now = time.monotonic()
        rec, stats = self.recovery, self.stats
        flying = [(st, st.timer) for st in self.slots if not st.done]
        stalled = rec.stalled(flying, now, timeout)
        if stalled is not None:
            raise self._timeout_error(stalled[0], timeout, switch)
        for st, tm in rec.due(flying, now, idle):
            pkt = bytearray(st.packet)
            pkt[_FLAGS_AT] |= rec.resend_flags(tm)
            self.outbox.append(pkt)
            rec.resent(tm, now)
            stats.resends += 1
            stats.packets_sent += 1
            stats.bytes_sent += len(pkt)
            stats.bytes_resent += len(pkt)
        return rec.wait(flying, now, longest)

    def finish(self, seconds: float) -> CallStats:
        """The call's statistics, with what recovery counted."""
        rec, stats = self.recovery, self.stats
        stats.spurious_resends = rec.spurious
        stats.fast_resends = rec.fast_resends
        stats.timeout_resends = rec.timeout_resends
        stats.hold_resends = rec.hold_resends
        stats.partial_rounds = rec.partial_rounds
        stats.partial_fraction = min(1.0, rec.partial_rounds * self.k / max(1, self.nblocks))
        if self.job.bounded_loss:
            stats.loss_deadline = max(rec.deadline(g) for g in {tm.group for tm in rec.timers})
        stats.seconds = seconds
        return stats

    def _timeout_error(self, st: _Slot, timeout: float, switch) -> SpinaTimeout:
        """Why slot `st` made no progress. The switch answers every resend of an incomplete
        round with a status naming who contributed; resends that got no answer at all mean the
        switch does not know this job (it restarted and was not redeployed, or the job or epoch
        is not admitted) or is unreachable, and no rank is to blame."""
        job, tm = self.job, st.timer
        head = (f"job {job.job} call {self.call_id}: no result for slot {st.slot} round "
                f"{st.round} within {timeout:g} s; ")
        if tm.held_for and not tm.statuses:
            # Bounded loss: the slot's previous round completed without these ranks, and the
            # switch holds this one until they are heard (docs/reliability.md): they stopped.
            held = self._job_ranks(tm.held_for)
            return SpinaTimeout(
                head + f"ranks {held} are missing from this slot's previous round (completed "
                "partial without them) and never sent this one; the switch holds it until "
                "they do: they stopped or lost contact with the switch", held)
        if tm.unanswered >= 3 or not tm.last_bitmap:
            silent = ("never answered this call" if not self.stats.packets_received else
                      f"did not answer the last {tm.unanswered} resends")
            overtaken = ("; or (bounded loss, a switch without the hold of a newer round: the "
                         "Tofino program) the switch reused the copy this round waits for "
                         "(docs/reliability.md)") if job.bounded_loss and \
                self.stats.packets_received else ""
            return SpinaTimeout(
                head + f"the switch at {switch[0]}:{switch[1]} {silent}: it is not "
                f"running, or it does not admit job "
                f"{job.job} epoch {job.epoch} (a switch restarted without a redeploy "
                f"has lost its jobs: run the controller's deploy){overtaken}", [])
        missing = self._job_ranks(~tm.last_bitmap)
        if not missing and job.racks:
            # The leaf's status: every rank of this rack is in, the spine waits for other
            # racks; which ones, a leaf cannot say (the spine's bitmap names racks).
            first, last = self.rack_first, self.rack_first + self.rack_size - 1
            missing = [r for r in range(job.nworkers) if not first <= r <= last]
            return SpinaTimeout(head + f"every rank of this rack ({first}..{last}) contributed; "
                                f"the spines wait for other racks: some of ranks {missing} "
                                "never contributed", missing)
        return SpinaTimeout(head + f"ranks {missing} never contributed", missing)

    def _job_ranks(self, bitmap: int) -> list[int]:
        """The job ranks named by a bitmap of this worker's switch's ranks."""
        return [self.rack_first + r for r in range(self.rack_size) if bitmap >> r & 1]


def _check_block_hint(flat: np.ndarray, blocks: np.ndarray, block_size: int) -> None:
    """Debug check of an allreduce `blocks` hint: sorted, in range, covering every non-zero
    block."""
    nblocks = -(-len(flat) // block_size)
    if len(blocks) and (blocks[0] < 0 or blocks[-1] >= nblocks or (np.diff(blocks) <= 0).any()):
        raise ValueError("blocks hint: must be strictly increasing block indices in "
                         f"0..{nblocks - 1}")
    missed = np.setdiff1d(nonzero_blocks(flat, block_size), blocks, assume_unique=True)
    if len(missed):
        raise ValueError(f"blocks hint misses {len(missed)} non-zero block(s) of the tensor, "
                         f"first {missed[:5].tolist()}: the agent would not send them")


_CODE = {np.dtype(np.float32): "float", np.dtype(np.float16): "float",
         np.dtype(np.float64): "float", np.dtype(np.int32): "int"}


class Agent:
    """One worker's end of a SpINA job.

    Args:
        job: the job's configuration (the controller hands it out).
        rank: this worker's rank in the job, 0..job.nworkers-1 (on the wire it goes by the
            rank its own switch knows: job.switch_rank(rank), in a two-level job its rank
            within its rack; errors name job ranks).
        switch: (host, port) of the switch's UDP endpoint (a two-level job's: the rack's leaf).
        sock: an already bound UDP socket at job.workers[rank]'s address (else one is bound).
        timeout: seconds without progress after which a call fails naming the missing ranks.
        rto: smallest retransmission timeout in seconds (the timer behind the last rounds of
            a call); the agent adapts it to the measured round latency (srtt + 4 rttvar, as
            TCP) and to timeouts that proved spurious, and doubles it while the switch stays
            silent (host_agent/recovery.py). Most losses are resent sooner, by fast retransmit.
        rendezvous: (host, port) of the job's run rendezvous (spina.rendezvous; the job file's
            `rendezvous`). Before its first call the agent joins the next run there and takes
            the run's epoch, so no result of another run (an earlier program on the same
            switch) can be taken for this one's. None: every call uses `job.epoch`.
        check_blocks: verify every `blocks` hint of allreduce against a scan of the tensor
            (a debug mode: costs the scan the hint saves). None: $SPINA_CHECK_BLOCKS=1.
        datapath: "compiled" (the answer loop's common case in host_agent/_core_answers.c, the
            rest in Python) or "python" (every answer in Python, and narrow lanes' rounding and
            decoding in numpy: the reference, for comparison); both give bit-identical
            results, datagrams, residuals, counters and recovery decisions.

    Example:
        >>> agent = Agent(job, rank, ("127.0.0.1", 47000))  # doctest: +SKIP
        >>> total = agent.allreduce(np.ones(1000, np.float32))  # doctest: +SKIP
    """

    def __init__(self, job: JobConfig, rank: int, switch: tuple[str, int],
                 sock: socket.socket | None = None, timeout: float = 10.0, rto: float = MIN_RTO,
                 rendezvous: tuple[str, int] | None = None, check_blocks: bool | None = None,
                 datapath: str = "compiled"):
        self.job = job.validate()
        if datapath not in DATAPATHS:
            raise ValueError(f"datapath {datapath!r}: one of {', '.join(DATAPATHS)}")
        self.datapath = datapath
        # Debug: verify every `blocks` hint against a full scan of the tensor (costs that scan).
        self.check_blocks = (os.environ.get("SPINA_CHECK_BLOCKS", "") == "1"
                             if check_blocks is None else check_blocks)
        if not 0 <= rank < job.nworkers:
            raise ValueError(f"rank {rank} outside 0..{job.nworkers - 1}")
        self.rank = rank
        try:  # answers are taken from this (address, port) only: numeric, as recvfrom gives it
            self.switch = (socket.gethostbyname(switch[0]), int(switch[1]))
        except OSError as e:
            raise SpinaError(f"switch address {switch[0]!r}: {e}") from None
        # the same as _core's socket calls take it: an IPv4 address as an int, the port
        self._switch_ip = struct.unpack("!I", socket.inet_aton(self.switch[0]))[0]
        self.rendezvous = rendezvous
        self._joined = False
        self.foreign_packets = 0  # over all calls: datagrams dropped for not coming from the switch
        self.timeout = timeout
        self.rtt = RttEstimator(rto)  # round latency, kept across calls
        if sock is None:
            me = job.workers[rank]  # this host's own address only, never a wildcard
            sock = bind_own_address(me.host, me.port,
                                    f"job {job.job}: field 'workers[{rank}].host'")
        self.sock = sock
        grow_buffers(sock)
        if sys.platform.startswith("linux"):  # report a closed switch port (ICMP) on the socket
            sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
        # when the switch's port began refusing in this call (None: it does not), and last did
        self._refused_since: float | None = None
        self._refused_last = 0.0
        # serve_metrics: this agent's Prometheus metrics (host_agent/metrics.py), counted per call
        self.metrics = self._metrics_server = None
        # the last round used per slot (persists across calls)
        self.rounds = np.zeros(job.nslots, np.int64)
        self.call_id = 0
        self.last_stats = CallStats()
        # every line about this agent's calls: job, call and rank as fields (read when written)
        self.log = spina_log.bind(log, job=lambda: self.job.job, epoch=lambda: self.job.epoch,
                                  call=lambda: self.call_id, rank=rank)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # answers land here, one recvmmsg batch at a time (_core.recv_answers)
        self._ring = bytearray(_RING_SLOTS * _RING_STRIDE)
        self._ring_views = [memoryview(self._ring)[i * _RING_STRIDE:(i + 1) * _RING_STRIDE]
                            for i in range(_RING_SLOTS)]
        self._buffers = _Buffers()
        # Every call holds `_busy` while it owns the socket; `_idle` is set between calls,
        # when the all-gather's responder thread reads it (host_agent/allgather.py Gatherer:
        # its calls' numbering, the last call that answers late requests for its chunks).
        self._busy = threading.RLock()
        self._idle = threading.Event()
        self._idle.set()
        self._gather = gather.Gatherer(sock, self.switch, self._send_gather, self._busy,
                                       self._idle, name=f"spina-gather-{rank}")

    @property
    def last_gather_stats(self) -> gather.GatherStats:
        """What the last all-gather call put on the wire and got back."""
        return self._gather.stats

    # ------------------------------------------------------------------ public API
    def allgather(self, x):
        """Every worker's `x`, stacked by rank: shape (nworkers, *x.shape), x's dtype, each
        row bit for bit what that rank passed (every rank gets the same bytes).

        Through the switch by multicast (docs/protocol.md "All-gather", host_agent/allgather.py):
        each worker sends its shard once; the switch replicates it to the job's other workers.
        Every rank must pass the same shape and dtype (a shard of another size raises
        LengthMismatch naming the rank). A flat job only (no `racks`).

        Args:
            x: a numpy array of any dtype, or a torch tensor (the result is a torch tensor).

        Example:
            >>> shards = agent.allgather(np.arange(4, dtype=np.float32))  # doctest: +SKIP
            >>> shards.shape  # doctest: +SKIP
            (4, 4)
        """
        if self.job.racks:
            raise SpinaError(f"job {self.job.job}: all-gather needs a flat job (the switch "
                             "replicates to the job's workers; a leaf or spine refuses it)")
        if _is_torch(x):
            import torch
            t = x.detach().contiguous().cpu()
            got = self.allgather(t.reshape(-1).view(torch.uint8).numpy())
            return torch.from_numpy(got).view(t.dtype).reshape((-1,) + tuple(t.shape)).to(
                x.device)
        shape = np.shape(x)
        arr = np.ascontiguousarray(x)  # (at least 1-d: the shape is x's)
        with self._call():
            if self.rendezvous is not None and not self._joined:
                self._join_run()
            call = self._gather.start(self.job, self.rank, arr)
            t0, ok = time.perf_counter(), False
            try:
                out = self._gather.run(call, self.timeout)
                ok = True
            except gather.GatherError as e:
                if e.timed_out:
                    raise SpinaTimeout(f"rank {self.rank}: {e}", e.missing) from None
                raise LengthMismatch(f"rank {self.rank}: {e}") from None
            finally:
                self.foreign_packets += call.stats.foreign_packets
                if self.metrics is not None:
                    self.metrics.call_done(self.job.job, self.rank, call.stats,
                                           time.perf_counter() - t0, ok, op="allgather")
        self._gather.serve()  # the responder answers for this call between calls
        return out.view(arr.dtype).reshape((self.job.nworkers,) + shape)

    @contextmanager
    def _call(self):
        """A call owns the socket: the responder thread stays off it meanwhile."""
        with self._busy:
            self._idle.clear()
            try:
                yield
            finally:
                self._idle.set()

    def _send_gather(self, batch: list) -> None:
        _core.send_batch(self.sock.fileno(), batch, self._switch_ip, self.switch[1])

    def allreduce(self, x, inplace: bool = False, blocks=None, layer=None, residual=None,
                  slot_exponents=None):
        """Element-wise sum of `x` over all workers; same shape and dtype as `x`.

        Accepts numpy arrays (float32, float16, float64, int32) and torch tensors (also
        bfloat16). int32 sums are exact (wrapping at 2**32 like numpy); float sums are within
        nworkers * 2**(-S-1) of the exact sum (docs/aggregation.md). A block with NaN/Inf at
        any worker is NaN in every result. Every rank gets bit-identical results.

        Args:
            x: the tensor to sum.
            inplace: write the sum into `x` (a contiguous float32 or int32 numpy array) and
                return it. Saves allocating and first touching a tensor-sized result buffer:
                only blocks that some worker sent are written; the others are zero in `x`
                already, being zero at every worker.
            blocks: optional sorted int array of the indices of the blocks (of the flattened
                tensor) that may be non-zero; the caller guarantees that every other block is
                all +0.0 (zero bits: the agent leaves those blocks as they are), and the agent
                then looks at these blocks only instead of scanning the tensor (a compressor
                knows what it selected). `check_blocks` on the agent (or
                $SPINA_CHECK_BLOCKS=1) verifies the promise and raises ValueError naming the
                first block the hint misses.
            layer: (i, n): `x` holds the i-th of n groups of layers in the order the next
                forward pass needs them (0: first); the job's priority_policy "layer" sets
                the call's priority from it (host_agent/dlcp.py). None: unknown.
            residual: error feedback for narrow lanes (job.lane_bits 16 or 8; docs/bits.md):
                a contiguous float32 numpy array of x's size that the caller keeps per tensor
                (zeros at first). The call sums x + residual and leaves in `residual` what
                its lanes did not carry, so nothing is lost across calls, only delayed. Not
                with `blocks` (the residual's blocks would need sending too) or int32 lanes.
                With `inplace` (x a contiguous float32 numpy array) x + residual is formed
                in x and summed there: no tensor-sized copy.
            slot_exponents: None, or per slot of the window (int32, job.nslots) the least
                exponent this worker announces in the slot's setup round (float tensors).
                host_agent/hooks/overlap.py sends a tensor in pieces of whole lane spans with the
                whole tensor's exponents, so each piece is quantized, and sums, exactly as
                in one call.
        """
        layer = dlcp.check_layer(layer)
        if slot_exponents is not None:
            slot_exponents = np.asarray(slot_exponents)
            if slot_exponents.shape != (self.job.nslots,) or slot_exponents.dtype != np.int32:
                raise ValueError(f"slot_exponents: need {self.job.nslots} int32 (one per slot), "
                                 f"got {slot_exponents.dtype} {slot_exponents.shape}")
        if residual is not None:  # error feedback (host_agent/narrow.py)
            x = narrow.with_residual(self.job, x, residual, blocks is not None or _is_torch(x),
                                     inplace, self.datapath == "compiled")
            inplace = True  # x + residual, ours or the caller's x: the call sums it there
        if blocks is not None:
            blocks = np.asarray(blocks, np.int64)
        if _is_torch(x):
            return _torch_allreduce(self, x, blocks, layer)
        arr = np.asarray(x)
        flat, integer, private = _flat_for_sum(arr, inplace)
        out = self._allreduce_flat(flat, integer=integer, inplace=inplace or private,
                                   blocks=blocks, layer=layer,
                                   residual=None if residual is None else residual.reshape(-1),
                                   slot_exponents=slot_exponents)
        return out.astype(arr.dtype, copy=False).reshape(arr.shape)

    def reduce_scatter(self, x, blocks=None, residual=None):
        """This rank's shard of the element-wise sum of `x` over all workers: the flat sum's
        elements [rank * c, (rank + 1) * c), c = ceil(x.size / nworkers), cut at x.size
        (torch.chunk's split, FSDP2's: with x.size a multiple of nworkers, the even split;
        otherwise the last ranks' shards are shorter or empty). A 1-d array of x's dtype.

        Through the switch (docs/protocol.md "Reduce-scatter"): every worker sends its
        non-zero blocks of the whole tensor, the switch sums them as for an all-reduce and
        sends each round's sums only to the ranks owning its blocks; the others get the
        round's header (it is done, where the lanes go next). With at least as many slots
        as ranks the lanes are laid out by shard (scatter.Owners.lanes), so a round's blocks
        have one owner; each shard is then quantized with its own slots' exponents, else it
        is bit for bit that part of what `allreduce` returns for the same tensors. Sums,
        quantization bound, NaN/Inf, dtypes, narrow lanes, loss recovery and errors as
        `allreduce`. A flat job only (no `racks`).

        Args:
            x: the tensor to sum (numpy float32, float16, float64, int32; torch also bfloat16:
                a torch tensor back).
            blocks: `allreduce`'s hint: sorted indices of the blocks of the flat tensor that
                may be non-zero (every other block all +0.0).
            residual: `allreduce`'s error feedback for narrow lanes (job.lane_bits 16 or 8).

        Example:
            >>> shard = agent.reduce_scatter(np.ones(8, np.float32))  # doctest: +SKIP
            >>> shard.shape  # 4 workers  # doctest: +SKIP
            (2,)
        """
        if self.job.racks:
            raise SpinaError(f"job {self.job.job}: reduce-scatter needs a flat job (a leaf "
                             "multicasts its rack's results whole)")
        if residual is not None:
            x = narrow.with_residual(self.job, x, residual, blocks is not None or _is_torch(x),
                                     compiled=self.datapath == "compiled")
            residual = residual.reshape(-1)
        if blocks is not None:
            blocks = np.asarray(blocks, np.int64)
        if _is_torch(x):
            import torch
            shard = self.reduce_scatter(_torch_to_numpy(x), blocks)
            return torch.from_numpy(shard).to(dtype=x.dtype, device=x.device)
        arr = np.asarray(x)
        flat, integer, private = _flat_for_sum(arr, False)
        n, nworkers = len(flat), self.job.nworkers
        owners = scatter.Owners(n, nworkers, self.job.block_size)
        out = self._allreduce_flat(flat, integer=integer, inplace=private or residual is not None,
                                   blocks=blocks, residual=residual, owners=owners)
        lo, hi = scatter.shard_bounds(n, nworkers, self.rank)
        return out[lo:hi].astype(arr.dtype)

    def rejoin(self) -> None:
        """Start a new run with the next call: join the rendezvous again for a fresh epoch
        (the daemon does this when a new process attaches to a rank)."""
        self._joined = False

    def _join_run(self) -> None:
        """Wait until every rank of the job has joined the next run; take its epoch."""
        job = self.job
        try:
            epoch = rendezvous.join(self.rendezvous, job.job, self.rank, job.nworkers, self.timeout,
                                    self.switch)
        except rendezvous.RendezvousError as e:
            if e.missing:
                raise SpinaTimeout(f"rank {self.rank}: {e}", e.missing) from None
            raise SpinaError(f"rank {self.rank}: {e}") from None
        self.job = replace(job, epoch=epoch)
        self.rounds = np.zeros(job.nslots, np.int64)
        self.call_id = 0
        self._gather.restart()
        self._joined = True
        self.log.info("run with epoch %d", epoch)

    def reset(self, job: JobConfig) -> None:
        """Start a new incarnation of the job (after a failure): its epoch must be new.

        The switch's slots for the job are cleared when the controller re-admits it with that
        epoch; the agent starts its round tags and call ids afresh to match.
        """
        if job.job != self.job.job or job.epoch == self.job.epoch:
            raise ValueError(f"reset needs the same job with a new epoch (job {self.job.job}, "
                             f"epoch {self.job.epoch})")
        self.job = job.validate()
        self.rounds = np.zeros(job.nslots, np.int64)
        self.call_id = 0
        self._gather.restart()

    def allreduce_async(self, x, inplace: bool = False, blocks=None,
                        layer=None, residual=None) -> concurrent.futures.Future:
        """Non-blocking all-reduce; calls run one at a time, in the order they were made."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="spina-agent")
        return self._executor.submit(self.allreduce, x, inplace, blocks, layer, residual)

    def serve_metrics(self, address: str):
        """Serve this agent's Prometheus metrics (host_agent/metrics.py: calls, packets,
        bytes, resends, latency, labelled job_id and rank) at http://[HOST:]PORT/metrics until
        close(); returns the spina.metrics.MetricsServer."""
        from host_agent.metrics import AgentMetrics
        metrics = AgentMetrics()
        metrics.agents.set(1)
        self._metrics_server = metrics.serve(address)
        self.metrics = metrics
        return self._metrics_server

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._gather.close()
        self.sock.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ one call
    def _allreduce_flat(self, flat: np.ndarray, integer: bool, inplace: bool = False,
                        blocks: np.ndarray | None = None, layer=None,
                        residual: np.ndarray | None = None,
                        slot_exponents: np.ndarray | None = None,
                        owners: scatter.Owners | None = None) -> np.ndarray:
        with self._call():
            return self._allreduce_call(flat, integer, inplace, blocks, layer, residual,
                                        slot_exponents, owners)

    def _allreduce_call(self, flat: np.ndarray, integer: bool, inplace: bool,
                        blocks: np.ndarray | None, layer, residual: np.ndarray | None,
                        slot_exponents: np.ndarray | None,
                        owners: scatter.Owners | None = None) -> np.ndarray:
        if len(flat) >= 1 << 32:
            raise ValueError(f"tensor of {len(flat)} elements exceeds the 32-bit length field")
        t0 = time.perf_counter()
        if self.rendezvous is not None and not self._joined:
            self._join_run()
        m0, c0 = time.monotonic(), time.thread_time()  # the timeline's origin (CallStats.phases)
        self.call_id = (self.call_id + 1) & 0xFFFFFFFF
        call = _Call(self.job, self.rank, self.call_id, self.rounds, flat, integer, inplace,
                     blocks, self._buffers, self.rtt, self.check_blocks, layer=layer,
                     compiled=self.datapath == "compiled", residual=residual,
                     slot_exponents=slot_exponents, owners=owners)
        t_plan = time.monotonic()
        sock = self.sock
        tick = min(0.1, call.recovery.deadline()) if self.job.bounded_loss else 0.1
        # Non-blocking, select() only when nothing is waiting: a socket timeout would cost a
        # poll() before every recv and send. Lost rounds are looked for when recovery's next
        # deadline comes (Recovery.wait; at most `every` apart, as a later latency sample may
        # shorten the timeout; every 1 ms with bounded loss, whose flush deadlines wait()
        # does not track), and at once when a round completes out of send order (fast
        # retransmit needs no idle socket).
        sock.settimeout(0.0)
        every = 0.001 if self.job.bounded_loss else min(MIN_RTO, self.rtt.min_rto)
        rec = call.recovery
        job = self.job
        ok = False  # the call returned its sums (for the metrics)
        waited, batches, t_answer, t_setup = 0.0, 0, m0, m0
        try:
            for st in call.active:  # setup round of every slot in use
                call.send_setup(st)
            self._flush(call)
            t_setup = time.monotonic()
            pending = len(call.active)
            recv, fd, ring, views = _core.recv_answers, sock.fileno(), self._ring, self._ring_views
            # every answer of this call comes from the switch's (address, port), and is a
            # result or status of this job, epoch, call and one of its slots (checked in C)
            source = (self._switch_ip, self.switch[1], job.job, job.epoch, self.call_id,
                      job.slot_base, len(call.slots))
            next_check = time.monotonic() + 0.001
            self._refused_since = None
            while pending:
                try:
                    received, foreign, malformed, answers = recv(fd, ring, _RING_STRIDE, *source)
                except OSError as e:
                    # an ICMP error (port unreachable: a switch restarting, ridden through
                    # until the call's timeout; others: lost like any datagram); any other
                    # error is the socket's
                    if not self._icmp_errors(call, e.errno):
                        raise
                    received = -1
                else:
                    if not received:  # idle: resend what is due, wait for an answer or a timer
                        now = time.monotonic()
                        rec.drained(now)
                        if now >= next_check or rec.recheck:
                            wait = call.resend_due(True, tick, self.timeout, self.switch)
                            self._flush(call)
                            next_check = now + min(wait, every)
                        else:
                            wait = next_check - now
                        select.select((sock,), (), (), wait)
                        waited += time.monotonic() - now
                        continue
                    if foreign:
                        call.stats.foreign_packets += foreign  # not from our switch: never read
                    for index, nbytes in malformed:
                        self._malformed(views[index], nbytes, call)
                    if answers and self._refused_since is not None:
                        self._refused_over(call)
                    # one time for the batch: every answer in it had arrived by then
                    t_answer = time.monotonic()
                    batches += 1
                    pending -= call.answers(views, answers, t_answer)
                    self._flush(call)
                if received < 0 or rec.recheck or time.monotonic() >= next_check:
                    wait = call.resend_due(False, tick, self.timeout, self.switch)
                    self._flush(call)
                    next_check = time.monotonic() + min(wait, every)
            ok = True
        except SpinaTimeout:
            # still refusing (resends go at most max_rto apart): no rank to blame, nothing listens
            if self._refused_since is None or \
                    time.monotonic() - self._refused_last > 2 * self.rtt.max_rto:
                raise
            raise self._refused_error(call) from None
        finally:
            sock.settimeout(tick)
            seconds = time.perf_counter() - t0
            self.last_stats = call.finish(seconds)  # also for a failed call
            m1 = time.monotonic()
            self.last_stats.phases = dict(
                scan=call.t_scan - m0, plan=t_plan - m0, setup_sent=t_setup - m0,
                setup_done=max(call.t_setup_done - m0, 0.0), answers=t_answer - m0, end=m1 - m0,
                waited=waited, cpu=time.thread_time() - c0, batches=batches)
            self.foreign_packets += call.stats.foreign_packets
            if self.metrics is not None:
                self.metrics.call_done(job.job, self.rank, self.last_stats, seconds, ok)
        self.rtt.call_done(rec.spurious_timeouts, rec.spurious_fast)
        return call.out

    def _malformed(self, view, nbytes: int, call: _Call) -> None:
        """A datagram from the switch that failed _core's header checks: dropped, counted, and
        logged with spina.wire's reason. _core hands all-gather packets over the same way
        (well formed, no answer of this call): the last all-gather call takes them."""
        if nbytes >= wire.HEADER_LEN and view[1] == wire.MSG_GATHER \
                and wire.header_error(_UNPACK(view), nbytes) is None:
            self._gather.between(view, nbytes)
            return
        call.stats.malformed_packets += 1
        if nbytes < wire.HEADER_LEN:
            why = f"truncated header: {nbytes} < {wire.HEADER_LEN} bytes"
        else:
            why = wire.header_error(_UNPACK(view), nbytes)
        self.log.warning("ignoring malformed packet: %s", why)

    def _flush(self, call: _Call) -> None:
        """Send the call's queued datagrams in one batch. A datagram the host refuses (a full
        buffer, a firewall's EPERM) is a loss like any other: the retransmission timer
        recovers it."""
        if call.outbox:
            lost = _core.send_batch(self.sock.fileno(), call.outbox, self._switch_ip,
                                    self.switch[1])
            call.outbox.clear()
            if lost:
                self.log.debug("%d datagram(s) refused by the host; the timer will resend", lost)
                self._icmp_errors(call, 0)  # a send may have taken the socket's pending error

    def _icmp_errors(self, call: _Call, err: int) -> bool:
        """Drain the socket's queue of ICMP errors (`err`: the errno a socket call just
        raised, 0 if none); whether there were any. A refusal (ECONNREFUSED: ICMP port
        unreachable, nothing listens on the switch's port) is not fatal: a switch process that
        restarts refuses until it listens again, and the rounds resent then complete the call
        (docs/reliability.md). The call fails only at its timeout, saying the switch refused."""
        errors = [err] if err in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                  errno.EHOSTDOWN) else []
        while hasattr(socket, "MSG_ERRQUEUE"):  # Linux
            try:
                _, cmsgs, _, _ = self.sock.recvmsg(1, _ERRQUEUE_CMSG, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                break
            errors += [struct.unpack_from("=I", data)[0] for _, _, data in cmsgs
                       if len(data) >= 4]
        if errno.ECONNREFUSED not in errors:
            return bool(errors)
        self._refused_last = time.monotonic()
        if self._refused_since is None:
            self._refused_since = self._refused_last
            self.log.warning("job %d call %d: the switch at %s:%d refuses datagrams (ICMP port "
                             "unreachable: nothing listens there); resending until it answers "
                             "or %g s pass without progress", self.job.job, call.call_id,
                             *self.switch, self.timeout)
        return True

    def _refused_over(self, call: _Call) -> None:
        """The switch answers again after refusing: say for how long it refused."""
        self.log.warning("job %d call %d: the switch at %s:%d answers again after refusing "
                         "datagrams for %.1f s", self.job.job, call.call_id, *self.switch,
                         time.monotonic() - self._refused_since)
        self._refused_since = None

    def _refused_error(self, call: _Call) -> SpinaError:
        """The call's timeout while the switch's port refused: nothing listens there."""
        return SpinaError(
            f"job {self.job.job} call {call.call_id}: the switch at {self.switch[0]}:"
            f"{self.switch[1]} refused every datagram for "
            f"{time.monotonic() - self._refused_since:.1f} s (ICMP port unreachable: nothing "
            f"listens on that port) until the call's timeout ({self.timeout:g} s without "
            "progress): it is not running, or the job file names the wrong address")


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _torch_to_numpy(t) -> np.ndarray:
    """A torch tensor as the numpy array a sum takes: float32 (any float dtype) or int32."""
    import torch
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return t.detach().to(torch.float32).contiguous().cpu().numpy()
    if t.dtype == torch.int32:
        return t.detach().contiguous().cpu().numpy()
    raise TypeError(f"unsupported dtype {t.dtype}")


def _torch_allreduce(agent: Agent, t, blocks=None, layer=None):
    import torch
    res = agent.allreduce(_torch_to_numpy(t), blocks=blocks, layer=layer)
    return torch.from_numpy(res).to(dtype=t.dtype, device=t.device)


def _flat_for_sum(arr: np.ndarray, inplace: bool) -> tuple[np.ndarray, bool, bool]:
    """(flat, integer, private) of a numpy array to sum: flat is float32 or int32, contiguous
    (arr's own memory when `inplace`); private: a copy of ours the call may sum into."""
    kind = _CODE.get(arr.dtype)
    if kind is None:
        raise TypeError(f"unsupported dtype {arr.dtype}: use float32, float16, float64 or int32")
    if inplace and not (arr.dtype in (np.float32, np.int32) and arr.flags.c_contiguous
                        and arr.flags.writeable):
        raise ValueError("inplace needs a writeable, contiguous float32 or int32 array")
    flat = arr.reshape(-1) if inplace else np.ascontiguousarray(arr.reshape(-1))
    if kind == "float" and flat.dtype != np.float32:
        return flat.astype(np.float32), False, True  # our own copy: sum into it
    return flat, kind == "int", False


__all__ = ["Agent", "CallStats", "SpinaError", "SpinaTimeout", "LengthMismatch"]
