"""Fewer bits and fewer rounds: sign and ternary votes, local and post-local SGD (docs/bits.md).

Run just these tests:
    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_bits.py

Vote and averaging tests run in this process on LocalCluster (a software switch and agents on
threads); the DDP test spawns 2 training processes (gloo group, file:// rendezvous) against a
software switch running in this test process.
"""
import concurrent.futures
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from host_agent.blocks import headroom_bits
from host_agent.compression import BucketLayout, make_compressor
from host_agent.compression.votes import BINS, EXP_MIN, onehot_message, onehot_scale, per_element
from host_agent.hooks import (
    CompressionHookState,
    LocalSGDOptimizer,
    LocalSGDState,
    VoteHookState,
    pack_aligned,
    spina_compressed_hook,
    spina_local_sgd_hook,
    spina_vote_hook,
)
from host_agent.local import LocalCluster
from spina.config import ConfigError
from tests.test_torch_hook import finish_worker

B = 16  # a small block size keeps the tests' tensors small
SIZES = (100, 7, 48)  # three layers: a partial block, a tiny one, whole blocks


def _layout(*sizes):
    return BucketLayout.of(tuple(f"p{i}" for i in range(len(sizes))), list(sizes), B)


def _aligned(layout, raw):
    return pack_aligned(torch.from_numpy(raw), layout.src, layout.dst, layout.length)


def _vote(cluster, comps, layout, grads):
    """One bucket through the switch at every rank: prepare, the scale call, encode, the vote
    call, decode. Returns per rank (p before feedback, own scale, scale, votes, sums, decoded)."""
    n = len(comps)
    prepared = [c.prepare(layout, g) for c, g in zip(comps, grads)]
    p_before = [b.p.copy() for b, _ in prepared]
    own = [None if b.own is None else b.own.copy() for b, _ in prepared]
    summed = cluster.allreduce([m for _, m in prepared])
    scales = [c.agreed_scale(b, s, n) for c, (b, _), s in zip(comps, prepared, summed)]
    votes = [c.encode(b, s) for c, (b, _), s in zip(comps, prepared, scales)]
    sent = [v.copy() for v in votes]
    totals = cluster.allreduce(votes)
    decoded = [c.decode(b, t, s, n) for c, (b, _), t, s in zip(comps, prepared, totals, scales)]
    for c in comps:
        c.end_step()
    return p_before, own, scales, sent, totals, decoded


# ---------------------------------------------------------------- sign
def test_sign_vote_sum_is_numpys_and_the_result_is_its_sign_times_the_mean_scale():
    """3 ranks, integer gradients: exact int32 vote sums, the majority's sign, the mean scale."""
    rng = np.random.default_rng(1)
    layout = _layout(*SIZES)
    comps = [make_compressor(method="sign", block_size=B) for _ in range(3)]
    grads = [rng.integers(-9, 10, sum(SIZES)).astype(np.float32) for _ in range(3)]
    with LocalCluster(3, block_size=B, nlanes=4, nslots=4) as c:
        p, own, scales, sent, totals, decoded = _vote(c, comps, layout, grads)
    expect = sum(np.sign(_aligned(layout, g)).astype(np.int64) for g in grads)
    for r in range(3):
        assert sent[r].dtype == np.int32 and set(np.unique(sent[r])) <= {-1, 0, 1}
        np.testing.assert_array_equal(totals[r], expect)
        np.testing.assert_array_equal(scales[r], scales[0])
        np.testing.assert_array_equal(decoded[r], decoded[0])  # bit-identical at every rank
    mean = np.mean(own, axis=0, dtype=np.float64)
    e = math.frexp(float(np.max(own)))[1]
    bound = 2.0 ** (e + headroom_bits(3) - 31) + 2.0 ** -23 * mean  # docs/aggregation.md
    assert (np.abs(scales[0] - mean) <= bound).all()
    np.testing.assert_array_equal(decoded[0], np.sign(expect) * per_element(layout, scales[0]))
    # EF-signSGD's scale: ||p||_1 / d per layer, in float64, rounded once
    for i, (d, k) in enumerate(zip(layout.dst, layout.sizes)):
        assert own[0][i] == np.float32(np.abs(p[0][d:d + k]).sum(dtype=np.float64) / k)


