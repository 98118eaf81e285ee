"""The Tofino 1 program's per-packet decisions equal the software switch's at the TNA sizes.

Run just this file: python -m pytest tests/test_tna_model.py

tests/tna_model.py transliterates tofino/include/{admission,aggregator,decide,priority}.p4
RegisterAction by RegisterAction (its const tables read from the P4 text). Random packet sequences
(duplicates, stale and new rounds, flushes, absent lanes, wrong epochs, unadmitted and
malformed packets; tests/test_p4_model.py's strategy at the TNA sizes) go through it
and through softswitch.pipeline.Pipeline, with the pipeline's hold of a newer round off (the
TNA program lacks it: spec.TNA_LACKS, tofino/README.md): every emitted packet, counter and
register cell must agree after every packet. The sizes the TNA parser does not hold, and the
congestion drop's loss budget, are compared too. The narrow-lane profiles
(-DSPINA_LANE_BITS=16 and 8, tofino/README.md "Narrow lanes") are compared the same way on
honest rounds of their width, and their differences (another width, saturation) are pinned.
"""
from __future__ import annotations

import socket

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from softswitch.egress import CongestionDrop
from softswitch.pipeline import Pipeline
from spina import spec, wire
from spina.config import JobConfig, WorkerAddr
from tests.test_p4_model import JOB, PORT, SWITCH_IP, frames, packet, src
from tests.tna_model import INA_OFF, M32, TnaModel, hold, hold_mask

K, BS = spec.TNA_SIZES["NLANES"], spec.TNA_SIZES["BLOCK_SIZE"]
SLOTS = spec.TNA_SIZES["POOL_SLOTS"]


