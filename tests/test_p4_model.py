"""The fast software pipeline equals a plain transliteration of the P4 program's INA path.

Run just this file: python -m pytest tests/test_p4_model.py

tests/p4model.py follows p4src/v1model/{ina_check,admission,aggregator}.p4 statement
by statement; here random packet sequences (duplicates, stale and new rounds, sparse lanes,
wrong epochs, unadmitted and malformed packets, all-gather packets) go through both, and
every emitted packet, counter and register cell must agree after every packet; so do the
leaf and spine roles (softswitch/fabric.py against fabric.p4's controls and the
Aggregator's spine rules). Whole frames (sizes the P4 parser stops at, frames cut short of
their UDP length, Ethernet trailers) go through the model's parser and
softswitch.dataplane.Dataplane, which must count them alike.
"""
from __future__ import annotations

import socket
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from softswitch.dataplane import Dataplane
from softswitch.egress import scatter_owners, scatter_strip
from softswitch.fabric import TO_GROUP, TO_SENDER, TO_UPSTREAM, FabricRoles
from softswitch.pipeline import Pipeline
from spina import rows, spec, wire
from spina.config import JobConfig, WorkerAddr
from tests.p4model import INA_OFF, M32, P4Model

K, BS, SLOTS, JOB, PORT = 4, 4, 4, 3, 1


def src(rank):
    return (f"10.0.0.{rank + 1}", 5000 + rank)


def packet(draw, nworkers, k=K, bs=BS, gather=True):
    """A contribution (now and then, if `gather`, an all-gather packet, a chunk or a request)
    of `k` lanes of `bs` elements from a random rank (nworkers: not admitted), sometimes of
    another version, epoch or round, or truncated."""
    rank = draw(st.integers(0, nworkers))          # nworkers: not admitted
    present = draw(st.integers(0, (1 << k) - 1))
    npresent = bin(present).count("1")
    h = wire.Header(
        version=draw(st.sampled_from([1] * 15 + [2])),
        msg_type=draw(st.sampled_from([wire.MSG_CONTRIB] * 6 + [wire.MSG_GATHER] * gather)),
        bitmap=draw(st.sampled_from([0, 0, 0b10, 0b11, 0b101])),  # reduce-scatter owners
        flags=draw(st.sampled_from([0, wire.FLAG_LAST, wire.FLAG_RESEND, wire.FLAG_LOSS_TOLERANT,
                                    wire.FLAG_LAST | wire.FLAG_LOSS_TOLERANT,
                                    wire.FLAG_RESEND | wire.FLAG_PARTIAL])),
        job=JOB, epoch=draw(st.sampled_from([1] * 9 + [2])), slot=draw(st.integers(0, 2)),
        rank=rank, nlanes=k, round=draw(st.integers(1, 4)),
        length=draw(st.sampled_from([9, 9, 10])),
        block_size=bs, exponent=draw(st.integers(-40, 40)), present=present,
        nonfinite=draw(st.integers(0, (1 << k) - 1)) & present)
    nxt = draw(st.lists(st.sampled_from([0, 1, 5, 9, wire.END]), min_size=k, max_size=k))
    data = draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=npresent * bs,
                         max_size=npresent * bs))
    pkt = wire.pack(h, nxt, np.array(data, np.int32).reshape(npresent, bs) if npresent else None)
    if draw(st.integers(0, 30)) == 0:
        pkt = pkt[:-4]  # truncated: malformed
    return rank, pkt


