"""Exactness of sparse all-reduce through the software switch (host agents + UDP switch).

Run just this file: .venv/bin/python -m pytest tests/test_allreduce.py
"""
import numpy as np
import pytest

from host_agent.blocks import headroom_bits, nonzero_blocks, scan_float_blocks
from host_agent.local import LocalCluster

B, K, W = 16, 4, 3  # small blocks, lanes and window so that tests cover many rounds


def sparse(rng, n, density, bs=B, dtype=np.float32):
    nblocks = -(-n // bs)
    out = np.zeros(nblocks * bs, dtype)
    nz = np.flatnonzero(rng.random(nblocks) < density)
    if dtype == np.int32:
        vals = rng.integers(-2**28, 2**28, (len(nz), bs))
    else:
        vals = rng.standard_normal((len(nz), bs)) * 10.0 ** rng.integers(-3, 4, (len(nz), 1))
    out.reshape(nblocks, bs)[nz] = vals
    return out[:n]


def expected_rounds(tensors, bs=B, k=K, w=W):
    """Rounds the protocol needs: per slot in use, a setup round plus its busiest lane's union
    blocks; the slots in use are those whose lanes hold a position of the tensor (slot 0
    always)."""
    union = np.unique(np.concatenate([nonzero_blocks(t.view(np.int32) if t.dtype == np.float32
                                                     else t, bs) for t in tensors]))
    lanes = union % (w * k)
    per_lane = np.bincount(lanes, minlength=w * k).reshape(w, k)
    used = max(1, min(w, -(-len(tensors[0]) // (bs * k))))
    return int((1 + per_lane.max(axis=1))[:used].sum())


def float_bound(tensors):
    """N * 2**(-S-1) for the shift S the agents agree on, plus float32 rounding of the sum."""
    n = len(tensors)
    m = max(float(np.abs(t).max()) for t in tensors)
    if m == 0:
        return 0.0
    e = int(np.frexp(m)[1])
    exact = np.abs(np.sum(np.stack(tensors).astype(np.float64), axis=0)).max()
    return n * 2.0 ** (e + headroom_bits(n) - 31) + exact * 2.0 ** -24


def run(tensors, **kw):
    n = len(tensors)
    with LocalCluster(n, rto=5.0, block_size=B, nlanes=K, nslots=W, **kw) as c:
        res = c.allreduce(tensors)
        return res, c.switch.pipeline.job_counters(c.job.job), [a.last_stats for a in c.agents]


def check(tensors, res, counters, stats):
    n = len(tensors)
    for r in res[1:]:
        assert r.tobytes() == res[0].tobytes(), "ranks differ"
    exact = np.sum(np.stack(tensors), axis=0, dtype=tensors[0].dtype if tensors[0].dtype == np.int32
                   else np.float64)
    if tensors[0].dtype == np.int32:
        assert (res[0] == exact).all()
    else:
        assert np.abs(res[0] - exact).max(initial=0) <= float_bound(tensors)
    rounds = expected_rounds(tensors)
    for t, s in zip(tensors, stats):
        assert s.rounds == rounds
        assert s.payload_bytes_sent == 4 * B * len(nonzero_blocks(t.view(np.int32), B))
        assert s.resends == 0
    assert counters["job_aggregated"] == n * rounds
    assert counters["job_results"] == n * rounds  # one result per worker per round
    assert counters["job_duplicates"] == 0


@pytest.mark.parametrize("nworkers", [2, 3, 5, 8])
@pytest.mark.parametrize("density", [0.0, 0.001, 0.01, 0.1, 1.0])
def test_float32_exact_within_bound(nworkers, density):
    """float32 sums are within the quantization bound, identical on all ranks, at any density."""
    rng = np.random.default_rng([nworkers, int(density * 1000)])
    n = 20_011  # not a multiple of the block size
    xs = [sparse(rng, n, density) for _ in range(nworkers)]
    check(xs, *run(xs))


@pytest.mark.parametrize("nworkers", [2, 4, 8])
@pytest.mark.parametrize("density", [0.0, 0.01, 1.0])
def test_int32_bit_exact(nworkers, density):
    """int32 sums are bit-exact (no scaling) and identical on all ranks."""
    rng = np.random.default_rng([nworkers, int(density * 1000), 7])
    xs = [sparse(rng, 5_003, density, dtype=np.int32) for _ in range(nworkers)]
    check(xs, *run(xs))


def test_int32_wraps_like_numpy():
    """int32 overflow wraps modulo 2**32 exactly as numpy's int32 sum."""
    xs = [np.full(100, 2**31 - 1, np.int32), np.full(100, 5, np.int32), np.full(100, -3, np.int32)]
    res, *_ = run(xs)
    assert (res[0] == np.sum(np.stack(xs), axis=0, dtype=np.int32)).all()


def test_one_worker_has_data_others_empty():
    """Workers with all-zero tensors send no payload; the sum equals the one worker's data."""
    rng = np.random.default_rng(11)
    xs = [np.zeros(3000, np.float32) for _ in range(4)]
    xs[2] = sparse(rng, 3000, 0.3)
    res, counters, stats = run(xs)
    check(xs, res, counters, stats)
    assert [s.payload_bytes_sent for i, s in enumerate(stats) if i != 2] == [0, 0, 0]


def test_all_zero_costs_only_setup_round():
    """An all-zero call costs exactly one header-only packet per slot per worker."""
    xs = [np.zeros(10_000, np.float32)] * 3
    res, counters, stats = run(xs)
    assert (res[0] == 0).all()
    assert [s.packets_sent for s in stats] == [W] * 3
    assert [s.payload_bytes_sent for s in stats] == [0] * 3


@pytest.mark.parametrize("n", [1, B - 1, B, B + 1, W * K * B + 3])
def test_short_and_odd_lengths(n):
    """Tensors shorter than a block, or one element past a lane boundary, sum correctly."""
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    check(xs, *run(xs))


def test_any_shape_and_dtypes():
    """Shapes are kept; float16, float64 and int32 inputs come back in their own dtype."""
    rng = np.random.default_rng(5)
    with LocalCluster(2, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        for dtype in (np.float16, np.float64, np.int32):
            xs = [(rng.standard_normal((7, 33)) * 100).astype(dtype) for _ in range(2)]
            res = c.allreduce(xs)
            assert res[0].shape == (7, 33) and res[0].dtype == dtype
            assert res[0].tobytes() == res[1].tobytes()
            exact = xs[0].astype(np.float64) + xs[1]
            tol = 0 if dtype == np.int32 else (0.2 if dtype == np.float16 else 1e-4)
            assert np.abs(res[0] - exact).max() <= tol


def test_torch_bfloat16_and_float16():
    """torch bfloat16/float16 tensors are summed and returned as torch tensors of the same dtype."""
    import torch
    with LocalCluster(2, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        for dtype in (torch.bfloat16, torch.float16):
            xs = [torch.randn(1000).to(dtype) for _ in range(2)]
            res = c.allreduce(xs)
            assert res[0].dtype == dtype and torch.equal(res[0], res[1])
            exact = (xs[0].double() + xs[1].double()).to(dtype).double()
            assert torch.allclose(res[0].double(), exact, rtol=1e-2, atol=1e-2)


def test_nan_and_inf_blocks_are_nan_everywhere():
    """A NaN or Inf in one worker's block makes that whole block NaN on every rank, others exact."""
    rng = np.random.default_rng(9)
    xs = [sparse(rng, 4000, 0.5) for _ in range(3)]
    xs[0][17] = np.nan  # block 1
    xs[1][B * 100 + 3] = np.inf  # block 100
    with LocalCluster(3, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        res = c.allreduce(xs)
    assert res[0].tobytes() == res[1].tobytes() == res[2].tobytes()
    bad = np.zeros(4000, bool)
    bad[B:2 * B] = bad[100 * B:101 * B] = True
    assert np.isnan(res[0][bad]).all()
    clean = [np.where(bad, 0, x) for x in xs]
    exact = np.sum(np.stack(clean).astype(np.float64), axis=0)
    assert np.abs(res[0][~bad] - exact[~bad]).max() <= float_bound(clean)


def test_consecutive_calls_and_async():
    """Many calls in a row reuse the slots (rounds continue); allreduce_async gives the same
    sums."""
    rng = np.random.default_rng(3)
    with LocalCluster(3, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        for i in range(6):
            xs = [sparse(rng, 2000 + i, [0.0, 0.05, 1.0][i % 3]) for _ in range(3)]
            futs = [a.allreduce_async(x) for a, x in zip(c.agents, xs)]
            res = [f.result(timeout=30) for f in futs]
            assert res[0].tobytes() == res[2].tobytes()
            exact = np.sum(np.stack(xs).astype(np.float64), 0)
            assert np.abs(res[0] - exact).max() <= float_bound(xs)


def test_large_fusion_default_lanes():
    """With the default lanes (a 64 KB datagram) and window, a 1M-element tensor sums correctly."""
    rng = np.random.default_rng(1)
    xs = [sparse(rng, 1_000_000, 0.2, bs=256) for _ in range(4)]
    with LocalCluster(4, rto=1.0) as c:
        res = c.allreduce(xs)
        sent = c.agents[0].last_stats.payload_bytes_sent
        assert sent == 4 * 256 * len(nonzero_blocks(xs[0], 256))
    assert res[0].tobytes() == res[3].tobytes()
    assert np.abs(res[0] - np.sum(np.stack(xs).astype(np.float64), 0)).max() <= float_bound(xs)


def test_inplace_writes_the_sum_into_the_input():
    """inplace=True sums into the caller's array (float32 and int32) with the same bits."""
    rng = np.random.default_rng(12)
    with LocalCluster(3, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        for dtype in (np.float32, np.int32):
            xs = [sparse(rng, 3001, 0.3, dtype=dtype) for _ in range(3)]
            ref = c.allreduce(xs)
            bufs = [x.copy() for x in xs]
            futs = [a.allreduce_async(b, inplace=True) for a, b in zip(c.agents, bufs)]
            outs = [f.result(timeout=30) for f in futs]
            for o, b in zip(outs, bufs):
                assert np.shares_memory(o, b) and b.tobytes() == ref[0].tobytes()
        with pytest.raises(ValueError, match="inplace needs"):
            c.agents[0].allreduce(np.ones(10, np.float64), inplace=True)


def test_scan_finds_the_blocks_with_values_and_their_largest_magnitude():
    """scan_float_blocks and nonzero_blocks agree with their definitions, element by element,
    for odd block sizes, unaligned views, partial last blocks, NaN, Inf and -0.0."""
    rng = np.random.default_rng(21)
    for _ in range(200):
        bs, n, skip = int(rng.integers(1, 40)), int(rng.integers(0, 400)), int(rng.integers(0, 2))
        x = np.zeros(n + skip, np.float32)[skip:]  # skip=1: not 8-byte aligned
        values = rng.random(n) < rng.random() * 0.3
        x[values] = rng.standard_normal(int(values.sum()))
        x[rng.random(n) < 0.1] = -0.0
        for special in (np.nan, -np.inf):
            if n and rng.random() < 0.3:
                x[rng.integers(n)] = special
        nb = -(-n // bs)
        pad = np.zeros(nb * bs, np.float32)
        pad[:n] = x
        per_block = pad.reshape(nb, bs)
        bits = per_block.view(np.int32)
        nz, absmax, negzero = scan_float_blocks(x, bs)
        assert nz.tolist() == np.flatnonzero((per_block != 0).any(axis=1)).tolist()  # NaN != 0
        assert absmax.tolist() == (bits & 0x7FFFFFFF).max(axis=1, initial=0)[nz].tolist()
        assert negzero.tolist() == np.flatnonzero((per_block == 0).all(axis=1)
                                                  & np.signbit(per_block).any(axis=1)).tolist()
        assert nonzero_blocks(x, bs).tolist() == np.flatnonzero((bits != 0).any(axis=1)).tolist()


@pytest.mark.parametrize("inplace", [False, True])
def test_negative_zero_blocks_are_not_sent_and_sum_to_positive_zero(inplace):
    """A block of zeros is not sent whatever the signs of its zeros; every zero of a result is
    +0.0, so ranks agree bit for bit (in place too: a -0.0 block nobody sends becomes +0.0)."""
    xs = [np.zeros(12 * B, np.float32) for _ in range(3)]
    xs[0][2 * B:3 * B] = -0.0                               # only -0.0: not sent
    xs[0][5 * B:6 * B] = [-0.0] * (B // 2) + [1.0] * (B // 2)  # sent: its -0.0 sum to +0.0
    xs[0][9 * B:10 * B] = -0.0
    xs[1][9 * B:10 * B] = 2.0                               # rank 1 sends block 9
    xs[2][11 * B:] = 3.0
    want = np.zeros(12 * B, np.float32)
    want[5 * B + B // 2:6 * B], want[9 * B:10 * B], want[11 * B:] = 1.0, 2.0, 3.0
    with LocalCluster(3, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        bufs = [x.copy() for x in xs]
        if inplace:
            futs = [a.allreduce_async(b, inplace=True) for a, b in zip(c.agents, bufs)]
            res = [f.result(timeout=30) for f in futs]
        else:
            res = c.allreduce(bufs)
        stats = [a.last_stats for a in c.agents]
    for r in res:
        assert r.tobytes() == want.tobytes()
    assert [s.nonzero_blocks for s in stats] == [1, 1, 1]
    assert [s.payload_bytes_sent for s in stats] == [4 * B] * 3


def test_shifts_outside_the_float32_scale_range_are_exact():
    """Subnormal blocks (shift > 127) and huge ones (shift < -126) quantize through ldexp,
    next to normal ones; sums of exactly representable values come out exact."""
    rng = np.random.default_rng(5)
    xs = []
    for _ in range(3):
        x = np.zeros(40 * B, np.float32)
        x[:B] = rng.integers(-7, 8, B) * 2.0 ** -140     # block 0 (slot 0): subnormal
        x[4 * B:5 * B] = rng.integers(-7, 8, B) * 2.0 ** 120  # block 4 (slot 1): near the top
        x[8 * B:9 * B] = rng.integers(-7, 8, B) * 0.5      # block 8 (slot 2): ordinary
        xs.append(x)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0).astype(np.float32)
    res, _, stats = run(xs)
    for r in res:
        assert r.tobytes() == exact.tobytes()
    assert [s.nonzero_blocks for s in stats] == [3, 3, 3]


def test_check_blocks_from_the_environment_names_the_first_missed_block(monkeypatch):
    """$SPINA_CHECK_BLOCKS=1 turns the hint check on; it names the first block the hint misses."""
    monkeypatch.setenv("SPINA_CHECK_BLOCKS", "1")
    x = np.zeros(10 * B, np.float32)
    x[[3 * B + 1, 6 * B, 8 * B]] = -0.0, 1.0, 2.0  # -0.0 has a bit set: a hint must cover it
    with LocalCluster(1, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        with pytest.raises(ValueError, match=r"misses 2 non-zero block\(s\).*first \[3, 8\]"):
            c.agents[0].allreduce(x, blocks=[6])
        got = c.agents[0].allreduce(x, blocks=[3, 6, 8])
        assert got.tobytes() == np.where(x == 0, np.float32(0), x).tobytes()  # -0.0 sums to +0.0
    monkeypatch.setenv("SPINA_CHECK_BLOCKS", "0")
    with LocalCluster(1, rto=5.0, block_size=B, nlanes=K, nslots=W) as c:
        assert c.agents[0].allreduce(x, blocks=[6])[8 * B] == 0.0  # unchecked: block 8 not sent
