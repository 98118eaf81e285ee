"""The software switch's state and pipeline: the P4 program (p4src/v1model/spina_v1model.p4) in
Python, with no sockets. One Dataplane is one switch, whatever carries its packets: the L2 mode
(softswitch/l2.py: Ethernet frames on interfaces) runs `process` on frames, the UDP mode
(softswitch/udp.py: one UDP socket) runs `roles.route_into` on INA payloads; both read the same
tables, so a row this switch accepts is a row its data path uses.

`process` is the frame pipeline: the P4 parser, ina_endpoint, InaCheck, admission and the
aggregator (softswitch.pipeline.Pipeline), the leaf and spine roles (softswitch.fabric.FabricRoles),
l2/ipv4_routes forwarding with per-packet spraying, the packet replication engine (multicast
groups of (port, rid)), worker_rewrite, the congestion drop and the IPv4 checksum. bmv2_tests
drive it in process, behind its P4Runtime servicer.

Tables are held by their P4 names (spina/spec.py) behind `table_add`, `table_delete` and
`mcast_group_set` (every default action is the P4 program's): the device interface its P4Runtime
service (p4runtime_server.py) calls, and `apply` for rows built in this process
(spina.rows: the one-machine path). A row this switch's mode cannot honour is refused by name
(ValueError): in the UDP mode every row names port 0 and there is no frame forwarding; a switch
given its `ports` refuses rows for other ports.

Frame layout the parser accepts (as the P4 parser): Ethernet II | IPv4 with ihl 5 | UDP with
destination port INA_UDP_PORT | INA header ... Anything else is forwarded.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

from softswitch.egress import CongestionDrop, EgressQueues, PortRate, scatter_strip
from softswitch.fabric import TO_GROUP, TO_OTHERS, TO_SENDER, FabricRoles, LeafJob
from softswitch.pipeline import DEFAULT_POOL_SLOTS, Admission, Pipeline
from spina import spec, wire
from spina.rows import SwitchRows

log = logging.getLogger("spina.softswitch")

ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8
L4_OFF = ETH_LEN + IPV4_LEN        # UDP header offset
INA_OFF = L4_OFF + UDP_LEN         # INA header offset
PRIORITY_AT = INA_OFF + wire.FIELD_OFFSET["priority"]  # the INA priority class byte
_RANK_AT, _NLANES_AT = wire.FIELD_OFFSET["rank"], wire.FIELD_OFFSET["nlanes"]
UDP_MODE_PORT = 0  # the UDP mode's one "ingress port": every sender, every copy
DATAPATHS = ("compiled", "python")  # the frames' data paths (Dataplane's datapath)


# ---------------------------------------------------------------- value helpers
def mac_bytes(mac) -> bytes:
    """'02:00:00:00:00:01', an int or 6 bytes -> 6 bytes."""
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError(f"MAC address needs 6 bytes, got {len(mac)}")
        return bytes(mac)
    if isinstance(mac, int):
        return mac.to_bytes(6, "big")
    parts = str(mac).split(":")
    if len(parts) != 6:
        raise ValueError(f"bad MAC address {mac!r}")
    return bytes(int(p, 16) for p in parts)


def ip_str(addr) -> str:
    """'10.0.0.1', an int or 4 bytes -> '10.0.0.1' (the form Pipeline's admission keys use)."""
    if isinstance(addr, (bytes, bytearray)):
        return socket.inet_ntoa(bytes(addr))
    return str(ipaddress.IPv4Address(addr))


def ipv4_checksum(header: bytes) -> int:
    """RFC 791 header checksum of a 20-byte header whose checksum field is zero."""
    s = sum(struct.unpack("!10H", header))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def with_ipv4_checksum(frame: bytearray) -> bytearray:
    """Recompute the checksum of the IPv4 header at offset 14 (as SpinaComputeChecksum)."""
    frame[24:26] = b"\0\0"
    frame[24:26] = ipv4_checksum(bytes(frame[ETH_LEN:L4_OFF])).to_bytes(2, "big")
    return frame


@dataclass(frozen=True)
class Route:
    network: ipaddress.IPv4Network
    port: int
    src_mac: bytes
    dst_mac: bytes


# ---------------------------------------------------------------- the frame pipeline
class Dataplane:
    """One switch: its tables, registers and the P4 pipeline. `process(frame, port)` ->
    [(port, frame)] in L2 mode; the UDP mode reads the same tables (softswitch/udp.py).

    Args:
        pool_slots, slot_capacity: the aggregation register pool (softswitch.pipeline).
        ina_udp_port: the UDP destination port the parser recognises (P4: INA_UDP_PORT).
        ports: the switch's ports, if known: rows naming another port are refused (None: any).
        udp_mode: the UDP mode's switch: every sender and copy on port 0 (UDP_MODE_PORT), and no
            frame forwarding (l2, spray_ports and ipv4_routes refused).
        datapath: the frames' data path (DATAPATHS): "compiled" runs the common case, a flat
            job's contributions, in softswitch/_datapath_l2.c (softswitch.compiled.
            CompiledFrames) and hands every other frame to the Python pipeline in arrival
            order, on the same registers; "python" runs every frame through the Python
            pipeline (`process_python`, the reference). The UDP mode has a compiled path of
            its own (softswitch/udp.py).
    """

    def __init__(self, pool_slots: int = DEFAULT_POOL_SLOTS,
                 slot_capacity: int = spec.DEFAULT_SLOT_CAPACITY,
                 ina_udp_port: int = spec.INA_UDP_PORT, ports=None, udp_mode: bool = False,
                 datapath: str = "compiled"):
        if datapath not in DATAPATHS:
            raise ValueError(f"datapath {datapath!r}: one of {', '.join(DATAPATHS)}")
        self.pipeline = Pipeline(pool_slots, slot_capacity)
        # Two-level aggregation (softswitch/fabric.py): tables job_level and leaf_upstream.
        self.roles = FabricRoles(self.pipeline)
        self.ina_udp_port = ina_udp_port
        self.udp_mode = udp_mode
        self.ports = frozenset({UDP_MODE_PORT} if udp_mode else ports or ()) or None
        # Bumped by every table or group change: a mode that derives state from the tables
        # (the UDP mode's destinations) knows when to derive it again.
        self.version = 0
        self.ina_endpoint: set[bytes] = set()                 # IPv4 dst (4 bytes)
        self.l2: dict[bytes, int] = {}                        # dst MAC -> port (bridge)
        # Per-packet spraying (forwarding.p4): dst MAC -> (group, ways); (group, turn) -> port;
        # register spray_turn, one cell per group.
        self.l2_spray: dict[bytes, tuple[int, int]] = {}
        self.spray_ports: dict[tuple[int, int], int] = {}
        self.spray_registers = {r.name: np.zeros(spec.P4_SIZES["SPRAY_GROUPS"], np.uint8)
                                for r in spec.SPRAY_REGISTERS}
        self.ipv4_routes: dict[ipaddress.IPv4Network, Route] = {}
        self.mcast_groups: dict[int, list[tuple[int, int]]] = {}  # grp -> [(port, rid)]
        self.worker_rewrite: dict[int, tuple[bytes, bytes, int]] = {}  # rid -> (mac, ip, udp)
        # The traffic manager: a port with a rate limit queues by priority (softswitch/egress.py);
        # its enq_qdepth is measured there. `qdepth` forces the enq_qdepth a port's egress sees
        # (tests exercising the congestion drop without a real queue).
        self.queues = EgressQueues()
        self.qdepth: dict[int, int] = {}
        # Egress: the congestion drop (table congestion), on the pipeline's counter and
        # register arrays, which P4Runtime and the metrics read.
        self.congestion = CongestionDrop(self.pipeline.counters, self.pipeline.job_registers)
        self.datapath = datapath
        self.compiled = None  # softswitch.compiled.CompiledFrames: the L2 mode's compiled frames
        if datapath == "compiled" and not udp_mode:
            from softswitch.compiled import CompiledFrames
            self.compiled = CompiledFrames(self)

    # ------------------------------------------------------------ control plane
    @property
    def counters(self):
        return self.pipeline.counters

    @property
    def registers(self):
        return self.pipeline.registers

    def table_add(self, table: str, key: dict, action: str, params: dict | None = None) -> None:
        """Insert (or replace) one entry; names and fields as in spina/spec.py TABLES. A row
        this switch cannot honour (class doc) is a ValueError naming it."""
        params = dict(params or {})
        add, _ = self._handlers(table)
        t = spec.TABLES[table]
        if action not in t.actions:
            raise KeyError(f"table {table!r} has no action {action!r} ({', '.join(t.actions)})")
        want = {k.name for k in t.keys}
        if set(key) != want:
            raise KeyError(f"table {table!r} needs keys {sorted(want)}, got {sorted(key)}")
        want_p = {p for p, _ in spec.ACTIONS[action].params}
        if set(params) != want_p:
            raise KeyError(f"action {action!r} needs parameters {sorted(want_p)}, "
                           f"got {sorted(params)}")
        add(self, key, action, params)
        self.version += 1

    def table_delete(self, table: str, key: dict) -> None:
        """Delete one entry (no entry: nothing to do, as the tables' dicts)."""
        _, delete = self._handlers(table)
        delete(self, key)
        self.version += 1

    def _handlers(self, table: str) -> tuple:
        """(add, delete) of `table` from TABLE_HANDLERS; a KeyError naming an unknown table."""
        try:
            return self.TABLE_HANDLERS[table]
        except KeyError:
            raise KeyError(f"no table {table!r} (tables: {', '.join(self.TABLE_HANDLERS)})") \
                from None

    def mcast_group_set(self, grp: int, replicas: list[tuple[int, int]]) -> None:
        """Packet replication engine: group -> [(egress port, replication id)]."""
        for port, _ in replicas:
            self._check_port(int(port), f"multicast group {grp}: a replica")
        if not replicas:
            self.mcast_groups.pop(grp, None)
        else:
            self.mcast_groups[grp] = [(int(p), int(r)) for p, r in replicas]
        self.version += 1

    def apply(self, rows: SwitchRows) -> None:
        """Write rows built in this process (spina.rows) to the tables, as a controller would."""
        for table, key, action, params in rows.entries:
            try:
                self.table_add(table, key, action, params)
            except ValueError as e:
                raise ValueError(f"table {table}: {e}") from None
        for grp, replicas in rows.groups.items():
            self.mcast_group_set(grp, replicas)

    def remove_job(self, job: int) -> None:
        """Delete every row of `job` (admission, worker_rewrite, group, roles, congestion); its
        slot registers stay as they are (the writer clears them, as the controller does)."""
        pipe = self.pipeline
        for k in [k for k in pipe.admission if k[2] == job]:
            del pipe.admission[k]
        for rid in range(spec.rid(job, 0), spec.rid(job, wire.MAX_WORKERS - 1) + 1):
            self.worker_rewrite.pop(rid, None)
        self.mcast_groups.pop(spec.mcast_grp(job), None)
        self.congestion.table.pop(job, None)
        self.roles.remove_job(job)
        self.version += 1

    def _check_port(self, port: int, what: str) -> None:
        if self.ports is not None and port not in self.ports:
            mode = "the UDP mode has one port, 0" if self.udp_mode else \
                f"this switch's ports are {', '.join(map(str, sorted(self.ports)))}"
            raise ValueError(f"{what}: port {port} is not a port of this switch ({mode})")

    def _no_frames(self, table: str) -> None:
        if self.udp_mode:
            raise ValueError("the UDP mode forwards no frames (only INA packets to its socket); "
                             "run the L2 mode for forwarding entries")

    # one add and one delete per table (TABLE_HANDLERS below): its rows into the structures the
    # data path reads
    def _add_ina_endpoint(self, key, action, params):
        self.ina_endpoint.add(socket.inet_aton(ip_str(key["dst_addr"])))

    def _delete_ina_endpoint(self, key):
        self.ina_endpoint.discard(socket.inet_aton(ip_str(key["dst_addr"])))

    @staticmethod
    def _admission_key(key) -> tuple:
        return (int(key["ingress_port"]), (ip_str(key["src_addr"]), int(key["src_port"])),
                int(key["job"]), int(key["rank"]))

    def _add_admission(self, key, action, params):
        k = self._admission_key(key)
        if action == "reject":
            self.pipeline.admission.pop(k, None)
            return
        self._check_port(k[0], "ingress_port")
        if int(params["mcast_grp"]) == 0:
            # v1model: mcast_grp 0 means "no multicast"; the result would leave on port 0.
            raise ValueError("admit: mcast_grp must be 1..65535 (0 is no multicast group)")
        self.pipeline.admission[k] = Admission(
            k[2], int(params["epoch"]), int(params["slot_base"]), int(params["nslots"]),
            int(params["nworkers"]), int(params["block_size"]), int(params["nlanes"]),
            int(params["mcast_grp"]))

    def _delete_admission(self, key):
        self.pipeline.admission.pop(self._admission_key(key), None)

    def _add_l2(self, key, action, params):
        self._no_frames("l2")
        mac = mac_bytes(key["dst_mac"])
        self.l2.pop(mac, None)
        self.l2_spray.pop(mac, None)
        if action == "bridge":
            self._check_port(int(params["port"]), "bridge")
            self.l2[mac] = int(params["port"])
        elif action == "spray":
            self.l2_spray[mac] = (int(params["group"]), int(params["ways"]))

    def _delete_l2(self, key):
        self.l2.pop(mac_bytes(key["dst_mac"]), None)
        self.l2_spray.pop(mac_bytes(key["dst_mac"]), None)

    def _add_spray_ports(self, key, action, params):
        self._no_frames("spray_ports")
        k = (int(key["group"]), int(key["turn"]))
        if action == "bridge":
            self._check_port(int(params["port"]), "bridge")
            self.spray_ports[k] = int(params["port"])
        else:
            self.spray_ports.pop(k, None)

    def _delete_spray_ports(self, key):
        self.spray_ports.pop((int(key["group"]), int(key["turn"])), None)

    def _add_ipv4_routes(self, key, action, params):
        self._no_frames("ipv4_routes")
        net = ipaddress.IPv4Network(key["dst_addr"], strict=False)
        if action == "drop":
            self.ipv4_routes.pop(net, None)
            return
        self._check_port(int(params["port"]), "route")
        self.ipv4_routes[net] = Route(net, int(params["port"]), mac_bytes(params["src_mac"]),
                                      mac_bytes(params["dst_mac"]))

    def _delete_ipv4_routes(self, key):
        self.ipv4_routes.pop(ipaddress.IPv4Network(key["dst_addr"], strict=False), None)

    def _add_worker_rewrite(self, key, action, params):
        if action == "drop_replica":
            self.worker_rewrite.pop(int(key["rid"]), None)
            return
        self.worker_rewrite[int(key["rid"])] = (
            mac_bytes(params["dst_mac"]), socket.inet_aton(ip_str(params["dst_addr"])),
            int(params["dst_port"]))

    def _delete_worker_rewrite(self, key):
        self.worker_rewrite.pop(int(key["rid"]), None)

    def _add_congestion(self, key, action, params):
        if action == "NoAction":
            self.congestion.table.pop(int(key["job"]), None)
            return
        self.congestion.table[int(key["job"])] = (int(params["qdepth"]), int(params["bound"]))

    def _delete_congestion(self, key):
        self.congestion.table.pop(int(key["job"]), None)

    def _add_job_level(self, key, action, params):
        job = int(key["job"])
        if action == "as_leaf" and int(params["mcast_grp"]) == 0:
            raise ValueError("as_leaf: mcast_grp must be 1..65535 (0 is no multicast group)")
        self.roles.leaves.pop(job, None)
        self.roles.spines.discard(job)
        if action == "as_leaf":
            self.roles.leaves[job] = LeafJob(**{k: int(v) for k, v in params.items()})
        elif action == "as_spine":
            self.roles.spines.add(job)

    def _delete_job_level(self, key):
        self.roles.leaves.pop(int(key["job"]), None)
        self.roles.spines.discard(int(key["job"]))

    def _add_leaf_upstream(self, key, action, params):
        k = (int(key["job"]), int(key["slot"]))
        if action != "to_spine":
            self.roles.upstream.pop(k, None)
            return
        self._check_port(int(params["port"]), "to_spine")
        # The spine listens and answers on the INA port (P4: udp.src_port == INA_UDP_PORT).
        self.roles.upstream[k] = (int(params["port"]),
                                  (ip_str(params["dst_addr"]), self.ina_udp_port),
                                  mac_bytes(params["dst_mac"]))

    def _delete_leaf_upstream(self, key):
        self.roles.upstream.pop((int(key["job"]), int(key["slot"])), None)

    # table name -> (add, delete), the dispatch of table_add and table_delete: every table of
    # spina/spec.py TABLES (tests/test_l2_dataplane.py checks both hold the same names).
    TABLE_HANDLERS = {
        "ina_endpoint": (_add_ina_endpoint, _delete_ina_endpoint),
        "admission": (_add_admission, _delete_admission),
        "congestion": (_add_congestion, _delete_congestion),
        "l2": (_add_l2, _delete_l2),
        "spray_ports": (_add_spray_ports, _delete_spray_ports),
        "ipv4_routes": (_add_ipv4_routes, _delete_ipv4_routes),
        "worker_rewrite": (_add_worker_rewrite, _delete_worker_rewrite),
        "job_level": (_add_job_level, _delete_job_level),
        "leaf_upstream": (_add_leaf_upstream, _delete_leaf_upstream),
    }

    # ------------------------------------------------------------ data plane
    def set_queue_rate(self, port: int, pps: float, now: float | None = None) -> None:
        """Limit each priority queue of `port` to `pps` frames a second (0: no limit), as
        BMv2's `set_queue_rate PPS PORT`."""
        self.queues.set_rate(port, pps, time.monotonic() if now is None else now)

    def set_port_rate(self, port: int, rate: PortRate | None, now: float | None = None) -> None:
        """Shape `port` as one link of `rate` (None: none): strict priority between its
        queues, the link time taken when a frame leaves egress (softswitch/egress.py; BMv2
        has no such shaper)."""
        self.queues.set_port_rate(port, rate, time.monotonic() if now is None else now)

    def process(self, frame: bytes, port: int, now: float | None = None) -> list[tuple[int, bytes]]:
        """One frame in on `port` at time `now` (default: the monotonic clock); the frames
        out, as (egress port, bytes): this frame's copies to ports without a queue, and
        whatever queued frames are due by `now`. The compiled path first (while the traffic
        manager is idle), what it punts through `process_python`."""
        fast = self.compiled
        if fast is not None and self.queues.idle:
            out = fast.process(frame, port)
            if out is not None:
                return out
        return self.process_python(frame, port, now)

    def process_python(self, frame: bytes, port: int,
                       now: float | None = None) -> list[tuple[int, bytes]]:
        """`process` in Python only: the reference, and every frame the compiled path
        punts."""
        queues = self.queues
        tm = not queues.idle  # no rate limit and nothing queued: no traffic manager at all
        out: list[tuple[int, bytes]] = []
        n = len(frame)
        if n >= ETH_LEN:  # no Ethernet header: Forwarding drops it
            udp = (n >= INA_OFF and frame[12] == 0x08 and frame[13] == 0x00
                   and frame[14] & 0x0F == 5 and frame[23] == spec.IP_PROTO_UDP)
            ina_port = udp and (frame[36] << 8 | frame[37]) == self.ina_udp_port
            ina_valid = ina_port and n >= INA_OFF + wire.HEADER_LEN
            # Priority control: the INA header's class picks the egress queue (3 bits).
            priority = frame[PRIORITY_AT] & 7 if tm and ina_valid else 0
            if ina_port and frame[30:34] in self.ina_endpoint:
                copies = self._terminate(frame, port)
            else:
                copies = self._forward(frame, port, ina_valid)
            if tm:
                now = time.monotonic() if now is None else now
                for eport, egress, args in copies:
                    self._enqueue(eport, priority, egress, args, now, out)
            else:
                qdepth = self.qdepth
                for eport, egress, args in copies:
                    out += egress(eport, *args, qdepth.get(eport, 0))
        if tm and queues.next_due() is not None:
            out += self.departures(time.monotonic() if now is None else now)
        return out

    def _enqueue(self, eport: int, priority: int, egress, args, now: float, out: list) -> None:
        """Traffic manager: run the egress now (a port without a rate limit) or queue it."""
        if not self.queues.limited(eport):
            out += egress(eport, *args, self.qdepth.get(eport, 0))
            return
        item = [egress, args, 0]
        depth = self.queues.push(eport, priority, item, now)
        if depth is not None:
            item[2] = self.qdepth.get(eport, depth)

    def departures(self, now: float | None = None) -> list[tuple[int, bytes]]:
        """Queued frames due by `now`, through the egress (with their enq_qdepth)."""
        out: list[tuple[int, bytes]] = []
        now = time.monotonic() if now is None else now
        for eport, (egress, args, depth) in self.queues.pop_due(now):
            out += egress(eport, *args, depth)
        if self.queues.shapers:  # shaped ports: egress runs at transmission
            out += self.queues.transmit(now, _run_egress)
        return out

    def next_departure(self) -> float | None:
        """When the next queued frame is due (None: nothing queued)."""
        return self.queues.next_due()

    def _terminate(self, frame: bytes, port: int) -> list:
        pipe = self.pipeline
        udp_len = frame[38] << 8 | frame[39]
        payload = frame[INA_OFF:L4_OFF + udp_len]
        if len(payload) != udp_len - UDP_LEN:
            # Shorter than its UDP length: no whole datagram (P4: InaCheck compares the UDP
            # length with std.packet_length, also where the parser stopped early).
            pipe.counters["port_malformed"][port % spec.MAX_PORTS] += 1
            return []
        src = (socket.inet_ntoa(frame[26:30]), frame[34] << 8 | frame[35])
        buf = bytearray(pipe.max_packet_len)
        n, to, key, grp = self.roles.route_into(payload, port, src, buf)
        if not n:
            return []
        data = bytes(buf[:n])
        # ReduceScatter: the ranks owning the round's blocks (0: all); a reply to a sender that
        # owns none of them is stripped here, a multicast copy in egress (by its rid's rank).
        owners = self.roles.owners(payload, data)
        if owners and to == TO_SENDER and not owners >> payload[_RANK_AT] & 1:
            data, n = scatter_strip(data), wire.data_offset(data[_NLANES_AT])
        # reply_to_sender: swap addresses, new lengths, UDP checksum 0.
        head = bytearray(frame[:INA_OFF])
        head[0:6], head[6:12] = frame[6:12], frame[0:6]
        head[26:30], head[30:34] = frame[30:34], frame[26:30]
        head[34:36], head[36:38] = frame[36:38], frame[34:36]
        head[38:40] = (UDP_LEN + n).to_bytes(2, "big")
        head[40:42] = b"\0\0"
        head[16:18] = (IPV4_LEN + UDP_LEN + n).to_bytes(2, "big")
        if to == TO_SENDER:
            return [(port, self._egress, (0, head, data, 0))]
        if to == TO_GROUP or to == TO_OTHERS:
            return [(eport, self._egress, (rid, bytearray(head), data, owners))
                    for eport, rid in self.mcast_groups.get(grp, ())]
        # TO_UPSTREAM, a leaf's partial: to the spine owning the slot, from the leaf.
        eport, (addr, udp_port), mac = key
        head[0:6], head[30:34] = mac, socket.inet_aton(addr)
        head[36:38] = udp_port.to_bytes(2, "big")
        return [(eport, self._egress, (0, head, data, 0))]

    def _egress(self, eport: int, rid: int, head: bytearray, data: bytes, owners: int,
                qdepth: int):
        """WorkerRewrite, ScatterStrip (a copy of a reduce-scatter result for a rank outside
        `owners`: header and next positions only), CongestionDrop, then the checksum, for one
        copy the switch wrote."""
        if owners and not owners >> spec.rid_rank(rid) & 1:
            data = scatter_strip(data)
            head[38:40] = (UDP_LEN + len(data)).to_bytes(2, "big")
            head[16:18] = (IPV4_LEN + UDP_LEN + len(data)).to_bytes(2, "big")
        if rid:
            rw = self.worker_rewrite.get(rid)
            if rw is None:
                return []  # drop_replica
            if (data[1] == wire.MSG_GATHER and head[30:34] == rw[1]
                    and head[36:38] == rw[2].to_bytes(2, "big")):
                return []  # an all-gather packet's copy for its own sender (addressed back)
            head[0:6], head[30:34] = rw[0], rw[1]
            head[36:38] = rw[2].to_bytes(2, "big")
        if self.congestion.drop(data, qdepth):
            return []
        return [(eport, bytes(with_ipv4_checksum(head)) + data)]

    def _forward(self, frame: bytes, port: int, ina_valid: bool) -> list:
        eport = self.l2.get(frame[0:6])
        if eport is None and self.l2_spray:
            sprayed = self.l2_spray.get(frame[0:6])
            if sprayed is not None:
                eport = self._spray_port(*sprayed)
                if eport is None:
                    return []  # spray_ports' default: drop
        if eport is not None:
            out = frame  # bridged: byte for byte
        else:
            if len(frame) < L4_OFF or frame[12:14] != b"\x08\x00":
                return []
            route = self._lpm(frame[30:34])
            if route is None:
                return []
            f = bytearray(frame)
            f[0:6], f[6:12] = route.dst_mac, route.src_mac
            f[22] = (f[22] - 1) & 0xFF
            eport, out = route.port, bytes(with_ipv4_checksum(f))
        return [(eport, self._egress_forwarded, (out, ina_valid))]

    def _egress_forwarded(self, eport: int, frame: bytes, ina_valid: bool, qdepth: int):
        """CongestionDrop for a forwarded frame (loss-tolerant INA packets only)."""
        if ina_valid and self.congestion.drop(frame[INA_OFF:], qdepth):
            return []
        return [(eport, frame)]

    def _spray_port(self, group: int, ways: int) -> int | None:
        """forwarding.p4's spray: this packet's turn of `group`, the register advanced (one
        read, one write), and spray_ports' port for the turn (None: no entry, dropped)."""
        turns = self.spray_registers["spray_turn"]
        turn = int(turns[group])
        if turn >= ways:
            turn = 0  # the group shrank since its last packet
        following = (turn + 1) & 0xFF
        turns[group] = 0 if following >= ways else following
        return self.spray_ports.get((group, turn))

    def _lpm(self, dst: bytes) -> Route | None:
        if not self.ipv4_routes:
            return None
        addr = ipaddress.IPv4Address(dst)
        best = None
        for net, r in self.ipv4_routes.items():
            if addr in net and (best is None or net.prefixlen > best.network.prefixlen):
                best = r
        return best

    # ------------------------------------------------------------ observation
    def counter(self, name: str, index: int) -> int:
        return int(self.pipeline.counters[name][index])

    def register(self, p4_name: str, index: int) -> int:
        """A register cell by its P4 name ('slot_values_l1_e5'), as the P4's unsigned bits.

        Value and lane registers map onto the pipeline's arrays with the P4 block size.
        """
        if p4_name in self.spray_registers:
            return int(self.spray_registers[p4_name][index])
        base, lane, elem = spec.split_p4_register(p4_name)
        reg = {r.name: r for r in spec.REGISTERS}.get(base)
        if reg is None:
            raise KeyError(f"no register {p4_name!r}")
        arr = self.pipeline.registers[base]
        if reg.shape in (spec.SLOT, spec.HEAD):
            v = arr[index]
        elif reg.shape == spec.LANE:
            v = arr[index, lane]
        else:
            v = arr[index, lane * spec.P4_SIZES["BLOCK_SIZE"] + elem]
        return int(v) & ((1 << reg.width) - 1)


def _run_egress(eport: int, item) -> list[tuple[int, bytes]]:
    """A queued frame (Dataplane._enqueue's item) through its egress."""
    egress, args, depth = item
    return egress(eport, *args, depth)
