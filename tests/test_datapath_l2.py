"""The L2 mode's compiled frames (softswitch/_datapath_l2.c, softswitch/compiled.py) against
the Python Dataplane, their reference: the same random frame sequences in give the same frames
out, on the same ports, and the same registers and counters; and through real AF_PACKET
sockets, an L2Switch of each data path sends every port the same frames.

Run just these: .venv/bin/python -m pytest -q tests/test_datapath_l2.py
"""
from __future__ import annotations

import contextlib
import socket
import struct

import numpy as np
import pytest

from softswitch.dataplane import Dataplane, ipv4_checksum
from softswitch.l2 import L2Switch
from spina import netns, rows, spec, wire
from tests.netns import root_ports
from tests.test_datapath import HOST, JOBS, Traffic, assert_same_state, job_config
from tests.waits import until

SWITCH_MAC = bytes.fromhex("020000000064")
SWITCH_IP = "10.0.0.100"
STRANGER = 43000  # Traffic's UDP port that no job admits


def mac(port: int) -> bytes:
    return bytes.fromhex(f"0200000001{port:02x}")


# each rank's switch port: job 3 on ports 1..3, job 9 on ports 2 and 4 (a port of two jobs)
PORTS = {3: (1, 2, 3), 9: (2, 4)}


def frame(pkt: bytes, sport: int, *, dst_ip: str = SWITCH_IP, dst_mac: bytes = SWITCH_MAC,
          src_mac: bytes = mac(1), udp_len: int | None = None, ihl: int = 5, proto: int = 17,
          pad: int = 0, ident: int = 0) -> bytes:
    """Ethernet | IPv4 (valid checksum) | UDP to the INA port | pkt, as a worker's host sends
    it; udp_len, ihl, proto and trailing padding as given (for malformed frames)."""
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 28 + len(pkt), ident, 0x4000, 64,
                               proto, 0, socket.inet_aton(HOST), socket.inet_aton(dst_ip)))
    ip[10:12] = ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    udp = struct.pack("!HHHH", sport, spec.INA_UDP_PORT,
                      8 + len(pkt) if udp_len is None else udp_len, 0)
    return dst_mac + src_mac + b"\x08\x00" + bytes(ip) + udp + pkt + bytes(pad)


def program(dp: Dataplane, ingress=None, epoch: int = 1) -> None:
    """JOBS on `dp`: every rank admitted on its port (`ingress`: all on that one port), its
    copy back to that port with its MAC; the endpoint; an l2 entry per worker MAC."""
    dp.table_add("ina_endpoint", {"dst_addr": SWITCH_IP}, "accept_ina")
    for cfg in JOBS:
        if cfg.job == 3:
            cfg = job_config(3, 3, 41000, epoch=epoch, nslots=4, slot_base=0, block_size=8,
                             nlanes=4)
        senders = [rows.Sender(ingress or p, HOST, w.port, mac(p).hex(":"))
                   for p, w in zip(PORTS[cfg.job], cfg.workers)]
        dp.apply(rows.flat_job(cfg, senders))
        dp.pipeline.clear_slots(cfg.slot_base, cfg.nslots)
    for p in (1, 2, 3, 4):
        dp.table_add("l2", {"dst_mac": mac(p).hex(":")}, "bridge", {"port": p})


