"""Conformance: ordinary forwarding (l2 exact, ipv4_routes LPM) for what is not aggregated.

Run just this file: python -m pytest bmv2_tests/test_forwarding.py
(SPINA_TARGETS=soft or bmv2 to pick one target; default both, BMv2 skips if absent.)
"""
from __future__ import annotations

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from bmv2_tests.helpers import (JOB, ForwardingEntries, InaEntries, contrib, expect,
                                expect_nothing, worker_mac)

ROUTER = "02:00:00:00:00:fe"
PAYLOAD = b"not an aggregation packet"


def udp_frame(dst_mac, dst_ip, ttl=64):
    return bytes(Ether(dst=dst_mac, src=worker_mac(0)) / IP(src="10.0.0.1", dst=dst_ip, ttl=ttl)
                 / UDP(sport=1234, dport=5678) / PAYLOAD)


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
