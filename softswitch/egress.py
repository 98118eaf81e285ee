"""The traffic manager between the software switch's ingress and egress: what BMv2's
simple_switch does with `--priority-queues 8` and `set_queue_rate`, so that the same
conformance tests see the same queue order, queue depths and congestion drops on both.

Per egress port there is one FIFO per priority (v1model `priority`, 3 bits). BMv2's rules, which
this keeps:
- a port without a rate limit is not queued at all here (its queue drains as fast as frames
  come; `enq_qdepth` is 0 unless a test forces it);
- a rate limit (packets per second) applies to each priority queue of the port on its own: a
  frame's departure time is max(now, the previous departure of its queue + 1/rate), fixed when
  it is queued, and a new limit restarts every queue's clock at the moment it is set;
- frames leave in departure-time order, FIFO within a queue, and at equal times the higher
  priority first (7 before 0). Because every priority queue keeps its own rate clock, a rate
  limit does not make the classes compete for one link: strict priority shows only at ties.
  That is BMv2's model (not a port shaper's), kept so that both targets agree;
- `enq_qdepth` is the number of frames in the frame's own priority queue when it arrived
  (BMv2 1.15.5 sets it from `egress_buffers.size(port, priority)`; frames of other priorities
  do not count); a priority queue holding `capacity` frames drops what comes next (tail drop,
  counted in `tail_drops`, no P4 counter: BMv2 counts none either).

A port may instead have a **port shaper** (`set_port_rate`), which BMv2's traffic manager does
not have and a real port (a Tofino's, a NIC's) does: one rate for the whole port, strict
priority between its queues, and the link time taken at transmission, after the egress
pipeline. Whenever the link is free, the head of the highest-priority queue holding a frame
that had arrived by then goes next; egress runs on it, and only what egress sends takes link
time (a frame egress drops, the congestion drop, takes none: the next frame starts in its
slot). The rate is bits/s on the wire (a frame's bytes, at least 60, plus 24 of preamble,
FCS and inter-frame gap), frames/s, or both (a frame takes the longer of the two): bits/s is
what a link is; frames/s is a switch's packet-rate limit and what BMv2's `set_queue_rate`
counts, kept for tests and comparisons. `enq_qdepth` and tail drop are as above.

Time is whatever the caller passes as `now` (seconds): the switch passes the monotonic clock,
tests a virtual one.

After the queues, the egress pipeline's own stage: `CongestionDrop` (priority.p4's control of
that name, applied in egress on the `enq_qdepth` measured here).
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from spina import wire
from spina.spec import LOSS_CREDIT_MAX, LOSS_CREDIT_ONE

PRIORITIES = 8        # v1model priority is 3 bits; simple_switch_grpc --priority-queues 8
QUEUE_CAPACITY = 64   # frames per priority queue (BMv2's default queue depth)
WIRE_OVERHEAD = 24    # bytes a frame takes on the wire besides its own: preamble+SFD 8, FCS 4,
MIN_FRAME = 60        # inter-frame gap 12; and the shortest frame without its FCS (padded)
_BIT_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
# Byte offsets of the INA header fields CongestionDrop reads from an outgoing packet.
_MSG_TYPE_AT, _FLAGS_AT, _JOB_AT = (wire.FIELD_OFFSET[f] for f in ("msg_type", "flags", "job"))


@dataclass(frozen=True)
class PortRate:
    """A port shaper's rate: frames/s (`pps`), bits/s on the wire (`bps`), or both (0: none)."""
    pps: float = 0.0
    bps: float = 0.0

    def seconds(self, frame_len: int) -> float:
        """Link time of one frame of `frame_len` bytes (without FCS)."""
        t = 1.0 / self.pps if self.pps else 0.0
        if self.bps:
            t = max(t, (max(frame_len, MIN_FRAME) + WIRE_OVERHEAD) * 8 / self.bps)
        return t

    def __str__(self) -> str:
        parts = ([f"{self.pps:g}pps"] if self.pps else []) + (
            [f"{self.bps / 1e6:g}mbit"] if self.bps else [])
        return ",".join(parts)


def parse_port_rate(text: str) -> PortRate:
    """'1gbit', '400mbit', '8000pps', '8000pps,1gbit' (tc's SI units) -> PortRate; ValueError
    saying what is expected otherwise."""
    pps = bps = 0.0
    for part in text.lower().split(","):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(pps|[kmg]?bit)\s*", part)
        v = float(m.group(1)) if m else 0.0
        if not m or v <= 0 or (pps if m.group(2) == "pps" else bps):
            raise ValueError(f"{text!r}: expected a rate > 0 in pps (frames/s) or bit, kbit, mbit, "
                             "gbit (bits/s), or one of each joined by a comma, e.g. 1gbit, "
                             "8000pps, 8000pps,1gbit")
        if m.group(2) == "pps":
            pps = v
        else:
            bps = v * _BIT_UNITS[m.group(2)[:-3]]
    if (pps and pps < 1) or (bps and bps < 1000):
        raise ValueError(f"{text!r}: a port rate needs at least 1 frame/s or 1 kbit/s")
    return PortRate(pps, bps)


