"""The software switch in L2 mode: Ethernet frames on network interfaces, the P4 program's
whole pipeline (p4src/v1model/spina_v1model.p4) in Python.

`Dataplane` is the frame-level pipeline, with no sockets: the P4 parser, ina_endpoint,
InaCheck, admission and the aggregator (softswitch.pipeline.Pipeline), l2/ipv4_routes
forwarding, the packet replication engine (multicast groups of (port, rid)), worker_rewrite,
the congestion drop and the IPv4 checksum. bmv2_tests drive it in process, behind its P4Runtime
servicer.
`L2Switch` attaches a Dataplane to interfaces (veth, mininet links) with AF_PACKET raw
sockets, numbered like BMv2's `-i N@intf`.

Tables are held by their P4 names (spina/spec.py) behind `table_add`, `table_delete` and
`mcast_group_set` (every default action is the P4 program's): the device interface its P4Runtime
service (p4runtime_server.py) calls. The controller writes them, over gRPC or in process
(controller.controller.program_in_process for `python -m softswitch l2 --config`).

Frame layout the parser accepts (as the P4 parser): Ethernet II | IPv4 with ihl 5 | UDP with
destination port INA_UDP_PORT | INA header ... Anything else is forwarded.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from spina import spec
from softswitch.egress import EgressQueues, PortRate
from softswitch.fabric import TO_GROUP, TO_SENDER, LeafJob, Roles
from softswitch.pipeline import DEFAULT_POOL_SLOTS, Admission, Pipeline
from spina import wire
from spina.net import grow_buffers

log = logging.getLogger("spina.softswitch.l2")

ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8
L4_OFF = ETH_LEN + IPV4_LEN        # UDP header offset
INA_OFF = L4_OFF + UDP_LEN         # INA header offset
PRIORITY_AT = INA_OFF + wire.FIELD_OFFSET["priority"]  # the INA priority class byte
_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_SOL_PACKET, _PACKET_IGNORE_OUTGOING = 263, 23


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
    """The P4 program's pipeline on Ethernet frames. `process(frame, port)` -> [(port, frame)].

    Args:
        pool_slots, slot_capacity: the aggregation register pool (softswitch.pipeline).
        ina_udp_port: the UDP destination port the parser recognises (P4: INA_UDP_PORT).
    """

    def __init__(self, pool_slots: int = DEFAULT_POOL_SLOTS,
                 slot_capacity: int = spec.DEFAULT_SLOT_CAPACITY,
                 ina_udp_port: int = spec.INA_UDP_PORT):
        self.pipeline = Pipeline(pool_slots, slot_capacity)
        # Two-level aggregation (softswitch/fabric.py): tables job_level and leaf_upstream.
        self.roles = Roles(self.pipeline)
        self.ina_udp_port = ina_udp_port
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

    # ------------------------------------------------------------ control plane
    @property
    def counters(self):
        return self.pipeline.counters

    @property
    def registers(self):
        return self.pipeline.registers

    def table_add(self, table: str, key: dict, action: str, params: dict | None = None) -> None:
        """Insert (or replace) one entry; names and fields as in spina/spec.py TABLES."""
        params = dict(params or {})
        t = spec.TABLES.get(table)
        if t is None:
            raise KeyError(f"no table {table!r} (tables: {', '.join(spec.TABLES)})")
        if action not in t.actions:
            raise KeyError(f"table {table!r} has no action {action!r} ({', '.join(t.actions)})")
        want = {k.name for k in t.keys}
        if set(key) != want:
            raise KeyError(f"table {table!r} needs keys {sorted(want)}, got {sorted(key)}")
        want_p = {p for p, _ in spec.ACTIONS[action].params}
        if set(params) != want_p:
            raise KeyError(f"action {action!r} needs parameters {sorted(want_p)}, "
                           f"got {sorted(params)}")
        if table == "ina_endpoint":
            self.ina_endpoint.add(socket.inet_aton(ip_str(key["dst_addr"])))
        elif table == "admission":
            k = (int(key["ingress_port"]), (ip_str(key["src_addr"]), int(key["src_port"])),
                 int(key["job"]), int(key["rank"]))
            if action == "reject":
                self.pipeline.admission.pop(k, None)
            elif int(params["mcast_grp"]) == 0:
                # v1model: mcast_grp 0 means "no multicast"; the result would leave on port 0.
                raise ValueError("admit: mcast_grp must be 1..65535 (0 is no multicast group)")
            else:
                self.pipeline.admission[k] = Admission(
                    k[2], int(params["epoch"]), int(params["slot_base"]), int(params["nslots"]),
                    int(params["nworkers"]), int(params["block_size"]), int(params["nlanes"]),
                    int(params["mcast_grp"]))
        elif table == "l2":
            mac = mac_bytes(key["dst_mac"])
            self.l2.pop(mac, None)
            self.l2_spray.pop(mac, None)
            if action == "bridge":
                self.l2[mac] = int(params["port"])
            elif action == "spray":
                self.l2_spray[mac] = (int(params["group"]), int(params["ways"]))
        elif table == "spray_ports":
            k = (int(key["group"]), int(key["turn"]))
            if action == "bridge":
                self.spray_ports[k] = int(params["port"])
            else:
                self.spray_ports.pop(k, None)
        elif table == "ipv4_routes":
            net = ipaddress.IPv4Network(key["dst_addr"], strict=False)
            if action == "drop":
                self.ipv4_routes.pop(net, None)
            else:
                self.ipv4_routes[net] = Route(net, int(params["port"]),
                                              mac_bytes(params["src_mac"]),
                                              mac_bytes(params["dst_mac"]))
        elif table == "worker_rewrite":
            self.worker_rewrite[int(key["rid"])] = (
                mac_bytes(params["dst_mac"]), socket.inet_aton(ip_str(params["dst_addr"])),
                int(params["dst_port"]))
        elif table == "congestion":
            self.pipeline.congestion[int(key["job"])] = (int(params["qdepth"]),
                                                         int(params["bound"]))
        elif table == "job_level":
            job = int(key["job"])
            self.roles.leaves.pop(job, None)
            self.roles.spines.discard(job)
            if action == "as_leaf" and int(params["mcast_grp"]) == 0:
                raise ValueError("as_leaf: mcast_grp must be 1..65535 (0 is no multicast group)")
            if action == "as_leaf":
                self.roles.leaves[job] = LeafJob(**{k: int(v) for k, v in params.items()})
            elif action == "as_spine":
                self.roles.spines.add(job)
        elif table == "leaf_upstream":
            k = (int(key["job"]), int(key["slot"]))
            if action == "to_spine":
                # The spine answers from its INA port (P4: udp.src_port == INA_UDP_PORT).
                self.roles.upstream[k] = (int(params["port"]),
                                          (ip_str(params["dst_addr"]), self.ina_udp_port),
                                          mac_bytes(params["dst_mac"]))
            else:
                self.roles.upstream.pop(k, None)
        else:
            raise KeyError(f"table {table!r} takes no entries here")

    def table_delete(self, table: str, key: dict) -> None:
        if table == "admission":
            self.pipeline.admission.pop((int(key["ingress_port"]),
                                         (ip_str(key["src_addr"]), int(key["src_port"])),
                                         int(key["job"]), int(key["rank"])), None)
        elif table == "ina_endpoint":
            self.ina_endpoint.discard(socket.inet_aton(ip_str(key["dst_addr"])))
        elif table == "l2":
            self.l2.pop(mac_bytes(key["dst_mac"]), None)
            self.l2_spray.pop(mac_bytes(key["dst_mac"]), None)
        elif table == "spray_ports":
            self.spray_ports.pop((int(key["group"]), int(key["turn"])), None)
        elif table == "ipv4_routes":
            self.ipv4_routes.pop(ipaddress.IPv4Network(key["dst_addr"], strict=False), None)
        elif table == "worker_rewrite":
            self.worker_rewrite.pop(int(key["rid"]), None)
        elif table == "congestion":
            self.pipeline.congestion.pop(int(key["job"]), None)
        elif table == "job_level":
            self.roles.leaves.pop(int(key["job"]), None)
            self.roles.spines.discard(int(key["job"]))
        elif table == "leaf_upstream":
            self.roles.upstream.pop((int(key["job"]), int(key["slot"])), None)
        else:
            raise KeyError(f"no table {table!r} with entries")

    def mcast_group_set(self, grp: int, replicas: list[tuple[int, int]]) -> None:
        """Packet replication engine: group -> [(egress port, replication id)]."""
        if not replicas:
            self.mcast_groups.pop(grp, None)
        else:
            self.mcast_groups[grp] = [(int(p), int(r)) for p, r in replicas]

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
        whatever queued frames are due by `now`."""
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
        roles = self.roles
        roles.pipeline = pipe  # the UDP mode's P4Runtime side swaps in its own pipeline
        buf = bytearray(pipe.max_packet_len)
        n, to, key, grp = roles.route_into(payload, port, src, buf)
        if not n:
            return []
        data = bytes(buf[:n])
        # reply_to_sender: swap addresses, new lengths, UDP checksum 0.
        head = bytearray(frame[:INA_OFF])
        head[0:6], head[6:12] = frame[6:12], frame[0:6]
        head[26:30], head[30:34] = frame[30:34], frame[26:30]
        head[34:36], head[36:38] = frame[36:38], frame[34:36]
        head[38:40] = (UDP_LEN + n).to_bytes(2, "big")
        head[40:42] = b"\0\0"
        head[16:18] = (IPV4_LEN + UDP_LEN + n).to_bytes(2, "big")
        if to == TO_SENDER:
            return [(port, self._egress, (0, head, data))]
        if to == TO_GROUP:
            return [(eport, self._egress, (rid, bytearray(head), data))
                    for eport, rid in self.mcast_groups.get(grp, ())]
        # TO_UPSTREAM, a leaf's partial: to the spine owning the slot, from the leaf.
        eport, (addr, udp_port), mac = key
        head[0:6], head[30:34] = mac, socket.inet_aton(addr)
        head[36:38] = udp_port.to_bytes(2, "big")
        return [(eport, self._egress, (0, head, data))]

    def _egress(self, eport: int, rid: int, head: bytearray, data: bytes, qdepth: int):
        """WorkerRewrite, CongestionDrop, then the checksum, for one copy the switch wrote."""
        if rid:
            rw = self.worker_rewrite.get(rid)
            if rw is None:
                return []  # drop_replica
            head[0:6], head[30:34] = rw[0], rw[1]
            head[36:38] = rw[2].to_bytes(2, "big")
        if self.pipeline.congestion_drop(data, qdepth):
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
        if ina_valid and self.pipeline.congestion_drop(frame[INA_OFF:], qdepth):
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