@st.composite
def scenario(draw):
    nworkers = draw(st.integers(1, 3))
    return nworkers, [packet(draw, nworkers) for _ in range(draw(st.integers(1, 40)))]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_pipeline_equals_p4_transliteration(sc):
    """Same packets out, same counters, same register cells, after every packet; and every
    copy of a reduce-scatter's result stripped for the same ranks (ScatterStrip)."""
    nworkers, packets = sc
    job = JobConfig(job=JOB, workers=tuple(WorkerAddr(r, *src(r)) for r in range(nworkers)),
                    slot_base=0, nslots=2, block_size=BS, nlanes=K)
    fast = Pipeline(pool_slots=SLOTS, slot_capacity=K * BS)
    fast.add_job(job, {r: (PORT, src(r)) for r in range(nworkers)}, mcast_grp=1)
    model = P4Model(SLOTS, K, BS)
    for r in range(nworkers):
        model.admission[(PORT, src(r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=2, nworkers=nworkers, block_size=BS, nlanes=K)
    for rank, pkt in packets:
        got = [(bytes(e.data), e.multicast) for e in fast.process(pkt, PORT, src(rank))]
        assert got == model.process(pkt, PORT, src(rank))
        _same_state(fast, model)
        for data, multicast in got:  # each copy through ScatterStrip, as egress sends it
            owners = scatter_owners(pkt) if data[1] == wire.MSG_RESULT else 0
            for r in range(nworkers) if multicast else (rank,):
                copy = data if not owners or owners >> r & 1 else scatter_strip(data)
                assert copy == model.scatter_strip(pkt, data, spec.rid(JOB, r) if multicast
                                                   else 0)


def _same_state(fast, model):
    for (name, index), value in model.counters.items():
        assert int(fast.counters[name][index]) == value, name
    assert sum(int(c.sum()) for c in fast.counters.values()) == sum(model.counters.values())
    reg = fast.registers
    for name, cells in model.reg.items():
        width = {"slot_exponent": 0xFFFF}.get(name, (1 << 64) - 1)
        assert [int(x) & width for x in reg[name]] == cells, name
    for lane in range(K):
        assert [int(x) for x in reg["slot_next"][:, lane]] == model.next[lane]
        for e in range(BS):
            assert [int(x) & M32 for x in reg["slot_values"][:, lane * BS + e]] == \
                model.values[lane][e]


SWITCH_IP = "10.0.0.100"


def frame(rank: int, payload: bytes, udp_len: int) -> bytes:
    """Ethernet / IPv4 (ihl 5) / UDP to the INA port from worker `rank`, UDP length `udp_len`."""
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0, 64, spec.IP_PROTO_UDP, 0,
                     socket.inet_aton(src(rank)[0]), socket.inet_aton(SWITCH_IP))
    udp = struct.pack(">HHHH", src(rank)[1], spec.INA_UDP_PORT, udp_len, 0)
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + udp + payload


@st.composite
def frames(draw, k=K, bs=BS):
    """Contributions of admitted ranks with P4 sizes (`k` lanes of `bs`) or sizes the P4 parser
    stops at (more lanes, another block size), sent whole, cut short, or with an Ethernet
    trailer."""
    out = []
    for _ in range(draw(st.integers(1, 12))):
        rank = draw(st.integers(0, 1))
        nlanes = draw(st.sampled_from([k] * 3 + [1, k + 1, k + 3]))
        block_size = draw(st.sampled_from([bs] * 3 + [bs // 2, 2 * bs]))
        present = draw(st.integers(0, (1 << nlanes) - 1))
        npresent = bin(present).count("1")
        h = wire.Header(msg_type=wire.MSG_CONTRIB, job=JOB, epoch=1, slot=draw(st.integers(0, 1)),
                        rank=rank, nlanes=nlanes, round=draw(st.integers(1, 2)),
                        block_size=block_size, present=present)
        data = np.arange(npresent * block_size, dtype=np.int32).reshape(npresent, block_size)
        pkt = wire.pack(h, [wire.END] * nlanes, data if npresent else None)
        whole = frame(rank, pkt, 8 + len(pkt))
        change = draw(st.sampled_from(["whole", "whole", "cut", "trailer"]))
        if change == "cut":
            whole = whole[:-draw(st.integers(1, len(pkt)))]
        elif change == "trailer":
            whole += bytes(draw(st.integers(1, 18)))
        out.append((rank, whole))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames())
def test_frames_are_judged_as_the_p4_parser_judges_them(sent):
    """Whole frames: malformed, unadmitted and aggregated alike, counters and registers after
    every frame (a frame cut short of its UDP length is malformed whatever its sizes)."""
    job = JobConfig(job=JOB, workers=(WorkerAddr(0, *src(0)), WorkerAddr(1, *src(1))),
                    slot_base=0, nslots=2, block_size=BS, nlanes=K)
    dp = Dataplane(pool_slots=SLOTS, slot_capacity=(K + 3) * 2 * BS)
    dp.ina_endpoint.add(socket.inet_aton(SWITCH_IP))
    dp.pipeline.add_job(job, {r: (PORT, src(r)) for r in range(2)}, mcast_grp=1)
    model = P4Model(SLOTS, K, BS)
    for r in range(2):
        model.admission[(PORT, src(r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=2, nworkers=2, block_size=BS, nlanes=K)
    for _rank, f in sent:
        got = [(out[INA_OFF:], False) for _, out in dp.process(f, PORT)]
        want = [(pkt, multicast) for pkt, multicast in model.process_frame(f, PORT)
                if not multicast]  # no multicast group configured: results go nowhere
        assert got == want
        _same_state(dp.pipeline, model)


# ---------------------------------------------------------------- leaf and spine roles
SPINE_SRC = ("10.0.2.1", spec.INA_UDP_PORT)
KINDS = {TO_GROUP: True, TO_SENDER: False, TO_UPSTREAM: "up"}
FLAGS = [0, wire.FLAG_LAST, wire.FLAG_RESEND, wire.FLAG_LOSS_TOLERANT, wire.FLAG_MISMATCH,
         wire.FLAG_PARTIAL | wire.FLAG_LAST, wire.FLAG_RESEND | wire.FLAG_PARTIAL,
         wire.FLAG_MISMATCH | wire.FLAG_PARTIAL | wire.FLAG_LOSS_TOLERANT,
         wire.FLAG_RESEND | wire.FLAG_REPLAY,
         wire.FLAG_RESEND | wire.FLAG_REPLAY | wire.FLAG_PARTIAL | wire.FLAG_LAST]


def role_packet(draw, msg_type, rank, nworkers_bits):
    present = draw(st.integers(0, (1 << K) - 1))
    npresent = bin(present).count("1")
    h = wire.Header(
        msg_type=msg_type, flags=draw(st.sampled_from(FLAGS)), job=JOB,
        epoch=draw(st.sampled_from([1] * 9 + [2])), slot=draw(st.sampled_from([0, 1, 1, 2])),
        rank=rank, nlanes=K, round=draw(st.integers(1, 3)),
        length=draw(st.sampled_from([9, 9, 10])), block_size=BS,
        exponent=draw(st.integers(-40, 40)), present=present,
        bitmap=draw(st.integers(0, (1 << nworkers_bits) - 1)),
        nonfinite=draw(st.integers(0, (1 << K) - 1)) & present)
    nxt = draw(st.lists(st.sampled_from([0, 1, 5, 9, wire.END]), min_size=K, max_size=K))
    data = draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=npresent * BS,
                         max_size=npresent * BS))
    return wire.pack(h, nxt, np.array(data, np.int32).reshape(npresent, BS) if npresent else None)


@st.composite
def leaf_scenario(draw):
    """A leaf of rack `rack` of a job with racks of `sizes` workers: its workers' packets
    (and others'), and the spine's results and statuses (and a stranger's)."""
    sizes = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=3)))
    rack = draw(st.integers(0, len(sizes) - 1))
    first = sum(sizes[:rack])
    out = []
    for _ in range(draw(st.integers(1, 50))):
        if draw(st.integers(0, 3)) == 0:
            who = draw(st.sampled_from([SPINE_SRC] * 5 + [("10.0.2.9", spec.INA_UDP_PORT)]))
            mt = draw(st.sampled_from([wire.MSG_RESULT] * 6 + [wire.MSG_STATUS] * 2
                                      + [wire.MSG_GATHER]))
            out.append((who, role_packet(draw, mt, draw(st.integers(0, len(sizes) - 1)),
                                         len(sizes) + 1)))
        else:
            # The rack's workers send local ranks 0..size-1 (size: not admitted).
            rank = draw(st.integers(0, sizes[rack]))
            mt = draw(st.sampled_from([wire.MSG_CONTRIB] * 8 + [wire.MSG_GATHER]))
            out.append((src(first + rank), role_packet(draw, mt, rank, 0)))
    return sizes, rack, out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(leaf_scenario())
