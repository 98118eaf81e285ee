"""Gradient compression (host_agent/compression/) and the agent's block hint.

Run just these tests:
    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_compression.py

Compressor tests run in this process on numpy arrays; hint tests on LocalCluster (a software
switch and agents on threads); the DDP test spawns 2 training processes (gloo group, file://
rendezvous) against a software switch running in this test process.
"""
import json
import math
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from host_agent.blocks import headroom_bits, nonzero_blocks
from host_agent.compression import BucketLayout, ResidualMemory, _kernels, kernels, make_compressor
from host_agent.hooks import (
    CompressionHookState,
    HookCounters,
    gloo_compressed_hook,
    pack_aligned,
    spina_compressed_hook,
    unpack_aligned,
)
from host_agent.local import LocalCluster
from softswitch.udp import Faults, UdpSwitch
from spina.config import ConfigError
from tests.test_torch_hook import FakeBucket, finish_worker

B = 16  # a small block size keeps the tests' tensors small


def _layout(*sizes, block_size=B):
    return BucketLayout.of(tuple(f"p{i}" for i in range(len(sizes))), list(sizes), block_size)


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("fields, name", [
    ({"ratio": 0.0}, "ratio"), ({"ratio": 1.5}, "ratio"), ({"ratio": -0.1}, "ratio"),
    ({"ratio": float("nan")}, "ratio"), ({"method": "topq"}, "method"),
    ({"momentum": 1.0}, "momentum"), ({"warmup_steps": -1}, "warmup_steps"),
    ({"min_blocks_per_param": -1}, "min_blocks_per_param"),
    ({"min_blocks_per_param": 1.5}, "min_blocks_per_param"),
    ({"ratio": 0.5, "warmup_steps": 10, "warmup_ratio": 0.1}, "warmup_ratio"),
    ({"ratio_max": 2.0}, "ratio_max"), ({"ratio_step": 1.0}, "ratio_step"),
    ({"ratio": 0.1, "ratio_max": 0.05}, "ratio_max"),
    ({"ratio": 0.1, "ratio_min": 0.2}, "ratio_min"),
])
def test_bad_configuration_is_rejected_naming_the_field(fields, name):
    """Ratios outside (0, 1], unknown methods and other bad fields fail naming the field."""
    with pytest.raises(ConfigError, match=f"field '{name}'"):
        make_compressor(**fields)


def test_unknown_config_key_is_rejected():
    """A mapping with a key that is no field fails naming the key."""
    with pytest.raises(ConfigError, match="unknown field 'ratoi'"):
        make_compressor({"method": "topk", "ratoi": 0.1})
    assert make_compressor({"method": "randomk", "ratio": 1.0}).config.ratio == 1.0


# ---------------------------------------------------------------- error feedback
def test_error_feedback_is_exact_over_steps():
    """Each element is either sent or kept, and sent + residual == sum of gradients exactly."""
    comp = make_compressor(method="topk", ratio=0.2, block_size=B)
    layout = _layout(300, 77)
    rng = np.random.default_rng(0)
    total_grad = np.zeros(layout.length, np.float32)
    total_sent = np.zeros(layout.length, np.float32)
    for step in range(20):
        # Integer-valued gradients: every float32 sum below is exact.
        raw = rng.integers(-50, 50, 377).astype(np.float32)
        g = pack_aligned(torch.from_numpy(raw), layout.src, layout.dst, layout.length)
        before = comp.memory.get(layout)["residual"] + g
        total_grad += g
        sel = comp.compress(layout, raw)
        comp.end_step()
        after = comp.memory.get(layout)["residual"]
        np.testing.assert_array_equal(sel.send + after, before)
        assert not ((sel.send != 0) & (after != 0)).any(), f"step {step}: an element counted twice"
        total_sent += sel.send
    np.testing.assert_array_equal(total_sent + comp.memory.get(layout)["residual"], total_grad)
    assert comp.step == 20


def test_momentum_correction_and_factor_masking_by_hand():
    """DGC: u = m u + g, v += u, send top blocks of v, clear them in v and u (values by hand)."""
    comp = make_compressor(method="topk", ratio=0.5, momentum=0.5, block_size=2)
    layout = _layout(4, block_size=2)
    sent = []
    for g in ([1, 1, 3, 3], [1, 1, 1, 1], [0, 0, 0, 0]):
        sent.append(comp.compress(layout, np.array(g, np.float32)).send.tolist())
        comp.end_step()
    assert sent == [[0, 0, 3, 3], [2.5, 2.5, 0, 0], [0, 0, 1.5, 1.5]]
    assert comp.memory.get(layout)["residual"].tolist() == [0, 0, 0, 0]
    assert comp.memory.get(layout)["momentum"].tolist() == [0, 0, 0, 0]


def test_masking_without_repeats_clears_only_the_velocity_of_blocks_that_waited():
    """mask_repeats=False: a block sent again the next step keeps its velocity (momentum SGD
    for it: u = m u + g sent whole), one that waited is cleared as DGC clears it; exact on a
    3-block bucket, one block a step, momentum 0.5."""
    layout = _layout(3 * B)
    comp = make_compressor(method="topk", ratio=0.1, momentum=0.5, mask_repeats=False,
                           block_size=B)
    dgc = make_compressor(method="topk", ratio=0.1, momentum=0.5, block_size=B)

    def step(c, g0, g1, g2):
        g = np.repeat(np.float32([g0, g1, g2]), B)
        sel = c.compress(layout, g)
        c.end_step()
        u = c.memory.get(layout)["momentum"].reshape(3, B)[:, 0]
        return sel.blocks.tolist(), sel.rows[:, 0].tolist(), u.tolist()

    # step 1: block 0 is first sent (it waited: cleared); blocks 1, 2 keep u = g
    assert step(comp, 4, 1, 2) == ([0], [4.0], [0.0, 1.0, 2.0])
    # step 2: block 0 again, u = g = 4 kept; v0 = 4; blocks 1, 2: u = 0.5 u + g, v += u
    assert step(comp, 4, 1, 1) == ([0], [4.0], [4.0, 1.5, 2.0])
    # step 3: block 0 again: u = 0.5 * 4 + 4 = 6, sent whole and kept
    assert step(comp, 4, 0, 0) == ([0], [6.0], [6.0, 0.75, 1.0])
    # DGC clears block 0's u each time: it sends 4, 4, then block 2 (v = 2 + 2 + 1 = 5 > 4)
    assert [step(dgc, *g)[:2] for g in ((4, 1, 2), (4, 1, 1), (4, 0, 0))] == [
        ([0], [4.0]), ([0], [4.0]), ([2], [5.0])]
    # step 4: block 2 (v = 2 + 2 + 1 + 0.5 = 5.5) waited: sent and its u cleared
    assert step(comp, 0, 0, 0) == ([2], [5.5], [3.0, 0.375, 0.0])
    assert comp.memory.get(layout)["residual"].reshape(3, B)[:, 0].tolist() == [3.0, 3.625, 0]