def test_sign_error_feedback_identity_over_steps():
    """residual = p - (||p||_1 / d) sign(p) at every step, p = old residual + gradient."""
    rng = np.random.default_rng(2)
    layout = _layout(*SIZES)
    comps = [make_compressor(method="sign", block_size=B) for _ in range(2)]
    with LocalCluster(2, block_size=B, nlanes=4, nslots=4) as c:
        residual = [np.zeros(layout.length, np.float32) for _ in comps]
        for _ in range(4):
            grads = [rng.standard_normal(sum(SIZES)).astype(np.float32) for _ in comps]
            p, own, _, sent, _, _ = _vote(c, comps, layout, grads)
            for r, comp in enumerate(comps):
                np.testing.assert_array_equal(p[r], residual[r] + _aligned(layout, grads[r]))
                np.testing.assert_array_equal(sent[r], np.sign(p[r]).astype(np.int32))
                carried = per_element(layout, own[r]) * sent[r].astype(np.float32)
                residual[r] = comp.memory.get(layout)["residual"]
                np.testing.assert_array_equal(residual[r], p[r] - carried)
                residual[r] = residual[r].copy()
    assert comps[0].step == 4


def test_signum_votes_on_the_local_momentum():
    """momentum m: u = m u + g, p = residual + u, the residual as without momentum (by hand)."""
    comp = make_compressor(method="sign", block_size=4, momentum=0.5)
    ps = []
    for g in ([4, -4, 2, 2], [0, 0, 2, -6]):
        ballot, msg = comp.prepare(BucketLayout.of(("p0",), [4], 4), np.array(g, np.float32))
        ps.append(ballot.p.tolist())
        comp.encode(ballot, comp.agreed_scale(ballot, msg, 1))
        comp.end_step()
    # step 1: u = g, p = u, ||p||_1 / 4 = 3: residual = [1, -1, -1, -1]
    # step 2: u = 0.5 [4, -4, 2, 2] + [0, 0, 2, -6] = [2, -2, 3, -5], p = residual + u
    assert ps == [[4, -4, 2, 2], [3, -3, 2, -6]]
    mem = comp.memory.get(BucketLayout.of(("p0",), [4], 4))
    assert mem["momentum"].tolist() == [2, -2, 3, -5]
    assert mem["residual"].tolist() == [-0.5, 0.5, -1.5, -2.5]  # p - 3.5 sign(p)


def test_error_feedback_off_keeps_no_residual():
    """error_feedback=False: p is the fresh gradient every step and no buffer is kept."""
    layout = _layout(*SIZES)
    for method in ("sign", "ternary"):
        comp = make_compressor(method=method, block_size=B, error_feedback=False)
        g = np.arange(sum(SIZES), dtype=np.float32) - 50
        for _ in range(2):
            ballot, _ = comp.prepare(layout, g)
            np.testing.assert_array_equal(ballot.p, _aligned(layout, g))
        assert comp.memory.buffers[layout.key] == {}  # no residual, no momentum


