"""The host agent's compiled core (host_agent/_core.c) against its numpy reference.

    python -m pytest -q tests/test_core.py

fill_round and deliver must give the bytes and values that the numpy forms in
host_agent/blocks.py (gather_blocks, quantize, dequantize, scatter_blocks) give, on random
inputs and on the edge cases: NaN/Inf blocks, the zero-padded last block, one to 64 lanes,
shifts outside float32's scale range (ldexp), int32 tensors, both of the core's loop
variants; block_scan the per-block largest |x| bits and OR of bits that numpy computes. The
header fields fill_round writes and the ones recv_answers reads must be spina.wire's
(HEADER_STRUCT), and its header checks wire.header_error's; a batch of datagrams read with one
recvmmsg keeps only the switch's well-formed answers of the call. A datagram the agent builds
with it must be exactly wire.pack of the reference.
"""
import socket
import threading

import numpy as np
import pytest

from host_agent import _core
from host_agent.agent import _A_INDEX, Agent, _Buffers, _Call
from host_agent.blocks import (
    LanePlan,
    dequantize,
    gather_blocks,
    quantize,
    rounding_noise,
    scatter_blocks,
    stochastic_quantize,
)
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
            i = b * B + int(rng.integers(0, min(B, n - b * B)))
            flat[i] = rng.choice([np.nan, np.inf, -np.inf])
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
        template = random_header(rng)
        wire.HEADER_STRUCT.pack_into(dgram, 0, *template)
        round_, flags, priority, exponent = (int(rng.integers(0, 2**32)), int(rng.integers(0, 256)),
                                             int(rng.integers(0, 256)),
                                             int(rng.integers(-2**15, 2**15)))
        flags &= ~wire.FLAGS_LANE_WIDTH  # int32 rows (narrow ones: test_narrow_fill_round_...)
        got_ptr = ptr.copy()
        got = _core.fill_round(dgram, flat, pos_ext, got_ptr, pos, nonfinite, lane0, shift,
                               integer, B, round_, flags, priority, exponent)
        assert got == (present, nf_bits, nrows, last)
        assert bytes(dgram[wire.HEADER_LEN:wire.HEADER_LEN + len(want)]) == want
        # the round's own fields written, the template's kept
        assert bytes(dgram[:wire.HEADER_LEN]) == wire.HEADER_STRUCT.pack(*with_fields(
            template, flags=flags | (wire.FLAG_LAST if last else 0), priority=priority,
            round=round_, exponent=exponent, bitmap=0, present=present, nonfinite=nf_bits))
        np.testing.assert_array_equal(got_ptr, new_ptr)


