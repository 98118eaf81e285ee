"""Addresses, frame builders (scapy, with wire.scapy_layer()) and per-feature entry helpers.

The helpers name entries by P4 names; every target encodes them with the controller's client
(bmv2_tests/target.py), and group and replication ids are the controller's (spina.spec).

Worker r sits on switch port r + 1 with MAC 02:00:00:00:01:0r, IPv4 10.0.0.(r+1) and UDP
port 50000 + r; the switch answers as 02:00:00:00:00:64 / 10.0.0.100:47000.
"""
from __future__ import annotations

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from spina import spec, wire

INA = wire.scapy_layer()
SWITCH_MAC = "02:00:00:00:00:64"
SWITCH_IP = "10.0.0.100"
INA_PORT = spec.INA_UDP_PORT
BS = spec.P4_SIZES["BLOCK_SIZE"]
K = spec.P4_SIZES["NLANES"]
JOB = 7
MCAST_GRP = spec.mcast_grp(JOB)


def worker_port(rank: int) -> int:
    return rank + 1


def worker_mac(rank: int) -> str:
    return f"02:00:00:00:01:{rank:02x}"


def worker_ip(rank: int) -> str:
    return f"10.0.0.{rank + 1}"


def worker_udp(rank: int) -> int:
    return 50000 + rank


def rid(rank: int, job: int = JOB) -> int:
    """The replication id of `rank`'s result copy, as the controller numbers it."""
    return spec.rid(job, rank)


def blocks_bytes(blocks: dict[int, list[int]] | None, flags: int = 0) -> tuple[int, bytes]:
    """{lane: BS values} -> (present bits, big-endian block bytes in lane order), in the lane
    width `flags` names (int32; int16 or int8 with FLAG_LANES16 or FLAG_LANES8)."""
    present, data = 0, b""
    for lane in sorted(blocks or {}):
        present |= 1 << lane
        data += np.asarray(blocks[lane], wire.data_dtype(flags)).tobytes()
    return present, data


def ina(**fields):
    """An INA layer with P4 sizes; `blocks` {lane: values} sets present and data (in the
    width the flags name)."""
    present, data = blocks_bytes(fields.pop("blocks", None), fields.get("flags", 0))
    fields.setdefault("present", present)
    fields.setdefault("data", data)
    fields.setdefault("nlanes", K)
    fields.setdefault("block_size", BS)
    fields.setdefault("next", [wire.END] * fields["nlanes"])
    fields.setdefault("job", JOB)
    fields.setdefault("epoch", 1)
    return INA(**fields)


def contrib(rank: int, slot: int = 0, round: int = 1, **fields) -> bytes:
    """Worker `rank`'s contribution frame as it arrives at the switch (`wire_rank`: the rank
    field when it differs from the host's number, as a leaf's workers send local ranks)."""
    fields.setdefault("msg_type", wire.MSG_CONTRIB)
    fields.setdefault("wire_rank", rank)
    src_udp = fields.pop("src_udp", worker_udp(rank))
    src_ip = fields.pop("src_ip", worker_ip(rank))
    dst_ip = fields.pop("dst_ip", SWITCH_IP)
    return bytes(Ether(dst=SWITCH_MAC, src=worker_mac(rank)) / IP(src=src_ip, dst=dst_ip)
                 / UDP(sport=src_udp, dport=INA_PORT)
                 / ina(rank=fields.pop("wire_rank"), slot=slot, round=round, **fields))


def reply(to_rank: int, **fields) -> bytes:
    """A frame the switch sends to worker `to_rank`: from the switch, UDP checksum zero."""
    fields.setdefault("msg_type", wire.MSG_RESULT)
    fields.setdefault("round", 1)  # as contrib()
    return bytes(Ether(dst=worker_mac(to_rank), src=SWITCH_MAC)
                 / IP(src=SWITCH_IP, dst=worker_ip(to_rank))
                 / UDP(sport=INA_PORT, dport=worker_udp(to_rank), chksum=0) / ina(**fields))


def results_to_all(nworkers: int, **fields) -> dict[int, list[bytes]]:
    """The result frame with `fields`, once to each of workers 0..nworkers-1 (multicast)."""
    return {worker_port(r): [reply(r, **fields)] for r in range(nworkers)}