class EgressQueues:
    def __init__(self, priorities: int = PRIORITIES, capacity: int = QUEUE_CAPACITY):
        self.priorities, self.capacity = priorities, capacity
        self.rates: dict[int, float] = {}                   # port -> packets/s (absent: none)
        self.shapers: dict[int, PortRate] = {}              # port -> its port shaper's rate
        self._free: dict[int, float] = {}                   # shaped port -> link free from
        self._queues: dict[int, list[deque]] = {}           # port -> one FIFO per priority
        self._last: dict[int, list[float]] = {}             # port -> last departure per priority
        self._size: dict[int, int] = {}                     # port -> frames queued
        self._seq = 0
        self._queued = 0   # frames queued on every port (0: the data path skips the queues)
        self.tail_drops = 0

    def set_rate(self, port: int, pps: float, now: float) -> None:
        """Limit every priority queue of `port` to `pps` frames a second (0: no limit)."""
        if pps < 0:
            raise ValueError(f"port {port}: queue rate must be >= 0 packets/s, got {pps}")
        if pps and port in self.shapers:
            raise ValueError(f"port {port}: has a port rate; a port has a port rate or queue "
                             "rates, not both")
        if pps == 0:
            self.rates.pop(port, None)
        else:
            self.rates[port] = float(pps)
            self._last[port] = [now] * self.priorities
            self._queues.setdefault(port, [deque() for _ in range(self.priorities)])

    def set_port_rate(self, port: int, rate: PortRate | None, now: float) -> None:
        """Shape `port` as one link of `rate`, strict priority between its queues (None: no
        shaper; frames still queued then leave at once)."""
        if rate is None or not (rate.pps or rate.bps):
            self.shapers.pop(port, None)
            self._free.pop(port, None)
            return
        if rate.pps < 0 or rate.bps < 0:
            raise ValueError(f"port {port}: port rate must be >= 0, got {rate}")
        if port in self.rates:
            raise ValueError(f"port {port}: has a queue rate; a port has a port rate or queue "
                             "rates, not both")
        self.shapers[port] = rate
        self._free[port] = now
        self._queues.setdefault(port, [deque() for _ in range(self.priorities)])

    @property
    def idle(self) -> bool:
        """No port is rate-limited and nothing is queued: frames skip the traffic manager."""
        return not self.rates and not self.shapers and not self._queued

    def limited(self, port: int) -> bool:
        return (port in self.rates or port in self.shapers
                or (self._queued > 0 and self._size.get(port, 0) > 0))

    def depth(self, port: int) -> int:
        return self._size.get(port, 0)

    def push(self, port: int, priority: int, item, now: float) -> int | None:
        """Queue `item` for `port`; its enq_qdepth, or None when its queue is full (dropped)."""
        queues = self._queues.setdefault(port, [deque() for _ in range(self.priorities)])
        q = queues[priority]
        if len(q) >= self.capacity:
            self.tail_drops += 1
            return None
        depth = len(q)  # BMv2: the depth of this priority's queue only
        rate = self.rates.get(port)
        if port in self.shapers:
            send = now  # a shaped port's frames keep their arrival time; transmit() schedules
        else:
            last = self._last.setdefault(port, [now] * self.priorities)
            send = now if rate is None else max(now, last[priority] + 1.0 / rate)
            last[priority] = send
        self._seq += 1
        q.append((send, self._seq, item))
        self._size[port] = self._size.get(port, 0) + 1
        self._queued += 1
        return depth

    def pop_due(self, now: float) -> list[tuple[int, object]]:
        """Every frame due by `now`, as (port, item), in departure order: by departure time,
        and at equal times the higher priority first (BMv2's egress serves the highest
        priority among the queues whose head is due)."""
        due = []
        for port, queues in self._queues.items():
            if not self._size.get(port) or port in self.shapers:
                continue
            for prio, q in enumerate(queues):
                while q and q[0][0] <= now:
                    send, seq, item = q.popleft()
                    self._size[port] -= 1
                    self._queued -= 1
                    due.append((send, -prio, seq, port, item))
        due.sort(key=lambda d: d[:3])
        return [(port, item) for *_, port, item in due]

    def transmit(self, now: float, run) -> list:
        """The shaped ports' transmissions up to `now`: whenever a port's link is free, the
        head of its highest-priority queue among the frames that had arrived by then goes
        through `run(port, item)` (the egress pipeline), which returns the frames it sends,
        as (port, bytes); their link time (PortRate.seconds) keeps the link busy. A frame
        egress drops takes none. Returns every frame sent, in transmission order."""
        out = []
        for port, rate in self.shapers.items():
            if not self._size.get(port):
                continue
            queues, free = self._queues[port], self._free[port]
            while self._size[port]:
                start = max(free, min(q[0][0] for q in queues if q))  # link free, a frame in
                if start > now:
                    break
                for q in reversed(queues):  # strict priority among the arrived heads
                    if q and q[0][0] <= start:
                        break
                item = q.popleft()[2]
                self._size[port] -= 1
                self._queued -= 1
                sent = run(port, item)
                free = start + sum(rate.seconds(len(f)) for _, f in sent)
                out += sent
            self._free[port] = free
        return out

    def next_due(self) -> float | None:
        """When the next queued frame may leave (None: nothing queued)."""
        if not self._queued:
            return None
        heads = []
        for port, queues in self._queues.items():
            if self._size.get(port):
                head = min(q[0][0] for q in queues if q)
                heads.append(max(head, self._free[port]) if port in self.shapers else head)
        return min(heads) if heads else None

    def clear(self) -> None:
        """Nothing queued, no rate limits, no shapers."""
        self.rates.clear()
        self.shapers.clear()
        self._free.clear()
        self._queues.clear()
        self._last.clear()
        self._size.clear()
        self._queued = 0