def test_min_blocks_per_param_raises_a_small_buckets_k():
    """min_blocks_per_param=1: a bucket of 4 tensors in 54 blocks sends 4 blocks at 1% (the
    ratio alone: 1), the largest by norm wherever they are; a big bucket keeps the ratio's k."""
    comp = make_compressor(method="topk", ratio=0.01, min_blocks_per_param=1, block_size=B)
    assert [comp.blocks_to_send(54, 4), comp.blocks_to_send(11_800, 4),
            comp.blocks_to_send(3, 4)] == [4, 118, 3]
    assert make_compressor(method="topk", ratio=0.01).blocks_to_send(54, 4) == 1
    layout = _layout(50 * B, 1, 2 * B, 1)  # conv2 weight and bias, conv1 weight and bias
    g = np.zeros(int(layout.sizes.sum()), np.float32)
    g[[3 * B, 10 * B, 50 * B]] = [5, 7, 3]  # blocks 3 and 10 of the first tensor, its bias
    g[50 * B + 1 + 5] = 9  # block 0 of the third tensor (block 51 of the bucket)
    assert comp.compress(layout, g).blocks.tolist() == [3, 10, 50, 51]


def test_momentum_without_masking_at_ratio_one_is_momentum_sgd():
    """momentum_masking=False, ratio 1: every step sends torch SGD's momentum buffer, bit for
    bit (u = m u + g, rounded twice as SGD's buf.mul_(m).add_(g))."""
    comp = make_compressor(method="topk", ratio=1.0, momentum=0.9, momentum_masking=False,
                           block_size=B)
    layout = _layout(8 * B)
    rng = np.random.default_rng(6)
    w = torch.nn.Parameter(torch.zeros(8 * B))
    sgd = torch.optim.SGD([w], lr=1.0, momentum=0.9)
    for _ in range(5):
        g = rng.standard_normal(layout.length).astype(np.float32)
        w.grad = torch.from_numpy(g.copy())
        sgd.step()
        sent = comp.compress(layout, g).send
        np.testing.assert_array_equal(sent, sgd.state[w]["momentum_buffer"].numpy())
        comp.end_step()


@pytest.mark.parametrize("fields", [dict(method="topk", ratio=0.1),
                                    dict(method="topk", ratio=0.1, momentum=0.9),
                                    dict(method="randomk", ratio=0.1),
                                    dict(method="scaled", ratio=0.1)])
def test_compress_into_the_kept_send_array_is_compress_then_write(fields):
    """compress(..., send): the same blocks, send array and residual as compress() then
    Selection.write, over steps, with the array cleared between steps as unpack clears it."""
    layout = _layout(300, 77, 1000, 8)
    a, b = make_compressor(block_size=B, **fields), make_compressor(block_size=B, **fields)
    kept = np.zeros(layout.length, np.float32)
    rng = np.random.default_rng(5)
    for _ in range(4):
        g = rng.standard_normal(int(layout.sizes.sum())).astype(np.float32)
        sa = a.compress(layout, g, kept)
        sb = b.compress(layout, g)
        a.end_step(), b.end_step()
        np.testing.assert_array_equal(sa.blocks, sb.blocks)
        assert sa.send is kept and sa.write(kept) is kept
        np.testing.assert_array_equal(_bits(kept), _bits(sb.send))
        for name, buf in a.memory.get(layout).items():
            np.testing.assert_array_equal(_bits(buf), _bits(b.memory.get(layout)[name]))
        kept.reshape(layout.nblocks, -1)[sa.blocks] = 0


def test_error_feedback_off_drops_the_rest():
    """error_feedback=False: no residual is kept; the send is the top blocks of the gradient."""
    comp = make_compressor(method="topk", ratio=0.5, error_feedback=False, block_size=2)
    layout = _layout(4, block_size=2)
    assert comp.compress(layout, np.array([1, 1, 3, 3], np.float32)).send.tolist() == [0, 0, 3, 3]
    assert comp.compress(layout, np.array([2, 2, 1, 1], np.float32)).send.tolist() == [2, 2, 0, 0]
    assert comp.memory.buffers[layout.key] == {}


def test_residual_moves_with_a_new_bucket_layout():
    """When DDP regroups parameters, each one's residual follows it; the old buffers go."""
    mem = ResidualMemory(("residual",))
    a = BucketLayout.of(("p", "q"), [20, 5], B)
    mem.get(a)["residual"][:] = np.arange(a.length)
    b1 = BucketLayout.of(("q",), [5], B)
    b2 = BucketLayout.of(("x", "p"), [3, 20], B)
    assert mem.get(b1)["residual"][:5].tolist() == list(range(32, 37))
    assert a.key in mem.buffers  # p still lives there
    assert mem.get(b2)["residual"][16:36].tolist() == list(range(20))
    assert a.key not in mem.buffers


# ---------------------------------------------------------------- the compiled pass
VARIANTS = ["generic"] + (["avx2"] if _kernels.VARIANT == "avx2" else [])


@pytest.fixture(params=VARIANTS)
def variant(request):
    """Each build of accumulate's block loop in turn (the CPU's default restored after)."""
    default = _kernels.VARIANT
    _kernels.set_variant(request.param)
    yield request.param
    _kernels.set_variant(default)


def _bits(a):
    return a.view(np.uint32)


@pytest.mark.parametrize("block_size", [256, 16, 13, 5])
@pytest.mark.parametrize("momentum", [None, 0.9])
def test_accumulate_is_its_numpy_definition_bit_for_bit(variant, block_size, momentum):
    """v += (u = m u + g, or g) and the lane-ordered block norms: identical bits to numpy,
    with partial blocks, padding, NaN, inf, -0.0 and subnormals in the data."""
    rng = np.random.default_rng(block_size)
    sizes = [300, 77, 1, 2 * block_size, 1000, 8]
    layout = _layout(*sizes, block_size=block_size)
    g = (rng.standard_normal(sum(sizes)) * 10.0 ** rng.integers(-3, 3, sum(sizes)))
    g = g.astype(np.float32)
    g[[5, 17, 400]] = [np.nan, np.inf, -0.0]
    g[[6, 7]] = np.float32(1e-42)  # subnormal
    v = rng.standard_normal(layout.length).astype(np.float32)  # padding not zero either
    u = None if momentum is None else rng.standard_normal(layout.length).astype(np.float32)
    v_ref, u_ref = v.copy(), None if u is None else u.copy()
    norms = kernels.accumulate(layout, g, v, u, momentum or 0.0)
    ref = kernels.accumulate_reference(layout, g, v_ref, u_ref, momentum or 0.0)
    np.testing.assert_array_equal(_bits(v), _bits(v_ref))
    if u is not None:
        np.testing.assert_array_equal(_bits(u), _bits(u_ref))
    finite = np.isfinite(ref)
    assert (np.isnan(norms) == np.isnan(ref)).all() and (~finite).sum() >= 1
    np.testing.assert_array_equal(_bits(norms[finite]), _bits(ref[finite]))
    # and the definition is a squared norm: a float64 sum differs by rounding only
    f64 = (v_ref.reshape(-1, block_size).astype(np.float64) ** 2).sum(1)
    np.testing.assert_allclose(ref[finite], f64[finite], rtol=1e-5)