def _admit(nworkers: int, nslots: int = 2, lane_bits: int = 32):
    """The same job in both: Pipeline.add_job and the model's admission entries (the model
    compiled for `lane_bits`, the job's lanes as wide)."""
    job = JobConfig(job=JOB, workers=tuple(WorkerAddr(r, *src(r)) for r in range(nworkers)),
                    slot_base=0, nslots=nslots, block_size=BS, nlanes=K, lane_bits=lane_bits)
    fast = Pipeline(pool_slots=SLOTS, slot_capacity=K * BS)
    fast.hold_newer_rounds = False  # the TNA program lacks the hold (spec.TNA_LACKS)
    fast.add_job(job, {r: (PORT, src(r)) for r in range(nworkers)}, mcast_grp=1)
    model = TnaModel(lane_bits)
    for r in range(nworkers):
        model.admission[(PORT, src(r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=nslots, nworkers=nworkers, block_size=BS, nlanes=K)
    return fast, model


def _same_state(fast: Pipeline, model: TnaModel) -> None:
    """Counters (by name and index) and every register cell, in spec's meaning."""
    for (name, index), value in model.counters.items():
        assert int(fast.counters[name][index]) == value, name
    assert sum(int(c.sum()) for c in fast.counters.values()) == sum(model.counters.values())
    reg = fast.registers
    for name in ("slot_round", "slot_bitmap", "slot_count", "slot_present", "slot_nonfinite",
                 "slot_exponent", "slot_length", "slot_flags"):
        # slot_flags: the TNA program stores no lane width (one program holds one width); the
        # software switch's cells hold the program's width or none (a copy never set)
        width = {"slot_exponent": 0xFFFF,
                 "slot_flags": 0xFF & ~wire.FLAGS_LANE_WIDTH}.get(name, (1 << 64) - 1)
        assert [int(x) & width for x in reg[name]] == model.spec_view(name), name
    assert {int(x) & wire.FLAGS_LANE_WIDTH for x in reg["slot_flags"]} <= {0, model.lane_flag}
    assert [int(x) for x in reg["slot_next"][:, 0]] == model.reg["slot_next_l0"]
    for e in range(BS):
        assert [int(x) & M32 for x in reg["slot_values"][:, e]] == \
            [v & M32 for v in model.values(e)], e


@st.composite
def scenario(draw):
    nworkers = draw(st.integers(1, 3))
    # contributions only: TNA has no all-gather (test_a_gather_packet_is_malformed_on_tna)
    return nworkers, [packet(draw, nworkers, K, BS, gather=False)
                      for _ in range(draw(st.integers(1, 40)))]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_tna_equals_pipeline(sc):
    """Same packets out (and where they go), same counters, same register cells, after every
    packet, for flat jobs at the TNA sizes."""
    nworkers, packets = sc
    fast, model = _admit(nworkers)
    for rank, pkt in packets:
        got = [(bytes(e.data), e.multicast) for e in fast.process(pkt, PORT, src(rank))]
        assert model.process(pkt, PORT, src(rank)) == got
        _same_state(fast, model)


def test_a_flush_then_a_late_rank_gets_the_stored_result():
    """Rank 0 contributes, flushes (PARTIAL); rank 1's late contribution is not added: both get
    the flushed result, and the bitmap keeps rank 1 out (the case slot_rank_round exists for)."""
    fast, model = _admit(2)
    h = dict(msg_type=wire.MSG_CONTRIB, job=JOB, epoch=1, slot=1, nlanes=K, round=7, length=9,
             block_size=BS, present=1)
    data = np.arange(BS, dtype=np.int32).reshape(1, BS)
    first = wire.pack(wire.Header(rank=0, **h), [5], data)
    flush = wire.pack(wire.Header(rank=0, **{**h, "flags": wire.FLAG_PARTIAL}), [5], data)
    late = wire.pack(wire.Header(rank=1, **h), [3], data * 100)
    assert model.process(first, PORT, src(0)) == []
    (flushed, multicast), = model.process(flush, PORT, src(0))
    assert multicast
    hdr = wire.unpack_header(flushed)
    assert (hdr.msg_type, hdr.flags, hdr.bitmap) == (wire.MSG_RESULT, wire.FLAG_PARTIAL, 0b01)
    (again, multicast), = model.process(late, PORT, src(1))
    assert not multicast
    hdr = wire.unpack_header(again)
    assert (hdr.flags, hdr.bitmap) == (wire.FLAG_PARTIAL | wire.FLAG_RESEND, 0b01)
    assert again[wire.HEADER_LEN + 4:] == flushed[wire.HEADER_LEN + 4:]  # rank 1 not added
    for pkt, rank in ((first, 0), (flush, 0), (late, 1)):
        fast.process(pkt, PORT, src(rank))
    _same_state(fast, model)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(K, BS))
def test_frames_are_judged_as_the_software_switch_judges_them(sent):
    """Whole frames at the TNA sizes, cut short or with an Ethernet trailer: malformed,
    aggregated and answered alike (UDP payloads; the TNA reply keeps a trailer, the software
    switch's does not), counters and registers after every frame. Frames of other sizes are
    left out here: test_other_sizes_are_malformed_on_tna pins that difference."""
    from softswitch.dataplane import Dataplane
    job = JobConfig(job=JOB, workers=(WorkerAddr(0, *src(0)), WorkerAddr(1, *src(1))),
                    slot_base=0, nslots=2, block_size=BS, nlanes=K)
    dp = Dataplane(pool_slots=SLOTS, slot_capacity=K * BS)
    dp.pipeline.hold_newer_rounds = False  # the TNA program lacks the hold (spec.TNA_LACKS)
    dp.ina_endpoint.add(socket.inet_aton(SWITCH_IP))
    dp.pipeline.add_job(job, {r: (PORT, src(r)) for r in range(2)}, mcast_grp=1)
    model = TnaModel()
    for r in range(2):
        model.admission[(PORT, src(r), JOB, r)] = dict(
            epoch=1, slot_base=0, nslots=2, nworkers=2, block_size=BS, nlanes=K)
    for _rank, f in sent:
        if (len(f) >= INA_OFF + wire.HEADER_LEN
                and (wire.unpack_header(f, INA_OFF).nlanes,
                     wire.unpack_header(f, INA_OFF).block_size) != (K, BS)):
            continue  # another size (a cut header is malformed on both)
        got = [(out[INA_OFF:], False) for _, out in dp.process(f, PORT)]
        want = [(pkt, multicast) for pkt, multicast in model.process_frame(f, PORT)
                if not multicast]  # no multicast group configured: results go nowhere
        assert want == got
        _same_state(dp.pipeline, model)


@st.composite
def other_sizes(draw):
    """Well-formed contributions (for the wire) with sizes the TNA parser does not hold."""
    nlanes, block_size = draw(st.sampled_from([(2, BS), (K, 8), (K, 32), (4, 4), (3, 16)]))
    present = draw(st.integers(0, (1 << nlanes) - 1))
    npresent = bin(present).count("1")
    h = wire.Header(msg_type=wire.MSG_CONTRIB, job=JOB, epoch=1, slot=0, rank=0, nlanes=nlanes,
                    round=1, block_size=block_size, present=present)
    data = np.zeros((npresent, block_size), np.int32)
    return wire.pack(h, [wire.END] * nlanes, data if npresent else None)


@settings(max_examples=40, deadline=None)
@given(other_sizes())
def test_other_sizes_are_malformed_on_tna(pkt):
    """Known difference (tofino/README.md): sizes other than one lane of BLOCK_SIZE are
    malformed on the TNA program, unadmitted in the software switch (and p4src); neither
    aggregates them."""
    fast, model = _admit(1)
    assert fast.process(pkt, PORT, src(0)) == []
    assert model.process(pkt, PORT, src(0)) == []
    assert fast.port_counters(PORT) == {"port_malformed": 0, "port_unadmitted": 1}
    assert model.counters == {("port_malformed", PORT): 1}


@st.composite
def congested(draw):
    """A job's congestion entry and the contributions (and results) egress sees."""
    threshold = draw(st.integers(0, 20))
    bound = draw(st.sampled_from([0, 1, spec.loss_bound(0.1), spec.loss_bound(0.5),
                                  spec.LOSS_CREDIT_ONE - 1]))
    out = []
    for _ in range(draw(st.integers(1, 60))):
        flags = draw(st.sampled_from([0, wire.FLAG_LOSS_TOLERANT, wire.FLAG_LOSS_TOLERANT]))
        msg = draw(st.sampled_from([wire.MSG_CONTRIB] * 5 + [wire.MSG_RESULT]))
        h = wire.Header(msg_type=msg, flags=flags, job=JOB, nlanes=K, block_size=BS)
        out.append((wire.pack(h, [wire.END], None), draw(st.integers(0, 40))))
    return threshold, bound, out


@settings(max_examples=150, deadline=None)
@given(congested())
def test_congestion_drop_equals_pipeline(c):
    """CongestionDrop's earn / earn_and_pay equal the software switch's (the same drops,
    job_congestion_* counters and job_loss_credit after every packet) up to the first drop from
    a saturated budget; that drop leaves exactly credit + bound - LOSS_CREDIT_ONE where the
    software switch leaves LOSS_CREDIT_MAX - LOSS_CREDIT_ONE (tofino/README.md), and on the TNA
    the bound and the burst cap hold over the whole sequence."""
    threshold, bound, packets = c
    fast, model = _admit(1)
    congestion = CongestionDrop(fast.counters, fast.job_registers)
    congestion.table[JOB] = (threshold, bound)
    model.congestion[JOB] = (threshold, bound)
    diverged = False
    for pkt, qdepth in packets:
        before = model.reg["job_loss_credit"][JOB]
        h = wire.unpack_header(pkt)
        saturated_drop = (h.msg_type == wire.MSG_CONTRIB and h.flags & wire.FLAG_LOSS_TOLERANT
                          and qdepth > threshold and before + bound > spec.LOSS_CREDIT_MAX)
        dropped = model.congestion_drop(pkt, qdepth)
        credit = model.reg["job_loss_credit"][JOB]
        if not diverged:
            assert dropped == congestion.drop(pkt, qdepth)
            if saturated_drop:
                assert dropped
                assert credit == before + bound - spec.LOSS_CREDIT_ONE
                assert int(fast.job_registers["job_loss_credit"][JOB]) == \
                    spec.LOSS_CREDIT_MAX - spec.LOSS_CREDIT_ONE
                diverged = True
            else:
                assert int(fast.job_registers["job_loss_credit"][JOB]) == credit
            for name in ("job_congestion_seen", "job_congestion_drops"):
                assert int(fast.counters[name][JOB]) == model.counters.get((name, JOB), 0)
        seen = model.counters.get(("job_congestion_seen", JOB), 0)
        drops = model.counters.get(("job_congestion_drops", JOB), 0)
        assert drops * spec.LOSS_CREDIT_ONE <= seen * bound
        assert 0 <= credit <= spec.LOSS_CREDIT_MAX


def test_a_gather_packet_is_malformed_on_tna():
    """The TNA program has no all-gather (tofino/README.md): a well-formed gather chunk of an
    admitted job is replicated by the software switch, and counted malformed by the TNA
    program, which sends nothing."""
    fast, model = _admit(2)
    h = wire.Header(msg_type=wire.MSG_GATHER, job=JOB, epoch=1, slot=0, rank=0, nlanes=K,
                    round=0, length=BS, block_size=BS, present=1)
    pkt = wire.pack(h, [0] + [wire.END] * (K - 1), np.arange(BS, dtype=np.int32).reshape(1, BS))
    assert len(fast.process(pkt, PORT, src(0))) == 1  # replicated to the job's group
    assert model.process(pkt, PORT, src(0)) == []
    assert model.counters[("port_malformed", PORT)] == 1


# ---------------------------------------------------------------- narrow-lane profiles
def _narrow(rank, lane_bits, **kw):
    """A contribution of `rank` in `lane_bits` lanes (values: kw's `data`, one block)."""
    data = kw.pop("data", None)
    h = wire.Header(msg_type=wire.MSG_CONTRIB, job=JOB, epoch=1, slot=0, rank=rank, nlanes=K,
                    round=1, length=9, block_size=BS, present=0 if data is None else 1,
                    **{**kw, "flags": kw.get("flags", 0) | wire.LANE_FLAGS[lane_bits]})
    return wire.pack(h, [wire.END], None if data is None else np.array([data]))


@st.composite
def narrow_scenario(draw):
    """An honest job's rounds in one lane width: every value at most 1/3 of the lane's range,
    so the sums of up to 3 ranks fit (the agent's shift makes it so, docs/bits.md) and neither
    the software switch nor the TNA profile saturates."""
    lane_bits = draw(st.sampled_from([16, 8]))
    nworkers = draw(st.integers(1, 3))
    bound = (1 << (lane_bits - 1)) // 3
    packets = []
    for _ in range(draw(st.integers(1, 30))):
        rank, pkt = packet(draw, nworkers, K, BS, gather=False)  # its header, in this width
        h = wire.unpack_header(pkt)
        full = len(pkt) == wire.packet_len(K, BS, h.present & 1)
        h.flags |= wire.LANE_FLAGS[lane_bits]
        data = (np.array([draw(st.lists(st.integers(-bound, bound), min_size=BS, max_size=BS))])
                if h.present & 1 else None)
        narrow = wire.pack(h, [draw(st.sampled_from([0, 1, 5, 9, wire.END]))], data)
        packets.append((rank, narrow if full else narrow[:-1]))  # cut short: malformed
    return lane_bits, nworkers, packets


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(narrow_scenario())
def test_narrow_profile_equals_pipeline(sc):
    """-DSPINA_LANE_BITS=16 / 8: an honest job's packets in the program's width give the same
    packets out (rows in the lane's width), counters and register cells after every packet as
    the software switch (which adds them into int32 cells and answers in the same width)."""
    lane_bits, nworkers, packets = sc
    fast, model = _admit(nworkers, lane_bits=lane_bits)
    for rank, pkt in packets:
        got = [(bytes(e.data), e.multicast) for e in fast.process(pkt, PORT, src(rank))]
        assert model.process(pkt, PORT, src(rank)) == got
        _same_state(fast, model)


def test_narrow_profile_sums_and_answers_in_its_width():
    """Two ranks in 16-bit lanes: the result is the exact sum with mixed signs, as int16 rows
    with FLAG_LANES16, from both; the sum at the lane's bounds is not clipped."""
    for lane_bits in (16, 8):
        top = 1 << (lane_bits - 1)
        a = [top - 1 - e for e in range(BS)]
        b = [-(e % 7) for e in range(BS)]
        fast, model = _admit(2, lane_bits=lane_bits)
        for rank, data in ((0, a), (1, b)):
            pkt = _narrow(rank, lane_bits, data=data, flags=wire.FLAG_LAST)
            got = [(bytes(e.data), e.multicast) for e in fast.process(pkt, PORT, src(rank))]
            assert model.process(pkt, PORT, src(rank)) == got
        (result, multicast), = got
        got = wire.unpack(result)
        h, rows = got.header, got.data
        assert multicast and h.msg_type == wire.MSG_RESULT
        assert h.flags == wire.FLAG_LAST | wire.LANE_FLAGS[lane_bits]
        assert len(result) == wire.HEADER_LEN + 4 + BS * lane_bits // 8
        assert [int(x) for x in rows[0]] == [x + y for x, y in zip(a, b)]
        _same_state(fast, model)


def test_another_width_is_malformed_on_a_narrow_profile():
    """Known difference (tofino/README.md): a contribution whose width is not the program's
    is malformed on the TNA program (one program holds one width), where the software switch
    adds it, marks the round MISMATCH and counts job_lane_mismatch."""
    for lane_bits, other in ((16, 32), (16, 8), (8, 16), (32, 16)):
        fast, model = _admit(2, lane_bits=lane_bits)
        first = _narrow(0, lane_bits, data=[1] * BS)
        odd = _narrow(1, other, data=[2] * BS)
        fast.process(first, PORT, src(0))
        model.process(first, PORT, src(0))
        (result,) = fast.process(odd, PORT, src(1))
        assert wire.unpack_header(result.data).flags & wire.FLAG_MISMATCH
        assert int(fast.counters["job_lane_mismatch"][JOB]) == 1
        assert model.process(odd, PORT, src(1)) == []
        assert model.counters[("port_malformed", PORT)] == 1
        # no block: malformed too (the width flags are checked, not only the UDP length)
        assert model.process(_narrow(1, other), PORT, src(1)) == []
        assert model.counters[("port_malformed", PORT)] == 2


def test_narrow_profile_saturates_each_add():
    """Known difference (tofino/README.md): the TNA cells are lane-wide and saturate at each
    add (|+|), the software switch's are int32 and clip the answer once. Sums of one sign
    beyond the lane agree in the answer (the lane's bound), but only the software switch
    counts job_lane_saturated; a running sum that leaves the lane and comes back differs."""
    top = (1 << 15) - 1
    fast, model = _admit(3, lane_bits=16)
    outs = []
    for rank, v in ((0, 30000), (1, 30000), (2, 30000)):  # one sign: 90000 -> 32767 on both
        pkt = _narrow(rank, 16, data=[v] * BS)
        outs = [fast.process(pkt, PORT, src(rank)), model.process(pkt, PORT, src(rank))]
    (soft,), (tna,) = outs
    assert bytes(soft.data) == tna[0]
    assert [int(x) for x in wire.unpack(tna[0]).data[0]] == [top] * BS
    assert int(fast.counters["job_lane_saturated"][JOB]) == 1  # the result packet, once
    assert ("job_lane_saturated", JOB) not in model.counters
    assert model.values(0)[1] == top and int(fast.registers["slot_values"][1, 0]) == 90000
    fast, model = _admit(3, lane_bits=16)
    for rank, v in ((0, 30000), (1, 30000), (2, -30000)):  # 32767 - 30000 on the TNA
        pkt = _narrow(rank, 16, data=[v] * BS)
        outs = [fast.process(pkt, PORT, src(rank)), model.process(pkt, PORT, src(rank))]
    (soft,), (tna,) = outs
    assert [int(x) for x in wire.unpack(bytes(soft.data)).data[0]] == [30000] * BS
    assert [int(x) for x in wire.unpack(tna[0]).data[0]] == [top - 30000] * BS


@st.composite
def hold_sequence(draw):
    """One slot's packets: (rank, round) pairs around a moving head, stale and newer rounds."""
    nworkers = draw(st.integers(1, 32))
    start = draw(st.sampled_from([1, M32 - 2]))  # rounds wrap around as 32-bit numbers
    steps = draw(st.lists(st.tuples(st.integers(0, nworkers - 1), st.integers(-2, 3)),
                          min_size=1, max_size=80))
    return nworkers, start, steps


@settings(max_examples=300, deadline=None)
@given(hold_sequence())
def test_t2na_hold_equals_the_software_hold(seq):
    """The Tofino 2 profile's hold (include/hold.p4: one cell of the head round and the ranks
    pending at it, in hold masks) holds exactly the packets the software switch's three head
    registers hold, and its pending ranks are the software's missing ones, after every packet
    (a round near the sender's last one, so that heads move, stay and go stale)."""
    nworkers, start, steps = seq
    pipe = Pipeline(pool_slots=SLOTS, slot_capacity=K * BS)
    cell = (0, 0)  # a cleared cell, as the software's
    last = [start] * nworkers
    for rank, step in steps:
        rnd = (last[rank] + step) & M32
        last[rank] = rnd
        cell, held = hold(cell, rnd, hold_mask(rank, nworkers))
        assert held == pipe._held(3, rnd, 1 << rank, nworkers)
        heard, count = (int(pipe.registers[n][3]) for n in ("head_heard", "head_missing"))
        missing = [r for r in range(nworkers) if not heard >> r & 1] if count else []
        assert len(missing) == count
        want = 0
        for r in missing:
            want |= hold_mask(r, nworkers)
        assert cell == (int(pipe.registers["head_round"][3]), want)