# ---------------------------------------------------------------- ternary
def test_ternary_sum_is_numpys_with_the_max_over_ranks_as_a_power_of_two():
    """3 ranks, integer gradients: shared scale 2**ceil(log2 max over ranks), exact sums."""
    layout = _layout(*SIZES)
    grads = []
    for r, top in enumerate((3, 5, 7)):  # layer 0's max differs by rank: the max is 7 -> 8
        g = np.zeros(sum(SIZES), np.float32)
        g[:100] = np.resize(np.arange(-top, top + 1), 100)
        g[100:107] = 0  # layer 1 zero at every rank: scale 0, nothing sent
        g[107:] = np.resize([16, -16, 1, 0], 48) if r == 0 else 2  # layer 2: max 16 -> 16
        grads.append(g)
    comps = [make_compressor(method="ternary", block_size=B, seed=5, clip_sigma=0)
             for _ in range(3)]
    for r, comp in enumerate(comps):
        comp.rank = r
    with LocalCluster(3, block_size=B, nlanes=4, nslots=4) as c:
        p, _, scales, sent, totals, decoded = _vote(c, comps, layout, grads)
    assert scales[0].tolist() == [8.0, 0.0, 16.0]
    for r in range(3):
        np.testing.assert_array_equal(scales[r], scales[0])
        np.testing.assert_array_equal(totals[r], sum(v.astype(np.int64) for v in sent))
        np.testing.assert_array_equal(decoded[r], decoded[0])
        v2 = sent[r][layout.dst[2]:layout.dst[2] + 48]
        if r == 0:  # |p| == s is always sent, p == 0 never
            np.testing.assert_array_equal(v2[0::4], 1)
            np.testing.assert_array_equal(v2[1::4], -1)
            np.testing.assert_array_equal(v2[3::4], 0)
        assert not sent[r][layout.dst[1]:layout.dst[2]].any()
        # the rule: sign(p) where u * s < |p|, drawn from (seed, rank, step, bucket)
        u = np.random.default_rng((5, r, 0, 0)).random(layout.length, dtype=np.float32)
        s = per_element(layout, scales[0])
        np.testing.assert_array_equal(sent[r], np.where(u * s < np.abs(p[r]), np.sign(p[r]), 0))
    exact = totals[0].astype(np.float64) * per_element(layout, scales[0]) / 3
    np.testing.assert_array_equal(decoded[0], exact.astype(np.float32))  # rounded once


def test_ternary_is_unbiased():
    """E[s t] = q over many draws (5 sigma, fixed seed), q = p without clipping."""
    layout = _layout(64)
    g = np.linspace(-1, 1, 64).astype(np.float32)
    comp = make_compressor(method="ternary", block_size=B, error_feedback=False, clip_sigma=0)
    total = np.zeros(64)
    steps = 2000
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        for _ in range(steps):
            _, _, scales, _, _, decoded = _vote(c, [comp], layout, [g])
            total += decoded[0]
    assert scales[0].tolist() == [1.0]
    sigma = np.sqrt(np.abs(g) * (1 - np.abs(g)) / steps)
    assert (np.abs(total / steps - g) <= 5 * sigma + 1e-6).all()


def test_ternary_clips_to_c_rms_and_feeds_back_the_clipping_only():
    """q = clip(p, +-c rms) per layer; residual = p - q exactly; the scale from max|q|."""
    rng = np.random.default_rng(3)
    layout = _layout(*SIZES)
    comp = make_compressor(method="ternary", block_size=B, clip_sigma=1.5)
    residual = np.zeros(layout.length, np.float32)
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        for _ in range(4):
            g = rng.standard_t(2, sum(SIZES)).astype(np.float32)
            p, _, scales, sent, _, _ = _vote(c, [comp], layout, [g])
            np.testing.assert_array_equal(p[0], residual + _aligned(layout, g))
            q = np.zeros_like(p[0])
            for i, (d, k) in enumerate(zip(layout.dst, layout.sizes)):
                sq = p[0][d:d + k] * p[0][d:d + k]  # squares in float32, summed in float64
                rms = np.sqrt(sq.sum(dtype=np.float64) / k)
                bound = np.float32(1.5 * rms)
                q[d:d + k] = np.clip(p[0][d:d + k], -bound, bound)
                assert scales[0][i] == 2.0 ** math.ceil(math.log2(np.abs(q[d:d + k]).max()))
            assert (np.abs(sent[0]) <= (q != 0)).all()  # a vote only where q is not zero
            residual = comp.memory.get(layout)["residual"].copy()
            np.testing.assert_array_equal(residual, p[0] - q)
            assert (residual != 0).any()  # t(2) tails: something was clipped


