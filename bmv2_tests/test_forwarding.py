"""Conformance: ordinary forwarding (l2 exact, ipv4_routes LPM) for what is not aggregated,
and per-packet spraying (l2 spray, spray_ports, register spray_turn).

Run just this file: python -m pytest bmv2_tests/test_forwarding.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from bmv2_tests.helpers import (
    JOB,
    ForwardingEntries,
    InaEntries,
    contrib,
    expect,
    expect_nothing,
    worker_mac,
)

ROUTER = "02:00:00:00:00:fe"
PAYLOAD = b"not an aggregation packet"


def udp_frame(dst_mac, dst_ip, ttl=64, payload=PAYLOAD):
    return bytes(Ether(dst=dst_mac, src=worker_mac(0)) / IP(src="10.0.0.1", dst=dst_ip, ttl=ttl)
                 / UDP(sport=1234, dport=5678) / payload)


def numbered(n: int, dst_mac: str = "02:00:00:00:02:01") -> list[bytes]:
    """`n` frames of one UDP flow to `dst_mac`, told apart by their payload."""
    return [udp_frame(dst_mac, "10.0.1.1", payload=b"packet %03d" % i) for i in range(n)]


def test_l2_bridges_by_destination_mac(target):
    """A frame whose destination MAC has an l2 entry leaves on that port, unchanged."""
    ForwardingEntries(target).add_l2_entry(worker_mac(2), 3)
    f = udp_frame(worker_mac(2), "10.0.0.3")
    target.send(1, f)
    expect(target, {3: [f]})


def test_l2_bridges_non_ip(target):
    """Non-IPv4 frames (ARP) are bridged by the l2 table too."""
    ForwardingEntries(target).add_l2_entry(worker_mac(1), 2)
    f = bytes(Ether(dst=worker_mac(1), src=worker_mac(0)) / ARP(psrc="10.0.0.1", pdst="10.0.0.2"))
    target.send(1, f)
    expect(target, {2: [f]})


def test_ipv4_longest_prefix_routes(target):
    """On an l2 miss the longest matching prefix routes: new MACs, TTL - 1, new checksum."""
    fwd = ForwardingEntries(target)
    fwd.add_ipv4_route_entry("10.1.0.0/16", 2, ROUTER, worker_mac(1))
    fwd.add_ipv4_route_entry("10.1.2.0/24", 4, ROUTER, worker_mac(3))
    target.send(1, udp_frame(ROUTER, "10.1.2.3"))
    target.send(1, udp_frame(ROUTER, "10.1.9.9"))
    want4 = Ether(udp_frame(ROUTER, "10.1.2.3", ttl=63))
    want4.src, want4.dst = ROUTER, worker_mac(3)
    want4[IP].chksum = None
    want2 = Ether(udp_frame(ROUTER, "10.1.9.9", ttl=63))
    want2.src, want2.dst = ROUTER, worker_mac(1)
    want2[IP].chksum = None
    expect(target, {4: [bytes(want4)], 2: [bytes(want2)]})


def test_unknown_destination_dropped(target):
    """No l2 entry and no route: dropped."""
    target.send(1, udp_frame(ROUTER, "192.168.1.1"))
    expect_nothing(target)


def test_ina_for_another_switch_is_forwarded(target):
    """An INA packet not addressed to this switch's endpoint is forwarded, not aggregated."""
    InaEntries(target).setup_job(2)
    ForwardingEntries(target).add_l2_entry("02:00:00:00:00:64", 4)
    f = contrib(0, dst_ip="10.0.0.200")
    target.send(1, f)
    expect(target, {4: [f]})
    assert target.counter("job_received", JOB) == 0


def test_spray_round_robin_over_group_ports(target):
    """Frames to a sprayed MAC leave by the group's ports in turn: 0, 1, 2, 0, ... (7 frames
    over 3 ports: 3, 2, 2), each unchanged; spray_turn holds the next turn."""
    ForwardingEntries(target).add_spray_entry("02:00:00:00:02:01", group=5, ports=[2, 3, 4])
    frames = numbered(7)
    for f in frames:
        target.send(1, f)
    expect(target, {2: frames[0::3], 3: frames[1::3], 4: frames[2::3]})
    assert target.register("spray_turn", 5) == 7 % 3


