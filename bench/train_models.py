"""The training WHAT's model families (`--model`): each a module of a width w, its parameter
count in closed form (so -b/-e, a gradient's bytes, pick the width) and its data.

  mlp  1024-w-w-10 (examples/train_compressed.py's MLP) on the digits upsampled to 32x32,
       flattened (examples/train_digits.py load_data: 1438 training, 359 test images)
  cnn  conv 5x5 1->16, pool, conv 5x5 16->32, pool, w hidden units, 10 classes (LeNet's
       shape, wider) on the same 32x32 digits: its parameters mostly in the dense head
  seq  a token embedding of w rows x 128, attention pooling (a learnt query), a hidden
       layer of 256, 10 classes, on a synthetic sequence task (`sequences`): embedding-heavy,
       its gradient sparse by rows (a one-layer transformer encoder diverged to NaN at
       learning rates that train the embedding in a few hundred steps)

Nothing is downloaded: the digits ship with scikit-learn, the sequences are generated.
"""
from __future__ import annotations

from dataclasses import dataclass

SEQ_DIM, SEQ_LEN, SEQ_FF = 128, 32, 256
SIGNAL = 1000  # tokens 0..999 carry a class (token % 10); the others are noise
SEQ_TRAIN, SEQ_TEST = 20_000, 1_000


@dataclass(frozen=True)
class Family:
    """A model family: its name, its parameters as a function of the width, its module and
    its data (xtr, ytr, xte, yte) for a seed and width."""
    name: str
    params: object  # (w) -> int
    build: object   # (w) -> torch.nn.Module
    data: object    # (seed, w) -> (xtr, ytr, xte, yte)
    min_width: int = 1

    def width_for(self, size: int) -> int:
        """The width whose float32 gradient is nearest `size` bytes (params grow with w)."""
        lo, hi = self.min_width, self.min_width
        while 4 * self.params(hi) < size:
            hi *= 2
        while lo < hi:  # the smallest w at or above size, then the nearer of it and w - 1
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if 4 * self.params(mid) < size else (lo, mid)
        if lo > self.min_width and size - 4 * self.params(lo - 1) <= 4 * self.params(lo) - size:
            return lo - 1
        return lo


def mlp_params(w: int) -> int:
    return w * w + 1036 * w + 10


def cnn_params(w: int) -> int:
    return (16 * 25 + 16) + (32 * 16 * 25 + 32) + 2048 * w + w + 10 * w + 10


def seq_params(w: int) -> int:
    d, ff = SEQ_DIM, SEQ_FF
    return w * d + (d + 1) + (d * ff + ff) + (ff * 10 + 10)


def digits_flat(seed: int, w: int = 0):
    """The digits at 32x32, normalised, flattened to 1024 inputs."""
    xtr, ytr, xte, yte = digits_images(seed)
    return xtr.flatten(1), ytr, xte.flatten(1), yte


def digits_images(seed: int, w: int = 0):
    from examples.train_digits import load_data
    return load_data(seed)


def sequences(seed: int, vocab: int):
    """The synthetic sequence task: SEQ_LEN tokens of a vocabulary of `vocab`; a sequence of
    class c holds 6 tokens of class c and 3 of another class d != c (a class-c token: one of
    the SIGNAL tokens with token % 10 == c), at random places, the rest noise tokens
    (SIGNAL..vocab-1). The class is the one with more tokens: a model must learn which
    tokens carry which class and count them. SEQ_TRAIN training and SEQ_TEST test
    sequences, the test set from its own stream; the same for a seed and vocabulary."""
    import torch

    def make(n: int, gen):
        y = torch.randint(10, (n,), generator=gen)
        other = (y + torch.randint(1, 10, (n,), generator=gen)) % 10
        x = torch.randint(SIGNAL, vocab, (n, SEQ_LEN), generator=gen)
        sig = torch.cat([y[:, None] + 10 * torch.randint(SIGNAL // 10, (n, 6), generator=gen),
                         other[:, None] + 10 * torch.randint(SIGNAL // 10, (n, 3),
                                                             generator=gen)], 1)
        places = torch.rand(n, SEQ_LEN, generator=gen).argsort(1)[:, :sig.shape[1]]
        return x.scatter_(1, places, sig), y

    xtr, ytr = make(SEQ_TRAIN, torch.Generator().manual_seed(2 * seed))
    xte, yte = make(SEQ_TEST, torch.Generator().manual_seed(2 * seed + 1))
    return xtr, ytr, xte, yte


def build_mlp(w: int):
    from examples.train_compressed import MLP
    return MLP(w, inputs=1024)


def build_cnn(w: int):
    from torch import nn
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, w), nn.ReLU(), nn.Linear(w, 10))


def build_seq(w: int):
    return _seq_module()(w)


def _seq_module():
    import torch
    from torch import nn

    class SeqClassifier(nn.Module):
        """Token embeddings, attention pooling (one learnt query over the sequence: softmax of
        its dot products, the weighted sum), a hidden layer of SEQ_FF, 10 classes."""

        def __init__(self, vocab: int):
            super().__init__()
            self.tokens = nn.Embedding(vocab, SEQ_DIM)
            self.query = nn.Linear(SEQ_DIM, 1)
            self.head = nn.Sequential(nn.Linear(SEQ_DIM, SEQ_FF), nn.ReLU(),
                                      nn.Linear(SEQ_FF, 10))

        def forward(self, x):
            h = self.tokens(x)
            weights = torch.softmax(self.query(h), dim=1)  # (batch, len, 1)
            return self.head((weights * h).sum(1))

    return SeqClassifier


FAMILIES = {f.name: f for f in (
    Family("mlp", mlp_params, build_mlp, digits_flat),
    Family("cnn", cnn_params, build_cnn, digits_images),
    Family("seq", seq_params, build_seq, sequences, min_width=SIGNAL),
)}