def test_fill_round_of_a_setup_round_writes_next_positions_only():
    """pos None (a setup round): the lanes' first positions, no rows, pointers unchanged."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        flat, pos_ext, ptr, _, nonfinite, lane0, _, B, k = random_case(rng, False)
        dgram = bytearray(b"\xaa" * wire.packet_len(k, B, k))
        got_ptr = ptr.copy()
        got = _core.fill_round(dgram, flat, pos_ext, got_ptr, None, nonfinite, lane0, 0, False,
                               B, 1, 0, 3, -7)
        nxt = pos_ext[ptr]
        last = bool((nxt < 0).all())
        assert got == (0, 0, 0, last)
        assert bytes(dgram[wire.HEADER_LEN:wire.data_offset(k)]) == np.where(
            nxt < 0, wire.END, nxt).astype(wire.NEXT_DTYPE).tobytes()
        assert dgram[wire.data_offset(k):] == b"\xaa" * (len(dgram) - wire.data_offset(k))
        h = wire.unpack_header(dgram)
        assert (h.flags, h.priority, h.round, h.exponent, h.present) == (
            wire.FLAG_LAST if last else 0, 3, 1, -7, 0)
        np.testing.assert_array_equal(got_ptr, ptr)


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
        # repeated positions (fewer blocks than lanes, or pos[-1] drawn before): keep one lane
        # per block, as in a real round
        _, first = np.unique(pos, return_index=True)
        present &= sum(1 << int(i) for i in first)
        nonfinite = 0 if integer else present & int(rng.integers(0, 2 ** k, dtype=np.uint64)) & (
            int(rng.integers(0, 2 ** k, dtype=np.uint64)))
        rows = bin(present).count("1")
        dgram = bytearray(wire.packet_len(k, B, rows))
        np.frombuffer(dgram, np.uint8)[wire.data_offset(k):] = rng.integers(0, 256, rows * B * 4)
        nxt = rng.integers(0, 2**32 - 1, k, dtype=np.uint32)
        nxt[rng.random(k) < (0.5 if rng.random() < 0.5 else 1.0)] = wire.END  # sometimes all END
        dgram[wire.HEADER_LEN:wire.data_offset(k)] = nxt.astype(wire.NEXT_DTYPE).tobytes()
        shift = int(rng.choice([0, 5, 30, 130, 160, -90]))  # >126: dequantize through ldexp
        dtype = np.int32 if integer else np.float32
        want = rng.standard_normal(n).astype(dtype)
        got = want.copy()
        reference_deliver(dgram, want, pos, present, nonfinite, shift, integer, B)
        got_pos = pos.copy()
        done = _core.deliver(dgram, got, got_pos, present, nonfinite, shift, integer, B)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        # then the next round's positions, and whether every lane is at END
        np.testing.assert_array_equal(got_pos, nxt.astype(np.int64))
        assert done is bool((nxt == wire.END).all())


# ------------------------------------------------------------------ narrow lanes (docs/bits.md)
@pytest.mark.parametrize("seed,rank,step,n", [(5, 0, 1, 37), (7, 3, 99, 1000),
                                              (1, 31, 2**32 - 1, 17), (2**40, 2, 5, 8),
                                              (65535, 7, 123456, 70001)])
def test_the_compiled_draws_are_numpys(seed, rank, step, n):
    """_core.rounding_noise computes blocks.rounding_noise's counter-based draws bit for bit
    (lengths around the vector loops' widths, seeds beyond 32 bits, steps at 2**32 - 1)."""
    got = np.empty(n, np.float32)
    _core.rounding_noise(seed, rank, step, got)
    want = rounding_noise(seed, rank, step, (n,))
    assert got.tobytes() == want.tobytes()
    assert got.min() >= 0 and got.max() < 1


def test_add_keep_is_numpys_add_and_copy():
    """_core.add_keep: out = x + residual and residual = out in one pass, bit for bit numpy's
    float32 add and copy (narrow.add_keep's reference), into a new array and into x itself;
    refused sizes are one ValueError."""
    from host_agent.narrow import add_keep
    rng = np.random.default_rng(3)
    for n in (1, 7, 1000, 4099):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
        r = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        want_r, want = r.copy(), np.empty_like(x)
        add_keep(x, want_r, want, compiled=False)
        got_r, got = r.copy(), np.empty_like(x)
        _core.add_keep(x, got_r, got)
        assert got.tobytes() == want.tobytes() == got_r.tobytes() == want_r.tobytes()
        assert want.tobytes() == (x + r).tobytes()
        x2, r2 = x.copy(), r.copy()
        assert add_keep(x2, r2, x2) is x2  # in place
        assert x2.tobytes() == r2.tobytes() == want.tobytes()
    with pytest.raises(ValueError, match="one size"):
        _core.add_keep(np.zeros(4, np.float32), np.zeros(3, np.float32), np.zeros(4, np.float32))


def reference_narrow_fill(flat, pos_ext, ptr, pos, nonfinite, lane0, shift, B, lane_bits, noise,
                          residual):
    """fill_round's narrow rows in numpy, as narrow.NumpyRounds.fill: (body after the header,
    present, nonfinite bits, nrows, last, new ptr); `residual` updated in place."""
    k = len(ptr)
    own = pos_ext[ptr]
    have = (own >= 0) & (own == pos)
    rows = np.array(gather_blocks(flat, own[have], B))
    plan_rows = (ptr - lane0 - np.arange(k))[have]
    nf = np.zeros(k, bool)
    nf[have] = nonfinite[plan_rows].astype(bool)
    rows = np.where(np.isfinite(rows), rows, np.float32(0))
    q = stochastic_quantize(rows, shift, lane_bits, noise[plan_rows])
    err = rows - dequantize(q, shift)
    err[nf[have]] = 0
    if have.any():
        scatter_blocks(residual, own[have], err, B)
    new_ptr = ptr + have
    nxt = pos_ext[new_ptr]
    body = (np.where(nxt < 0, wire.END, nxt).astype(wire.NEXT_DTYPE).tobytes()
            + q.astype(wire.data_dtype(wire.LANE_FLAGS[lane_bits])).tobytes())
    bits = lambda m: sum(1 << int(i) for i in np.flatnonzero(m))  # noqa: E731
    return body, bits(have), bits(nf), int(have.sum()), bool((nxt < 0).all()), new_ptr


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_narrow_fill_round_gives_the_reference_bytes_and_residual(variant, lane_bits):
    """Random tensors and rounds (NaN/Inf blocks, partial last blocks, shifts through ldexp's
    range): the same 16-/8-bit rows, header fields and pointers as numpy's stochastic
    rounding with rounding_noise's draws for each plan row, and the same residual bytes."""
    rng = np.random.default_rng(21 + lane_bits)
    width = wire.LANE_FLAGS[lane_bits]
    for _ in range(150):
        flat, pos_ext, ptr, pos, nonfinite, lane0, shift, B, k = random_case(rng, False)
        shift -= 30 - lane_bits  # random_case's int32 shift, for this lane's width
        seed, rank, step = int(rng.integers(0, 2**16)), int(rng.integers(0, 32)), int(
            rng.integers(0, 2**32))
        noise = rounding_noise(seed, rank, step, (int((pos_ext >= 0).sum()), B))
        want_res = rng.standard_normal(len(flat)).astype(np.float32)
        got_res = want_res.copy()
        want, present, nf_bits, nrows, last, new_ptr = reference_narrow_fill(
            flat, pos_ext, ptr, pos, nonfinite, lane0, shift, B, lane_bits, noise, want_res)
        dgram = bytearray(b"\xaa" * wire.packet_len(k, B, k))
        got_ptr = ptr.copy()
        got = _core.fill_round(dgram, flat, pos_ext, got_ptr, pos, nonfinite, lane0, shift,
                               False, B, 9, wire.FLAG_LOSS_TOLERANT | width, 2, 3,
                               (seed, rank, step), got_res)
        assert got == (present, nf_bits, nrows, last)
        assert bytes(dgram[wire.HEADER_LEN:wire.HEADER_LEN + len(want)]) == want
        h = wire.unpack_header(dgram)
        assert h.flags == wire.FLAG_LOSS_TOLERANT | width | (wire.FLAG_LAST if last else 0)
        np.testing.assert_array_equal(got_ptr, new_ptr)
        assert got_res.tobytes() == want_res.tobytes()


@pytest.mark.parametrize("lane_bits", [16, 8])
def test_narrow_deliver_writes_the_reference_values(lane_bits):
    """Random 16-/8-bit results: dequantized as numpy's dequantize (shifts through ldexp's
    range), NaN lanes, the next positions."""
    rng = np.random.default_rng(31 + lane_bits)
    width = wire.LANE_FLAGS[lane_bits]
    for _ in range(100):
        B = int(rng.choice([1, 3, 8, 256]))
        k = int(rng.choice([1, 7, 64]))
        n = int(rng.integers(k * B, 4 * B * k))
        nblocks = -(-n // B)
        # distinct blocks, the partial last one among them
        pos = np.append(rng.choice(nblocks - 1, k - 1, replace=False), nblocks - 1)
        present = int(rng.integers(0, 2 ** k, dtype=np.uint64))
        nonfinite = present & int(rng.integers(0, 2 ** k, dtype=np.uint64))
        rows = bin(present).count("1")
        dgram = bytearray(wire.packet_len(k, B, rows, width))
        data = rng.integers(-2**(lane_bits - 1), 2**(lane_bits - 1), (rows, B))
        dgram[wire.data_offset(k):] = data.astype(wire.data_dtype(width)).tobytes()
        nxt = rng.integers(0, 2**32 - 1, k, dtype=np.uint32)
        dgram[wire.HEADER_LEN:wire.data_offset(k)] = nxt.astype(wire.NEXT_DTYPE).tobytes()
        shift = int(rng.choice([0, 5, 14, 130, 160, -90]))
        want = rng.standard_normal(n).astype(np.float32)
        got = want.copy()
        if rows:
            scatter_blocks(want, pos[wire.lane_indices(present, k)],
                           dequantize(data.astype(wire.data_dtype(width)), shift), B)
        if nonfinite:
            scatter_blocks(want, pos[wire.lane_indices(nonfinite, k)], np.nan, B)
        got_pos = pos.copy()
        _core.deliver(dgram, got, got_pos, present, nonfinite, shift, False, B, width)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(got_pos, nxt.astype(np.int64))


def test_narrow_arguments_are_checked():
    """Both widths, a narrow int32 tensor, a narrow data round without draws, a residual on
    int32 lanes or of another size, a bad width for deliver: ValueError, nothing written."""
    flat = np.ones(8, np.float32)
    pos_ext = np.array([0, -1], np.int64)
    dgram = bytearray(wire.packet_len(1, 8, 1))
    args = (dgram, flat, pos_ext, np.array([0]), np.array([0]), None, 0, 3, False, 8, 1)
    for flags, integer, draws, res in (
            (wire.FLAGS_LANE_WIDTH, False, (1, 0, 1), None),
            (wire.FLAG_LANES16, True, (1, 0, 1), None),
            (wire.FLAG_LANES8, False, None, None),
            (0, False, None, np.zeros(8, np.float32))):
        a = list(args)
        a[8] = integer
        with pytest.raises(ValueError, match="lane width"):
            _core.fill_round(*a, flags, 0, 0, draws, res)
    with pytest.raises(ValueError, match="flat's size"):
        _core.fill_round(*args, wire.FLAG_LANES8, 0, 0, (1, 0, 1), np.zeros(9, np.float32))
    assert dgram == bytearray(wire.packet_len(1, 8, 1))
    out = np.zeros(8, np.float32)
    for width, integer in ((wire.FLAGS_LANE_WIDTH, False), (wire.FLAG_LANES16, True), (1, False)):
        with pytest.raises(ValueError, match="width"):
            _core.deliver(dgram, out, np.array([0], np.int64), 1, 0, 0, integer, 8, width)


def test_bad_arguments_raise_and_write_nothing():
    """Positions outside the tensor, a short datagram, a pointer off the plan: errors, not
    writes out of bounds."""
    flat = np.ones(10, np.float32)
    pos_ext = np.array([0, 5, -1], np.int64)
    dgram = bytearray(wire.packet_len(1, 4, 1))
    head = (1, 0, 0, 0)  # round, flags, priority, exponent
    with pytest.raises(IndexError, match="outside the tensor"):
        _core.fill_round(dgram, flat, pos_ext, np.array([1]), np.array([5]), None, 0, 0, False, 4,
                         *head)
    with pytest.raises(IndexError, match="outside pos_ext"):
        _core.fill_round(dgram, flat, pos_ext, np.array([3]), np.array([0]), None, 0, 0, False, 4,
                         *head)
    with pytest.raises(ValueError, match="too short"):
        _core.fill_round(bytearray(50), flat, pos_ext, np.array([0]), np.array([0]), None, 0, 0,
                         False, 4, *head)
    for field in ((2**32, 0, 0, 0), (1, 256, 0, 0), (1, 0, -1, 0), (1, 0, 0, 2**15)):
        with pytest.raises(ValueError, match="outside its field"):
            _core.fill_round(dgram, flat, pos_ext, np.array([0]), np.array([0]), None, 0, 0,
                             False, 4, *field)
    out = np.zeros(10, np.float32)
    with pytest.raises(IndexError, match="outside the output"):
        _core.deliver(bytearray(wire.packet_len(2, 4, 2)), out, np.array([0, 3], np.int64), 0b11,
                      0, 0, False, 4)
    assert not out.any()
    with pytest.raises(ValueError, match="shorter than its present rows"):
        _core.deliver(bytearray(60), out, np.array([0], np.int64), 1, 0, 0, False, 4)


def reference_block_scan(flat, bs, blocks=None):
    """block_scan in numpy: per block (the last one zero-padded, which changes neither the max
    nor the OR), the max of the bits without the sign bit and the OR of the bits."""
    n = len(flat)
    nb = -(-n // bs)
    pad = np.zeros(nb * bs, np.uint32)
    pad[:n] = flat.view(np.uint32)
    rows = pad.reshape(nb, bs)
    if blocks is not None:
        rows = rows[blocks]
    maxabs = (rows & 0x7FFFFFFF).max(axis=1, initial=0)
    orbits = np.bitwise_or.reduce(rows, axis=1) if len(rows) else np.zeros(0, np.uint32)
    return maxabs.astype(np.int32), orbits.view(np.int32)


@pytest.mark.parametrize("hinted", [False, True])
def test_block_scan_gives_the_reference_max_and_or(variant, hinted):
    """Every block (or the hinted ones only): the largest |x| bits and the OR of the bits, for
    odd block sizes, unaligned views, partial last blocks, NaN, Inf, -0.0 and int32 bit
    patterns with the sign bit set."""
    rng = np.random.default_rng(33)
    for _ in range(300):
        bs, n, skip = int(rng.integers(1, 70)), int(rng.integers(0, 600)), int(rng.integers(0, 2))
        x = np.zeros(n + skip, np.float32)[skip:]  # skip=1: not 8-byte aligned
        values = rng.random(n) < rng.random() * 0.3
        x[values] = rng.standard_normal(int(values.sum()))
        x[rng.random(n) < 0.05] = -0.0
        for special in (np.nan, np.inf, -np.inf):
            if n and rng.random() < 0.2:
                x[rng.integers(n)] = special
        if rng.random() < 0.3:  # int32 data: any bit pattern
            x.view(np.int32)[:] = np.where(rng.random(n) < 0.2,
                                           rng.integers(-2**31, 2**31, n), 0).astype(np.int32)
        nb = -(-n // bs)
        blocks = (np.flatnonzero(rng.random(nb) < 0.5) if hinted else None)
        got = np.empty(nb if blocks is None else len(blocks), np.int32), \
            np.empty(nb if blocks is None else len(blocks), np.int32)
        _core.block_scan(x, bs, got[0], got[1], blocks)
        want = reference_block_scan(x, bs, blocks)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_block_scan_checks_its_arguments():
    """Block indices outside the tensor and output arrays of the wrong size are errors, never
    reads or writes out of bounds."""
    flat = np.ones(10, np.float32)  # 3 blocks of 4
    out = np.zeros(2, np.int32), np.zeros(2, np.int32)
    with pytest.raises(IndexError, match="block 3 outside 0..2"):
        _core.block_scan(flat, 4, *out, np.array([0, 3], np.int64))
    with pytest.raises(IndexError, match="block -1 outside"):
        _core.block_scan(flat, 4, *out, np.array([-1, 0], np.int64))
    with pytest.raises(ValueError, match="need 3 items each"):
        _core.block_scan(flat, 4, *out, None)
    with pytest.raises(ValueError, match="block_size >= 1"):
        _core.block_scan(flat, 0, *out, None)
    assert not out[0].any() and not out[1].any()


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
                 RttEstimator())

    def flush():  # what the agent's _flush sends
        sent.extend(bytes(p) for p in call.outbox)
        call.outbox.clear()

    nz = [b for b in range(13) if b != 5]
    pos_ext, first, _ = lane_plan(nz, W, k)
    np.testing.assert_array_equal(call.pos_ext, pos_ext)
    st = call.slots[1]  # lanes 4..7: blocks 4 and 12, 6, 7
    ptr = first[4:8].copy()
    call.send_setup(st)
    flush()
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
        verdict, a = _core.check_answer(res, len(res), job.job, job.epoch, 9, job.slot_base, W)
        assert verdict == 0 and a[1] == st.index
        got = call.answer(res, a)
        flush()
        return got

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
    flush()
    assert (wire.unpack_header(sent[-1]).flags
            == wire.FLAG_LAST | wire.FLAG_RESEND | wire.FLAG_PARTIAL)
    assert sent[-1][wire.HEADER_LEN:] == want[wire.HEADER_LEN:]
    assert sent[-2] == want  # the stored datagram is unchanged


def random_header(rng) -> list:
    """Random values for every header field (HEADER_STRUCT order), each within its width."""
    return [int(rng.integers(0, 2 ** bits, dtype=np.uint64))
            - (2 ** (bits - 1) if code.islower() else 0)
            for _, code, bits in wire.HEADER_FIELDS]


def with_fields(fields: list, **changes) -> list:
    """`fields` (HEADER_STRUCT order) with the named ones changed."""
    return [changes.get(name, v) for name, v in zip(wire.FIELD_NAMES, fields)]


EXPECT = dict(job=7, epoch=3, call=11, slot_base=4, nslots=3)  # the call answers must belong to


def answer_datagram(rng, **fields) -> bytearray:
    """A well-formed answer of the EXPECT call (random lanes, rows, flags), fields changed."""
    k, B = int(rng.choice([1, 4, 64])), int(rng.choice([1, 8]))
    present = int(rng.integers(0, 2 ** k, dtype=np.uint64))
    h = dict(version=wire.VERSION, msg_type=int(rng.choice([wire.MSG_RESULT, wire.MSG_STATUS])),
             flags=int(rng.integers(0, 32)), priority=0, job=EXPECT["job"],
             epoch=EXPECT["epoch"], call=EXPECT["call"],
             slot=EXPECT["slot_base"] + int(rng.integers(0, EXPECT["nslots"])),
             rank=int(rng.integers(0, 32)), nlanes=k, round=int(rng.integers(0, 2**32)),
             length=int(rng.integers(0, 2**32)), block_size=B,
             exponent=int(rng.integers(-2**15, 2**15)), bitmap=int(rng.integers(0, 2**32)),
             present=present, nonfinite=present & int(rng.integers(0, 2 ** k, dtype=np.uint64)))
    h.update(fields)
    rows = bin(h["present"]).count("1") * B
    body = rng.integers(0, 256, 4 * k + 4 * rows, dtype=np.uint8).tobytes()
    return bytearray(wire.HEADER_STRUCT.pack(*(h[n] for n in wire.FIELD_NAMES)) + body)


def check(dgram, size=None):
    return _core.check_answer(dgram, len(dgram) if size is None else size, *EXPECT.values())


def test_check_answer_reads_the_wire_fields_and_agrees_with_header_error():
    """Random good answers: every field as wire.unpack_header reads it; random corruptions of
    one header byte or of the size: malformed exactly where wire.header_error says so, else
    an answer or not one of this call's."""
    rng = np.random.default_rng(21)
    for _ in range(400):
        d = answer_datagram(rng)
        verdict, a = check(d)
        h = wire.unpack_header(d)
        assert verdict == 0
        assert a == (0, h.slot - EXPECT["slot_base"], h.msg_type, h.flags, h.round, h.exponent,
                     h.bitmap, h.present, h.nonfinite, h.length, len(d))
        bad = bytearray(d) + bytes(4)  # room for a datagram 4 bytes too long
        i = int(rng.integers(0, wire.HEADER_LEN))
        bad[i] = int(rng.integers(0, 256))
        size = len(d) + int(rng.choice([0, 0, -1, 4, -len(d) + int(rng.integers(0, 48))]))
        verdict, _ = check(bad, size)
        t = wire.HEADER_STRUCT.unpack_from(bad)
        malformed = size < wire.HEADER_LEN or wire.header_error(t, size) is not None
        assert (verdict == 2) == malformed, (i, size, t)


@pytest.mark.parametrize("change", [dict(msg_type=wire.MSG_CONTRIB), dict(job=8), dict(epoch=4),
                                    dict(call=12), dict(slot=3), dict(slot=7)])
def test_check_answer_names_what_is_not_this_calls(change):
    """A contribution, another job, epoch or call, a slot outside the window: verdict 3."""
    rng = np.random.default_rng(1)
    assert check(answer_datagram(rng, **change)) == (3, None)


def test_check_answer_hands_all_gather_packets_over():
    """An all-gather packet, of this call's job or not: verdict 4 (the agent's all-gather's)."""
    rng = np.random.default_rng(1)
    for change in (dict(), dict(job=8), dict(call=12)):
        assert check(answer_datagram(rng, msg_type=wire.MSG_GATHER, **change)) == (4, None)


@pytest.fixture
def sockets():
    """An agent's socket (non-blocking), a switch's and a stranger's, all on 127.0.0.1."""
    made = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    for s in made:
        s.bind(("127.0.0.1", 0))
    made[0].setblocking(False)
    yield made
    for s in made:
        s.close()


def ip_of(sock) -> int:
    return int.from_bytes(socket.inet_aton(sock.getsockname()[0]), "big")


def test_recv_answers_keeps_only_the_switchs_well_formed_answers(sockets):
    """One batch of good answers with a malformed one, a truncated one, another job's and a
    stranger's among them: the good ones in order with their ring index, the malformed and
    truncated ones listed, the stranger's counted and never read, the other job's dropped."""
    agent, switch, stranger = sockets
    rng = np.random.default_rng(9)
    good = [answer_datagram(rng) for _ in range(5)]
    bad = answer_datagram(rng)
    bad[0] = 9  # version
    batch = [good[0], bad, good[1], bytes(30), good[2], answer_datagram(rng, job=99), good[3]]
    for d in batch:
        switch.sendto(d, agent.getsockname())
    stranger.sendto(good[4], agent.getsockname())
    stride = 1 << 16
    ring = bytearray(16 * stride)
    got = _core.recv_answers(agent.fileno(), ring, stride, ip_of(switch), switch.getsockname()[1],
                             *EXPECT.values())
    received, foreign, malformed, answers = got
    assert (received, foreign) == (8, 1)
    assert malformed == [(1, len(bad)), (3, 30)]
    assert [a[_A_INDEX] for a in answers] == [0, 2, 4, 6]
    for a, d in zip(answers, good):
        assert a[1:] == check(d)[1][1:]
        assert ring[a[_A_INDEX] * stride:a[_A_INDEX] * stride + len(d)] == d
    # nothing waiting: received 0, no error
    assert _core.recv_answers(agent.fileno(), ring, stride, ip_of(switch),
                              switch.getsockname()[1], *EXPECT.values()) == (0, 0, [], [])


def test_recv_answers_reads_at_most_a_ring_per_call(sockets):
    """More waiting than the ring holds: the rest stays for the next call, in order."""
    agent, switch, _ = sockets
    rng = np.random.default_rng(2)
    sent = [answer_datagram(rng) for _ in range(5)]
    for d in sent:
        switch.sendto(d, agent.getsockname())
    stride = 1 << 16
    ring = bytearray(3 * stride)
    args = (ip_of(switch), switch.getsockname()[1], *EXPECT.values())
    first = _core.recv_answers(agent.fileno(), ring, stride, *args)
    second = _core.recv_answers(agent.fileno(), ring, stride, *args)
    assert (first[0], second[0]) == (3, 2)
    assert [a[4] for a in first[3] + second[3]] == [wire.unpack_header(d).round for d in sent]


def test_send_batch_sends_every_datagram_in_order(sockets):
    """send_batch: each datagram arrives whole, in order, from the agent's socket."""
    agent, switch, _ = sockets
    rng = np.random.default_rng(4)
    dgrams = [bytearray(rng.integers(0, 256, int(n), dtype=np.uint8).tobytes())
              for n in rng.integers(2, 9000, 70)]  # more than one sendmmsg (64 at most)
    switch.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)  # room for all of them
    views = [memoryview(d)[:len(d) - 1] if i % 2 else d for i, d in enumerate(dgrams)]
    switch.settimeout(5)
    got = []
    reader = threading.Thread(target=lambda: got.extend(
        switch.recvfrom(1 << 16) for _ in range(len(views))))
    reader.start()
    assert _core.send_batch(agent.fileno(), views, ip_of(switch), switch.getsockname()[1]) == 0
    reader.join()
    assert [d for d, _ in got] == [bytes(v) for v in views]
    assert {a for _, a in got} == {agent.getsockname()}


def test_an_agent_drops_and_counts_only_the_bad_datagrams_among_good_ones():
    """A one-worker switch that sends, before each result, a malformed datagram, another job's
    answer and (from a stranger's socket) a copy of the result: the call's sum is exact, each
    bad datagram dropped and counted as before (malformed, foreign), none taken for a result."""
    from spina.config import JobConfig, WorkerAddr
    sw, stranger, me = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3))
    for s in (sw, stranger, me):
        s.bind(("127.0.0.1", 0))
    sw.settimeout(0.1)  # looks at `stop` this often
    stop = threading.Event()
    results = [0]

    def switch():  # echo every contribution as the result of one worker, with the bad ones
        while not stop.is_set():
            try:
                d, addr = sw.recvfrom(1 << 16)
            except socket.timeout:
                continue
            if d[1] != wire.MSG_CONTRIB:
                continue
            res = bytearray(d)
            res[1], res[wire.FIELD_OFFSET["bitmap"] + 3] = wire.MSG_RESULT, 1
            sw.sendto(res[:-1], addr)  # malformed: one byte short
            other = bytearray(res)
            other[wire.FIELD_OFFSET["job"] + 1] ^= 1
            sw.sendto(other, addr)  # another job's
            stranger.sendto(res, addr)  # not from the switch
            sw.sendto(res, addr)
            results[0] += 1

    t = threading.Thread(target=switch)
    t.start()
    job = JobConfig(job=1, workers=(WorkerAddr(0, *me.getsockname()),), block_size=16,
                    nlanes=4, nslots=3)
    agent = Agent(job, 0, sw.getsockname(), sock=me, rto=1.0, timeout=5)
    try:
        x = np.zeros(16 * 40, np.int32)
        x[::7] = np.arange(1, len(x[::7]) + 1)
        got = agent.allreduce(x)
        np.testing.assert_array_equal(got, x)
        st = agent.last_stats
        assert st.malformed_packets == st.foreign_packets == results[0] == st.packets_received
        assert st.resends == 0
    finally:
        stop.set()
        t.join()
        agent.close()
        sw.close()
        stranger.close()
