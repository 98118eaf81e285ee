"""Conformance: INA endpoint, header checks (malformed) and admission.

Run just this file: python -m pytest bmv2_tests/test_admission.py
(SPINA_TARGETS=soft or bmv2 to pick one target; default both, BMv2 skips if absent.)
"""
from __future__ import annotations

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from bmv2_tests.helpers import (
    BS,
    INA_PORT,
    JOB,
    SWITCH_IP,
    SWITCH_MAC,
    InaEntries,
    K,
    contrib,
    expect_nothing,
    worker_ip,
    worker_mac,
)
from spina import wire


def _unadmitted(target, port=1):
    expect_nothing(target)
    assert target.counter("port_unadmitted", port) == 1
    assert target.counter("job_received", JOB) == 0


def _malformed(target, port=1):
    expect_nothing(target)
    assert target.counter("port_malformed", port) == 1
    assert target.counter("port_unadmitted", port) == 0


def test_admitted_contribution_is_received(target):
    """A contribution from the admitted (port, address, UDP port, job, rank) is counted."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: [1] * BS}))
    expect_nothing(target)
    assert target.counter("job_received", JOB) == 1
    assert target.counter("job_aggregated", JOB) == 1


def test_wrong_ingress_port_unadmitted(target):
    """The right addresses on another switch port are not admitted."""
    InaEntries(target).setup_job(2)
    target.send(3, contrib(0))
    _unadmitted(target, 3)


def test_wrong_udp_source_port_unadmitted(target):
    """The UDP source port is part of the sender's identity."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, src_udp=40000))
    _unadmitted(target)


def test_wrong_source_address_unadmitted(target):
    """The IPv4 source address is part of the sender's identity."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, src_ip="10.9.9.9"))
    _unadmitted(target)


def test_rank_spoof_unadmitted(target):
    """A worker cannot claim another worker's rank."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(1, src_ip=worker_ip(0), src_udp=50000))
    _unadmitted(target)


def test_other_job_unadmitted(target):
    """A worker cannot contribute to a job it was not admitted to."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, job=JOB + 1))
    _unadmitted(target)


def test_slot_outside_job_range_unadmitted(target):
    """Slots outside [slot_base, slot_base + nslots) are not the job's."""
    InaEntries(target).setup_job(2, slot_base=2, nslots=2)
    target.send(1, contrib(0, slot=4))
    _unadmitted(target)
    target.send(1, contrib(0, slot=1))
    expect_nothing(target)
    assert target.counter("port_unadmitted", 1) == 2


def test_sizes_other_than_the_jobs_unadmitted(target):
    """nlanes or block_size other than the job's are not admitted."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, nlanes=2, next=[1, 2]))
    _unadmitted(target)


def test_bad_version_malformed(target):
    """An unknown header version is malformed, counted per port."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, version=2))
    _malformed(target)


def test_non_contribution_from_host_malformed(target):
    """Hosts send contributions only: a RESULT arriving at the switch is malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, msg_type=wire.MSG_RESULT))
    _malformed(target)


def test_length_disagreeing_with_header_malformed(target):
    """A UDP payload whose length disagrees with nlanes/present/block_size is malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, present=0b1))  # claims a block, carries none
    _malformed(target)


def test_present_beyond_nlanes_malformed(target):
    """present bits beyond nlanes are malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, nlanes=2, next=[1, 2], present=0b100, data=b"\0" * 4 * BS))
    _malformed(target)


def test_rank_beyond_bitmap_malformed(target):
    """A rank of 32 or more does not fit the bitmap: malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(40, src_ip=worker_ip(0), src_udp=50000))
    _malformed(target)


def test_truncated_header_malformed(target):
    """A UDP payload shorter than the INA header is malformed."""
    InaEntries(target).setup_job(2)
    frame = bytes(Ether(dst=SWITCH_MAC, src=worker_mac(0)) / IP(src=worker_ip(0), dst=SWITCH_IP)
                  / UDP(sport=50000, dport=INA_PORT) / (b"\x01\x01" + b"\0" * 20))
    target.send(1, frame)
    _malformed(target)


# A frame shorter than its UDP length holds no whole datagram: malformed, as wire.header_error
# sees the datagram. The P4 parser stops early at sizes it cannot hold (nlanes > NLANES,
# block_size != BLOCK_SIZE) and so sees no parser_error there; InaCheck then compares the UDP
# length with the frame's real length (it once counted these `port_unadmitted`).
def test_short_frame_with_more_lanes_than_p4_malformed(target):
    """nlanes above the P4's NLANES and a frame 4 bytes short of its UDP length: malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, nlanes=K + 1)[:-4])
    _malformed(target)


def test_short_frame_with_other_block_size_malformed(target):
    """A block size the P4 does not parse and a frame cut inside the block: malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, block_size=BS // 2, present=0b1, data=b"\0" * 2 * BS)[:-8])
    _malformed(target)


def test_short_frame_with_p4_sizes_malformed(target):
    """P4 sizes and a frame cut inside the last block (the parser runs out): malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, blocks={0: [1] * BS})[:-4])
    _malformed(target)


def test_trailer_after_unparsable_sizes_unadmitted(target):
    """Bytes after the UDP length are an Ethernet trailer, not payload: a complete packet with
    sizes other than the job's is unadmitted, not malformed."""
    InaEntries(target).setup_job(2)
    target.send(1, contrib(0, nlanes=K + 1) + b"\0" * 6)
    _unadmitted(target)
    assert target.counter("port_malformed", 1) == 0
