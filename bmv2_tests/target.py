"""The target interface the conformance tests are written against, and the software target.

A target takes table entries and multicast groups by their P4 names
(spina/spec.py), takes frames on numbered ports, and lets a test check exactly what left
on which port and read counters and registers. Every target is written through the
controller's P4Runtime client (`P4RuntimeTarget`: controller.p4rt.Connection, whose P4Info
index encodes the entries) and read through its register adapters (controller/registers.py),
so the tests exercise the encoding the controller uses. `SoftTarget` runs the software switch's
Dataplane in-process behind its P4Runtime servicer (CI); bmv2_tests/bmv2.py has the BMv2 target.
"""
from __future__ import annotations

from p4.v1 import p4runtime_pb2 as pb

from controller import controls
from controller.p4rt import Connection
from controller.registers import P4RuntimeRegisters, RegisterAdapter
from softswitch.dataplane import Dataplane
from softswitch.p4runtime_server import SoftSwitchServicer
from spina import spec

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


class P4RuntimeTarget(Target):
    """Entries, default actions, groups and counters through the controller's Connection;
    registers through a controller register adapter.

    Args:
        conn: a primary connection whose pipeline is set.
        registers: the target's register adapter.
    """

    def __init__(self, conn: Connection, registers: RegisterAdapter):
        self.conn = conn
        self.registers = registers

    def table_add(self, table, key, action, params=None):
        e = self.conn.index.table_entry(table, key, action, params or {})
        self.conn.write([(pb.Update.INSERT, pb.Entity(table_entry=e))])

    def table_delete(self, table, key):
        e = self.conn.index.table_entry(table, key, None, {})
        self.conn.write([(pb.Update.DELETE, pb.Entity(table_entry=e))])

    def table_set_default(self, table, action, params=None):
        e = self.conn.index.table_entry(table, {}, action, params or {}, default=True)
        self.conn.write([(pb.Update.MODIFY, pb.Entity(table_entry=e))])

    def mcast_group_set(self, grp, replicas):
        g = pb.MulticastGroupEntry(multicast_group_id=grp)
        for port, rid in replicas:
            g.replicas.add(egress_port=port, instance=rid)
        exists = any(x.multicast_group_id == grp for x in self.conn.read_groups())
        pre = pb.PacketReplicationEngineEntry(multicast_group_entry=g)
        self.conn.write([(pb.Update.MODIFY if exists else pb.Update.INSERT,
                          pb.Entity(packet_replication_engine_entry=pre))])

    def counter(self, name, index):
        return self.conn.read_counters(name, [index]).get(index, 0)

    def register(self, name, index):
        return self.registers.read(name, index)

    def clear_tables(self) -> None:
        """Every control clears its own tables and groups (the controller's classes)."""
        c = self.conn
        self.conn.write([u for ctl in (controls.Admission(c), controls.InaEndpoint(c),
                                       controls.WorkerRewrite(c), controls.Replication(c),
                                       controls.Forwarding(c), controls.CongestionDrop(c),
                                       controls.FabricRoles(c))
                         for u in ctl.clear()])


class SoftTarget(P4RuntimeTarget):
    """The software switch (softswitch.dataplane.Dataplane), in this process, behind its P4Runtime
    servicer (no gRPC: Connection.in_process). `datapath`: the Dataplane's, "python" (target
    soft: every frame through the Python pipeline, the reference) or "compiled" (target
    soft-compiled: the common case in softswitch/_datapath_l2.c, the rest punted to Python)."""
    can_force_qdepth = True
    can_rate_limit = True

    def __init__(self, datapath: str = "python"):
        self.name = "soft" if datapath == "python" else f"soft-{datapath}"
        self.dp = Dataplane(datapath=datapath)
        conn = Connection.in_process(SoftSwitchServicer(self.dp))
        super().__init__(conn, P4RuntimeRegisters(conn))
        self._commit()
        self._out: list[tuple[int, bytes]] = []
        # A virtual clock: sending takes no time, waiting `timeout` in received() lets the
        # rate-limited queues drain that long, so queue tests are exact and instant.
        self.now = 0.0

    def _commit(self) -> None:
        """A newly committed pipeline: empty tables, zero counters and registers."""
        self.conn.set_pipeline(spec.p4info(), b"", cookie=1)

    def send(self, port, frame):
        self._out += self.dp.process(bytes(frame), port, now=self.now)

    def received(self, timeout=0.0):
        self.now += timeout
        self._out += self.dp.departures(self.now)
        out, self._out = self._out, []
        return out

    def set_qdepth(self, port, depth):
        self.dp.qdepth[port] = depth

    def set_queue_rate(self, port, pps):
        self.dp.set_queue_rate(port, pps, now=self.now)

    def reset(self):
        self._commit()
        self.dp.qdepth.clear()
        self.dp.queues.clear()
        self._out = []

    def close(self):
        self.conn.close()