def test_accumulate_refuses_bad_input():
    """Wrong dtypes, pieces outside the arrays, norms of the wrong length: one-line errors."""
    layout = _layout(40)
    v, norms = np.zeros(layout.length, np.float32), np.zeros(layout.nblocks, np.float32)
    with pytest.raises(TypeError, match="grad: needs float32 items, got format 'd'"):
        kernels.accumulate(layout, np.zeros(40), v)
    with pytest.raises(ValueError, match=r"piece 0 \(src 0, dst 0, size 40\) outside grad \(39\)"):
        kernels.accumulate(layout, np.zeros(39, np.float32), v)
    with pytest.raises(ValueError, match=r"norms \(and cand\) one item per block \(48"):
        _kernels.accumulate(np.zeros(40, np.float32), layout.src, layout.dst, layout.sizes, B,
                            v, None, 0.0, norms[:-1], -1, None)
    with pytest.raises(ValueError, match=r"norms \(and cand\) one item per block"):
        _kernels.accumulate(np.zeros(40, np.float32), layout.src, layout.dst, layout.sizes, B,
                            v, None, 0.0, norms, 0, np.zeros(layout.nblocks - 1, np.int64))
    with pytest.raises(ValueError, match="threshold is a norm key"):
        _kernels.accumulate(np.zeros(40, np.float32), layout.src, layout.dst, layout.sizes, B,
                            v, None, 0.0, norms, 0x7FC00001, None)
    two = _layout(20, 20)  # the second piece's blocks before the first's end: refused
    with pytest.raises(ValueError, match="before the previous piece's blocks end"):
        _kernels.accumulate(np.zeros(40, np.float32), two.src, two.dst[::-1].copy(), two.sizes,
                            B, np.zeros(two.length, np.float32), None, 0.0,
                            np.zeros(two.nblocks, np.float32), -1, None)


def test_accumulate_collects_the_blocks_at_or_above_the_threshold():
    """The pass's candidates: exactly the blocks whose new norm's key is >= the threshold, in
    increasing order, as their rank keys (NaN, inf and padding-only blocks included); none
    without a threshold."""
    rng = np.random.default_rng(4)
    layout = _layout(300, 77, 1, 2 * B, 1000, 8, block_size=B)
    g = rng.standard_normal(int(layout.sizes.sum())).astype(np.float32)
    g[[5, 17]] = [np.nan, np.inf]
    for thr in (0, 0x3F800000, 0x41000000, 0x7F800000, 0x7FC00000):
        v = rng.standard_normal(layout.length).astype(np.float32)
        cand = kernels.Candidates(layout.nblocks)
        cand.threshold = thr
        norms = kernels.accumulate(layout, g, v, None, 0.0, cand)
        expect = np.flatnonzero(kernels.norm_keys(norms) >= thr)
        assert cand.count == len(expect)
        np.testing.assert_array_equal(cand.blocks[:cand.count], kernels.rank_keys(norms, expect))
    cand.threshold = -1
    kernels.accumulate(layout, g, v, None, 0.0, cand)
    assert cand.count == -1


