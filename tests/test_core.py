"""The host agent's compiled core (host_agent/_core.c) against its numpy reference.

    python -m pytest -q tests/test_core.py

fill_round and deliver must give the bytes and values that the numpy forms in
host_agent/blocks.py (gather_blocks, quantize, dequantize, scatter_blocks) give, on random
inputs and on the edge cases: NaN/Inf blocks, the zero-padded last block, one to 64 lanes,
shifts outside float32's scale range (ldexp), int32 tensors, both of the core's loop
variants. A datagram the agent builds with it must be exactly wire.pack of the reference.
"""
import numpy as np
import pytest

from host_agent import _core
from host_agent.agent import _Buffers, _Call
from host_agent.blocks import (LanePlan, dequantize, gather_blocks, quantize, scatter_blocks)
from host_agent.recovery import RttEstimator
from spina import wire
from spina.config import JobConfig, WorkerAddr


def _variants():
    """The loop variants this CPU runs (avx2 only where the CPU has it)."""
    got = ["generic"]
    try:
        _core.set_variant("avx2")
        got.append("avx2")
    except ValueError:
        print("test_core: this CPU has no AVX2: only the generic loops are compared")
    _core.set_variant(got[-1])
    return got


VARIANTS = _variants()


@pytest.fixture(params=VARIANTS)
def variant(request):
    """Run the test with one loop variant, then restore the default (the best one)."""
    _core.set_variant(request.param)
    yield request.param
    _core.set_variant(VARIANTS[-1])


def lane_plan(nz, nslots, k):
    """pos_ext and each lane's first index in it, as _Call lays them out."""
    plan, order = LanePlan.build(np.asarray(nz, np.int64), nslots, k)
    L = nslots * k
    per_lane = np.diff(plan.lane_bounds)
    pos_ext = np.full(len(plan.pos) + L, -1, np.int64)
    pos_ext[np.arange(len(plan.pos)) + np.repeat(np.arange(L), per_lane)] = plan.pos
    return pos_ext, plan.lane_bounds[:-1] + np.arange(L), order


def reference_fill(flat, pos_ext, ptr, pos, nonfinite, lane0, shift, integer, B):
    """fill_round in numpy: (datagram body after the header, present, nonfinite bits,
    nrows, last, the advanced ptr)."""
    k = len(ptr)
    own = pos_ext[ptr]
    have = (own >= 0) & (own == pos)
    rows = np.array(gather_blocks(flat, own[have], B))  # the last block zero-padded
    nf = np.zeros(k, bool)
    if nonfinite is not None:
        nf[have] = nonfinite[(ptr - lane0 - np.arange(k))[have]].astype(bool)
        bad = nf[have]
        rows[bad] = np.where(np.isfinite(rows[bad]), rows[bad], 0)
    if integer:
        data = rows.astype(wire.DATA_DTYPE)
    else:
        data = quantize(rows, shift, np.empty(rows.shape, wire.DATA_DTYPE),
                        np.empty(rows.shape, np.float32))
    new_ptr = ptr + have
    nxt = pos_ext[new_ptr]
    body = (np.where(nxt < 0, wire.END, nxt).astype(wire.NEXT_DTYPE).tobytes()
            + data.tobytes())
    bits = lambda m: sum(1 << int(i) for i in np.flatnonzero(m))  # noqa: E731
    return body, bits(have), bits(nf), int(have.sum()), bool((nxt < 0).all()), new_ptr


def reference_deliver(datagram, out, pos, present, nonfinite, shift, integer, B):
    """deliver in numpy."""
    k = len(pos)
    lanes = wire.lane_indices(present, k)
    data = np.frombuffer(datagram, wire.DATA_DTYPE, len(lanes) * B,
                         wire.data_offset(k)).reshape(-1, B)
    rows = data.astype(np.int32) if integer else dequantize(data, shift)
    if len(lanes):
        scatter_blocks(out, pos[lanes], rows, B)
    if nonfinite and not integer:
        scatter_blocks(out, pos[wire.lane_indices(nonfinite, k)], np.nan, B)