def test_leaf_role_equals_p4_transliteration(sc):
    """softswitch.fabric's leaf equals the P4's (fabric.p4's ToSpine and FromSpine): packets out and
    where they go, counters and registers after every packet."""
    _leaf_agrees(*sc)


def test_leaf_replay_equals_p4_transliteration():
    """The replay (random scenarios rarely reach it): rack 1 of (2, 2) completes slot 1 round
    2, stores the spine's result, then meets statuses of rack 0 that lack it (replayed: twice,
    both go up), name it (dropped), and its own status (a duplicate)."""
    rng = np.random.default_rng(5)

    def pkt(msg_type, rank, flags=0, bitmap=0, present=0b11):
        h = wire.Header(msg_type=msg_type, flags=flags, job=JOB, epoch=1, slot=1, rank=rank,
                        nlanes=K, round=2, length=9, block_size=BS, exponent=3,
                        present=present, bitmap=bitmap)
        n = bin(present).count("1")
        data = rng.integers(-2**31, 2**31, (n, BS), dtype=np.int64).astype(np.int32)
        return wire.pack(h, [1, 5, 9, wire.END], data if n else None)

    # Rack 1's workers (job ranks 2, 3) send their local ranks 0, 1.
    packets = [(src(2), pkt(wire.MSG_CONTRIB, 0)), (src(3), pkt(wire.MSG_CONTRIB, 1, present=0b10)),
               (SPINE_SRC, pkt(wire.MSG_RESULT, 1, wire.FLAG_LAST | wire.FLAG_PARTIAL, 0b11))]
    for bitmap in (0b01, 0b00, 0b10):
        packets.append((SPINE_SRC, pkt(wire.MSG_STATUS, 0, wire.FLAG_RESEND, bitmap, 0)))
    packets.append((SPINE_SRC, pkt(wire.MSG_STATUS, 1, wire.FLAG_RESEND, 0b01, 0)))
    ups = _leaf_agrees((2, 2), 1, packets)
    assert [(len(p), wire.unpack_header(p).flags) for p in ups] == [
        (len(packets[2][1]), wire.FLAG_LAST | wire.FLAG_PARTIAL | wire.FLAG_RESEND
         | wire.FLAG_REPLAY)] * 2