def test_onehot_scale_edges():
    """Powers of two are their own ceiling; tiny values clip up; Inf, NaN and > 2**127 are NaN."""
    m = np.array([1.0, 3.0, 0.0, 2.0 ** -140, np.inf, np.nan, 3e38, 2.0 ** 127], np.float32)
    msg = onehot_message(m, B)
    assert msg.size == len(m) * BINS
    scale = onehot_scale(msg, len(m))
    assert scale[:4].tolist() == [1.0, 4.0, 0.0, 2.0 ** EXP_MIN]
    assert np.isnan(scale[4:7]).all() and scale[7] == 2.0 ** 127
    # the sum over ranks: the highest exponent any rank had
    both = onehot_message(np.array([0.3, 0.0], np.float32), B) + \
        onehot_message(np.array([5.0, 0.0], np.float32), B)
    assert onehot_scale(both, 2).tolist() == [8.0, 0.0]


@pytest.mark.parametrize("method", ["sign", "ternary"])
def test_a_nonfinite_layer_is_nan_at_every_rank_and_drops_its_residual(method):
    """A NaN at one rank: that layer NaN in every result, its residual zeroed; others finite."""
    layout = _layout(64, 64)
    comps = [make_compressor(method=method, block_size=B) for _ in range(2)]
    grads = [np.ones(128, np.float32), np.ones(128, np.float32)]
    grads[1][3] = np.nan
    with LocalCluster(2, block_size=B, nlanes=4, nslots=4) as c:
        _, _, _, _, _, decoded = _vote(c, comps, layout, grads)
    for r in range(2):
        assert np.isnan(decoded[r][:64]).all() and np.isfinite(decoded[r][64:]).all()
        assert not comps[r].memory.get(layout)["residual"][:64].any()
    np.testing.assert_array_equal(decoded[0][64:], decoded[1][64:])


def test_votes_need_their_own_hook():
    """The block hook refuses a vote compressor; the vote hook a block one or another block size."""
    comp = make_compressor(method="sign", block_size=B)
    with pytest.raises(TypeError, match="spina_vote_hook"):
        comp.compress(_layout(16), np.zeros(16, np.float32))

    class Bucket:
        def buffer(self):
            return torch.zeros(16)
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        with pytest.raises(TypeError, match="spina_vote_hook"):
            spina_compressed_hook(CompressionHookState(comp, c.agents[0]), Bucket())
        with pytest.raises(TypeError, match="'topk'"):
            VoteHookState(make_compressor(method="topk", block_size=B), c.agents[0])
        with pytest.raises(ConfigError,
                           match="the compressor's blocks have 32 elements, job 1's have 16"):
            VoteHookState(make_compressor(method="sign", block_size=32), c.agents[0])
    with pytest.raises(ConfigError, match="field 'clip_sigma'"):
        make_compressor(method="ternary", clip_sigma=-1.0)


# ---------------------------------------------------------------- local SGD
class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _local_run(cluster, period, steps, record=None):
    """Every rank of `cluster` trains its own replica on its own data; returns the states."""
    n = len(cluster.agents)
    states = [LocalSGDState(a, period) for a in cluster.agents]
    models = []
    for _ in range(n):
        torch.manual_seed(0)
        models.append(_Net())
    opts = [LocalSGDOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), s)
            for m, s in zip(models, states)]
    if record is not None:
        for r, o in enumerate(opts):
            original = o.average

            def recording(r=r, original=original):
                record.setdefault(states[r].step, {})[r] = _flat(models[r]).clone()
                original()
                record[states[r].step][("after", r)] = _flat(models[r]).clone()
            o.average = recording

    def train(r):
        gen = torch.Generator().manual_seed(100 + r)
        for _ in range(steps):
            x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
            opts[r].zero_grad()
            torch.nn.functional.cross_entropy(models[r](x), y).backward()
            opts[r].step()
        return _flat(models[r])
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        finals = list(pool.map(train, range(n)))
    return states, finals