class InaEntries:
    """Entries of the INA tables (ina_endpoint, admission, worker_rewrite, multicast)."""

    def __init__(self, target):
        self.t = target

    def add_ina_endpoint_entry(self, addr: str = SWITCH_IP):
        self.t.table_add("ina_endpoint", {"dst_addr": addr}, "accept_ina")

    def add_admission_entry(self, rank: int, nworkers: int, *, port=None, src_addr=None,
                            src_port=None, job=JOB, epoch=1, slot_base=0, nslots=4,
                            block_size=BS, nlanes=K, mcast_grp=MCAST_GRP, wire_rank=None):
        """Host `rank` admitted as rank `wire_rank` (default: `rank`)."""
        self.t.table_add(
            "admission",
            {"ingress_port": worker_port(rank) if port is None else port,
             "src_addr": src_addr or worker_ip(rank),
             "src_port": worker_udp(rank) if src_port is None else src_port,
             "job": job, "rank": rank if wire_rank is None else wire_rank},
            "admit", {"epoch": epoch, "slot_base": slot_base, "nslots": nslots,
                      "nworkers": nworkers, "block_size": block_size, "nlanes": nlanes,
                      "mcast_grp": mcast_grp})

    def add_worker_rewrite_entry(self, rank: int, wire_rank: int | None = None):
        """Host `rank`'s copy, by the replication id of `wire_rank` (default: `rank`)."""
        self.t.table_add("worker_rewrite", {"rid": rid(rank if wire_rank is None else wire_rank)},
                         "rewrite_for_worker",
                         {"dst_mac": worker_mac(rank), "dst_addr": worker_ip(rank),
                          "dst_port": worker_udp(rank)})

    def setup_job(self, nworkers: int = 2, **adm):
        """A job of `nworkers` ranks on ports 1..n, results multicast to all of them."""
        self.add_ina_endpoint_entry()
        for r in range(nworkers):
            self.add_admission_entry(r, nworkers, **adm)
            self.add_worker_rewrite_entry(r)
        self.t.mcast_group_set(adm.get("mcast_grp", MCAST_GRP),
                               [(worker_port(r), rid(r)) for r in range(nworkers)])


class ForwardingEntries:
    def __init__(self, target):
        self.t = target

    def add_l2_entry(self, mac: str, port: int):
        self.t.table_add("l2", {"dst_mac": mac}, "bridge", {"port": port})

    def add_spray_entry(self, mac: str, group: int, ports: list[int], ways: int | None = None):
        """l2 spray(group, ways) for `mac`, and spray_ports' port for each turn."""
        self.t.table_add("l2", {"dst_mac": mac}, "spray",
                         {"group": group, "ways": len(ports) if ways is None else ways})
        for turn, port in enumerate(ports):
            self.t.table_add("spray_ports", {"group": group, "turn": turn}, "bridge",
                             {"port": port})

    def add_ipv4_route_entry(self, prefix: str, port: int, src_mac: str, dst_mac: str):
        self.t.table_add("ipv4_routes", {"dst_addr": prefix}, "route",
                         {"port": port, "src_mac": src_mac, "dst_mac": dst_mac})


def expect(target, expected: dict[int, list[bytes]], timeout: float = 0.5):
    """Exactly these frames on these ports (in order per port) and nothing anywhere else."""
    got: dict[int, list[bytes]] = {}
    for port, frame in target.received(timeout):
        got.setdefault(port, []).append(frame)
    want = {p: [bytes(f) for f in fs] for p, fs in expected.items() if fs}
    if got != want:
        lines = []
        for p in sorted(set(got) | set(want)):
            g, w = got.get(p, []), want.get(p, [])
            if g != w:
                lines.append(f"port {p}: got {len(g)} frame(s), want {len(w)}")
                for a, b in zip(g, w):
                    if a != b:
                        lines.append(_diff(a, b))
                        break
        raise AssertionError("; ".join(lines))


def expect_nothing(target, timeout: float = 0.3):
    expect(target, {}, timeout)


def _diff(got: bytes, want: bytes) -> str:
    g, w = Ether(got), Ether(want)
    return f"first difference at byte {_first_diff(got, want)}:\n got  {g!r}\n want {w!r}"


def _first_diff(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
