"""Priority overlap: the next forward pass starts while later layers' gradients are in flight.

DDP hands its buckets over from the model's last layers to its first, and every SpINA call
keeps that order (the agent's one-thread executor, first in first out). The next forward
pass needs the first layers first, so with plain DDP it waits for the whole backward's
communication, and then for the optimiser step of every layer. Two parts change that:

- `PrioritySender`, the send queue: a tensor handed over is split into chunks of whole lane
  spans, and the chunk sent next is the most urgent tensor's (lowest priority number: the
  front layers), so a small urgent bucket goes between two chunks of a large one. Every
  rank must make the same calls in the same order (a call is matched at the switch by its
  number), and buckets reach each rank at its own moment; so before each chunk the ranks
  agree on what to send with a small int32 all-reduce through the same switch (the
  *negotiation*: per key, 1 if handed over here, its priority, chunk count and whether it
  is the last of its group; a key counts once every rank has it). Once a group's last key
  (DDP's last bucket of a backward pass) counts, every key of the group does, and nothing
  more can preempt them: the rest goes in priority order without negotiating. Each chunk
  announces the whole tensor's exponent per slot (Agent.allreduce's `slot_exponents`) and
  lies on whole lane spans, so its blocks keep their lanes and their quantization: the
  sums are bit-identical to one call per tensor.
  `order="fifo"` sends the same chunks in hand-over order, without negotiation (the
  hand-over order is the same on every rank).

- `PriorityOverlap`, the training side (ByteScheduler's and P3's scheme, for DDP): the comm
  hook hands each bucket to the sender and returns DDP's local bucket at once, so backward
  does not wait for any communication; each parameter has its own optimiser, and a forward
  pre-hook on every module waits only for the buckets holding its own parameters, then
  applies their averaged gradients and steps their optimisers. The weights every forward
  pass sees are those of plain DDP followed by `optimizer.step()`, bit for bit (same sums,
  same per-parameter float operations), while the back layers' gradients still travel
  during the next forward's first layers.

docs/collectives.md ("Priority overlap") has the measurements and when it pays.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from host_agent.blocks import exponent_of_bits, rescale_nonfinite, scan_float_blocks
from host_agent.hooks.layout import block_aligned_layout
from spina import wire
from spina.config import ConfigError

ORDERS = ("priority", "fifo")
DEFAULT_CHUNK = 1 << 20   # elements (4 MB of float32: 34 ms at 1 Gbit/s), rounded up to lane spans
DEFAULT_KEYS = 256        # keys the negotiation covers: DDP bucket indices 0..255
MAX_PRIORITY = 1 << 16    # priorities 0..MAX_PRIORITY-1 (a sum over ranks stays in int32)


def lane_span(job) -> int:
    """Elements in one pass over every lane (nslots * nlanes blocks): a chunk starting at a
    multiple of it puts each block in the lane, hence the slot, it has in the whole tensor."""
    return job.nslots * job.nlanes * job.block_size


def slot_exponents(flat: np.ndarray, job) -> np.ndarray:
    """Per slot of `job`, the exponent this worker announces for float32 `flat` in one call:
    the largest over its non-zero blocks in that slot (finite values only), as
    agent._Call computes it; EXPONENT_NONE for a slot with none."""
    B, W, k = job.block_size, job.nslots, job.nlanes
    nz, bits, _ = scan_float_blocks(flat, B)
    rescale_nonfinite(flat, nz, bits, B)  # a NaN/Inf block's scale: its finite values
    out = np.full(W, wire.EXPONENT_NONE, np.int32)
    np.maximum.at(out, (nz % (W * k)) // k, exponent_of_bits(bits))
    return out


@dataclass
class _Entry:
    """One tensor in the send queue."""
    key: int
    flat: np.ndarray
    priority: int
    layer: tuple[int, int] | None
    exponents: np.ndarray
    nchunks: int
    future: concurrent.futures.Future
    arrival: int
    last: bool = False  # the last key of its group (a backward pass's last bucket)
    sent: int = 0  # chunks done


@dataclass
class TraceEvent:
    """One call of the sender's thread: kind "chunk" or "negotiate", times perf_counter's."""
    kind: str
    key: int
    chunk: int
    t0: float
    t1: float


@dataclass
class _Shared:
    """The sender's state its thread and submit() share, under `cond`."""
    cond: threading.Condition = field(default_factory=threading.Condition)
    pending: dict = field(default_factory=dict)  # key -> _Entry
    arrivals: int = 0
    closing: bool = False
    error: BaseException | None = None


