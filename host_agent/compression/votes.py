"""Sign and ternary votes: signSGD with majority vote and TernGrad, summed exactly by SpINA.

    comp = make_compressor(method="sign", block_size=agent.job.block_size)   # or "ternary"
    model.register_comm_hook(VoteHookState(comp, agent), spina_vote_hook)    # host_agent.hooks

Each rank turns its bucket p (the fresh gradient, or with `momentum` its local momentum
u = m u + g as in Signum; plus, with error feedback, its residual) into integers in
{-1, 0, +1}, one per element, in whole blocks, and the switch adds them as int32
(exact: int32 tensors travel unscaled, docs/aggregation.md). A bucket costs two calls, run one
after the other on the hook's own thread (so every rank makes them in the same order):

1. the scale: a small float32 message, a block per parameter (layer), summed by the switch;
   - sign: each rank's EF-signSGD scale ||p||_1 / d; the agreed scale is the ranks' mean
     (within SpINA's quantization bound; a NaN or Inf makes the layer NaN at every rank).
   - ternary: a one-hot row of 256 float32 bins at the exponent e = ceil(log2 max|q|) (the
     exponent SpINA's setup round would take); the sum counts the ranks per exponent, so the
     highest non-empty bin is the maximum over ranks, and the shared scale s = 2**e >= every
     rank's max|q| (within 2x of TernGrad's max: a power of two, as the switch's own exponent).
     Each rank sends at most one non-zero block per layer, and a NaN or Inf in p puts NaN in
     its row, which makes the layer NaN at every rank (the loss scaler sees it).
2. the votes, int32:
   - sign: v = sign(p); the result is sign(sum of v) (the majority; 0 on a tie) times the
     agreed scale, so the update has SGD's magnitude and the vote's direction.
   - ternary: t = sign(q) with probability |q| / s, else 0 (TernGrad's stochastic
     ternarisation: s t is unbiased for q, p clipped); the result is s * (sum of t) / N.

Error feedback (`error_feedback=True`): sign keeps EF-signSGD's residual p - c with
c = (||p||_1 / d) sign(p), the rank's own compressed message (a contraction, as EF needs; the
majority vote is no rank's message and is not fed back). Ternary first clips p to
+-clip_sigma x its layer's root mean square (TernGrad's gradient clipping), q, and keeps p - q:
the clipping's error. The ternary draw itself is unbiased and is not fed back: its error
s t - q has the expected square s ||q||_1 - ||q||^2, which exceeds ||q||^2 as soon as s is
large against the typical |q| (no contraction, which error feedback needs), and feeding it
back made the residual grow without bound (docs/bits.md). A layer whose agreed scale is not
finite drops its residual, so a step the loss scaler skips does not poison the steps after it.

Bytes: int32 lanes carry a vote in 4 bytes, as much as a dense float; ternary skips blocks that
are zero at every rank. Narrow lanes (docs/bits.md) are what turns the votes into fewer bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from host_agent.compression.compressors import BucketLayout, Compressor

EXP_MIN = -128   # ternary's one-hot bins: exponents EXP_MIN .. EXP_MIN + BINS - 1; a smaller
BINS = 256       # max|p| takes EXP_MIN (still >= it); above 2**127 counts as not finite


def padded_sizes(layout: BucketLayout) -> np.ndarray:
    """Each parameter's length in the aligned array (whole blocks)."""
    return -(-layout.sizes // layout.block_size) * layout.block_size


def per_element(layout: BucketLayout, per_piece: np.ndarray) -> np.ndarray:
    """A per-parameter value repeated over that parameter's aligned elements."""
    return np.repeat(per_piece, padded_sizes(layout))


def piece_reduce(ufunc, a: np.ndarray, layout: BucketLayout, dtype=None) -> np.ndarray:
    """ufunc (np.add, np.maximum) over each parameter's aligned span, padding included."""
    out = np.zeros(len(layout.sizes), dtype or a.dtype)
    live = layout.sizes > 0
    if live.any():
        out[live] = ufunc.reduceat(a, layout.dst[live], dtype=dtype)
    return out


def ternary_exponents(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ceil(log2 m) clipped below at EXP_MIN, not-finite mask) of per-layer maxima m >= 0."""
    mant, e = np.frexp(m)
    e = e - (mant == 0.5)  # an exact power of two is its own ceiling
    bad = ~np.isfinite(m) | (e > EXP_MIN + BINS - 1)
    return np.where(bad, EXP_MIN, np.maximum(e, EXP_MIN)).astype(np.int64), bad


def onehot_message(m: np.ndarray, block_size: int) -> np.ndarray:
    """Rows of BINS float32 (padded to whole blocks), one per layer: 1.0 at the layer's
    exponent bin, NaN in a layer whose max is not finite, nothing for an all-zero layer."""
    row = -(-BINS // block_size) * block_size
    msg = np.zeros((len(m), row), np.float32)
    e, bad = ternary_exponents(m)
    live = (m > 0) & ~bad
    msg[np.flatnonzero(live), e[live] - EXP_MIN] = 1.0
    msg[bad, 0] = np.nan
    return msg.reshape(-1)


def onehot_scale(summed: np.ndarray, nlayers: int) -> np.ndarray:
    """The shared scale per layer from the summed one-hot rows: 2**(highest non-empty bin),
    0 where no rank had a non-zero value, NaN where any rank was not finite."""
    counts = summed.reshape(nlayers, -1)[:, :BINS]
    has = counts > 0
    top = BINS - 1 - np.argmax(has[:, ::-1], axis=1)
    scale = np.ldexp(np.float32(1), (EXP_MIN + top).astype(np.int32)).astype(np.float32)
    scale[~has.any(axis=1)] = 0
    scale[np.isnan(counts).any(axis=1)] = np.nan
    return scale


@dataclass
class Ballot:
    """One bucket at one rank between the hook's two calls.

    p: the residual plus the fresh gradient (aligned; with error feedback, the residual's own
    buffer, which becomes the new residual); own: sign's per-layer ||p||_1 / d, or ternary's
    clipped q; step, bucket: where the ternary draws come from.
    """
    layout: BucketLayout
    p: np.ndarray
    step: int
    bucket: int
    own: np.ndarray | None = None


class VoteCompressor(Compressor):
    """Base of the votes: p = gradient (+ residual), a scale message, int32 votes, decoding.

    The hook calls, per bucket: `prepare(layout, grad)` -> (Ballot, float32 message, summed
    over ranks), `agreed_scale(ballot, summed, world)` (per layer), `encode(ballot, scale)`
    (int32 votes; updates the residual), then `decode(ballot, summed_votes, scale, world)`
    (float32, aligned: the bucket's averaged gradient). Only `prepare` touches the
    compressor's counters, so the later calls may run on another thread while the next bucket
    is prepared. `rank` seeds the ternary draws (the hook sets it).
    """

    def __init__(self, config, block_size: int):
        super().__init__(config, block_size)
        self.rank = 0

    def compress(self, layout, grad, send=None):
        raise TypeError(f"method {self.config.method!r} sends votes: register it with "
                        "spina_vote_hook (host_agent.hooks.votes), which decodes them")

    def prepare(self, layout: BucketLayout, grad: np.ndarray) -> tuple[Ballot, np.ndarray]:
        cfg = self.config
        mem = self.memory.get(layout)
        p = mem["residual"] if cfg.error_feedback else np.zeros(layout.length, np.float32)
        if cfg.momentum:  # Signum: the vote is on the local momentum u = m u + g
            u = mem["momentum"]
            _add_pieces(layout, u, grad, scale=cfg.momentum)
            p += u
        else:
            _add_pieces(layout, p, grad)
        ballot = Ballot(layout, p, self.step, self.bucket_index)
        self.bucket_index += 1
        return ballot, self.message(ballot)

    def feed_back(self, ballot: Ballot, carried: np.ndarray, scale: np.ndarray) -> None:
        """residual = p - what this rank's message carried; zero where the scale is not finite."""
        if self.config.error_feedback:
            ballot.p -= carried
            ballot.p[~np.isfinite(per_element(ballot.layout, scale))] = 0

    def message(self, ballot: Ballot) -> np.ndarray:
        raise NotImplementedError

    def agreed_scale(self, ballot: Ballot, summed: np.ndarray, world: int) -> np.ndarray:
        raise NotImplementedError

    def encode(self, ballot: Ballot, scale: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ballot: Ballot, votes: np.ndarray, scale: np.ndarray,
               world: int) -> np.ndarray:
        raise NotImplementedError


def signs(p: np.ndarray) -> np.ndarray:
    """sign(p) as int32; NaN gives 0 (its layer is NaN through the scale)."""
    return (p > 0).astype(np.int32) - (p < 0)


class SignVote(VoteCompressor):
    """signSGD with majority vote; error feedback as EF-signSGD (scale ||p||_1 / d per layer)."""

    def message(self, ballot):
        layout = ballot.layout
        d = np.maximum(layout.sizes, 1)
        own = (piece_reduce(np.add, np.abs(ballot.p), layout, np.float64) / d)
        ballot.own = own.astype(np.float32)
        msg = np.zeros((len(own), self.block_size), np.float32)  # a block per layer: a NaN
        msg[:, 0] = ballot.own                                    # spoils its own layer only
        return msg.reshape(-1)

    def agreed_scale(self, ballot, summed, world):
        return summed[::self.block_size] / np.float32(world)

    def encode(self, ballot, scale):
        votes = signs(ballot.p)
        self.feed_back(ballot, per_element(ballot.layout, ballot.own) * votes.astype(np.float32),
                       scale)
        return votes

    def decode(self, ballot, votes, scale, world):
        return np.sign(votes).astype(np.float32) * per_element(ballot.layout, scale)


class TernGrad(VoteCompressor):
    """TernGrad: q = p clipped to +-c rms per layer; t in {-1, 0, +1} with E[s t] = q, s shared
    (the max over ranks of max|q|, as 2**e). Error feedback keeps p - q (the clipping's error)."""

    def message(self, ballot):
        p, layout, c = ballot.p, ballot.layout, self.config.clip_sigma
        if c:
            d = np.maximum(layout.sizes, 1)
            rms = np.sqrt(piece_reduce(np.add, p * p, layout, np.float64) / d)
            bound = per_element(layout, (c * rms).astype(np.float32))
            ballot.own = np.clip(p, -bound, bound)
        else:
            ballot.own = p.copy() if self.config.error_feedback else p
        return onehot_message(piece_reduce(np.maximum, np.abs(ballot.own), layout),
                              self.block_size)

    def agreed_scale(self, ballot, summed, world):
        return onehot_scale(summed, len(ballot.layout.sizes))

    def draws(self, ballot: Ballot) -> np.ndarray:
        """This rank's uniforms for the bucket: independent across ranks, steps and buckets,
        reproducible from (seed, rank, step, bucket)."""
        rng = np.random.default_rng((self.config.seed, self.rank, ballot.step, ballot.bucket))
        return rng.random(len(ballot.p), dtype=np.float32)

    def encode(self, ballot, scale):
        q = ballot.own
        s = per_element(ballot.layout, scale)
        # P(u * s < |q|) = |q| / s: s is a power of two, so u * s is exact.
        with np.errstate(invalid="ignore"):
            keep = self.draws(ballot) * s < np.abs(q)
        votes = np.where(keep, signs(q), 0).astype(np.int32)
        self.feed_back(ballot, q, scale)  # the draw is unbiased: only clipping is fed back
        return votes

    def decode(self, ballot, votes, scale, world):
        # sum * s is exact (a power of two times a small integer): one rounding, the division
        return votes.astype(np.float32) * per_element(ballot.layout, scale) / np.float32(world)


def _add_pieces(layout: BucketLayout, aligned: np.ndarray, bucket: np.ndarray,
                scale: float = 1.0) -> None:
    """aligned = scale * aligned + bucket, parameter by parameter at the aligned offsets (the
    padding between pieces stays zero): torch's axpy is one pass where numpy needs two."""
    a, b = torch.from_numpy(aligned), torch.from_numpy(bucket)
    for s, d, k in layout.pieces():  # a loop per parameter, not per element
        if scale == 1.0:
            a[d:d + k] += b[s:s + k]
        else:
            torch.add(b[s:s + k], a[d:d + k], alpha=scale, out=a[d:d + k])


__all__ = ["Ballot", "SignVote", "TernGrad", "VoteCompressor", "onehot_message", "onehot_scale"]
