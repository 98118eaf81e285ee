"""scikit-learn's digits (1797 8x8 images, bundled with it: no download), the one loader of the
examples and the benchmarks (examples/train_digits.py, examples/dlcp_train.py,
bench/dlcp_bench/worker.py; bench/training.py through train_digits).

    from examples.digits import flat_split
    xtr, ytr, xte, yte = flat_split(seed=0)   # 1438 training and 359 test images
"""
from __future__ import annotations

import numpy as np


def images() -> tuple[np.ndarray, np.ndarray]:
    """Every image as float32 pixels in 0..1, shape (1797, 8, 8), and the labels (int64)."""
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target


def flat_split(seed: int):
    """Pixels flattened to 64 inputs and an 80/20 split by numpy's permutation of `seed`:
    (x_train, y_train, x_test, y_test)."""
    x, y = images()
    x = x.reshape(len(x), -1)
    perm = np.random.default_rng(seed).permutation(len(x))
    ntest = len(x) // 5
    return x[perm[ntest:]], y[perm[ntest:]], x[perm[:ntest]], y[perm[:ntest]]
