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

Lost packets are resent after a timeout; the switch recognises a resend (worker bitmap)
and answers with the stored result or with a status naming who is still missing.
docs/aggregation.md has the details.
"""
from __future__ import annotations

import concurrent.futures
import logging
import socket
import time
from dataclasses import dataclass

import numpy as np

from host_agent.blocks import (LanePlan, dequantize, exponent_of, gather_blocks,
                               nonzero_blocks, quant_shift, quantize)
from spina import wire
from spina.net import grow_buffers
from spina.config import JobConfig

log = logging.getLogger("spina.agent")


class SpinaError(RuntimeError):
    """An all-reduce that could not complete; the message says why."""


class SpinaTimeout(SpinaError):
    """Some workers never contributed; `.missing` lists their ranks."""

    def __init__(self, msg: str, missing: list[int]):
        super().__init__(msg)
        self.missing = missing


class LengthMismatch(SpinaError):
    """Workers called all-reduce with tensors of different lengths."""


@dataclass
class CallStats:
    """What one call put on the wire (this worker) and got back."""
    length: int = 0
    nonzero_blocks: int = 0
    packets_sent: int = 0
    bytes_sent: int = 0          # whole UDP payloads
    payload_bytes_sent: int = 0  # block data only
    resends: int = 0
    packets_received: int = 0
    bytes_received: int = 0
    rounds: int = 0
    seconds: float = 0.0


@dataclass
class _Slot:
    """Per-slot progress within one call."""
    slot: int
    ptr: np.ndarray = None        # per lane: index in plan.pos of the first own block >= pos
    ends: np.ndarray = None
    pos: np.ndarray = None        # positions of the round in flight (None: setup round)
    round: int = 0
    shift: int = 0
    packet: bytes = b""
    sent_at: float = 0.0
    rto: float = 0.0
    progress_at: float = 0.0
    done: bool = False
    last_bitmap: int = 0
    resent: bool = False


_CODE = {np.dtype(np.float32): "float", np.dtype(np.float16): "float", np.dtype(np.float64): "float",
         np.dtype(np.int32): "int"}


class Agent:
    """One worker's end of a SpINA job.

    Args:
        job: the job's configuration (the controller hands it out).
        rank: this worker's rank.
        switch: (host, port) of the switch's UDP endpoint.
        sock: an already bound UDP socket at job.workers[rank]'s address (else one is bound).
        timeout: seconds without progress after which a call fails naming the missing ranks.
        rto: smallest retransmission timeout in seconds; the agent adapts it to the measured
            round latency (srtt + 4 rttvar, as TCP) and doubles it on each resend, up to 1 s.

    Example:
        >>> agent = Agent(job, rank, ("127.0.0.1", 47000))  # doctest: +SKIP
        >>> total = agent.allreduce(np.ones(1000, np.float32))  # doctest: +SKIP
    """

    def __init__(self, job: JobConfig, rank: int, switch: tuple[str, int],
                 sock: socket.socket | None = None, timeout: float = 10.0, rto: float = 0.1):
        self.job = job.validate()
        if not 0 <= rank < job.nworkers:
            raise ValueError(f"rank {rank} outside 0..{job.nworkers - 1}")
        self.rank = rank
        self.switch = switch
        self.timeout = timeout
        self.min_rto = rto
        self.srtt: float | None = None  # smoothed round latency (s), kept across calls
        self.rttvar = 0.0
        if sock is None:
            me = job.workers[rank]
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((me.host, me.port))
        self.sock = sock
        grow_buffers(sock)
        self.rounds = np.zeros(job.nslots, np.int64)  # last round used per slot (persist across calls)
        self.call_id = 0
        self.last_stats = CallStats()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._nonfinite: np.ndarray | None = None  # per plan row, in the call in progress

    # ------------------------------------------------------------------ public API
    def allreduce(self, x):
        """Element-wise sum of `x` over all workers; same shape and dtype as `x`.

        Accepts numpy arrays (float32, float16, float64, int32) and torch tensors (also
        bfloat16). int32 sums are exact (wrapping at 2**32 like numpy); float sums are within
        nworkers * 2**(-S-1) of the exact sum (docs/aggregation.md). A block with NaN/Inf at
        any worker is NaN in every result. Every rank gets bit-identical results.
        """
        if _is_torch(x):
            return _torch_allreduce(self, x)
        arr = np.asarray(x)
        kind = _CODE.get(arr.dtype)
        if kind is None:
            raise TypeError(f"unsupported dtype {arr.dtype}: use float32, float16, float64 or int32")
        flat = np.ascontiguousarray(arr.reshape(-1))
        if kind == "float" and flat.dtype != np.float32:
            flat = flat.astype(np.float32)
        out = self._allreduce_flat(flat, integer=(kind == "int"))
        return out.astype(arr.dtype, copy=False).reshape(arr.shape)

    def allreduce_async(self, x) -> concurrent.futures.Future:
        """Non-blocking all-reduce; calls run one at a time, in the order they were made."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spina-agent")
        return self._executor.submit(self.allreduce, x)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ one call
    def _allreduce_flat(self, flat: np.ndarray, integer: bool) -> np.ndarray:
        job = self.job
        t0 = time.perf_counter()
        B, k, W = job.block_size, job.nlanes, job.nslots
        n = len(flat)
        if n >= 1 << 32:
            raise ValueError(f"tensor of {n} elements exceeds the 32-bit length field")
        self.call_id = (self.call_id + 1) & 0xFFFFFFFF
        stats = CallStats(length=n)
        nblocks = -(-n // B)
        nz = nonzero_blocks(flat, B)
        stats.nonzero_blocks = len(nz)
        plan, order = LanePlan.build(nz, W, k)
        rows = gather_blocks(flat, plan.pos, B) if len(nz) else np.zeros((0, B), flat.dtype)
        nonfinite = np.zeros(len(rows), bool)
        if integer:
            q = rows.astype(np.int32, copy=False)
            slot_exp = np.zeros(W, np.int32)
        else:
            # NaN/Inf propagate through max: one pass finds both the scale and bad blocks.
            maxabs = np.abs(rows).max(axis=1) if len(rows) else np.zeros(0, np.float32)
            nonfinite = ~np.isfinite(maxabs)
            if nonfinite.any():
                bad = rows[nonfinite]
                rows[nonfinite] = np.where(np.isfinite(bad), bad, np.float32(0))
                maxabs[nonfinite] = np.abs(rows[nonfinite]).max(axis=1)
            slot_exp = np.full(W, wire.EXPONENT_NONE, np.int32)
            if len(rows):
                starts = plan.lane_bounds[:-1:k]
                has = starts < plan.lane_bounds[k::k]
                # One sentinel past the end so that empty trailing slots index a valid row.
                exps = np.append(exponent_of(maxabs), wire.EXPONENT_NONE)
                red = np.maximum.reduceat(exps, starts)
                slot_exp[has] = red[has]
            q = np.empty(rows.shape, np.int32)
        self._nonfinite = nonfinite if nonfinite.any() else None
        out = np.zeros(nblocks * B, np.int32 if integer else np.float32)
        out2d = out.reshape(nblocks, B)

        base = wire.Header(msg_type=wire.MSG_CONTRIB, priority=job.priority, job=job.job,
                           epoch=job.epoch, call=self.call_id, rank=self.rank, nlanes=k,
                           length=n, block_size=B)
        now = time.monotonic()
        slots = []
        for s in range(W):
            st = _Slot(s + job.slot_base, ptr=plan.first_ptr(s), ends=plan.lane_ends(s).copy(),
                       progress_at=now, rto=self.rto)
            nxt = plan.next_at(st.ptr, st.ends)
            flags = wire.FLAG_LAST if (nxt == wire.END).all() else 0
            self._send(st, base.copy(exponent=int(slot_exp[s]), flags=flags), nxt, None, stats, s)
            slots.append(st)
        pending = W
        buf = bytearray(wire.MAX_UDP_PAYLOAD + 1)
        self.sock.settimeout(self.min_rto)
        while pending:
            try:
                nbytes = self.sock.recv_into(buf)
            except (socket.timeout, BlockingIOError):
                nbytes = -1
            except ConnectionRefusedError:
                nbytes = -1  # ICMP port unreachable: the switch is not up (yet); keep resending
            if nbytes >= 0:
                res = self._accept(buf, nbytes, slots)
                if res is not None:
                    s, h = res
                    st = slots[s]
                    stats.packets_received += 1
                    stats.bytes_received += nbytes
                    if h.msg_type == wire.MSG_STATUS:
                        st.last_bitmap = h.bitmap
                    else:
                        if h.flags & wire.FLAG_MISMATCH:
                            raise LengthMismatch(
                                f"job {job.job} call {self.call_id}: workers disagree on the tensor "
                                f"length: rank {self.rank} has {n} elements, another rank "
                                f"{h.length}")
                        st.progress_at = time.monotonic()
                        if not st.resent:  # Karn: time only rounds sent once
                            self._sample_rtt(st.progress_at - st.sent_at)
                        st.rto = self.rto
                        if st.pos is None:  # setup result: the agreed exponent
                            st.shift = 0 if integer else quant_shift(h.exponent, job.nworkers)
                            r = plan.slot_rows(s)
                            if not integer and r.stop > r.start:
                                q[r] = quantize(rows[r], st.shift)
                        else:
                            self._deliver(buf, h, st, out2d, integer, plan, nonfinite)
                        stats.rounds += 1
                        pos = np.frombuffer(buf, wire.NEXT_DTYPE, k, wire.HEADER_LEN).astype(np.uint32)
                        if (pos == wire.END).all():
                            st.done = True
                            pending -= 1
                        else:
                            self._next_round(st, pos, plan, q, base.copy(exponent=h.exponent), stats, s)
            self._check_timers(slots, stats)
        stats.seconds = time.perf_counter() - t0
        self.last_stats = stats
        return out[:n]

    def _accept(self, buf, nbytes, slots):
        """(slot index, header) if this is the answer to a round in flight, else None."""
        try:
            h = wire.unpack_header(buf)
            wire.check_header(h, nbytes)
        except wire.MalformedPacket as e:
            log.warning("rank %d: ignoring malformed packet: %s", self.rank, e)
            return None
        s = h.slot - self.job.slot_base
        if (h.msg_type == wire.MSG_CONTRIB or h.job != self.job.job or h.epoch != self.job.epoch
                or not 0 <= s < len(slots) or h.call != self.call_id):
            return None
        st = slots[s]
        if st.done or h.round != st.round:
            return None  # an answer to an earlier round (duplicate result)
        return s, h

    def _deliver(self, buf, h, st, out2d, integer, plan, nonfinite):
        """Write a data round's sums into the output blocks."""
        k, B = self.job.nlanes, self.job.block_size
        if not h.present:
            return
        lanes = wire.lane_bits_to_mask(np.array([h.present], np.uint64), k)[0]
        data = np.frombuffer(buf, wire.DATA_DTYPE, int(lanes.sum()) * B, wire.HEADER_LEN + 4 * k)
        data = data.reshape(-1, B).astype(np.int32)
        where = st.pos[lanes].astype(np.int64)
        out2d[where] = data if integer else dequantize(data, st.shift)
        if h.nonfinite:
            nf = wire.lane_bits_to_mask(np.array([h.nonfinite], np.uint64), k)[0]
            out2d[st.pos[nf].astype(np.int64)] = np.nan

    def _next_round(self, st: _Slot, pos: np.ndarray, plan: LanePlan, q, base, stats, s):
        live = st.ptr < st.ends
        have = np.zeros(len(pos), bool)
        have[live] = plan.pos[st.ptr[live]] == pos[live]
        rows = st.ptr[have]
        st.ptr = st.ptr + have
        nxt = plan.next_at(st.ptr, st.ends)
        st.pos = pos
        present = int(wire.mask_to_lane_bits(have[None, :])[0])
        nonfinite_bits = 0
        if self._nonfinite is not None and len(rows) and self._nonfinite[rows].any():
            nf = np.zeros(len(pos), bool)
            nf[have] = self._nonfinite[rows]
            nonfinite_bits = int(wire.mask_to_lane_bits(nf[None, :])[0])
        flags = wire.FLAG_LAST if (nxt == wire.END).all() else 0
        h = base.copy(present=present, nonfinite=nonfinite_bits, flags=flags)
        self._send(st, h, nxt, q[rows] if len(rows) else None, stats, s)

    def _send(self, st: _Slot, h: wire.Header, nxt, data, stats: CallStats, s: int):
        self.rounds[s] += 1
        st.round = int(self.rounds[s]) & 0xFFFFFFFF
        h.slot, h.round = st.slot, st.round
        st.packet = wire.pack(h, nxt, data)
        st.resent = False
        st.sent_at = time.monotonic()
        self.sock.sendto(st.packet, self.switch)
        stats.packets_sent += 1
        stats.bytes_sent += len(st.packet)
        if data is not None:
            stats.payload_bytes_sent += data.size * 4

    @property
    def rto(self) -> float:
        if self.srtt is None:
            return max(self.min_rto, 0.2)
        return min(1.0, max(self.min_rto, self.srtt + 4 * self.rttvar))

    def _sample_rtt(self, sample: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = sample, sample / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
            self.srtt = 0.875 * self.srtt + 0.125 * sample

    def _check_timers(self, slots: list[_Slot], stats: CallStats) -> None:
        now = time.monotonic()
        for st in slots:
            if st.done:
                continue
            if now - st.progress_at > self.timeout:
                missing = [r for r in range(self.job.nworkers) if not st.last_bitmap >> r & 1]
                raise SpinaTimeout(
                    f"job {self.job.job} call {self.call_id}: no result for slot {st.slot} round "
                    f"{st.round} within {self.timeout:g} s; " +
                    (f"ranks {missing} never contributed" if st.last_bitmap else
                     "the switch never answered (is it running, and is this job admitted?)"),
                    missing if st.last_bitmap else [])
            if now - st.sent_at > st.rto:
                pkt = bytearray(st.packet)
                pkt[2] |= wire.FLAG_RESEND
                self.sock.sendto(pkt, self.switch)
                st.sent_at = now
                st.resent = True
                st.rto = min(st.rto * 2, 1.0)
                stats.resends += 1
                stats.packets_sent += 1
                stats.bytes_sent += len(pkt)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _torch_allreduce(agent: Agent, t):
    import torch
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        arr = t.detach().to(torch.float32).contiguous().cpu().numpy()
    elif t.dtype == torch.int32:
        arr = t.detach().contiguous().cpu().numpy()
    else:
        raise TypeError(f"unsupported dtype {t.dtype}")
    res = agent.allreduce(arr)
    return torch.from_numpy(res).to(dtype=t.dtype, device=t.device)


__all__ = ["Agent", "CallStats", "SpinaError", "SpinaTimeout", "LengthMismatch"]