class CongestionDrop:
    """P4: CongestionDrop (priority.p4), applied in egress. Table `congestion` (key job, action
    set_congestion): `table[job] = (queue depth threshold, fixed-point loss bound)`; a job
    without an entry is never dropped.

    Its counters (job_congestion_seen, job_congestion_drops) and register (job_loss_credit,
    one cell per job id, which clear_slots and admission leave alone) are cells of the
    switch's arrays, `counters` and `job_registers` (the Pipeline's), where the P4Runtime
    server and the metrics read every counter and register.
    """

    __slots__ = ("table", "counters", "job_registers")

    def __init__(self, counters: dict, job_registers: dict):
        self.table: dict[int, tuple[int, int]] = {}
        self.counters = counters
        self.job_registers = job_registers

    def drop(self, data, qdepth: int) -> bool:
        """True (and counted) if this INA packet is dropped for congestion: a contribution,
        loss-tolerant, its queue deeper than its job's threshold at enqueue (`qdepth`, P4's
        `standard_metadata.enq_qdepth`), and the job's loss credit holds one packet. Results
        and status packets are never dropped here. One read-modify-write of job_loss_credit
        per contribution of a job with an entry.
        """
        if data[_MSG_TYPE_AT] != wire.MSG_CONTRIB:
            return False
        job = data[_JOB_AT] << 8 | data[_JOB_AT + 1]
        entry = self.table.get(job)
        if entry is None:
            return False
        threshold, bound = entry
        self.counters["job_congestion_seen"][job] += 1
        credit_reg = self.job_registers["job_loss_credit"]
        credit = min(int(credit_reg[job]) + bound, LOSS_CREDIT_MAX)
        drop = (qdepth > threshold and data[_FLAGS_AT] & wire.FLAG_LOSS_TOLERANT != 0
                and credit >= LOSS_CREDIT_ONE)
        if drop:
            credit -= LOSS_CREDIT_ONE
            self.counters["job_congestion_drops"][job] += 1
        credit_reg[job] = credit
        return drop


# ReduceScatter (docs/protocol.md "Reduce-scatter"): a contribution's `bitmap` names the ranks
# owning the blocks of its round (0: every rank, an all-reduce). A result's copy for a rank
# outside that set keeps its header and next positions only: the rank learns that the round is
# done and where its lanes go next, and no block crosses its downlink. P4: the ingress carries
# the owners to egress in metadata; egress strips the data lanes of a replica whose rank (the
# low bits of its rid, spina.spec.rid) is not among them.
_PRESENT_AT, _NONFINITE_AT, _NLANES_AT, _BITMAP_AT = (wire.FIELD_OFFSET[f] for f in (
    "present", "nonfinite", "nlanes", "bitmap"))
_NO_LANES = bytes(16)  # present and nonfinite, 64 bits each, side by side in the header
assert _NONFINITE_AT == _PRESENT_AT + 8


def scatter_owners(pkt) -> int:
    """The ranks owning a contribution's round (its `bitmap`; 0 for every other packet, and
    for a contribution to an all-reduce: every rank gets the whole result)."""
    if len(pkt) < wire.HEADER_LEN or pkt[1] != wire.MSG_CONTRIB:
        return 0
    return int.from_bytes(pkt[_BITMAP_AT:_BITMAP_AT + 4], "big")


def scatter_strip(result) -> bytes:
    """ScatterStrip: the copy of `result` (a MSG_RESULT, as the P4's) for a rank that owns none
    of its round's blocks: the header with present and nonfinite 0 and the next positions, no
    data. A status is never stripped: the Aggregator drops every block of it (no rank's data)."""
    n = wire.data_offset(result[_NLANES_AT])
    out = bytearray(result[:n])
    out[_PRESENT_AT:_PRESENT_AT + 16] = _NO_LANES
    return bytes(out)
