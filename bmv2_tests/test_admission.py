"""Conformance: INA endpoint, header checks (malformed) and admission.

Run just this file: python -m pytest bmv2_tests/test_admission.py
(SPINA_TARGETS=soft, soft-compiled or bmv2 to pick targets; default all three, BMv2 skips if
absent.)
"""
from __future__ import annotations

import pytest
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


def _truncated_header():
    return bytes(Ether(dst=SWITCH_MAC, src=worker_mac(0)) / IP(src=worker_ip(0), dst=SWITCH_IP)
                 / UDP(sport=50000, dport=INA_PORT) / (b"\x01\x01" + b"\0" * 20))


# (case, ingress port, the frame): every one is not admitted, counted at its port only.
UNADMITTED = [
    # the right addresses on another switch port
    ("wrong ingress port", 3, lambda: contrib(0)),
    # the UDP source port and the IPv4 source address are part of the sender's identity
    ("wrong UDP source port", 1, lambda: contrib(0, src_udp=40000)),
    ("wrong source address", 1, lambda: contrib(0, src_ip="10.9.9.9")),
    # a worker cannot claim another worker's rank, or a job it was not admitted to
    ("rank spoof", 1, lambda: contrib(1, src_ip=worker_ip(0), src_udp=50000)),
    ("other job", 1, lambda: contrib(0, job=JOB + 1)),
    # nlanes or block_size other than the job's
    ("other sizes", 1, lambda: contrib(0, nlanes=2, next=[1, 2])),
    # bytes after the UDP length are an Ethernet trailer, not payload: a complete packet with
    # sizes other than the job's is unadmitted, not malformed
    ("trailer after unparsable sizes", 1, lambda: contrib(0, nlanes=K + 1) + b"\0" * 6),
]

# (case, the frame), sent on port 1: every one is malformed, counted per port.
MALFORMED = [
    ("bad version", lambda: contrib(0, version=2)),
    # hosts send contributions only
    ("a RESULT from a host", lambda: contrib(0, msg_type=wire.MSG_RESULT)),
    # the UDP length disagrees with nlanes/present/block_size: claims a block, carries none
    ("length disagreeing with header", lambda: contrib(0, present=0b1)),
    ("present beyond nlanes",
     lambda: contrib(0, nlanes=2, next=[1, 2], present=0b100, data=b"\0" * 4 * BS)),
    # a rank of 32 or more does not fit the bitmap
    ("rank beyond bitmap", lambda: contrib(40, src_ip=worker_ip(0), src_udp=50000)),
    ("UDP payload shorter than the header", _truncated_header),
    # A frame shorter than its UDP length holds no whole datagram: malformed, as
    # wire.header_error sees the datagram. The P4 parser stops early at sizes it cannot hold
    # (nlanes > NLANES, block_size != BLOCK_SIZE) and so sees no parser_error there; InaCheck
    # then compares the UDP length with the frame's real length (it once counted these
    # `port_unadmitted`).
    ("short frame, more lanes than the P4's", lambda: contrib(0, nlanes=K + 1)[:-4]),
    ("short frame, a block size the P4 does not parse",
     lambda: contrib(0, block_size=BS // 2, present=0b1, data=b"\0" * 2 * BS)[:-8]),
    ("short frame, P4 sizes, cut inside the last block",
     lambda: contrib(0, blocks={0: [1] * BS})[:-4]),
]


@pytest.mark.parametrize("port, frame", [c[1:] for c in UNADMITTED],
                         ids=[c[0] for c in UNADMITTED])
def test_unadmitted(target, port, frame):
    """Not the admitted (port, address, UDP port, job, rank) or sizes: dropped, counted
    port_unadmitted at its port, nothing received, nothing malformed."""
    InaEntries(target).setup_job(2)
    target.send(port, frame())
    _unadmitted(target, port)
    assert target.counter("port_malformed", port) == 0


@pytest.mark.parametrize("frame", [c[1] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed(target, frame):
    """A header the switch refuses: dropped, counted port_malformed, never unadmitted."""
    InaEntries(target).setup_job(2)
    target.send(1, frame())
    _malformed(target)
    assert target.counter("job_received", JOB) == 0


def test_slot_outside_job_range_unadmitted(target):
    """Slots outside [slot_base, slot_base + nslots) are not the job's."""
    InaEntries(target).setup_job(2, slot_base=2, nslots=2)
    target.send(1, contrib(0, slot=4))
    _unadmitted(target)
    target.send(1, contrib(0, slot=1))
    expect_nothing(target)
    assert target.counter("port_unadmitted", 1) == 2
