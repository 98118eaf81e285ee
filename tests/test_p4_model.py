"""The fast software pipeline equals a plain transliteration of the P4 program's INA path.

Run just this file: python -m pytest tests/test_p4_model.py

tests/p4model.py follows p4src/include/control/{ina_check,admission,aggregator}.p4 statement
by statement; here random packet sequences (duplicates, stale and new rounds, sparse lanes,
wrong epochs, unadmitted and malformed packets) go through both, and every emitted packet,
counter and register cell must agree after every packet.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from softswitch.pipeline import Pipeline
from spina import wire
from spina.config import JobConfig, WorkerAddr
try:  # tests/ is on sys.path under pytest's default import mode, unless tests/ is a package
    from p4model import M32, P4Model
except ImportError:
    from tests.p4model import M32, P4Model

K, BS, SLOTS, JOB, PORT = 4, 4, 4, 3, 1


def src(rank):
    return (f"10.0.0.{rank + 1}", 5000 + rank)


def packet(draw, nworkers):
    rank = draw(st.integers(0, nworkers))          # nworkers: not admitted
    present = draw(st.integers(0, (1 << K) - 1))
    npresent = bin(present).count("1")
    h = wire.Header(
        version=draw(st.sampled_from([1] * 15 + [2])), msg_type=wire.MSG_CONTRIB,
        flags=draw(st.sampled_from([0, wire.FLAG_LAST, wire.FLAG_RESEND, wire.FLAG_LOSS_TOLERANT,
                                    wire.FLAG_LAST | wire.FLAG_LOSS_TOLERANT,
                                    wire.FLAG_RESEND | wire.FLAG_PARTIAL])),
        job=JOB, epoch=draw(st.sampled_from([1] * 9 + [2])), slot=draw(st.integers(0, 2)),
        rank=rank, nlanes=K, round=draw(st.integers(1, 4)), length=draw(st.sampled_from([9, 9, 10])),
        block_size=BS, exponent=draw(st.integers(-40, 40)), present=present,
        nonfinite=draw(st.integers(0, (1 << K) - 1)) & present)
    nxt = draw(st.lists(st.sampled_from([0, 1, 5, 9, wire.END]), min_size=K, max_size=K))
    data = draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=npresent * BS,
                         max_size=npresent * BS))
    pkt = wire.pack(h, nxt, np.array(data, np.int32).reshape(npresent, BS) if npresent else None)
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
    """Same packets out, same counters, same register cells, after every packet."""
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