class Frames:
    """Traffic's datagrams as frames on their sender's port, some with 16-bit lanes
    (docs/bits.md) or padding after the datagram, and frames a switch must refuse or forward:
    a wrong ingress port (unadmitted), a UDP length beyond the frame or below 8, another
    destination (bridged or dropped), IPv4 options, TCP, ARP, a truncated frame; some
    duplicated or swapped with the next."""

    def __init__(self, seed: int):
        self.traffic = Traffic(seed)
        self.rng = self.traffic.rng
        self.held: list = []

    def _one(self) -> tuple[bytes, int]:
        rng = self.rng
        pkt, (_, sport) = self.traffic.packet()
        job = int.from_bytes(pkt[4:6], "big") if len(pkt) >= 6 else 3
        rank = pkt[wire.FIELD_OFFSET["rank"]] if len(pkt) >= wire.HEADER_LEN else 0
        ports = PORTS.get(job, (1,))
        port = ports[rank % len(ports)] if sport != STRANGER else int(rng.integers(1, 5))
        odd = rng.random()
        kw = {"src_mac": mac(port), "ident": int(rng.integers(1 << 16))}
        if odd < 0.03:
            port = port % 4 + 1  # admitted elsewhere
        elif odd < 0.08:
            kw["pad"] = int(rng.integers(1, 30))
        elif odd < 0.10:
            kw["udp_len"] = 8 + len(pkt) + int(rng.integers(1, 9))
        elif odd < 0.11:
            kw["udp_len"] = int(rng.integers(0, 8))
        elif odd < 0.13:
            kw["dst_ip"] = "10.0.0.7"
            kw["dst_mac"] = mac(int(rng.integers(1, 6)))  # port 5: no l2 entry, dropped
        elif odd < 0.14:
            kw["ihl"] = 6
        elif odd < 0.15:
            kw["proto"] = 6
        elif odd < 0.17 and len(pkt) >= wire.HEADER_LEN:
            h = wire.unpack_header(pkt)
            h.flags |= wire.FLAG_LANES16
            data = rng.integers(-(1 << 15), 1 << 15, (bin(h.present).count("1"), h.block_size))
            pkt = wire.pack(h, np.frombuffer(pkt, wire.NEXT_DTYPE, h.nlanes, wire.HEADER_LEN),
                            data)
        f = frame(pkt, sport, **kw)
        if 0.17 <= odd < 0.18:
            f = f[:12] + b"\x08\x06" + f[14:]  # ARP's ethertype
        elif 0.18 <= odd < 0.185:
            f = f[:30]
        return f, port

    def __iter__(self):
        while True:
            f = self._one()
            odd = self.rng.random()
            if odd < 0.05:
                yield f
                yield f
            elif odd < 0.10:
                later = f
                yield self._one()
                yield later
            else:
                yield f


def pair() -> tuple[Dataplane, Dataplane]:
    fast = Dataplane(pool_slots=16, slot_capacity=64, datapath="compiled")
    ref = Dataplane(pool_slots=16, slot_capacity=64, datapath="python")
    for dp in (fast, ref):
        program(dp)
    return fast, ref


def change_tables(i: int, dp: Dataplane) -> None:
    """Mid-sequence changes, the same on both switches: a re-admission of job 3 at epoch 2,
    a worker_rewrite row gone, a replica without a replication id (its job is Python's), the
    hold off and on, job 9 made a spine and flat again."""
    if i == 1000:
        program(dp, epoch=2)
    elif i == 1500:
        dp.table_delete("worker_rewrite", {"rid": spec.rid(9, 1)})
    elif i == 2500:
        dp.mcast_group_set(spec.mcast_grp(3), dp.mcast_groups[spec.mcast_grp(3)] + [(4, 0)])
    elif i == 3500:
        dp.mcast_group_set(spec.mcast_grp(3), dp.mcast_groups[spec.mcast_grp(3)][:-1])
        dp.table_add("job_level", {"job": 9}, "as_spine", {})
    elif i == 4500:
        dp.table_delete("job_level", {"job": 9})
    if i in (3000, 4000):
        dp.pipeline.hold_newer_rounds = i != 3000


