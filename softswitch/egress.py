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
- `enq_qdepth` is the number of frames queued at the port (every priority) when the frame
  arrived; a priority queue holding `capacity` frames drops what comes next (tail drop,
  counted in `tail_drops`, no P4 counter: BMv2 counts none either).
Time is whatever the caller passes as `now` (seconds): the switch passes the monotonic clock,
tests a virtual one.
"""
from __future__ import annotations

from collections import deque

PRIORITIES = 8        # v1model priority is 3 bits; simple_switch_grpc --priority-queues 8
QUEUE_CAPACITY = 64   # frames per priority queue (BMv2's default queue depth)


class EgressQueues:
    def __init__(self, priorities: int = PRIORITIES, capacity: int = QUEUE_CAPACITY):
        self.priorities, self.capacity = priorities, capacity
        self.rates: dict[int, float] = {}                   # port -> packets/s (absent: none)
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
        if pps == 0:
            self.rates.pop(port, None)
        else:
            self.rates[port] = float(pps)
            self._last[port] = [now] * self.priorities
            self._queues.setdefault(port, [deque() for _ in range(self.priorities)])

    @property
    def idle(self) -> bool:
        """No port is rate-limited and nothing is queued: frames skip the traffic manager."""
        return not self.rates and not self._queued

    def limited(self, port: int) -> bool:
        return port in self.rates or (self._queued > 0 and self._size.get(port, 0) > 0)

    def depth(self, port: int) -> int:
        return self._size.get(port, 0)

    def push(self, port: int, priority: int, item, now: float) -> int | None:
        """Queue `item` for `port`; its enq_qdepth, or None when its queue is full (dropped)."""
        queues = self._queues.setdefault(port, [deque() for _ in range(self.priorities)])
        q = queues[priority]
        if len(q) >= self.capacity:
            self.tail_drops += 1
            return None
        depth = self._size.get(port, 0)
        rate = self.rates.get(port)
        last = self._last.setdefault(port, [now] * self.priorities)
        send = now if rate is None else max(now, last[priority] + 1.0 / rate)
        last[priority] = send
        self._seq += 1
        q.append((send, self._seq, item))
        self._size[port] = depth + 1
        self._queued += 1
        return depth

    def pop_due(self, now: float) -> list[tuple[int, object]]:
        """Every frame due by `now`, as (port, item), in departure order: by departure time,
        and at equal times the higher priority first (BMv2's egress serves the highest
        priority among the queues whose head is due)."""
        due = []
        for port, queues in self._queues.items():
            if not self._size.get(port):
                continue
            for prio, q in enumerate(queues):
                while q and q[0][0] <= now:
                    send, seq, item = q.popleft()
                    self._size[port] -= 1
                    self._queued -= 1
                    due.append((send, -prio, seq, port, item))
        due.sort(key=lambda d: d[:3])
        return [(port, item) for *_, port, item in due]

    def next_due(self) -> float | None:
        """When the next queued frame may leave (None: nothing queued)."""
        if not self._queued:
            return None
        heads = [q[0][0] for port, queues in self._queues.items() if self._size.get(port)
                 for q in queues if q]
        return min(heads) if heads else None

    def clear(self) -> None:
        """Nothing queued, no rate limits."""
        self.rates.clear()
        self._queues.clear()
        self._last.clear()
        self._size.clear()
        self._queued = 0