class PrioritySender:
    """The agent's send queue ordered by priority, the order agreed by every rank.

    Args:
        agent: this rank's `Agent` (int32 lanes). The sender's thread makes all its calls;
            nothing else may call the agent while a tensor is queued.
        chunk_elements: the largest piece sent in one call, rounded up to whole lane spans
            (`lane_span`); a tensor waiting for a more urgent one waits at most one chunk.
        order: "priority" (the most urgent handed-over key first; negotiated) or "fifo"
            (hand-over order, every chunk of a tensor before the next tensor).
        keys: the keys 0..keys-1 a tensor may be submitted under (the negotiation's length).
        trace: record every call as a `TraceEvent` in `events`.

    Every rank must submit the same keys, with the same sizes, priorities and `last` flags,
    in the same order (DDP's buckets are); each key at most once at a time.

    Raises:
        ConfigError: naming the field: order, chunk_elements, keys, or the job's lane_bits
            (narrow lanes round stochastically per call: a chunk would not sum as the whole).
    """

    def __init__(self, agent, chunk_elements: int = DEFAULT_CHUNK, order: str = "priority",
                 keys: int = DEFAULT_KEYS, trace: bool = False):
        job = agent.job
        if order not in ORDERS:
            raise ConfigError(f"field 'order': {order!r} is not one of {', '.join(ORDERS)}")
        if type(chunk_elements) is not int or chunk_elements < 1:
            raise ConfigError(f"field 'chunk_elements': need a positive int, got "
                              f"{chunk_elements!r}")
        if type(keys) is not int or not 1 <= keys <= 4096:
            raise ConfigError(f"field 'keys': need an int in 1..4096, got {keys!r}")
        if job.lane_bits != 32:
            raise ConfigError(f"field 'lane_bits': priority overlap needs 32-bit lanes, the job "
                              f"has {job.lane_bits}")
        self.agent, self.order, self.keys = agent, order, keys
        span = lane_span(job)
        self.chunk = -(-chunk_elements // span) * span
        self.nworkers = job.nworkers
        self.events: list[TraceEvent] | None = [] if trace else None
        self._s = _Shared()
        self._batch: list[_Entry] = []  # agreed, no negotiation needed: a closed group
        self._thread = threading.Thread(target=self._run, name="spina-priority", daemon=True)
        self._thread.start()

    def submit(self, key: int, flat: np.ndarray, priority: int = 0,
               layer: tuple[int, int] | None = None,
               last: bool = False) -> concurrent.futures.Future:
        """Queue the sum of `flat` (float32, 1-D, contiguous, writeable: the sum is written
        into it) under `key`; lower `priority` goes first. `last`: no key comes after this
        one until every key queued so far is sent (DDP's last bucket of a backward pass).
        `layer`: DLCP's (Agent.allreduce). Returns a future of `flat`."""
        if type(key) is not int or not 0 <= key < self.keys:
            raise ValueError(f"key: need an int in 0..{self.keys - 1}, got {key!r}")
        if type(priority) is not int or not 0 <= priority < MAX_PRIORITY:
            raise ValueError(f"priority: need an int in 0..{MAX_PRIORITY - 1}, got {priority!r}")
        if not (isinstance(flat, np.ndarray) and flat.dtype == np.float32 and flat.ndim == 1
                and flat.flags.c_contiguous and flat.flags.writeable):
            raise ValueError("flat: need a writeable, contiguous 1-D float32 array")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        entry = _Entry(key, flat, priority, layer, slot_exponents(flat, self.agent.job),
                       max(1, -(-len(flat) // self.chunk)), fut, 0, bool(last))
        s = self._s
        with s.cond:
            if s.error is not None:
                raise s.error
            if s.closing:
                raise RuntimeError("PrioritySender is closed")
            if key in s.pending:
                raise ValueError(f"key: {key} is still in flight")
            entry.arrival = s.arrivals
            s.arrivals += 1
            s.pending[key] = entry
            s.cond.notify()
        return fut

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        with self._s.cond:
            self._s.closing = True
            self._s.cond.notify()
        self._thread.join()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        s = self._s
        while True:
            with s.cond:
                while not s.pending and not s.closing:
                    s.cond.wait()
                if not s.pending:
                    return
                oldest = min(s.pending.values(), key=lambda e: e.arrival)
            try:
                entry = (oldest if self.order == "fifo" else
                         self._batch[0] if self._batch else self._agree())
                self._send_chunk(entry)
                if self._batch and entry.sent == entry.nchunks:
                    self._batch.remove(entry)
            except BaseException as e:  # every queued future fails: the ranks are out of step
                with s.cond:
                    s.error = e
                    for other in s.pending.values():
                        other.future.set_exception(e)
                    s.pending.clear()
                    s.closing = True
                return

    def _traced(self, kind: str, key: int, chunk: int, call):
        t0 = time.perf_counter()
        out = call()
        if self.events is not None:
            self.events.append(TraceEvent(kind, key, chunk, t0, time.perf_counter()))
        return out

    def _agree(self) -> _Entry:
        """Negotiate: the most urgent key every rank has handed over (by priority, then key);
        if a last key is among those, all of them in that order (`_batch`)."""
        K = self.keys
        vec = np.zeros(4 * K, np.int32)
        with self._s.cond:
            mine = dict(self._s.pending)
        for key, e in mine.items():
            vec[key:4 * K:K] = 1, e.priority, e.nchunks - e.sent, e.last
        total = self._traced("negotiate", -1, -1, lambda: self.agent.allreduce(vec))
        n = self.nworkers
        ready = [k for k in np.flatnonzero(total[:K] == n).tolist() if k in mine]
        for k in ready:
            e = mine[k]
            if (total[K + k] != n * e.priority or total[2 * K + k] != n * (e.nchunks - e.sent)
                    or total[3 * K + k] != n * e.last):
                raise ValueError(f"key {k}: the ranks disagree on its priority, size or last "
                                 f"flag (summed over {n} ranks: {total[K + k]}, "
                                 f"{total[2 * K + k]} chunks left, {total[3 * K + k]}; here "
                                 f"{e.priority}, {e.nchunks - e.sent}, {int(e.last)})")
        if not ready:  # handed over in the same order everywhere, the oldest is common
            raise ValueError(f"keys {sorted(mine)}: no key is queued at every rank: the ranks "
                             "submitted keys in different orders")
        ready.sort(key=lambda k: (mine[k].priority, k))
        if any(mine[k].last for k in ready):  # the group is complete everywhere
            self._batch = [mine[k] for k in ready]
        return mine[ready[0]]

    def _send_chunk(self, e: _Entry) -> None:
        a = e.sent * self.chunk
        piece = e.flat[a:a + self.chunk]
        self._traced("chunk", e.key, e.sent, lambda: self.agent.allreduce(
            piece, inplace=True, layer=e.layer, slot_exponents=e.exponents))
        e.sent += 1
        if e.sent == e.nchunks:
            with self._s.cond:
                del self._s.pending[e.key]
            e.future.set_result(e.flat)


# ----------------------------------------------------------------------------- DDP side
@dataclass
class _Bucket:
    """One DDP bucket handed to the sender: where its parameters' gradients are in the sum."""
    key: int
    params: list
    src: np.ndarray
    dst: np.ndarray
    like: object  # DDP's bucket buffer: the dtype, shape and length of the result
    future: concurrent.futures.Future


class PriorityOverlap:
    """DDP training whose next forward pass overlaps the previous step's communication.

    Registers a comm hook on `model` (a DistributedDataParallel) and a forward pre-hook on
    every module of `model.module` that holds parameters; see the module docstring. The
    training loop is forward, backward, nothing else: no optimiser step and no zero_grad
    (each parameter's optimiser steps in its module's pre-hook, and its gradient is then
    set to None). Call `synchronize()` before reading the weights (evaluation, a
    checkpoint, the end): it applies every step still in flight.

    Args:
        model: the DDP model (nothing registered on it yet).
        agent: this rank's `Agent` (32-bit lanes), used by nothing else meanwhile.
        optimizer_class: e.g. torch.optim.SGD; one instance per parameter, made with
            **optimizer_kwargs. An optimiser that updates each parameter from its own
            gradient and state only (SGD, Adam, ...; not LAMB's or LARS's whole-model norms
            across parameters) steps exactly as one optimiser over all parameters.
        chunk_elements, order: the `PrioritySender`'s.
        world_size: divisor for averaging; default hooks.common.processes_summed(agent).
        trace: record the sender's calls (`sender.events`) and this side's waits and
            optimiser steps (`events`: TraceEvent kind "wait" or "step", key = bucket).

    Raises:
        ConfigError: naming the field (the sender's, or `optimizer_class` not a class).
    """

    __slots__ = ("sender", "block_size", "world_size", "optimizers", "_pending", "events",
                 "wait_seconds", "_handles")

    def __init__(self, model, agent, optimizer_class, chunk_elements: int = DEFAULT_CHUNK,
                 order: str = "priority", world_size: int | None = None, trace: bool = False,
                 **optimizer_kwargs):
        from host_agent.hooks.common import processes_summed  # torch: the DDP side only
        if not isinstance(optimizer_class, type):
            raise ConfigError(f"field 'optimizer_class': need an optimiser class such as "
                              f"torch.optim.SGD, got {optimizer_class!r}")
        self.sender = PrioritySender(agent, chunk_elements, order, trace=trace)
        self.block_size = agent.job.block_size
        self.world_size = world_size or processes_summed(agent)
        module = model.module
        self.optimizers = {p: optimizer_class([p], **optimizer_kwargs)
                           for p in module.parameters() if p.requires_grad}
        self._pending: dict = {}  # parameter -> _Bucket whose sum it waits for
        self.events: list[TraceEvent] | None = [] if trace else None
        self.wait_seconds = 0.0  # forward passes blocked on a bucket's sum
        self._handles = [m.register_forward_pre_hook(self._pre_forward)
                         for m in module.modules() if next(m.parameters(False), None) is not None]
        model.register_comm_hook(self, overlap_hook)

    def hand_over(self, bucket) -> None:
        """The comm hook's work: copy the bucket's gradients out and queue their sum."""
        from host_agent.hooks.common import pack_aligned
        params = list(bucket.parameters())
        for p in params:  # a parameter still waiting from the step before (its module never ran)
            if p in self._pending:
                self._apply(self._pending[p])
        buf = bucket.buffer()
        src, dst, aligned = block_aligned_layout([p.numel() for p in params], self.block_size)
        flat = pack_aligned(buf, src, dst, aligned)
        key = bucket.index()
        fut = self.sender.submit(key, flat, self.sender.keys - 1 - key,  # front layers first
                                 last=bucket.is_last())
        b = _Bucket(key, params, src, dst, buf, fut)
        for p in params:
            self._pending[p] = b

    def _pre_forward(self, module, args) -> None:
        for p in module.parameters(recurse=False):
            b = self._pending.get(p)
            if b is not None:
                self._apply(b)

    def _apply(self, b: _Bucket) -> None:
        """Wait for bucket `b`'s sum, average it into its parameters' gradients, step them."""
        from host_agent.hooks.common import unpack_aligned
        t0 = time.perf_counter()
        res = b.future.result()
        t1 = time.perf_counter()
        self.wait_seconds += t1 - t0
        avg = unpack_aligned(res, b.src, b.dst, b.like, self.world_size)
        for p, s in zip(b.params, b.src.tolist()):
            p.grad = avg[s:s + p.numel()].view_as(p)
            self.optimizers[p].step()
            p.grad = None
            del self._pending[p]
        if self.events is not None:
            self.events += [TraceEvent("wait", b.key, 0, t0, t1),
                            TraceEvent("step", b.key, 0, t1, time.perf_counter())]

    def synchronize(self) -> None:
        """Apply every bucket still in flight (front layers first)."""
        for b in sorted({id(b): b for b in self._pending.values()}.values(),
                        key=lambda b: -b.key):
            if b.params[0] in self._pending:
                self._apply(b)

    def close(self) -> None:
        """synchronize(), remove the pre-hooks, stop the sender's thread."""
        try:
            self.synchronize()
        finally:
            for h in self._handles:
                h.remove()
            self.sender.close()


def overlap_hook(state, bucket):
    """DDP comm hook of `PriorityOverlap` (registered by it): queue the bucket's sum and
    give DDP its own bucket back at once; the averaged gradients are applied later, in the
    forward pre-hooks. Unannotated (DDP checks annotations only when present), so that this
    module imports no torch until a DDP model uses it.

    Args:
        state: the `PriorityOverlap`.
        bucket: DDP's `torch.distributed.GradBucket`.

    Returns:
        A completed `torch.futures.Future` of `bucket.buffer()` itself, unchanged.
    """
    import torch
    state.hand_over(bucket)
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


__all__ = ["PrioritySender", "PriorityOverlap", "overlap_hook", "TraceEvent", "lane_span",
           "slot_exponents", "ORDERS", "DEFAULT_CHUNK"]