def test_local_sgd_averages_to_the_mean_bit_identical_with_a_quarter_of_the_rounds():
    """H=4: averaged after steps 4 and 8 to the mean (bound), bit-identical; 1/4 of H=1's rounds."""
    n, steps = 3, 8
    record = {}
    with LocalCluster(n, block_size=B, nlanes=4, nslots=4) as c:
        states, finals = _local_run(c, 4, steps, record)
        every, _ = _local_run(c, 1, steps)
    assert sorted(record) == [4, 8]
    for step, snap in record.items():
        before = torch.stack([snap[r] for r in range(n)])
        assert not torch.equal(before[0], before[1]), "ranks trained on different data"
        mean = before.double().mean(0)
        e = math.frexp(float(before.abs().max()))[1]
        tol = 2.0 ** (e + headroom_bits(n) - 31) + 2.0 ** -23 * mean.abs()
        for r in range(n):
            after = snap[("after", r)]
            assert torch.equal(after, snap[("after", 0)]), f"step {step}: rank {r} differs"
            assert ((after.double() - mean).abs() <= tol).all()
    assert all(torch.equal(f, finals[0]) for f in finals)  # step 8 averaged last
    assert [s.averages for s in states] == [2] * n and [s.averages for s in every] == [8] * n
    assert states[0].sync_rounds == 0 and states[0].average_rounds > 0
    assert 4 * states[0].rounds == every[0].rounds  # the same call, a quarter as often


def test_local_sgd_state_fields_are_checked():
    """period < 1 and a negative or non-integer warm-up fail naming the field."""
    with LocalCluster(1, block_size=B, nlanes=4, nslots=2) as c:
        for kwargs, name in (({"period": 0}, "period"), ({"period": 2.5}, "period"),
                             ({"period": 2, "warmup_steps": -1}, "warmup_steps")):
            with pytest.raises(ConfigError, match=f"field '{name}'"):
                LocalSGDState(c.agents[0], **kwargs)


# ---------------------------------------------------------------- DDP
WORLD = 2
VOTE_STEPS = 3
S, H, LOCAL_STEPS = 2, 2, 6  # post-local SGD: 2 synchronous steps, then average every 2


def _gather(a: np.ndarray) -> list[np.ndarray]:
    t = torch.from_numpy(np.ascontiguousarray(a))
    out = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(out, t)
    return [o.numpy() for o in out]


def _same_weights(model) -> bool:
    flat = _flat(model)
    theirs = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(theirs, flat)
    return all(torch.equal(t, theirs[0]) for t in theirs)


def _ddp_votes(rank, agent, report):
    for method in ("sign", "ternary"):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(_Net())
        comp = make_compressor(method=method, block_size=B)
        state = VoteHookState(comp, agent)
        model.register_comm_hook(state, spina_vote_hook)
        seen = []
        original = comp.encode

        def recording(ballot, scale, original=original, seen=seen):
            p, own = ballot.p.copy(), ballot.own.copy()  # own: ternary's clipped q
            votes = original(ballot, scale)
            seen.append((ballot.layout, p, own, scale.copy(), votes.copy()))
            return votes
        comp.encode = recording
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(10 + rank)
        for step in range(VOTE_STEPS):
            x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            layout, p, q, scale, votes = seen[-1]
            total = sum(v.astype(np.int64) for v in _gather(votes))
            if method == "sign":  # direction: the majority of every rank's sign, exactly
                expect_dir = np.sign(total)
                assert (votes == np.sign(p)).all()
            else:  # the shared scale: 2**ceil(log2 max over ranks of max|q|) per layer
                tops = np.max([[np.abs(a[d:d + k]).max() for d, k in zip(layout.dst, layout.sizes)]
                               for a in _gather(q)], axis=0)
                assert scale.tolist() == [2.0 ** math.ceil(math.log2(t)) for t in tops]
            where = {pid: (d, k) for pid, d, k in zip(layout.params, layout.dst, layout.sizes)}
            for prm in model.parameters():
                d, k = where[id(prm)]
                got = prm.grad.reshape(-1).numpy()
                s = per_element(layout, scale)[d:d + k]
                if method == "sign":
                    np.testing.assert_array_equal(got, expect_dir[d:d + k] * s)
                else:
                    np.testing.assert_array_equal(got, total[d:d + k] * s / WORLD)
            opt.step()
            assert _same_weights(model), f"{method} step {step}: ranks differ"
        state.close()
        report[method] = {"calls": state.calls, "blocks_total": state.blocks_total,
                          "step": comp.step}


