"""The large-batch LAMB variants of examples/train_compressed.py: the frozen second moment and
trust ratio (1-bit LAMB's warm-up then freeze) against a float64 numpy LAMB, the update's
linearity in the gradient that error feedback needs, the run flags, and a 2-rank run with a
dense warm-up through SpINA.

Run just this file: python -m pytest tests/test_largebatch_lamb.py
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def example():
    spec = importlib.util.spec_from_file_location("train_compressed",
                                                  ROOT / "examples" / "train_compressed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EX = example()
LR, B1, B2, EPS, WD = 0.05, 0.9, 0.999, 1e-6, 0.01


def lamb_reference(w0, grads, freeze_after=None, trust_after=None):
    """LAMB in float64 numpy, one layer: the weights after each gradient of `grads`."""
    w, m, v = w0.astype(np.float64), np.zeros(w0.shape), np.zeros(w0.shape)
    trusts, out = [], []
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        m = B1 * m + (1 - B1) * g
        if freeze_after is None or t <= freeze_after:
            v, tv = B2 * v + (1 - B2) * g * g, t
        r = (m / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** tv)) + EPS) + WD * w
        if trust_after is None or t <= trust_after:
            trusts.append(np.linalg.norm(w) / np.linalg.norm(r))
            trust = trusts[-1]
        else:
            trust = np.mean(trusts)
        w = w - LR * trust * r
        out.append(w)
    return out


def run_lamb(w0, grads, **kw):
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = EX.Lamb([p], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD, **kw)
    out = []
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        out.append(p.detach().numpy().copy())
    return out, opt.state[p]


@pytest.mark.parametrize("kw", [{}, {"freeze_after": 3}, {"freeze_after": 3, "trust_after": 3},
                                {"trust_after": 2}])
def test_lamb_matches_reference(kw):
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((16, 8)).astype(np.float32)
    grads = [rng.standard_normal((16, 8)).astype(np.float32) * (1 + t) for t in range(8)]
    got, _ = run_lamb(w0, grads, **kw)
    ref = lamb_reference(w0, grads, **kw)
    for t, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6, err_msg=f"step {t + 1}, {kw}")
    # the variants do differ from LAMB on these gradients (growing scale)
    if kw:
        assert np.abs(ref[-1] - lamb_reference(w0, grads)[-1]).max() > 1e-3


def test_frozen_second_moment_stays_bit_for_bit():
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal(300).astype(np.float32)
    grads = [rng.standard_normal(300).astype(np.float32) for _ in range(4)]
    _, st4 = run_lamb(w0, grads, freeze_after=4)
    v4 = st4["v"].clone()
    _, st8 = run_lamb(w0, grads + [g * 5 for g in grads], freeze_after=4)
    assert torch.equal(st8["v"], v4) and st8["tv"] == 4 and st8["t"] == 8
    assert st4["trust_sum"] > 0


def displacement(w0, grads, g_last, **kw):
    """What the last step moves the weights by, after the steps of `grads`."""
    before, _ = run_lamb(w0, grads, **kw)
    after, _ = run_lamb(w0, grads + [g_last], **kw)
    return after[-1].astype(np.float64) - before[-1]


def test_frozen_update_is_linear_in_the_gradient():
    """Error feedback delivers a block's gradients late and summed: the optimiser must move
    the weights by an affine function of what arrives, d(2g) - d(g) == d(g) - d(0). With v
    and the trust ratio frozen it does (to float32 rounding); LAMB's live v and trust don't."""
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal(512).astype(np.float32)
    warm = [rng.standard_normal(512).astype(np.float32) for _ in range(5)]
    g = np.zeros(512, np.float32)
    g[:256] = rng.standard_normal(256) * 3  # one block delivered, the other not
    for kw, linear in (({"freeze_after": 5, "trust_after": 5}, True), ({}, False),
                       ({"freeze_after": 5}, False)):
        d0, d1, d2 = (displacement(w0, warm, a * g, **kw) for a in (0, 1, 2))
        bend = np.abs((d2 - d1) - (d1 - d0)).max() / np.abs(d1 - d0).max()
        assert (bend < 1e-4) == linear, (kw, bend)


def test_parse_run_flags():
    r = EX.parse_run("topk@0.01+dense10+freeze10+trust10")
    assert (r["method"], r["ratio"], r["dense_steps"], r["freeze_after"], r["trust_after"],
            r["mask"], r["transport"]) == ("topk", 0.01, 10, 10, 10, False, "spina")
    assert EX.parse_run("scaled@0.1+mask")["mask"] is True
    for bad, named in (("topk@0.01+dens10", "+dens10"), ("topk@0.01+freeze", "+freeze"),
                       ("topk@0.01+trust0", "+trust0"), ("topk@0.01+mask3", "+mask3"),
                       ("dense-gloo+dense5", "compressed runs only"),
                       ("gloo-topk@0.01+dense5", "SpINA runs only")):
        with pytest.raises(ValueError, match=named.replace("+", r"\+")):
            EX.parse_run(bad)


def test_dense_warmup_then_frozen_run(tmp_path):
    """2 ranks x 4 steps of the large-batch task: 2 dense steps through SpINA, then top-k with
    LAMB's v and trust frozen; every rank ends with the same weights, the dense steps count
    as all blocks sent."""
    out = tmp_path / "lb.png"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "train_compressed.py"), "--task", "largebatch", "--steps", "4",
           "--batch", "16", "--runs", "topk@0.01+dense2+freeze2+trust2", "--out", str(out)]
    # waits: stopped
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert run["weights_identical_across_ranks"] and run["dense_steps"] == 2
    sizes = (512 * 1024, 1024, 1024 * 1024, 1024, 1024 * 10, 10)
    nblocks = sum(-(-s // 256) for s in sizes)
    # half the steps dense (all blocks), half at ceil(1%) of each bucket's blocks
    assert 0.5 + 0.5 * 0.01 <= run["blocks_fraction"] <= 0.5 + 0.5 * (0.01 + 3 / nblocks)
    # about half a dense step per step (SpINA skips all-zero blocks and adds headers)
    dense_bytes = 4 * sum(sizes)
    assert 0.35 * dense_bytes < run["bytes_per_step"] < 0.6 * dense_bytes


def test_bad_run_flag_exits_2():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_compressed.py"),
                           "--task", "largebatch", "--runs", "topk@0.01+frozen"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "+frozen" in proc.stderr.strip().splitlines()[-1]