def random_case(rng, integer):
    """A tensor (some NaN/Inf blocks if float), its lane plan and a round's positions for one
    slot: some lanes at this worker's next block, others at a later block or END."""
    B = int(rng.choice([1, 3, 8, 256]))
    k = int(rng.choice([1, 2, 7, 56, 64]))
    nslots = int(rng.integers(1, 4))
    n = int(rng.integers(1, 10 * B * nslots * k))  # a few blocks per lane, often a partial last
    nblocks = -(-n // B)
    e = int(rng.choice([0, 10, -20, 100, -110, -140]))  # -110/-140: shifts above 127 (ldexp)
    if integer:
        flat = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
    else:
        flat = (rng.uniform(-1, 1, n) * 2.0 ** e).astype(np.float32)
        for b in rng.choice(nblocks, min(nblocks, 3), replace=False):
            flat[b * B + int(rng.integers(0, min(B, n - b * B)))] = rng.choice([np.nan, np.inf, -np.inf])
    nz = np.sort(rng.choice(nblocks, int(rng.integers(1, nblocks + 1)), replace=False))
    nz = np.union1d(nz, [nblocks - 1])  # the partial last block, when there is one
    pos_ext, first, order = lane_plan(nz, nslots, k)
    nonfinite = None  # per plan row, as _Call keeps it
    if not integer:
        nonfinite = (~np.isfinite(gather_blocks(flat, nz, B)).all(axis=1))[order].view(np.uint8)
    s = int(rng.integers(0, nslots))
    ptr = first[s * k:(s + 1) * k].copy()
    ptr += (rng.random(k) < 0.3) & (pos_ext[ptr] >= 0)  # some lanes a block further on
    own = pos_ext[ptr]
    pos = np.where(own >= 0, own, wire.END).astype(np.int64)
    later = rng.random(k) < 0.3
    pos[later] = np.where(rng.random(later.sum()) < 0.5, wire.END, pos[later] + 1)
    shift = 28 - e
    return flat, pos_ext, ptr, pos, nonfinite, s * k, shift, B, k


@pytest.mark.parametrize("integer", [False, True])
def test_fill_round_gives_the_reference_bytes(variant, integer):
    """Random tensors and rounds: the same body, lane bits, row count, last flag and pointers."""
    rng = np.random.default_rng(7 + integer)
    for _ in range(150):
        flat, pos_ext, ptr, pos, nonfinite, lane0, shift, B, k = random_case(rng, integer)
        want, present, nf_bits, nrows, last, new_ptr = reference_fill(
            flat, pos_ext, ptr, pos, nonfinite, lane0, shift, integer, B)
        dgram = bytearray(b"\xaa" * wire.packet_len(k, B, k))
        got_ptr = ptr.copy()
        got = _core.fill_round(dgram, flat, pos_ext, got_ptr, pos, nonfinite, lane0, shift,
                               integer, B)
        assert got == (present, nf_bits, nrows, last)
        assert bytes(dgram[wire.HEADER_LEN:wire.HEADER_LEN + len(want)]) == want
        assert dgram[:wire.HEADER_LEN] == b"\xaa" * wire.HEADER_LEN  # the header is the agent's
        np.testing.assert_array_equal(got_ptr, new_ptr)


@pytest.mark.parametrize("integer", [False, True])
def test_deliver_writes_the_reference_values(variant, integer):
    """Random results: the output's bytes (NaN bits included) equal the reference's."""
    rng = np.random.default_rng(11 + integer)
    for _ in range(150):
        B = int(rng.choice([1, 3, 8, 256]))
        k = int(rng.choice([1, 2, 7, 56, 64]))
        n = int(rng.integers(1, 30 * B * k))
        nblocks = -(-n // B)
        pos = rng.choice(nblocks, k, replace=nblocks < k).astype(np.int64)
        pos[-1] = nblocks - 1  # the partial last block, when there is one
        present = int(rng.integers(0, 2 ** k, dtype=np.uint64))
        if nblocks < k:  # repeated positions: keep one lane per block
            _, first = np.unique(pos, return_index=True)
            present &= sum(1 << int(i) for i in first)
        nonfinite = 0 if integer else present & int(rng.integers(0, 2 ** k, dtype=np.uint64)) & (
            int(rng.integers(0, 2 ** k, dtype=np.uint64)))
        rows = bin(present).count("1")
        dgram = bytearray(wire.packet_len(k, B, rows))
        np.frombuffer(dgram, np.uint8)[wire.data_offset(k):] = rng.integers(0, 256, rows * B * 4)
        shift = int(rng.choice([0, 5, 30, 130, 160, -90]))  # >126: dequantize through ldexp
        dtype = np.int32 if integer else np.float32
        want = rng.standard_normal(n).astype(dtype)
        got = want.copy()
        reference_deliver(dgram, want, pos, present, nonfinite, shift, integer, B)
        _core.deliver(dgram, got, pos, present, nonfinite, shift, integer, B)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bad_arguments_raise_and_write_nothing():
    """Positions outside the tensor, a short datagram, a pointer off the plan: errors, not
    writes out of bounds."""
    flat = np.ones(10, np.float32)
    pos_ext = np.array([0, 5, -1], np.int64)
    dgram = bytearray(wire.packet_len(1, 4, 1))
    with pytest.raises(IndexError, match="outside the tensor"):
        _core.fill_round(dgram, flat, pos_ext, np.array([1]), np.array([5]), None, 0, 0, False, 4)
    with pytest.raises(IndexError, match="outside pos_ext"):
        _core.fill_round(dgram, flat, pos_ext, np.array([3]), np.array([0]), None, 0, 0, False, 4)
    with pytest.raises(ValueError, match="too short"):
        _core.fill_round(bytearray(50), flat, pos_ext, np.array([0]), np.array([0]), None, 0, 0,
                         False, 4)
    out = np.zeros(10, np.float32)
    with pytest.raises(IndexError, match="outside the output"):
        _core.deliver(bytearray(wire.packet_len(2, 4, 2)), out, np.array([0, 3], np.int64), 0b11,
                      0, 0, False, 4)
    assert not out.any()
    with pytest.raises(ValueError, match="shorter than its present rows"):
        _core.deliver(bytearray(60), out, np.array([0], np.int64), 1, 0, 0, False, 4)


def test_the_agents_datagrams_are_wire_pack_of_the_reference():
    """A slot's rounds as the agent sends them (header with the job's priority, a lane only
    the other worker has, a NaN/Inf block, the partial last block, LAST, and RESEND with
    PARTIAL set in place on a resend) equal wire.pack of the reference."""
    B, k, W = 8, 4, 2
    rng = np.random.default_rng(3)
    flat = rng.standard_normal(100).astype(np.float32)  # 13 blocks, the last one partial
    flat[5 * B:6 * B] = 0          # block 5 (lane 5): only the other worker has it
    flat[6 * B + 1] = np.inf       # block 6 (lane 6): non-finite
    job = JobConfig(job=3, workers=(WorkerAddr(0, "127.0.0.1", 1), WorkerAddr(1, "127.0.0.1", 2)),
                    block_size=B, nlanes=k, nslots=W, priority=5, bounded_loss=0.5,
                    loss_deadline=1e-9)
    sent = []
    call = _Call(job, 1, 9, np.zeros(W, np.int64), flat, False, False, None, _Buffers(),
                 RttEstimator(), lambda pkt: sent.append(bytes(pkt)))
    nz = [b for b in range(13) if b != 5]
    pos_ext, first, _ = lane_plan(nz, W, k)
    np.testing.assert_array_equal(call.pos_ext, pos_ext)
    st = call.slots[1]  # lanes 4..7: blocks 4 and 12, 6, 7
    ptr = first[4:8].copy()
    call.send_setup(st)
    exponent = int(call.slot_exp[1])
    head = dict(priority=5, job=3, epoch=1, call=9, slot=1, rank=1, nlanes=k, length=100,
                block_size=B)
    assert sent[-1] == wire.pack(wire.Header(**head, round=1, exponent=exponent),
                                 [4, wire.END, 6, 7])

    def answer(round_, positions, exponent=0, present=0, rows=None):
        res = bytearray(wire.pack(wire.Header(**{**head, "rank": 0, "priority": 0},
                                              msg_type=wire.MSG_RESULT, round=round_,
                                              exponent=exponent, bitmap=3, present=present),
                                  positions, rows))
        return call.on_answer(res, len(res), st, wire.HEADER_STRUCT.unpack_from(res))

    # setup result: the union's first positions and the exponent every worker quantizes with
    assert not answer(1, [4, 5, 6, 7], exponent + 1)
    for round_, pos, flags in ((2, [4, 5, 6, 7], 0), (3, [12, wire.END, wire.END, wire.END],
                                                      wire.FLAG_LAST)):
        body, present, nf_bits, nrows, last, ptr = reference_fill(
            flat, pos_ext, ptr, np.array(pos, np.int64), call.nonfinite, 4, st.shift, False, B)
        data = np.frombuffer(body, wire.DATA_DTYPE, offset=4 * k).reshape(-1, B)
        want = wire.pack(wire.Header(**head, round=round_, exponent=exponent + 1, flags=flags,
                                     present=present, nonfinite=nf_bits),
                         np.frombuffer(body[:4 * k], wire.NEXT_DTYPE), data)
        assert sent[-1] == want
        assert last == bool(flags)
        if round_ == 2:
            assert (present, nf_bits, nrows) == (0b1101, 0b0100, 3)
            assert answer(2, [12, wire.END, wire.END, wire.END], present=0b1101, rows=data) is False
    assert (present, nrows) == (0b0001, 1)
    # Past the loss deadline the round is flushed: resent with RESEND and PARTIAL set in place.
    call.slots[0].done = True  # (never started here)
    call.resend_due(False, 0.1, 10.0, ("127.0.0.1", 1))
    assert wire.unpack_header(sent[-1]).flags == wire.FLAG_LAST | wire.FLAG_RESEND | wire.FLAG_PARTIAL
    assert sent[-1][wire.HEADER_LEN:] == want[wire.HEADER_LEN:]
    assert sent[-2] == want  # the stored datagram is unchanged