# ---------------------------------------------------------------- raw sockets
class L2Switch:
    """The Dataplane on network interfaces. `start()` runs it in a thread; `stop()` ends it.

    Args:
        interfaces: {port number: interface name}, as BMv2's `-i 1@veth1`.
        dataplane: the pipeline to run (a new one if None).
    """

    def __init__(self, interfaces: dict[int, str], dataplane: Dataplane | None = None):
        self.dataplane = dataplane or Dataplane()
        self.socks: dict[int, socket.socket] = {}
        try:
            for port, ifname in interfaces.items():
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
                try:  # Linux >= 4.20: our own transmissions are not handed back to us
                    s.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
                except OSError:
                    pass  # older kernels: serve_forever skips them (PACKET_OUTGOING)
                grow_buffers(s)  # a burst of every worker's frames must fit while we work
                s.bind((ifname, 0))
                s.setblocking(False)
                self.socks[port] = s
        except OSError:
            self.close()
            raise
        self.interfaces = dict(interfaces)
        self._by_fd = {s.fileno(): p for p, s in self.socks.items()}
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None
        self.frames_in = self.frames_out = 0

    def serve_forever(self) -> None:
        poller = select.poll()
        for fd in self._by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        dp = self.dataplane
        buf = bytearray(65536)  # every frame lands here first
        view = memoryview(buf)
        log.info("software switch (L2) on %s",
                 ", ".join(f"{p}@{i}" for p, i in self.interfaces.items()))
        while True:
            due = dp.next_departure()  # a rate-limited port has frames waiting
            wait = None if due is None else max(0, int((due - time.monotonic()) * 1000) + 1)
            events = poller.poll(wait)
            if due is not None:
                try:
                    with dp.pipeline.lock:
                        outs = dp.departures(time.monotonic())
                except Exception:  # a bug must not take the switch down
                    log.exception("egress error on queued frames; dropped")
                    outs = []
                self._transmit(outs)
            for fd, _ in events:
                if fd == self._stop_r:
                    return
                port = self._by_fd[fd]
                sock = self.socks[port]
                recv = sock.recvfrom_into
                while True:  # drain: one poll wake-up per burst
                    try:
                        n, addr = recv(buf)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as e:
                        log.debug("port %d: %s", port, e)
                        break
                    if addr[2] == _PACKET_OUTGOING:
                        continue  # our own transmission seen again (kernels before 4.20)
                    frame = bytes(view[:n])  # the frame's size, not a 64 KiB allocation
                    self.frames_in += 1
                    try:
                        with dp.pipeline.lock:
                            outs = dp.process(frame, port)
                    except Exception:  # a bug must not take the switch down
                        log.exception("pipeline error on a frame from port %d; dropped", port)
                        continue
                    self._transmit(outs)

    def _transmit(self, outs: list[tuple[int, bytes]]) -> None:
        for eport, data in outs:
            out = self.socks.get(eport)
            if out is None:
                continue
            try:
                out.send(data)
                self.frames_out += 1
            except OSError as e:
                log.debug("send on port %d failed: %s", eport, e)

    def start(self) -> "L2Switch":
        self._thread = threading.Thread(target=self.serve_forever, name="spina-l2", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()
        for fd in (getattr(self, "_stop_r", None), getattr(self, "_stop_w", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._stop_r = self._stop_w = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