@pytest.mark.parametrize("block_size", [256, 16, 13])
@pytest.mark.parametrize("divisor", [1, 3, 4])
def test_unpack_is_its_numpy_definition_and_clears_what_the_sum_wrote(block_size, divisor):
    """The sum back into the bucket, divided: identical bits to numpy and to the dense hook's
    unpack_aligned (NaN, inf, -0.0, subnormals, a NaN block's padding), and the send array
    +0.0 everywhere after, so the hook can reuse it."""
    rng = np.random.default_rng(block_size + divisor)
    sizes = [300, 77, 1, 2 * block_size, 1000, 8]
    layout = _layout(*sizes, block_size=block_size)
    res = (rng.standard_normal(layout.length) * 10.0 ** rng.integers(-3, 3, layout.length))
    res = res.astype(np.float32).reshape(-1, block_size)
    res[rng.random(layout.nblocks) < 0.6] = 0  # most blocks: nobody sent them
    res[1] = np.nan  # a block some rank sent with NaN: the agent writes it whole, padding too
    res[2] = 0
    res[2, 3] = -0.0  # a block of zeros but one -0.0: its bits are not zero
    res = res.reshape(-1)
    res[[5, 17, 400]] = [np.inf, -np.inf, np.float32(1e-42)]
    for _, d, k in layout.pieces():  # the padding of other blocks: zero, as the agent's sums
        res[d + k:d + -(-k // block_size) * block_size] = 0
    res.reshape(-1, block_size)[1] = np.nan
    res_ref, dense = res.copy(), res.copy()
    out = np.full(sum(sizes), 7, np.float32)
    out_ref = out.copy()
    kernels.unpack(layout, res, out, divisor)
    kernels.unpack_reference(layout, res_ref, out_ref, divisor)
    np.testing.assert_array_equal(_bits(out), _bits(out_ref))
    assert np.isnan(out).any() and (_bits(out) == _bits(np.float32(-0.0))).any()
    like = torch.zeros(sum(sizes))
    old = unpack_aligned(dense, layout.src, layout.dst, like, divisor).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(old))
    finite = ~np.isnan(out)  # NaN payloads aside, every bit as the dense hook's path
    np.testing.assert_array_equal(_bits(out[finite]), _bits(old[finite]))
    assert not _bits(res).any() and not _bits(res_ref).any()  # cleared: ready for reuse


def test_unpack_refuses_bad_input():
    """A read-only or wrongly typed array, a piece outside, a divisor below 1: one-line errors."""
    layout = _layout(40)
    res, out = np.zeros(layout.length, np.float32), np.zeros(40, np.float32)
    with pytest.raises(TypeError, match="out: needs float32 items, got format 'd'"):
        kernels.unpack(layout, res, np.zeros(40))
    with pytest.raises(ValueError, match=r"piece 0 \(src 0, dst 0, size 40\) outside out \(39\)"):
        kernels.unpack(layout, res, out[:39])
    with pytest.raises(ValueError, match="divisor >= 1"):
        kernels.unpack(layout, res, out, 0)
    res.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        kernels.unpack(layout, res, out)


@pytest.mark.parametrize("clear, with_u", [(True, True), (True, False), (False, False)])
def test_take_is_numpy_gather_and_clear(clear, with_u):
    """take: the rows bit for bit as v2d[blocks] (NaN, -0.0 included), or the same blocks of
    a send array (nothing else of it written), exactly those blocks cleared in v (if asked)
    and u; a block outside v, a send array of another length are refused."""
    rng = np.random.default_rng(3)
    for k, into_send in ((0, False), (1, False), (37, False), (0, True), (1, True), (37, True)):
        v = rng.standard_normal(100 * 13).astype(np.float32)
        v[[5, 6]] = [np.nan, -0.0]
        u = rng.standard_normal(v.size).astype(np.float32) if with_u else None
        blocks = np.sort(rng.choice(100, k, replace=False)).astype(np.int64)
        if k:
            blocks[0] = 0  # the block with NaN and -0.0
        v_ref, u_ref = v.reshape(-1, 13).copy(), None if u is None else u.reshape(-1, 13).copy()
        if into_send:
            send = np.full(v.size, 7, np.float32)  # 7: what take must leave alone
            assert kernels.take(v, blocks, 13, clear, u, send) is send
            expect = np.full((100, 13), 7, np.float32)
            expect[blocks] = v_ref[blocks]
            np.testing.assert_array_equal(_bits(send), _bits(expect.reshape(-1)))
        else:
            rows = kernels.take(v, blocks, 13, clear, u)
            np.testing.assert_array_equal(_bits(rows), _bits(v_ref[blocks]))
        if clear:
            v_ref[blocks] = 0
        if u is not None:
            u_ref[blocks] = 0
            np.testing.assert_array_equal(_bits(u), _bits(u_ref.reshape(-1)))
        np.testing.assert_array_equal(_bits(v), _bits(v_ref.reshape(-1)))
    with pytest.raises(ValueError, match="take: block 100 outside v's 100 blocks"):
        kernels.take(v, np.array([3, 100]), 13)
    with pytest.raises(ValueError, match=r"take: dest needs 1300 items \(as v\)"):
        kernels.take(v, np.array([3]), 13, True, None, np.zeros(1299, np.float32))


def _check_top(norms, k, seed, nsample=kernels.SAMPLE):
    """top_blocks against its numpy definition; returns (candidates, threshold)."""
    out = np.full(len(norms), -7, np.int64)
    count, cand, thr = _kernels.top_blocks(norms, k, nsample, seed, out, -1, 0)
    sample_thr = kernels.sample_threshold_reference(norms, k, seed, nsample)
    ref, ref_cand, ref_thr = kernels.top_blocks_reference(norms, k, sample_thr)
    assert count == min(k, len(norms))  # the documented bound: exactly k, always
    np.testing.assert_array_equal(out[:count], ref)
    np.testing.assert_array_equal(ref, kernels.top_blocks_reference(norms, k)[0])  # it prunes
    assert (cand, thr) == (ref_cand, ref_thr)
    return cand, thr


def test_top_blocks_is_its_numpy_definition():
    """Random sizes, k, seeds, ties and NaN: the same candidates, threshold and exact top k."""
    rng = np.random.default_rng(7)
    sampled = 0
    for trial in range(150):
        n = int(rng.integers(1, 60000))
        k = int(rng.integers(0, n + 2)) if trial % 2 else max(1, n // 100)
        norms = (rng.random(n) ** 3).astype(np.float32)
        if trial % 3 == 0:
            norms = np.round(norms * 10).astype(np.float32)  # many ties
        if trial % 5 == 0:
            norms[rng.integers(0, n, 3)] = np.nan
        cand, thr = _check_top(norms, k, int(rng.integers(0, 2 ** 63)))
        sampled += thr >= 0
        assert k <= cand <= n or k >= n
    assert sampled >= 50  # most k = 1% cases went through the sample


def test_top_blocks_takes_the_pass_candidates_between_k_and_4k():
    """Candidates from the pass (k to 4 k of them) replace the sample: the threshold they were
    collected at is kept, the result is the exact top k; too few or too many: a new sample,
    the same result. Over training-like steps the kept threshold carries on."""
    rng = np.random.default_rng(9)
    n, k = 20577, 206
    for trial in range(60):
        norms = (rng.random(n) ** 3).astype(np.float32)
        if trial % 3 == 0:
            norms = np.round(norms * 50).astype(np.float32)  # ties
        if trial % 7 == 0:
            norms[rng.integers(0, n, 2)] = np.nan
        keys = kernels.norm_keys(norms)
        thr = int(np.sort(keys)[n - int(rng.integers(k // 2, 6 * k))])  # k/2 .. 6k candidates
        given = np.flatnonzero(keys >= thr)
        cand = kernels.Candidates(n)
        cand.blocks[:len(given)] = kernels.rank_keys(norms, given)
        cand.count, cand.threshold = len(given), thr
        blocks = kernels.top_blocks(norms, k, seed=trial, candidates=cand)
        np.testing.assert_array_equal(blocks, kernels.top_blocks_reference(norms, k)[0])
        if k <= len(given) <= 4 * k:
            assert cand.threshold == thr  # kept: no sample drawn
        else:  # a new sample's threshold, as without candidates
            assert cand.threshold == kernels.top_blocks_reference(
                norms, k, kernels.sample_threshold_reference(norms, k, trial))[2]
    # exactly k candidates: all of them, no partial sort
    norms = rng.permutation(n).astype(np.float32)
    given = np.flatnonzero(norms >= n - k)
    cand = kernels.Candidates(n)
    cand.blocks[:k], cand.count = kernels.rank_keys(norms, given), k
    cand.threshold = int(kernels.norm_keys(np.float32([n - k]))[0])
    np.testing.assert_array_equal(kernels.top_blocks(norms, k, candidates=cand), given)
    # a wrong candidate list is refused (top_blocks reads the blocks it names)
    out = kernels.rank_keys(norms, np.arange(n))
    out[3] = kernels.rank_keys(norms, np.array([2]))[0]
    with pytest.raises(ValueError, match="given candidate 3 .* not increasing"):
        _kernels.top_blocks(norms, k, 1024, 0, out, 2 * k, 0)
    out[3] = 0xFFFFFFFF - n  # block n
    with pytest.raises(ValueError, match="given candidate 3 .* outside"):
        _kernels.top_blocks(norms, k, 1024, 0, out, 2 * k, 0)


def test_top_blocks_order_ties_and_nan():
    """Equal norms go to the lower index; NaN ranks above +inf, +inf above the rest."""
    norms = np.array([1, 3, 3, np.inf, 0, np.nan, 3, 2], np.float32)
    assert kernels.top_blocks(norms, 4, nsample=0).tolist() == [1, 2, 3, 5]
    assert kernels.top_blocks(norms, 1).tolist() == [5]
    assert kernels.top_blocks(np.ones(50000, np.float32), 3).tolist() == [0, 1, 2]
    assert kernels.top_blocks(norms, 0).tolist() == []
    assert kernels.top_blocks(norms, 9).tolist() == list(range(8))


def test_top_blocks_falls_back_to_all_when_the_sample_overestimates():
    """Large norms exactly at the sampled blocks: fewer than k candidates, so all blocks are
    candidates (threshold -1) and the result is still the exact top k."""
    n, k, seed = 100000, 500, 11
    rng = np.random.default_rng(8)
    norms = rng.random(n).astype(np.float32)
    norms[kernels.sample_positions(n, kernels.SAMPLE, seed)] += 10
    assert _check_top(norms, k, seed) == (n, -1)
    norms = rng.random(n).astype(np.float32)  # no trap: the sample is used
    cand, thr = _check_top(norms, k, seed)
    assert thr >= 0 and k <= cand < 3 * k


def test_error_feedback_identity_with_float_gradients_and_momentum():
    """send + residual_after == residual_before + (m u + g) bit for bit, u cleared where sent."""
    rng = np.random.default_rng(9)
    layout = _layout(3000, 500, 17)
    comp = make_compressor(method="topk", ratio=0.05, momentum=0.9, block_size=B)
    m = np.float32(0.9)
    for _ in range(10):
        g = rng.standard_normal(3517).astype(np.float32)
        mem = comp.memory.get(layout)
        r0, u0 = mem["residual"].copy(), mem["momentum"].copy()
        ga = pack_aligned(torch.from_numpy(g), layout.src, layout.dst, layout.length)
        u1 = m * u0 + ga
        sel = comp.compress(layout, g)
        comp.end_step()
        np.testing.assert_array_equal(sel.send + mem["residual"], r0 + u1)
        assert not ((sel.send != 0) & (mem["residual"] != 0)).any()
        sent = np.zeros(layout.nblocks, bool)
        sent[sel.blocks] = True
        u2d = mem["momentum"].reshape(-1, B)
        np.testing.assert_array_equal(u2d[~sent], u1.reshape(-1, B)[~sent])
        assert not u2d[sent].any()


# ---------------------------------------------------------------- selection
def test_mask_equals_the_blocks_sent_and_k_follows_the_ratio():
    """The selection's blocks are exactly the non-zero blocks of what is sent, k = ceil(r n)."""
    rng = np.random.default_rng(1)
    layout = _layout(1000, 600)
    for method in ("topk", "randomk", "losscomp"):
        comp = make_compressor(method=method, ratio=0.07, block_size=B)
        sel = comp.compress(layout, rng.standard_normal(layout.length).astype(np.float32))
        assert len(sel.blocks) == math.ceil(0.07 * layout.nblocks) == 8, method  # of 101
        np.testing.assert_array_equal(nonzero_blocks(sel.send, B), sel.blocks)


def test_topk_picks_the_largest_blocks():
    """Block top-k sends the blocks with the largest L2 norm, nothing else."""
    g = np.ones(10 * B, np.float32)
    g[3 * B] = 5  # block 3: norm^2 = 15 + 25
    g[7 * B:8 * B] = 2  # block 7: norm^2 = 64
    sel = make_compressor(method="topk", ratio=0.2, block_size=B).compress(_layout(10 * B), g)
    assert sel.blocks.tolist() == [3, 7]


def test_warmup_schedule_lowers_the_ratio_geometrically():
    """Warm-up: k goes 250, 112, 50, 23, 10 blocks of 1000 over 4 steps, then stays at 1%."""
    comp = make_compressor(method="topk", ratio=0.01, warmup_steps=4, warmup_ratio=0.25,
                           block_size=B)
    layout = _layout(1000 * B)
    ks = []
    for _ in range(6):
        ks.append(len(comp.compress(layout, np.ones(layout.length, np.float32)).blocks))
        comp.end_step()
    assert ks == [250, 112, 50, 23, 10, 10]


def test_randomk_is_the_same_on_every_rank_and_changes_per_step():
    """Random-k draws from (seed, step, bucket): ranks agree whatever their gradients."""
    layout = _layout(100 * B)
    a, b = (make_compressor(method="randomk", ratio=0.05, block_size=B) for _ in range(2))
    rng = np.random.default_rng(2)
    picks = []
    for _ in range(3):
        sa = a.compress(layout, rng.standard_normal(layout.length).astype(np.float32)).blocks
        sb = b.compress(layout, rng.standard_normal(layout.length).astype(np.float32)).blocks
        np.testing.assert_array_equal(sa, sb)
        picks.append(sa.tolist())
        a.end_step()
        b.end_step()
    assert len(picks[0]) == 5 and picks[0] != picks[1] != picks[2]


def test_scaled_sends_from_every_layer_with_the_fresh_gradient_norm():
    """Scaling+mask: every layer sends ceil(r * its blocks); each layer's sent norm = ||g_l||."""
    layout = _layout(40 * B, 3 * B, 5)
    comp = make_compressor(method="scaled", ratio=0.1, block_size=B)
    rng = np.random.default_rng(3)
    for _ in range(3):  # the residual grows, the sent norm still follows the fresh gradient
        raw = rng.standard_normal(43 * B + 5).astype(np.float32)
        g = pack_aligned(torch.from_numpy(raw), layout.src, layout.dst, layout.length)
        sel = comp.compress(layout, raw)
        comp.end_step()
        seg = layout.block_segments()
        assert np.bincount(seg[sel.blocks], minlength=3).tolist() == [4, 1, 1]
        for layer in range(3):
            rows = seg == layer
            sent = np.linalg.norm(sel.send.reshape(-1, B)[rows])
            np.testing.assert_allclose(sent, np.linalg.norm(g.reshape(-1, B)[rows]), rtol=1e-5)


def test_losscomp_credits_blocks_sent_before_a_loss_drop():
    """LossComp: blocks sent the step before a loss drop gain credit; others only decay."""
    layout = _layout(20 * B)
    comp = make_compressor(method="losscomp", ratio=0.1, loss_window=4, block_size=B)
    g = np.zeros(layout.length, np.float32)
    g[5 * B:7 * B] = 1  # only blocks 5 and 6 have mass: they are the ones sampled
    first = comp.compress(layout, g.copy()).blocks
    comp.end_step()
    comp.observe_loss(2.0)
    comp.compress(layout, np.zeros(layout.length, np.float32))
    comp.end_step()
    comp.observe_loss(1.0)  # fell by half after the first step's blocks were applied
    credit = comp.credit[layout.key]
    assert first.tolist() == [5, 6]
    np.testing.assert_allclose(credit[first], 0.5 / 4)
    assert (np.delete(credit, first) == 0).all()


def test_losscomp_ratio_follows_the_loss_trend():
    """A window whose loss fell > 2% lowers the ratio by 1.25; a flat one raises it; bounded."""
    comp = make_compressor(method="losscomp", ratio=0.1, loss_window=2, ratio_min=0.06,
                           ratio_max=0.2, block_size=B)
    ratios = []
    for loss in (4, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1):
        comp.observe_loss(loss)
        ratios.append(comp.current_ratio())
    np.testing.assert_allclose(ratios[1::2],
                               [0.1, 0.08, 0.064, 0.08, 0.1, 0.125, 0.15625, 0.1953125, 0.2])


# ---------------------------------------------------------------- the agent's block hint
def _sparse(rng, n, nblocks_nz, dtype=np.float32):
    x = np.zeros(n, dtype)
    blocks = np.sort(rng.choice(-(-n // B), nblocks_nz, replace=False))
    for b in blocks:  # test data set-up, not the data path
        x[b * B:(b + 1) * B] = rng.integers(-1000, 1000, B)[:len(x[b * B:(b + 1) * B])]
    return x, blocks


@pytest.mark.parametrize("nnz", [9, 45])  # hinted blocks gathered; over a third: one scan
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_block_hint_gives_the_same_result_and_sends_only_those_blocks(dtype, nnz):
    """With the hint (a superset of the non-zero blocks) results are bit-identical to a scan."""
    rng = np.random.default_rng(4)
    n = 60 * B + 7  # a partial last block
    xs, hints = zip(*(_sparse(rng, n, nnz, dtype) for _ in range(3)))
    xs[0][-3:] = 5  # the partial last block is non-zero at rank 0
    hints = [np.union1d(h, [3, 60]).astype(np.int64) for h in hints]  # plus zero blocks
    with LocalCluster(3, block_size=B, nlanes=4, nslots=4) as c:
        plain = c.allreduce(list(xs))
        plain_blocks = [a.last_stats.nonzero_blocks for a in c.agents]
        hinted = c.allreduce(list(xs), blocks=hints)
        stats = [a.last_stats for a in c.agents]
    for p, h in zip(plain, hinted):
        np.testing.assert_array_equal(p, h)
    assert ([s.nonzero_blocks for s in stats] == plain_blocks
            == [len(nonzero_blocks(x, B)) for x in xs])
    assert all(s.payload_bytes_sent == s.nonzero_blocks * B * 4 for s in stats)


def test_block_hint_check_catches_a_wrong_mask():
    """check_blocks: a hint missing a non-zero block, or unsorted, fails naming the block."""
    x = np.zeros(10 * B, np.float32)
    x[[2 * B, 7 * B + 3]] = 1.0
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        agent = c.agents[0]
        agent.check_blocks = True
        with pytest.raises(ValueError, match=r"misses 1 non-zero block\(s\) .*first \[7\]"):
            agent.allreduce(x, blocks=[2, 5])
        with pytest.raises(ValueError, match="strictly increasing"):
            agent.allreduce(x, blocks=[7, 2])
        np.testing.assert_array_equal(agent.allreduce(x, blocks=[2, 7]), x)


def test_compressed_sum_through_the_switch():
    """Each rank's selection goes through the hinted agent; the switch sums the union."""
    rng = np.random.default_rng(5)
    layout = _layout(64 * B)
    comps = [make_compressor(method="topk", ratio=0.1, block_size=B) for _ in range(2)]
    sels = [c.compress(layout, rng.standard_normal(layout.length).astype(np.float32))
            for c in comps]
    with LocalCluster(2, block_size=B, nlanes=4, nslots=4) as c:
        out = c.allreduce([s.send for s in sels], blocks=[s.blocks for s in sels])
        stats = [a.last_stats for a in c.agents]
    np.testing.assert_array_equal(out[0], out[1])
    exact = sels[0].send + sels[1].send
    e = math.frexp(float(np.abs(exact).max()))[1]
    assert np.abs(out[0] - exact).max() <= 2.0 ** (e + headroom_bits(2) - 31) * 2
    assert [s.payload_bytes_sent for s in stats] == [7 * B * 4] * 2
    union = np.union1d(sels[0].blocks, sels[1].blocks)
    np.testing.assert_array_equal(nonzero_blocks(out[0], B), union)


# ---------------------------------------------------------------- hook state
@pytest.mark.parametrize("comp_block", [512, 128])
def test_a_compressor_with_other_blocks_than_the_job_is_refused(comp_block):
    """Blocks of 512 (or 128) on a job of 256: refused when the state is built, naming both."""
    with LocalCluster(1, block_size=256, nlanes=4, nslots=2) as c:
        comp = make_compressor(method="topk", ratio=0.01, block_size=comp_block)
        with pytest.raises(ConfigError, match=rf"field 'block_size': the compressor's blocks "
                                              rf"have {comp_block} elements, job 1's have 256"):
            CompressionHookState(comp, c.agents[0])
        CompressionHookState(make_compressor(block_size=256), c.agents[0])  # the job's: fine


def test_double_momentum_is_refused():
    """Compressor momentum (DGC) with an optimiser's own momentum: refused, naming both."""
    params = [torch.nn.Parameter(torch.zeros(3))]
    comp = make_compressor(method="topk", momentum=0.9, block_size=B)
    state = CompressionHookState(comp, world_size=1)
    with pytest.raises(ConfigError, match=r"field 'momentum': the compressor applies momentum "
                                          r"0\.9 .* param group 0 has momentum 0\.5"):
        CompressionHookState(comp, world_size=1,
                             optimizer=torch.optim.SGD(params, lr=0.1, momentum=0.5))
    CompressionHookState(comp, world_size=1, optimizer=torch.optim.SGD(params, lr=0.1))
    CompressionHookState(make_compressor(block_size=B), world_size=1,
                         optimizer=torch.optim.SGD(params, lr=0.1, momentum=0.9))
    assert state.calls == 0


def test_compressed_state_reports_the_agents_call_stats_with_resends():
    """The compressed state sums the agent's CallStats as the dense state does: a lost packet
    shows up as a resend in both the agent's stats and the state."""
    dropped = []

    def drop_first_of_rank0(h):  # one contribution of rank 0 is lost, once
        if h.rank == 0 and h.msg_type == 1 and not dropped:
            dropped.append(h)
            return True
        return False
    with UdpSwitch(port=0, faults=Faults(drop_in_match=drop_first_of_rank0)) as sw, \
            LocalCluster(2, switch=sw, block_size=B, nlanes=4, nslots=2) as c:
        states = [CompressionHookState(make_compressor(method="topk", ratio=0.25, block_size=B),
                                       a) for a in c.agents]
        xs = [torch.arange(40 * B, dtype=torch.float32) * (r + 1) for r in range(2)]
        futs = [spina_compressed_hook(s, FakeBucket(x)) for s, x in zip(states, xs)]
        for f in futs:
            f.wait()
        stats = [a.last_stats for a in c.agents]
    assert len(dropped) == 1 and stats[0].resends >= 1
    for state, st in zip(states, stats):
        assert (state.calls, state.elements) == (1, 40 * B)
        for name in HookCounters.COUNTERS[2:]:
            assert getattr(state, name) == getattr(st, name), name
        assert (state.blocks_sent, state.blocks_total) == (10, 40)


class _OwnedLock:
    """A lock that knows which thread holds it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.owner = None

    def __enter__(self):
        self._lock.acquire()
        self.owner = threading.get_ident()

    def __exit__(self, *exc):
        self.owner = None
        self._lock.release()


class _CheckedState(CompressionHookState):
    """Fails any counter write made without holding the state's lock."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._lock = _OwnedLock()

    def __setattr__(self, name, value):
        lock = getattr(self, "_lock", None)
        if name in self.COUNTERS and isinstance(lock, _OwnedLock):
            assert lock.owner == threading.get_ident(), f"{name} written without the lock"
        super().__setattr__(name, value)


def test_every_counter_update_of_both_hooks_holds_the_lock(tmp_path):
    """SpINA's callbacks (agent thread) and gloo's (its threads) write counters under the lock."""
    x = torch.arange(40 * B, dtype=torch.float32)
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        state = _CheckedState(make_compressor(method="topk", ratio=0.25, block_size=B),
                              c.agents[0])
        spina_compressed_hook(state, FakeBucket(x.clone())).wait()
    assert (state.calls, state.blocks_sent, state.bytes_sent > 0) == (1, 10, True)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rv", rank=0, world_size=1)
    try:
        for method in ("topk", "none"):  # all_gather of the blocks; all_reduce when dense
            state = _CheckedState(make_compressor(method=method, ratio=0.25, block_size=B))
            got = gloo_compressed_hook(state, FakeBucket(x.clone())).wait()
            assert state.calls == 1 and state.seconds > 0, method
    finally:
        dist.destroy_process_group()
    assert got.tolist() == x.tolist()


def test_concurrent_counter_updates_lose_nothing():
    """8 threads x 5000 updates, switching threads every microsecond: exact totals."""
    state = CompressionHookState(make_compressor(block_size=B), world_size=1)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch between a counter's read and write is likely

    def work():
        for _ in range(5000):
            state.add(calls=1, seconds=float(len(str(0.5))) - 2.0, bytes_sent=3)
    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert (state.calls, state.seconds, state.bytes_sent) == (40000, 40000.0, 120000)


# ---------------------------------------------------------------- DDP hooks
WORLD = 2
STEPS = 3
MICRO = 2  # no_sync micro-batches before each synchronised one
CONFIGS = [("spina", {"method": "topk", "ratio": 0.1, "momentum": 0.9}),
           ("spina", {"method": "randomk", "ratio": 0.1}),
           ("spina", {"method": "scaled", "ratio": 0.1}),
           ("spina", {"method": "losscomp", "ratio": 0.1}),
           ("gloo", {"method": "topk", "ratio": 0.1})]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)
        self.unused = torch.nn.Linear(8, 8)  # never in forward: zeros in DDP's bucket

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _ddp_worker(rank, tmp):
    """Every config: STEPS steps of MICRO no_sync backward passes plus one synchronised."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=WORLD)
    from host_agent.assignment import agent_from_env
    agent = agent_from_env(f"{tmp}/job.json", rank=rank, timeout=20)
    agent.check_blocks = True  # every hint is verified against a full scan
    report = []
    for transport, fields in CONFIGS:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(_Net(), find_unused_parameters=True)
        comp = make_compressor(block_size=B, **fields)
        state = CompressionHookState(comp, agent if transport == "spina" else None)
        model.register_comm_hook(state, spina_compressed_hook if transport == "spina"
                                 else gloo_compressed_hook)
        local = _Net()  # a plain replica: the accumulated gradient the hook must see
        records = []
        original = comp.compress

        def recording(layout, grad, send=None, original=original, records=records, comp=comp):
            before = {n: b.copy() for n, b in comp.memory.get(layout).items()}
            sel = original(layout, grad, send)
            # a copy of what went out: the hook's unpack clears its kept send array
            rows = sel.rows if sel.array is None else sel.array.reshape(sel.nblocks, -1)[sel.blocks]
            sent = type(sel)(sel.blocks, rows.copy(), sel.nblocks)
            aligned = pack_aligned(torch.from_numpy(grad), layout.src, layout.dst, layout.length)
            records.append((layout, aligned, before, sent,
                            {n: b.copy() for n, b in comp.memory.get(layout).items()}))
            return sel
        comp.compress = recording
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(10 + rank)
        for step in range(STEPS):
            local.load_state_dict(model.module.state_dict())
            local.zero_grad(set_to_none=True)
            opt.zero_grad(set_to_none=True)
            for micro in range(MICRO + 1):
                x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
                torch.nn.functional.cross_entropy(local(x), y).backward()
                if micro < MICRO:
                    with model.no_sync():
                        torch.nn.functional.cross_entropy(model(x), y).backward()
                else:
                    torch.nn.functional.cross_entropy(model(x), y).backward()
            assert len(records) == step + 1, "one bucket, compressed once per synchronised step"
            layout, grad, before, sel, after = records[-1]
            # The hook saw the gradient accumulated over the no_sync passes.
            params = dict((id(p), lp) for p, lp in zip(model.parameters(), local.parameters()))
            for pid, d, size in zip(layout.params, layout.dst.tolist(), layout.sizes.tolist()):
                lg = params[pid].grad
                expect = np.zeros(size, np.float32) if lg is None else lg.reshape(-1).numpy()
                np.testing.assert_allclose(grad[d:d + size], expect, rtol=1e-6, atol=1e-7)
            # The unused parameter: no gradient, no residual, nothing sent.
            ui = layout.params.index(id(model.module.unused.weight))
            d, size = int(layout.dst[ui]), int(layout.sizes[ui])
            for buf in after.values():
                assert not buf[d:d + size].any()
            assert model.module.unused.weight.grad is None  # DDP leaves it untouched
            # Error feedback: each element either sent (residual cleared) or kept.
            if "residual" in after and not fields.get("momentum"):
                v = before["residual"] + grad
                sent2d = sel.send.reshape(-1, B)
                kept = np.ones(layout.nblocks, bool)
                kept[sel.blocks] = False
                np.testing.assert_array_equal(after["residual"].reshape(-1, B)[kept],
                                              v.reshape(-1, B)[kept])
                assert not after["residual"].reshape(-1, B)[sel.blocks].any()
                assert not sent2d[kept].any()
            # The averaged gradient is the sum of every rank's send / WORLD.
            sends = [torch.empty(layout.length) for _ in range(WORLD)]
            dist.all_gather(sends, torch.from_numpy(sel.send))
            exact = sum(s.double() for s in sends) / WORLD
            e = math.frexp(max(float(t.abs().max()) for t in sends))[1]  # |every send| < 2**e
            where = {pid: (d, size) for pid, d, size in
                     zip(layout.params, layout.dst.tolist(), layout.sizes.tolist())}
            for p in model.parameters():
                d, size = where[id(p)]
                got = np.zeros(size) if p.grad is None else p.grad.reshape(-1).numpy()
                ref = exact[d:d + size].numpy()
                tol = 2.0 ** (e + headroom_bits(WORLD) - 31) + 2.0 ** -22 * np.abs(ref)
                assert (np.abs(got - ref) <= tol).all(), f"{transport} {fields}: step {step}"
            # The hook's send array, kept across steps, is all +0.0 again (unpack cleared
            # the union of the ranks' blocks); check_blocks above verified each hint with it.
            assert transport == "gloo" or len(state.send_arrays) == 1
            assert not any(a.view(np.uint32).any() for _, a in state.send_arrays.values())
            opt.step()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            theirs = [torch.empty_like(flat) for _ in range(WORLD)]
            dist.all_gather(theirs, flat)
            assert all(torch.equal(t, theirs[0]) for t in theirs), f"step {step}: ranks differ"
            state.observe_loss(1.0 / (step + 1))
        assert comp.step == STEPS
        report.append({"transport": transport, **fields, "blocks_sent": state.blocks_sent,
                       "blocks_total": state.blocks_total, "bytes_sent": state.bytes_sent})
    finish_worker(rank, tmp, agent, report)


def test_ddp_compressed_hooks_no_sync_unused_params_and_identical_ranks(job_file):
    """2-rank DDP, every method and both transports: exact feedback, union sum, same weights."""
    tmp = str(job_file.parent)
    mp.start_processes(_ddp_worker, args=(tmp,), nprocs=WORLD, join=True, start_method="spawn")
    report = json.loads(Path(tmp, "report.json").read_text())
    nblocks = 2048 // B + 4 + 640 // B + 1 + 64 // B + 1  # fc1, fc2, unused: weights and biases
    assert [r["blocks_total"] for r in report] == [STEPS * nblocks] * len(CONFIGS)
    k = math.ceil(0.1 * nblocks)
    assert ([r["blocks_sent"] for r in report if r["method"] in ("topk", "randomk")]
            == [STEPS * k] * 3)
    gloo = report[-1]
    assert gloo["bytes_sent"] == STEPS * (WORLD - 1) * k * (B + 1) * 4


def test_example_runs_tiny(tmp_path):
    """examples/train_compressed.py, 2 ranks x 2 steps of the 5M MLP at 2 seeds: runs, reports,
    agrees; a LossComp knob reaches the compressor; --merge keeps one result per run and seed."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "smoke.png"
    knob = "gloo-losscomp@0.01:ratio_max=0.01:temperature=0.5"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(root / "examples" / "train_compressed.py"), "--task", "mlp", "--steps", "2",
           "--batch", "8", "--runs", f"topk@0.01,{knob}", "--seeds", "0,1", "--out", str(out)]
    # waits: stopped
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.with_suffix(".json").read_text())
    assert [(r["name"], r["seed"]) for r in summary["runs"]] == [
        ("topk@0.01", 0), (knob, 0), ("topk@0.01", 1), (knob, 1)]
    assert summary["runs"][1]["knobs"] == {"ratio_max": 0.01, "temperature": 0.5}
    # another seed: other weights and batches, so another loss at the first step
    assert summary["runs"][0]["step_loss"][0] != summary["runs"][2]["step_loss"][0]
    assert f"| {knob} | 0,1 |" in proc.stdout and out.exists()
    runs = {r["name"]: r for r in summary["runs"] if r["seed"] == 0}
    assert all(r["weights_identical_across_ranks"] for r in summary["runs"])
    assert runs["topk@0.01"]["params"] == 512 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10
    nblocks = sum(-(-s // 256) for s in (512 * 2048, 2048, 2048 * 2048, 2048, 2048 * 10, 10))
    # ceil(1% of each bucket's blocks): DDP splits the model into a few buckets
    assert 0.01 <= runs["topk@0.01"]["blocks_fraction"] <= 0.01 + 3 / nblocks
    dense = 4 * runs["topk@0.01"]["params"]  # what one rank sends of a dense gradient, at least
    assert runs["topk@0.01"]["bytes_per_step"] < 0.03 * dense

    merged = tmp_path / "merged.png"
    proc = subprocess.run([sys.executable, str(root / "examples" / "train_compressed.py"),
                           "--merge", str(out.with_suffix(".json")), str(out.with_suffix(".json")),
                           "--out", str(merged)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(merged.with_suffix(".json").read_text())
    assert again["runs"] == summary["runs"] and merged.exists()


@pytest.mark.parametrize("args, message", [
    (["--runs", "losscomp@0.01:ratio_max=0.005"], "field 'ratio_max': must be at least"),
    (["--runs", "losscomp@0.01:cooling=2"], "unknown field 'cooling'"),
    (["--runs", "losscomp@0.01:temperature=warm"], "field 'temperature' needs a number"),
    (["--runs", "dense-gloo:ratio_max=0.5"], "only a compressed run"),
    (["--runs", "topk@1%"], "the ratio after @"),
    (["--seeds", "0,0"], "--seeds: '0,0'"),
    (["--seeds", "one"], "--seeds: 'one'"),
])
def test_example_refuses_bad_runs_and_seeds_in_one_line(args, message):
    """train_compressed.py checks --runs and --seeds before it starts anything: exit 2, one
    line naming the option and the field."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "examples" / "train_compressed.py"), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.startswith("examples/train_compressed.py: error: argument --")


def test_defaults_follow_the_rule():
    """compression_defaults is docs/compression.md's rule: 1% of the blocks and at least a
    block per tensor of a bucket, DGC's warm-up over ceil(10%) of the steps (none under 2
    steps), error feedback, the SGD's momentum as DGC's correction with masking only of
    blocks that waited; LossComp's ratio held at the ratio, its window a 50th of the steps
    (at least 5)."""
    from spina.communication import compression_defaults
    c = compression_defaults("topk", steps=200, momentum=0.9)
    assert (c.method, c.ratio, c.warmup_steps, c.warmup_ratio, c.error_feedback, c.momentum,
            c.momentum_masking, c.mask_repeats, c.min_blocks_per_param) == (
        "topk", 0.01, 20, 0.25, True, 0.9, True, False, 1)
    assert compression_defaults("topk", steps=1000).warmup_steps == 100
    assert compression_defaults("topk", steps=1001).warmup_steps == 101  # ceil
    assert compression_defaults("topk", steps=15).warmup_steps == 2
    assert compression_defaults("topk", steps=10).warmup_steps == 0  # 1 step: no warm-up
    assert compression_defaults("topk", steps=200).momentum == 0.0  # plain SGD: none
    lc = compression_defaults("losscomp", steps=1000, momentum=0.9, ratio=0.02)
    assert (lc.ratio, lc.ratio_bounds, lc.loss_window, lc.warmup_steps) == (
        0.02, (0.02, 0.02), 20, 100)
    assert compression_defaults("losscomp", steps=200).loss_window == 5
    # the compressor built from it runs the warm-up it says: 25% of blocks at step 0
    comp = make_compressor(compression_defaults("topk", steps=200, momentum=0.9))
    assert comp.config.warmup_steps == 20


def test_the_trace_of_top_k_keeping_every_block_is_the_dense_trace():
    """bench/compression_trace.py (docs/compression.md reads its CSVs): 2 simulated ranks of
    a small MLP, 3 steps. Top-k keeping every block, without momentum, sends every non-zero
    block and so follows the dense reference: the same loss before the first
    update, bit for bit, and within float32 rounding after it; one row per step and
    parameter."""
    from bench.compression_trace import simulate
    from spina.communication import CompressionConfig
    common = dict(seed=3, steps=3, momentum=0.0, workers=2, eval_every=1)
    dense_rows, topk_rows = [], []
    dense = simulate("mlp", 64, method="dense", rows=dense_rows, **common)
    topk = simulate("mlp", 64, method="topk", rows=topk_rows, **common,
                    config=CompressionConfig(method="topk", ratio=1.0).validate())
    nparams = len({r["param"] for r in dense_rows})
    assert len(dense) == len(topk) == 3 and len(topk_rows) == len(dense_rows) == 3 * nparams
    # every block with a non-zero sum is sent (the digits' blank border pixels leave a few
    # blocks of the first layer's gradient zero); the equal update norms below say no other
    # block was held back
    assert all(0 < r["sent_blocks"] <= r["blocks"] for r in topk_rows)
    assert all(r["sent_blocks"] == r["blocks"] for r in topk_rows if r["param"] != "0.weight")
    assert topk_rows[0]["loss"] == dense_rows[0]["loss"]
    for a, b in zip(topk_rows, dense_rows):
        assert a["param"] == b["param"] and a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["update_norm"] == pytest.approx(b["update_norm"], rel=1e-4, abs=1e-9)
