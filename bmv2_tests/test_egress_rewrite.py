"""Conformance: each result copy is rewritten for its worker (MAC, IPv4, UDP port).

Run just this file: python -m pytest bmv2_tests/test_egress_rewrite.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from bmv2_tests.helpers import JOB, MCAST_GRP, InaEntries, contrib, expect, reply, rid, worker_port


def test_copies_rewritten_per_worker_with_valid_checksums(target):
    """Every copy carries its worker's addresses, a valid IPv4 checksum and UDP checksum 0."""
    InaEntries(target).setup_job(3)
    for r in range(3):
        target.send(worker_port(r), contrib(r))
    got = target.received(0.5)
    assert sorted(p for p, _ in got) == [1, 2, 3]
    for port, frame in got:
        pkt = Ether(frame)
        r = port - 1
        assert frame == reply(r, rank=2, bitmap=0b111)
        ip = pkt[IP]
        sent = ip.chksum
        del ip.chksum
        assert IP(bytes(ip))[IP].chksum == sent
        assert pkt[UDP].chksum == 0


def test_replica_without_rewrite_entry_dropped(target):
    """A multicast copy whose replication id has no worker_rewrite entry is dropped."""
    ina = InaEntries(target)
    ina.add_ina_endpoint_entry()
    for r in range(2):
        ina.add_admission_entry(r, 2)
    ina.add_worker_rewrite_entry(0)
    target.mcast_group_set(MCAST_GRP, [(1, rid(0)), (2, rid(1))])
    target.send(1, contrib(0))
    target.send(2, contrib(1))
    expect(target, {1: [reply(0, rank=1, bitmap=3)]})
    assert target.counter("job_results", JOB) == 2