def _leaf(job: JobConfig, rack: int, sources) -> FabricRoles:
    """A software switch holding the rows the plan writes for rack `rack` of `job` at its leaf
    (spina.rows.leaf_job): the rack's workers from `sources` on PORT, both slots' spine
    SPINE_SRC on PORT."""
    dp = Dataplane(pool_slots=SLOTS, slot_capacity=K * BS)
    dp.apply(rows.leaf_job(job, rack, [rows.Sender(PORT, *a) for a in sources],
                           [rows.Upstream(0, 2, PORT, SPINE_SRC[0])]))
    return dp.roles


def _leaf_agrees(sizes, rack, packets) -> list[bytes]:
    """Run `packets` through the software leaf and the P4 transliteration: equal packets,
    counters, registers; returns what went up after the rack's own partial."""
    n = sum(sizes)
    job = JobConfig(job=JOB, workers=tuple(WorkerAddr(r, *src(r)) for r in range(n)),
                    slot_base=0, nslots=2, block_size=BS, nlanes=K, racks=sizes)
    first = sum(sizes[:rack])
    local = range(sizes[rack])
    leaf = _leaf(job, rack, [src(first + r) for r in local])
    model = P4Model(SLOTS, K, BS)
    for r in local:
        model.admission[(PORT, src(first + r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=2, nworkers=sizes[rack], block_size=BS, nlanes=K)
    model.job_level[JOB] = dict(leaf=True, rack=rack, nlocal=sizes[rack], epoch=1)
    for slot in (0, 1):
        model.leaf_upstream[(JOB, slot)] = (PORT, SPINE_SRC)
    out = bytearray(leaf.pipeline.max_packet_len)
    ups = []
    for who, pkt in packets:
        n_out, to, _ = leaf.process_into(pkt, PORT, who, out)
        got = [(bytes(out[:n_out]), KINDS[to])] if n_out else []
        assert got == model.process(pkt, PORT, who)
        _same_state(leaf.pipeline, model)
        if to == TO_UPSTREAM and who == SPINE_SRC:
            ups.append(bytes(out[:n_out]))
    return ups


def test_a_full_rack_of_32_equals_the_p4_transliteration():
    """A leaf of 32 workers (local ranks 0..31, the largest rack): the round goes up with all
    32 bits, the spine's status comes down naming every local rank (0xFFFFFFFF: P4 computes
    1 << 32 in 64 bits), its result with the rack's bit names the partial's 32 ranks, the same
    packets and state in the software leaf and the P4 transliteration."""
    sizes = (32, 1)
    job = JobConfig(job=JOB, workers=tuple(WorkerAddr(r, *src(r)) for r in range(33)),
                    slot_base=0, nslots=2, block_size=BS, nlanes=K, racks=sizes)
    leaf = _leaf(job, 0, [src(r) for r in range(32)])
    model = P4Model(SLOTS, K, BS)
    for r in range(32):
        model.admission[(PORT, src(r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=2, nworkers=32, block_size=BS, nlanes=K)
    model.job_level[JOB] = dict(leaf=True, rack=0, nlocal=32, epoch=1)
    for slot in (0, 1):
        model.leaf_upstream[(JOB, slot)] = (PORT, SPINE_SRC)

    def packet(msg_type, rank, bitmap=0):
        h = wire.Header(msg_type=msg_type, job=JOB, epoch=1, slot=1, rank=rank, nlanes=K,
                        round=1, length=9, block_size=BS, present=1, bitmap=bitmap)
        return wire.pack(h, [1] * K, np.full((1, BS), rank + 1, np.int32))

    out = bytearray(leaf.pipeline.max_packet_len)
    sent = [(src(r), packet(wire.MSG_CONTRIB, r)) for r in range(32)]
    sent += [(SPINE_SRC, packet(wire.MSG_STATUS, 0, bitmap=0b01)),
             (SPINE_SRC, packet(wire.MSG_RESULT, 1, bitmap=0b11))]
    got_bitmaps = []
    for who, pkt in sent:
        n_out, to, _ = leaf.process_into(pkt, PORT, who, out)
        got = [(bytes(out[:n_out]), KINDS[to])] if n_out else []
        assert got == model.process(pkt, PORT, who)
        _same_state(leaf.pipeline, model)
        if got:
            got_bitmaps.append((got[0][1], wire.unpack_header(got[0][0]).bitmap))
    assert got_bitmaps == [("up", M32), (True, M32), (True, M32)]


@st.composite
def spine_scenario(draw):
    nleaves = draw(st.integers(1, 3))
    ranks = [draw(st.integers(0, nleaves)) for _ in range(draw(st.integers(1, 40)))]
    types = [draw(st.sampled_from([wire.MSG_CONTRIB] * 8 + [wire.MSG_GATHER])) for _ in ranks]
    return nleaves, [(r, role_packet(draw, t, r, 4)) for r, t in zip(ranks, types)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spine_scenario())
def test_spine_role_equals_p4_transliteration(sc):
    """A spine job (job_level as_spine): partials' MISMATCH and PARTIAL carried into rounds."""
    nleaves, packets = sc
    job = JobConfig(job=JOB, workers=tuple(WorkerAddr(r, *src(r)) for r in range(nleaves)),
                    slot_base=0, nslots=2, block_size=BS, nlanes=K)
    roles = FabricRoles(Pipeline(pool_slots=SLOTS, slot_capacity=K * BS))
    roles.pipeline.add_job(job, {r: (PORT, src(r)) for r in range(nleaves)}, mcast_grp=1)
    roles.spines.add(JOB)
    model = P4Model(SLOTS, K, BS)
    for r in range(nleaves):
        model.admission[(PORT, src(r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=2, nworkers=nleaves, block_size=BS, nlanes=K)
    model.job_level[JOB] = dict(spine=True)
    out = bytearray(roles.pipeline.max_packet_len)
    for rank, pkt in packets:
        n_out, to, _ = roles.process_into(pkt, PORT, src(rank), out)
        got = [(bytes(out[:n_out]), KINDS[to])] if n_out else []
        assert got == model.process(pkt, PORT, src(rank))
        _same_state(roles.pipeline, model)
