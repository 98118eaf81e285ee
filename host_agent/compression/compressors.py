"""Block compressors: choose whole blocks of a gradient bucket, keep what was not sent.

A compressor sees one bucket at a time as a block-aligned float32 array (every parameter
starts on a block boundary, `BucketLayout`) and returns a `Selection`: the sorted indices of
the blocks it sends and their values (the hook writes them into the bucket's send array,
zero elsewhere, and calls `Agent.allreduce(..., blocks=selection.blocks)` so that the agent
looks at the selected blocks only). The error feedback, the momentum and the block norms are
one compiled pass over the bucket (kernels.accumulate), the selection a sampled threshold and
a partial sort of the candidates' norms (kernels.top_blocks); no element is ever sorted.

Each rank selects on its own (DGC); the switch sums the union of the ranks' blocks, where a
rank that did not select a block contributes zeros, and that block stays in its residual.
Error feedback is exact: after a step, sent + residual == residual before + gradient,
element by element, with every element in exactly one of the two.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from host_agent.compression import kernels
from host_agent.compression.config import CompressionConfig
from host_agent.hooks.layout import block_aligned_layout


@dataclass(frozen=True)
class BucketLayout:
    """Where a bucket's parameters sit in its block-aligned flat array.

    params: one hashable identity per parameter (DDP: id() of the Parameter); src: offsets in
    the bucket; dst: offsets in the aligned array (multiples of block_size); sizes: element
    counts; length: the aligned array's length (a multiple of block_size).
    """
    params: tuple
    src: np.ndarray
    dst: np.ndarray
    sizes: np.ndarray
    length: int
    block_size: int

    @property
    def key(self) -> tuple:
        return self.params + tuple(self.sizes.tolist())

    @property
    def nblocks(self) -> int:
        return self.length // self.block_size

    def pieces(self):
        """(bucket offset, aligned offset, size) per parameter."""
        return zip(self.src.tolist(), self.dst.tolist(), self.sizes.tolist())

    def piece_sq_norms(self, bucket: np.ndarray) -> np.ndarray:
        """Squared L2 norm of each parameter's piece of the (unaligned) bucket."""
        return np.array([np.dot(bucket[s:s + k], bucket[s:s + k]) for s, _, k in self.pieces()],
                        np.float64)

    def block_segments(self) -> np.ndarray:
        """Per block: the index of the parameter it belongs to."""
        per_param = -(-self.sizes // self.block_size)
        return np.repeat(np.arange(len(self.sizes)), per_param)

    @classmethod
    def of(cls, params, sizes, block_size: int) -> "BucketLayout":
        """Layout of parameters packed back to back, each padded to whole blocks."""
        src, dst, length = block_aligned_layout(sizes, block_size)
        return cls(tuple(params), src, dst, np.asarray(sizes, np.int64), length, block_size)


@dataclass
class Selection:
    """One bucket's compressed form at one rank.

    blocks: sorted int64 indices of the blocks sent (None: dense, let the agent scan).
    rows: float32 (len(blocks), block_size): the sent blocks' values, in the order of
        `blocks`; dense: the whole aligned array (layout.length,); None when `array`
        holds them.
    nblocks: the bucket's block count.
    array: the aligned send array the compressor wrote the blocks into, or None
        (`Compressor.compress(..., send=...)`).

    The compressor hands over the blocks alone: an aligned array of the whole bucket, zero
    outside them, is what the agent sums, and the hook keeps one per bucket (compress writes
    the blocks straight into it, or `write` puts the rows in; kernels.unpack clears what the
    sum wrote). `send` builds a fresh one.
    """
    blocks: np.ndarray | None
    rows: np.ndarray | None
    nblocks: int
    array: np.ndarray | None = None

    def write(self, out: np.ndarray) -> np.ndarray:
        """Put the sent values into `out`, a float32 aligned array that is +0.0 outside the
        selected blocks; returns it. Dense: returns `rows` itself (out unused)."""
        if self.blocks is None:
            return self.rows
        if self.array is not None:
            if self.array is not out:
                out.reshape(self.nblocks, -1)[self.blocks] = \
                    self.array.reshape(self.nblocks, -1)[self.blocks]
            return out
        out.reshape(self.nblocks, -1)[self.blocks] = self.rows
        return out

    @property
    def send(self) -> np.ndarray:
        """The aligned array: the selected blocks' values, zeros elsewhere (dense: rows; the
        compressor's `array` if it wrote one, else a new one)."""
        if self.blocks is None:
            return self.rows
        if self.array is not None:
            return self.array
        B = self.rows.shape[1]
        return self.write(np.zeros(self.nblocks * B, np.float32))


class ResidualMemory:
    """Per-bucket flat buffers (residual, momentum) that survive a change of bucket layout.

    DDP rebuilds its buckets after the first iteration (parameters regrouped by the order
    their gradients became ready). Buffers are kept per layout; when a new layout appears,
    each parameter's slice moves from wherever it was, so nothing is lost, and a layout's
    buffers are freed once all its parameters moved.
    """

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self.buffers: dict[tuple, dict[str, np.ndarray]] = {}
        self._where: dict = {}   # parameter -> (layout key, offset)
        self._users: dict[tuple, int] = {}

    def get(self, layout: BucketLayout) -> dict[str, np.ndarray]:
        key = layout.key
        bufs = self.buffers.get(key)
        if bufs is not None:
            return bufs
        bufs = {n: np.zeros(layout.length, np.float32) for n in self.names}
        for p, d, size in zip(layout.params, layout.dst.tolist(), layout.sizes.tolist()):
            old = self._where.get(p)
            if old is not None:  # a loop per parameter, on a layout change only
                okey, od = old
                for n in self.names:
                    bufs[n][d:d + size] = self.buffers[okey][n][od:od + size]
                self._users[okey] -= 1
                if self._users[okey] == 0:
                    del self.buffers[okey], self._users[okey]
            self._where[p] = (key, d)
        self.buffers[key] = bufs
        self._users[key] = len(layout.params)
        return bufs

    def of_param(self, param) -> dict[str, np.ndarray]:
        """{name: view of the parameter's slice} of its current buffers ({}: none yet)."""
        where = self._where.get(param)
        if where is None:
            return {}
        key, d = where
        layout_sizes = dict(zip(key[:len(key) // 2], key[len(key) // 2:]))
        size = layout_sizes[param]
        return {n: b[d:d + size] for n, b in self.buffers[key].items()}


def top_scores(score: np.ndarray, k: int) -> np.ndarray:
    """Sorted indices of the k largest of any float scores (LossComp's signed log weights;
    block norms go through kernels.top_blocks)."""
    n = len(score)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.argpartition(score, n - k)[n - k:]).astype(np.int64)


class Compressor:
    """Block compression with error feedback, DGC momentum correction and warm-up.

    Subclasses choose the blocks (`choose`) and may rescale what is sent (`rescale`). State
    (residual, momentum, step) lives here and survives across steps and buckets; one
    compressor per model replica (per rank).

    Args:
        config: a `CompressionConfig` (validated here).
        block_size: the SpINA job's block size (elements per block).
    """

    def __init__(self, config: CompressionConfig, block_size: int):
        self.config = config.validate()
        self.block_size = block_size
        names = (("residual",) if config.error_feedback else ()) + \
                (("momentum",) if config.momentum else ())
        self.memory = ResidualMemory(names)
        self.previous_blocks: dict[tuple, np.ndarray] = {}  # layout key -> last step's blocks
        self.step = 0          # completed steps (end_step calls)
        self.bucket_index = 0  # buckets compressed in the current step

    def current_ratio(self) -> float:
        cfg = self.config
        if self.step < cfg.warmup_steps:  # geometric: warmup_ratio -> ratio
            return (cfg.warmup_ratio
                    * (cfg.ratio / cfg.warmup_ratio) ** (self.step / cfg.warmup_steps))
        return cfg.ratio

    def blocks_to_send(self, nblocks: int, nparams: int = 1) -> int:
        """k for a bucket of `nblocks` blocks holding `nparams` parameters: the ratio's share,
        at least 1 block and at least min_blocks_per_param per parameter, at most all."""
        # the epsilon keeps float error (0.07 * 100 = 7.000000000000001) from adding one
        k = math.ceil(self.current_ratio() * nblocks - 1e-9)
        return min(nblocks, max(1, k, self.config.min_blocks_per_param * nparams))

    def compress(self, layout: BucketLayout, grad: np.ndarray,
                 send: np.ndarray | None = None) -> Selection:
        """Compress one bucket's fresh local gradient.

        Args:
            layout: where the bucket's parameters go in the block-aligned array.
            grad: the bucket as DDP packs it (float32, parameters back to back, length
                layout.sizes.sum()); read, never written. The residual (or velocity) takes
                it piece by piece, so the bucket is never copied to an aligned array first.
            send: the bucket's kept send array (float32, layout.length, +0.0 everywhere),
                or None. Given, the selected blocks go straight into it from the residual
                (`Selection.array`), without rows in between.

        Returns the blocks to send and their values; the residual (and velocity) lose
        exactly the sent blocks.
        """
        cfg = self.config
        B, nblocks = self.block_size, layout.nblocks
        mem = self.memory.get(layout)
        v = mem["residual"] if cfg.error_feedback else np.zeros(layout.length, np.float32)
        u = mem.get("momentum")  # DGC momentum correction: accumulate velocity, not gradient
        norms = kernels.accumulate(layout, grad, v, u, cfg.momentum, self.candidates(layout))
        blocks = self.choose(norms, self.blocks_to_send(nblocks, len(layout.sizes)), layout,
                             grad)
        self.bucket_index += 1
        # k rows copied, not an array of the whole bucket; sent blocks leave the residual,
        # and with DGC's masking the velocity (sent velocity must not push again)
        u_sent = u if cfg.momentum_masking else None
        if u is not None and cfg.momentum_masking and not cfg.mask_repeats:
            self.mask_waited(layout, u, blocks)
            u_sent = None
        if send is not None and not self.rescales:
            kernels.take(v, blocks, B, cfg.error_feedback, u_sent, send)
            return Selection(blocks, None, nblocks, send)
        rows = kernels.take(v, blocks, B, cfg.error_feedback, u_sent)
        self.rescale(rows, blocks, norms, layout, grad)
        sel = Selection(blocks, rows, nblocks)
        if send is not None:
            sel.array = sel.write(send)
        return sel

    def mask_waited(self, layout: BucketLayout, u: np.ndarray, blocks: np.ndarray) -> None:
        """Momentum masking without repeats: clear u (+0.0) in the `blocks` this bucket did
        not send in its previous step (all of them on a layout's first step)."""
        key = layout.key
        before = self.previous_blocks.get(key)
        if before is None:  # a new layout (DDP's rebuild): forget the ones the memory freed
            self.previous_blocks = {k: b for k, b in self.previous_blocks.items()
                                    if k in self.memory.buffers}
        waited = blocks if before is None else np.setdiff1d(blocks, before, assume_unique=True)
        u.reshape(layout.nblocks, self.block_size)[waited] = 0.0
        self.previous_blocks[key] = blocks

    def end_step(self) -> None:
        """The step's last bucket was compressed (the hooks call this)."""
        self.step += 1
        self.bucket_index = 0

    def observe_loss(self, loss: float) -> None:
        """The step's training loss, the same on every rank (LossComp uses it)."""

    def choose(self, norms, k, layout, grad) -> np.ndarray:
        """Sorted int64 indices of the k blocks to send, given every block's squared norm."""
        raise NotImplementedError

    def candidates(self, layout: BucketLayout) -> kernels.Candidates | None:
        """The bucket's `kernels.Candidates` the pass fills for `choose`, or None (only the
        top-k selection uses them)."""
        return None

    rescales = False  # True: `rescale` changes the rows (they are then taken before `send`)

    def rescale(self, rows, blocks, norms, layout, grad) -> None:
        """Scale the sent rows (k, block_size) in place (only the large-batch method does)."""


class DenseCompressor(Compressor):
    """No compression: the bucket goes as it is and the agent finds its non-zero blocks."""

    def compress(self, layout: BucketLayout, grad: np.ndarray,
                 send: np.ndarray | None = None) -> Selection:
        """A new aligned array of the bucket (`send` unused: the agent sums this one)."""
        self.bucket_index += 1
        send = np.zeros(layout.length, np.float32)
        kernels.accumulate(layout, grad, send)  # the bucket, block-aligned (norms unused)
        return Selection(None, send, layout.nblocks)


class BlockTopK(Compressor):
    """The k blocks with the largest L2 norm (of gradient + residual)."""

    def __init__(self, config: CompressionConfig, block_size: int):
        super().__init__(config, block_size)
        self._candidates: dict[tuple, kernels.Candidates] = {}  # per layout, as the memory

    def candidates(self, layout):
        key = layout.key
        held = self._candidates.get(key)
        if held is None:  # a new layout (DDP's rebuild): forget the ones the memory freed
            self._candidates = {k: c for k, c in self._candidates.items()
                                if k in self.memory.buffers}
            held = self._candidates[key] = kernels.Candidates(layout.nblocks)
        return held

    def choose(self, norms, k, layout, grad):
        # the sample's seed changes per bucket and step; the result never depends on it, nor
        # on whether the pass's candidates replaced the sample
        return kernels.top_blocks(norms, k, seed=(self.step << 16) + self.bucket_index,
                                  candidates=self.candidates(layout))


class RandomK(Compressor):
    """k blocks drawn uniformly, the same blocks on every rank (seed, step, bucket): a control."""

    def choose(self, norms, k, layout, grad):
        rng = np.random.default_rng((self.config.seed, self.step, self.bucket_index))
        return np.sort(rng.choice(len(norms), k, replace=False)).astype(np.int64)


class ScaledMask(Compressor):
    """Large-batch compression for layer-wise optimisers (LARS, LAMB).

    Global top-k leaves some layers with no block at all, and the rest with a norm unrelated
    to the layer's true gradient; a layer-wise optimiser's trust ratio ||w|| / ||update||
    then scales those layers wrongly. Here every layer (parameter) sends its own top
    ceil(ratio * its blocks) blocks, and the sent values of each layer are scaled so their
    norm equals the norm of the layer's fresh local gradient. Unsent elements arrive as exact
    zeros, a mask a masked optimiser can use to leave its state for them untouched.
    The residual keeps the unscaled values not sent, as for top-k.
    """
    rescales = True

    def choose(self, norms, k, layout, grad):
        seg = layout.block_segments()
        per_layer = -(-layout.sizes // self.block_size)
        quota = np.minimum(per_layer,
                           np.maximum(1, np.ceil(self.current_ratio() * per_layer - 1e-9)))
        order = np.lexsort((-norms, seg))  # by layer, then by decreasing norm within it
        rank_in_layer = (np.arange(len(order))
                         - np.repeat(np.cumsum(per_layer) - per_layer, per_layer))
        return np.sort(order[rank_in_layer < quota[seg[order]]]).astype(np.int64)

    def rescale(self, rows, blocks, norms, layout, grad):
        seg = layout.block_segments()
        nseg = len(layout.sizes)
        fresh = layout.piece_sq_norms(grad)
        sent = np.bincount(seg[blocks], weights=norms[blocks], minlength=nseg)
        scale = np.where(sent > 0, np.sqrt(fresh / np.where(sent > 0, sent, 1)), 1.0)
        rows *= scale[seg[blocks]].astype(np.float32)[:, None]


class LossComp(Compressor):
    """Loss-voted compression: blocks whose sending preceded a loss drop are favoured.

    Per bucket, each block carries a credit: after every step, the blocks sent in the step
    before get the relative loss change (previous loss - this loss) / previous loss, and all
    credits decay with the horizon `loss_window` (an exponential average over a few windows of
    steps). Blocks are sampled without replacement (Gumbel top-k) with weight
    (norm^2 * exp(credit_weight * credit / max|credit|)) ** (1 / temperature).
    The ratio follows the loss trend: after each window of `loss_window` steps, a mean loss
    that fell by more than `trend_threshold` against the previous window lowers the ratio by
    `ratio_step` (compression is not hurting: send less), otherwise it rises, within
    [ratio_min, ratio_max]. The loss must be the same on every rank (average it), so every
    rank sends the same number of blocks.
    """

    def __init__(self, config: CompressionConfig, block_size: int):
        super().__init__(config, block_size)
        self.ratio = config.ratio
        self.credit: dict[tuple, np.ndarray] = {}
        self.sent_last: dict[tuple, np.ndarray] = {}  # blocks sent in the latest step
        self.sent_before: dict[tuple, np.ndarray] = {}  # ... and in the step before it
        self.prev_loss: float | None = None
        self.window: list[float] = []  # losses of the current trend window
        self.prev_window_mean: float | None = None
        self.rng = np.random.default_rng(config.seed)

    def current_ratio(self) -> float:
        cfg = self.config
        if self.step < cfg.warmup_steps:
            return super().current_ratio()
        return self.ratio

    def choose(self, norms, k, layout, grad):
        key = layout.key
        credit = self.credit.setdefault(key, np.zeros(len(norms)))
        top = np.abs(credit).max()
        logw = np.log(norms.astype(np.float64) + 1e-300)
        if top > 0:
            logw += self.config.credit_weight * credit / top
        gumbel = -np.log(-np.log(self.rng.random(len(norms))))
        blocks = top_scores(logw / self.config.temperature + gumbel, k)
        self.sent_before[key] = self.sent_last.get(key, blocks[:0])
        self.sent_last[key] = blocks
        return blocks

    def observe_loss(self, loss: float) -> None:
        cfg = self.config
        if self.prev_loss is not None:
            gain = (self.prev_loss - loss) / max(abs(self.prev_loss), 1e-12)
            decay = 1.0 - 1.0 / cfg.loss_window
            for key, credit in self.credit.items():
                credit *= decay
                # The step before the last one changed the weights this loss was measured at.
                credit[self.sent_before.get(key, [])] += (1.0 - decay) * gain
        self.prev_loss = float(loss)
        self.window.append(float(loss))
        if len(self.window) == cfg.loss_window:
            mean = float(np.mean(self.window))
            if self.prev_window_mean is not None:
                lo, hi = cfg.ratio_bounds
                fell = (self.prev_window_mean - mean) / max(abs(self.prev_window_mean), 1e-12)
                factor = 1 / cfg.ratio_step if fell > cfg.trend_threshold else cfg.ratio_step
                self.ratio = min(hi, max(lo, self.ratio * factor))
            self.prev_window_mean = mean
            self.window.clear()
