"""The MLP whose gradients the workers all-reduce: parameters per layer, the synthetic
gradients of the step-time mode, and the numpy MLP `--train` trains on examples/digits.py's
data."""
from __future__ import annotations

import numpy as np


def layer_sizes(widths: list[int]) -> list[int]:
    """Parameters per layer of an MLP (weights + bias): 64,64,10 -> [4160, 650]."""
    return [a * b + b for a, b in zip(widths[:-1], widths[1:])]


def make_gradient(sizes: list[int], rank: int, variant: int) -> list[np.ndarray]:
    """One worker's gradient, one float32 array per layer: normal values whose scale varies
    from block to block (lognormal), as real gradients' magnitudes do, so that the magnitude
    policy has something to rank; each layer's overall scale shrinks with depth."""
    rng = np.random.default_rng([20261201, rank, variant, len(sizes)])
    out = []
    for i, n in enumerate(sizes):
        nb = -(-n // 256)
        scale = np.repeat(rng.lognormal(0.0, 1.0, nb).astype(np.float32), 256)[:n]
        out.append(rng.standard_normal(n, np.float32) * scale * np.float32(0.1 / (i + 1)))
    return out


VARIANTS = 3  # distinct gradients per worker, cycled step by step


def mlp_init(widths: list[int], seed: int) -> list[np.ndarray]:
    """One flat float32 array per layer: weights (in x out, He) then bias (zeros)."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([(rng.standard_normal(a * b) * np.sqrt(2 / a)).astype(np.float32),
                            np.zeros(b, np.float32)]) for a, b in zip(widths[:-1], widths[1:])]


def _layers(params, widths):
    return [(p[:a * b].reshape(a, b), p[a * b:]) for p, a, b in
            zip(params, widths[:-1], widths[1:])]


def mlp_grad(params, widths, x, y) -> list[np.ndarray]:
    """Cross-entropy gradient of the ReLU MLP on one batch, flat per layer like `params`."""
    ls = _layers(params, widths)
    hs = [x]
    for w, b in ls[:-1]:
        hs.append(np.maximum(hs[-1] @ w + b, 0))
    z = hs[-1] @ ls[-1][0] + ls[-1][1]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    d = p / len(y)
    out = []
    for i in reversed(range(len(ls))):
        out.append(np.concatenate([(hs[i].T @ d).ravel(), d.sum(0)]).astype(np.float32))
        if i:
            d = (d @ ls[i][0].T) * (hs[i] > 0)
    return out[::-1]


def mlp_accuracy(params, widths, x, y) -> float:
    h = x
    ls = _layers(params, widths)
    for w, b in ls[:-1]:
        h = np.maximum(h @ w + b, 0)
    return float(((h @ ls[-1][0] + ls[-1][1]).argmax(1) == y).mean() * 100)
