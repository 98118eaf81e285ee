"""The Tofino 1 program pass by pass, byte for byte (tests/tna_pass.py), against the passes'
composition in tests/tna_model.py.

Run just this file: python -m pytest tests/test_tna_testgen.py

tests/tna_pass.py runs one frame through one pass of the pipe (parsers, controls, deparsers,
the bridged and harvest headers, block_e in front): the grain of P4Testgen's tests. Chained
through the recirculation port, its passes must give what TnaModel.process_frame gives for the
whole packet: the same UDP payloads out (and where), counters and register cells after every
frame.
"""
from __future__ import annotations

import socket

from hypothesis import HealthCheck, given, settings

from spina import wire
from tests.test_p4_model import JOB, PORT, SWITCH_IP, frame, src
from tests.test_tna_model import scenario
from tests.tna_model import INA_OFF, TnaModel
from tests.tna_pass import IPV4, TnaPipe, ipv4_checksum, unpack

MCAST_GRP = 7


def _admitted(nworkers: int) -> tuple[TnaPipe, TnaModel]:
    """The job of tests/test_tna_model.py admitted in a pipe and in a model of its own, with a
    multicast group whose replicas go back to the ranks' ports (replication id rank + 1)."""
    pipe, model = TnaPipe(), TnaModel()
    pipe.ina_endpoint.add(int.from_bytes(socket.inet_aton(SWITCH_IP), "big"))
    for r in range(nworkers):
        entry = dict(epoch=1, slot_base=0, nslots=2, nworkers=nworkers, block_size=64, nlanes=1,
                     mcast_grp=MCAST_GRP)
        pipe.model.admission[(PORT, src(r), JOB, r)] = entry
        model.admission[(PORT, src(r), JOB, r)] = entry
        ip = int.from_bytes(socket.inet_aton(src(r)[0]), "big")
        pipe.worker_rewrite[r + 1] = (0x020000000000 + r, ip, src(r)[1])
    return pipe, model


def _leaving(pipe: TnaPipe, port: int, f: bytes, nworkers: int) -> list[tuple[bytes, bool]]:
    """What leaves the pipe for frame `f` from `port`, as TnaModel.process_frame says it:
    (UDP payload, multicast); every replica of a multicast result goes through egress."""
    out = []
    for o in pipe.forward(port, f):
        frames = ([pipe.egress_pass(o.frame, PORT, egress_rid=r + 1).frame
                   for r in range(nworkers)] if o.mcast_grp else [o.frame])
        for fr in frames:
            ip = unpack(IPV4, fr[14:34])
            assert ip["hdr_checksum"] == ipv4_checksum(ip)
        udp_len = int.from_bytes(frames[0][INA_OFF - 4:INA_OFF - 2], "big")
        payloads = {fr[INA_OFF:INA_OFF + udp_len - 8] for fr in frames}
        assert len(payloads) == 1  # replicas differ in their addresses only
        out.append((payloads.pop(), bool(o.mcast_grp)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_the_passes_compose_to_the_model(sc):
    """Random contributions (tests/test_tna_model.py's scenarios) as frames: the chained passes
    send what the model sends, and leave the same counters and register cells."""
    nworkers, packets = sc
    pipe, model = _admitted(nworkers)
    for rank, pkt in packets:
        f = frame(rank, pkt, 8 + len(pkt))
        want = model.process_frame(f, PORT)
        assert _leaving(pipe, PORT, f, nworkers) == want
        assert pipe.model.counters == model.counters
        assert pipe.model.reg == model.reg


def test_a_reply_goes_round_twice_with_its_block_in_front():
    """A one-worker round: the first pass leaves towards the recirculation port with the
    harvest header and block_e (the egress pairs' sums) in front, the second with the high
    halves read, the third sends the result to the job's group."""
    import numpy as np
    pipe, _ = _admitted(1)
    data = np.arange(64, dtype=np.int32).reshape(1, 64) + 1000
    pkt = wire.pack(wire.Header(msg_type=wire.MSG_CONTRIB, job=JOB, epoch=1, slot=1, rank=0,
                                nlanes=1, round=3, length=5, block_size=64, present=1,
                                flags=wire.FLAG_LAST), [9], data)
    first = pipe.run(PORT, frame(0, pkt, 8 + len(pkt)))
    assert first.port == 68
    assert first.frame[:6] == bytes([0, 1, 0, PORT, 0, MCAST_GRP])  # harvest: block, port, grp
    assert first.frame[6:6 + 120] == data[0, :30].astype(">i4").tobytes()
    second = pipe.run(68, first.frame)
    assert second.port == 68 and second.frame[:2] == bytes([1, 1])  # last, block
    third = pipe.run(68, second.frame)
    assert (third.port, third.mcast_grp) == (None, MCAST_GRP)