def _ddp_post_local(rank, agent, report):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_Net())
    state = LocalSGDState(agent, period=H, warmup_steps=S)
    model.register_comm_hook(state, spina_local_sgd_hook)
    opt = LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), state)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # a scheduler works
    gen = torch.Generator().manual_seed(20 + rank)
    same = []
    for _ in range(LOCAL_STEPS):
        x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        same.append(_same_weights(model))
    report["post_local"] = {"same": same, "sync_calls": state.sync_calls,
                            "averages": state.averages, "lr": opt.param_groups[0]["lr"],
                            "sync_rounds": state.sync_rounds,
                            "average_rounds": state.average_rounds}


def _ddp_worker(rank, tmp):
    """Both votes through spina_vote_hook, then post-local SGD, in one pair of processes."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=WORLD)
    from host_agent.assignment import agent_from_env
    agent = agent_from_env(f"{tmp}/job.json", rank=rank, timeout=20)
    report = {}
    _ddp_votes(rank, agent, report)
    _ddp_post_local(rank, agent, report)
    finish_worker(rank, tmp, agent, report)


def test_ddp_votes_and_post_local_sgd(job_file):
    """2-rank DDP: exact votes and shared scales, same weights; post-local SGD's phases."""
    tmp = str(job_file.parent)
    mp.start_processes(_ddp_worker, args=(tmp,), nprocs=WORLD, join=True, start_method="spawn")
    report = json.loads(Path(tmp, "report.json").read_text())
    nblocks = 2048 // B + 4 + 640 // B + 1  # fc1, fc2: weights and biases, one bucket
    for method in ("sign", "ternary"):
        assert report[method] == {"calls": VOTE_STEPS, "blocks_total": VOTE_STEPS * nblocks,
                                  "step": VOTE_STEPS}
    post = report["post_local"]
    # synchronous steps 1-2 keep the weights equal; local 3 and 5 differ; 4 and 6 averaged
    assert post["same"] == [True, True, False, True, False, True]
    assert post["sync_calls"] == S and post["averages"] == (LOCAL_STEPS - S) // H
    assert post["sync_rounds"] > 0 and post["average_rounds"] > 0
    assert post["lr"] == 0.1 * 0.5 ** LOCAL_STEPS


def test_example_runs_tiny(tmp_path):
    """examples/train_bits.py, 2 ranks, one digits epoch: every kind of run (8-bit lanes on a
    switch of their own), a report, a plot."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bits.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(root / "examples" / "train_bits.py"), "--task", "digits", "--epochs", "1",
           "--runs", "dense-spina,dense-spina8,signum,ternary,local@4", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)  # stopped
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert list(runs) == ["dense-spina", "dense-spina8", "signum", "ternary", "local@4"]
    assert all(r["weights_identical_across_ranks"] for r in runs.values())
    # the 8-bit job's rows are a quarter of int32's, the packets (block 256) as many, headers
    # the same size: a little over a quarter of the bytes
    ratio = runs["dense-spina8"]["bytes_per_step"] / runs["dense-spina"]["bytes_per_step"]
    assert 0.25 < ratio < 0.3, ratio
    assert runs["dense-spina8"]["lane_bits"] == 8 and runs["dense-spina"]["lane_bits"] == 32
    # every step's gradient against a parameter average every 4 steps (and one at the end)
    assert runs["local@4"]["rounds_per_step"] < 0.35 * runs["dense-spina"]["rounds_per_step"]
    assert out.with_suffix(".png").exists()


def test_the_second_task_model_has_over_5m_parameters_and_takes_the_digits():
    """digits-wide (issue 32's second task): WideLeNet has at least 5M parameters and maps the
    digits images, as the examples load them, to 10 logits."""
    from examples.train_digits import WideLeNet, load_data
    xtr, ytr, xte, yte = load_data(0)
    model = WideLeNet()
    assert sum(p.numel() for p in model.parameters()) == 5_439_370
    assert model(xte[:8]).shape == (8, 10)
    assert len(ytr) + len(yte) == 1797 and xtr.shape[1:] == (1, 32, 32)