def test_spray_groups_take_turns_independently(target):
    """Two MACs in one group share its turn; a second group has its own."""
    fwd = ForwardingEntries(target)
    fwd.add_spray_entry("02:00:00:00:02:01", group=1, ports=[2, 3])
    target.table_add("l2", {"dst_mac": "02:00:00:00:02:02"}, "spray", {"group": 1, "ways": 2})
    fwd.add_spray_entry("02:00:00:00:02:03", group=2, ports=[4, 3, 2])
    a, b, c = (numbered(2, mac) for mac in ("02:00:00:00:02:01", "02:00:00:00:02:02",
                                            "02:00:00:00:02:03"))
    for f in (a[0], b[0], c[0], a[1], c[1], b[1]):
        target.send(1, f)
    # group 1: a0 turn 0 (port 2), b0 turn 1 (3), a1 turn 0 (2), b1 turn 1 (3);
    # group 2: c0 turn 0 (port 4), c1 turn 1 (3).
    expect(target, {2: [a[0], a[1]], 3: [b[0], c[1], b[1]], 4: [c[0]]})
    assert (target.register("spray_turn", 1), target.register("spray_turn", 2)) == (0, 2)


def test_spray_group_shrunk_restarts_at_turn_zero(target):
    """A turn at or beyond the group's ways (the entry changed to fewer ports) counts as 0."""
    mac = "02:00:00:00:02:01"
    fwd = ForwardingEntries(target)
    fwd.add_spray_entry(mac, group=3, ports=[2, 3, 4])
    frames = numbered(4)
    target.send(1, frames[0])
    target.send(1, frames[1])
    expect(target, {2: [frames[0]], 3: [frames[1]]})
    assert target.register("spray_turn", 3) == 2
    target.table_delete("l2", {"dst_mac": mac})
    target.table_add("l2", {"dst_mac": mac}, "spray", {"group": 3, "ways": 2})
    target.send(1, frames[2])  # turn 2 >= ways 2: turn 0
    target.send(1, frames[3])
    expect(target, {2: [frames[2]], 3: [frames[3]]})
    assert target.register("spray_turn", 3) == 0


def test_spray_turn_without_port_drops(target):
    """A turn with no spray_ports entry drops its frame (spray_ports' default); the turn
    still advances."""
    ForwardingEntries(target).add_spray_entry("02:00:00:00:02:01", group=9, ports=[4], ways=2)
    frames = numbered(3)
    for f in frames:
        target.send(1, f)
    expect(target, {4: [frames[0], frames[2]]})
    assert target.register("spray_turn", 9) == 1


def test_spray_leaves_aggregation_alone(target):
    """INA packets to this switch are aggregated as before even when its MAC is sprayed: the
    result is multicast to the workers and the spray group's turn never moves."""
    from bmv2_tests.helpers import SWITCH_MAC, reply, worker_port
    InaEntries(target).setup_job(2)
    ForwardingEntries(target).add_spray_entry(SWITCH_MAC, group=4, ports=[3, 4])
    target.send(1, contrib(0))
    target.send(2, contrib(1))
    expect(target, {worker_port(r): [reply(r, rank=1, bitmap=0b11)] for r in range(2)})
    assert target.counter("job_aggregated", JOB) == 2
    assert target.register("spray_turn", 4) == 0


def test_ina_for_another_switch_is_sprayed(target):
    """An INA packet passing through (not to this switch's endpoint) is ordinary traffic: a
    sprayed destination MAC sprays it too, unchanged and not aggregated."""
    InaEntries(target).setup_job(2)
    ForwardingEntries(target).add_spray_entry("02:00:00:00:00:65", group=0, ports=[3, 4])
    other_switch = bytes.fromhex("020000000065")
    frames = [other_switch + contrib(0, round=r, dst_ip="10.0.0.200")[6:] for r in (1, 2, 3)]
    for f in frames:
        target.send(1, f)
    expect(target, {3: [frames[0], frames[2]], 4: [frames[1]]})
    assert target.counter("job_received", JOB) == 0