@pytest.mark.parametrize("seed", range(3))
def test_random_frames_give_the_same_frames_registers_and_counters(seed):
    """6,000 random frames (and table changes mid-way) through both data paths: identical
    frames on identical ports after every one, identical registers and counters after every
    500; most served compiled, every kind of refusal punted."""
    fast, ref = pair()
    source = Frames(seed)
    frames = iter(source)
    for i in range(6000):
        f, port = next(frames)
        assert fast.process(f, port) == ref.process(f, port), f"frame {i}"
        if i % 500 == 499:
            assert_same_state(fast, ref)
        for dp in (fast, ref):
            change_tables(i, dp)
        if i == 1000:
            source.traffic.epochs[3] = 2
    assert_same_state(fast, ref)
    punted = fast.compiled.punted
    assert 500 < punted < 4000, punted  # the refusals, job 3 for 1000 frames, job 9 as spine
    c = fast.pipeline.job_counters(3)
    assert c["job_aggregated"] > 300 and c["job_results"] > 100 and c["job_held"] > 0
    assert c["job_stale"] > 0 and c["job_duplicates"] > 0
    assert fast.counter("port_malformed", 1) > 0 and fast.counter("port_unadmitted", 2) > 0


def _through_sockets(datapath: str, seed: int, n: int = 2400) -> tuple[L2Switch, dict]:
    """Frames(seed)'s frames, all sent into port 1 of an L2Switch of `datapath` on four veth
    pairs (every sender admitted there too; copies go to each rank's own port), in chunks the
    switch takes before the next: the stopped switch and the frames each port sent, in order."""
    socks: dict[int, socket.socket] = {}
    with contextlib.ExitStack() as made:  # the sockets closed, then the ports removed
        # ports4.yaml's: IPv6 off (no router solicitations on the ports)
        sw_if, host_if = made.enter_context(root_ports(4, netns.unique_tag("l2c")))
        got: dict[int, list[bytes]] = {p: [] for p in sw_if}
        for p, ifc in host_if.items():
            socks[p] = made.enter_context(netns.packet_socket(ifc))  # its frames only
            socks[p].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
            socks[p].setblocking(False)
        dp = Dataplane(pool_slots=16, slot_capacity=64, datapath=datapath)
        program(dp)
        for (_, src, job, rank), adm in list(dp.pipeline.admission.items()):
            dp.table_add("admission", {"ingress_port": 1, "src_addr": src[0], "src_port": src[1],
                                       "job": job, "rank": rank}, "admit",
                         {f: getattr(adm, f) for f in ("epoch", "slot_base", "nslots", "nworkers",
                                                       "block_size", "nlanes", "mcast_grp")})
        frames = iter(Frames(seed))
        with L2Switch(sw_if, dp) as sw:
            for start in range(0, n, 100):
                for _ in range(100):
                    socks[1].send(next(frames)[0])
                want = start + 100
                until(lambda w=want: sw.frames_in >= w, f"the switch to take frame {want}", 10,
                      every=0.001)
                assert sw.frames_in == want, (start, sw.frames_in)

        def received():  # every frame the stopped switch sent, at the host ends
            for p, s in socks.items():
                while True:
                    try:
                        data, addr = s.recvfrom(1 << 16)
                    except BlockingIOError:
                        break
                    if addr[2] != 4:  # PACKET_OUTGOING: what this test sent
                        got[p].append(data)
            return sum(map(len, got.values())) >= sw.frames_out
        until(received, f"the {sw.frames_out} frames the switch sent", 10)
        return sw, got


def test_the_switch_sends_every_port_the_same_frames_on_both_paths():
    """The same frames into an L2Switch over veth pairs: the compiled switch (batched receive,
    one sendmmsg per port) sends each port exactly the frames the Python switch sends, in the
    same order, and ends with the same registers and counters; it punted the refusals."""
    why = netns.why_no_namespaces()
    if why:
        pytest.skip(why)
    fast, got_fast = _through_sockets("compiled", seed=5)
    ref, got_ref = _through_sockets("python", seed=5)
    assert got_fast == got_ref
    assert sum(map(len, got_ref.values())) > 300 and all(got_ref.values())
    assert_same_state(fast.dataplane, ref.dataplane)  # (their .pipeline's arrays)
    assert fast.frames_in == ref.frames_in == 2400
    assert fast.frames_out == ref.frames_out == sum(map(len, got_ref.values()))
    stats = fast.dataplane.compiled.stats()
    assert 100 < fast.punted < 1200 and stats["frames_out"] > 300, (fast.punted, stats)
