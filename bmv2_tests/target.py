"""The target interface the conformance tests are written against, and the software target.

A target takes table entries, multicast groups and the congestion threshold by their P4 names
(spina/spec.py), takes frames on numbered ports, and lets a test check exactly what left
on which port and read counters and registers. `SoftTarget` runs the software switch's
Dataplane in-process (CI); bmv2_tests/bmv2.py has the BMv2 target.
"""
from __future__ import annotations

from softswitch.l2 import Dataplane

PORTS = (1, 2, 3, 4)  # front-panel ports the tests use (BMv2: -i 1@... -i 4@...)


class Target:
    """What a conformance test may do to a switch."""
    name = "abstract"
    can_force_qdepth = False
    can_rate_limit = False

    def table_add(self, table: str, key: dict, action: str, params: dict | None = None): ...
    def table_set_default(self, table: str, action: str, params: dict | None = None): ...
    def mcast_group_set(self, grp: int, replicas: list[tuple[int, int]]): ...
    def send(self, port: int, frame: bytes): ...

    def received(self, timeout: float) -> list[tuple[int, bytes]]:
        """Every frame that left the switch since the last call, as (port, bytes)."""

    def counter(self, name: str, index: int) -> int: ...
    def register(self, name: str, index: int) -> int: ...

    def set_qdepth(self, port: int, depth: int):
        """Make the egress of `port` see this enq_qdepth (targets that can force it)."""
        raise NotImplementedError

    def set_queue_rate(self, port: int, pps: int):
        """Let the egress queues of `port` send at most `pps` packets a second (0: no limit),
        so that a burst really queues (targets with real queues)."""
        raise NotImplementedError

    def reset(self):
        """Forget every entry, group, counter and register value a test wrote."""

    def close(self): ...


class SoftTarget(Target):
    """The software switch (softswitch.l2.Dataplane), in this process."""
    name = "soft"
    can_force_qdepth = True

    def __init__(self):
        self.dp = Dataplane()
        self._out: list[tuple[int, bytes]] = []

    def table_add(self, table, key, action, params=None):
        self.dp.table_add(table, key, action, params)

    def table_set_default(self, table, action, params=None):
        self.dp.table_set_default(table, action, params)

    def mcast_group_set(self, grp, replicas):
        self.dp.mcast_group_set(grp, replicas)

    def send(self, port, frame):
        self._out += self.dp.process(bytes(frame), port)

    def received(self, timeout=0.0):
        out, self._out = self._out, []
        return out

    def counter(self, name, index):
        return self.dp.counter(name, index)

    def register(self, name, index):
        return self.dp.register(name, index)

    def set_qdepth(self, port, depth):
        self.dp.qdepth[port] = depth

    def reset(self):
        self.dp = Dataplane()
        self._out = []
