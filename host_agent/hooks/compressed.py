"""The compressed hooks: each gradient bucket compressed, then summed by SpINA or gloo.

    agent = agent_from_env()
    compressor = make_compressor(method="topk", ratio=0.01, momentum=0.9,
                                 block_size=agent.job.block_size)  # the job's blocks
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0)  # the compressor has it
    state = CompressionHookState(compressor, agent, optimizer=opt)  # checks both
    model.register_comm_hook(state, spina_compressed_hook)          # in-network (SpINA)
    model.register_comm_hook(CompressionHookState(compressor), gloo_compressed_hook)  # control

Both hooks compress the same way (the state's `Compressor`); they differ only in how the
selected blocks travel: `spina_compressed_hook` hands the block-sparse bucket to the agent
with the selected block indices (no second scan) and the switch sums the union;
`gloo_compressed_hook` all-gathers every rank's (block indices, block values) over the
process group and adds them up locally. The control measures what in-network aggregation
adds on top of compression. Like PowerSGD's hook, the state lives in a small object with
`__slots__`; the compressor's step advances after each step's last bucket.
"""
# No `from __future__ import annotations`: DDP compares the hook's annotations as objects.
import time

import numpy as np
import torch
import torch.distributed as dist

from host_agent.agent import Agent
from host_agent.compression import kernels
from host_agent.compression.compressors import BucketLayout, Compressor, Selection
from host_agent.hooks.common import (
    HookCounters,
    fail,
    hook_future,
    processes_summed,
    unpack_aligned,
)
from host_agent.hooks.layout import segment_sizes
from spina.config import ConfigError


class CompressionHookState(HookCounters):
    """State of the compressed hooks: a compressor, a transport, and running statistics.

    Args:
        compressor: this rank's `Compressor` (one per model replica; keeps residuals). With an
            agent, its block size must be the job's (`agent.job.block_size`): the agent cuts
            the bucket into the job's blocks, and a compressor with other blocks would hand
            it a wrong block hint (sums that silently lose elements, or an IndexError).
        agent: this rank's SpINA `Agent` (spina_compressed_hook); None for the gloo control.
        world_size: divisor for averaging; default the agent's job size or the group's size.
        process_group: the gloo group of the control (default: the default group).
        optimizer: the training's optimiser, to check that it adds no momentum of its own
            when the compressor does (DGC momentum correction: the optimiser's momentum
            must be 0, or every gradient is accelerated twice); None: not checked.

    Raises:
        ConfigError: a block size that differs from the job's, or double momentum.

    Attributes (summed over buckets since construction or `reset_stats()`, under a lock: the
    gloo control's buckets finish on several threads at once): the counters of
    `host_agent.hooks.common.HookCounters` (calls, elements, bytes_sent, resends, seconds, ...:
    for SpINA the agent's CallStats, as the dense hook's state; for gloo, bytes_sent is a
    ring all-gather's (N-1) x the packed indices and values and seconds the time from the
    collective's start to its end), and:
        blocks_sent, blocks_total: blocks this rank selected / blocks in its buckets.
        compress_seconds: time in the compressor (packing, selection, residual update).
    """

    COUNTERS = HookCounters.COUNTERS + ("blocks_sent", "blocks_total", "compress_seconds")
    __slots__ = ("compressor", "agent", "world_size", "process_group", "blocks_sent",
                 "blocks_total", "compress_seconds", "send_arrays")

    def __init__(self, compressor: Compressor, agent: Agent | None = None,
                 world_size: int | None = None, process_group=None, optimizer=None):
        if agent is not None and compressor.block_size != agent.job.block_size:
            raise ConfigError(
                f"field 'block_size': the compressor's blocks have {compressor.block_size} "
                f"elements, job {agent.job.job}'s have {agent.job.block_size}: make it with "
                "make_compressor(..., block_size=agent.job.block_size)")
        if optimizer is not None:
            check_single_momentum(compressor, optimizer)
        self.compressor = compressor
        self.agent = agent
        self.process_group = process_group
        if world_size is None:
            world_size = (processes_summed(agent) if agent is not None
                          else dist.get_world_size(process_group))
        self.world_size = world_size
        self.send_arrays: dict = {}  # bucket index -> (layout key, aligned float32 array)
        super().__init__()

    def send_array(self, bucket, layout: BucketLayout) -> np.ndarray:
        """The bucket's aligned send array, kept across steps: +0.0 everywhere between calls
        (the selection writes its blocks, kernels.unpack clears the blocks the sum wrote), so
        no call zeroes a bucket-sized array. One per bucket index, new when its layout
        changes (DDP's bucket rebuild)."""
        index = bucket.index() if hasattr(bucket, "index") else 0
        held = self.send_arrays.get(index)
        if held is None or held[0] != layout.key:
            held = self.send_arrays[index] = (layout.key, np.zeros(layout.length, np.float32))
        return held[1]

    def observe_loss(self, loss: float) -> None:
        """Tell the compressor this step's loss (averaged over ranks; LossComp votes with it)."""
        self.compressor.observe_loss(float(loss))


def check_single_momentum(compressor: Compressor, optimizer) -> None:
    """Refuse DGC momentum correction together with an optimiser that has momentum too.

    With `momentum` > 0 the compressor accumulates the velocity u = m u + g and sends it; an
    optimiser with momentum of its own (torch SGD, RMSprop: a param group's `momentum`) would
    accelerate that velocity again. Optimisers without a `momentum` field (Adam's betas,
    LAMB) pass unchecked: DGC's correction is for momentum SGD.

    Raises:
        ConfigError: naming the compressor's momentum and the first param group with one.
    """
    m = compressor.config.momentum
    if not m:
        return
    for i, group in enumerate(optimizer.param_groups):
        if group.get("momentum", 0):
            raise ConfigError(
                f"field 'momentum': the compressor applies momentum {m} (DGC momentum "
                f"correction), so the optimiser's must be 0; its param group {i} has "
                f"momentum {group['momentum']}")


def bucket_layout(bucket, block_size: int) -> BucketLayout:
    """The bucket's block-aligned layout, parameters named by id() (every compressed hook's)."""
    sizes = segment_sizes(bucket, bucket.buffer().numel())
    try:
        params = tuple(id(p) for p in bucket.parameters())
    except AttributeError:
        params = ()
    if len(params) != len(sizes):  # a bare buffer (tests): one piece, named by its index
        params = (("bucket", bucket.index() if hasattr(bucket, "index") else 0),)
    return BucketLayout.of(params, sizes, block_size)


def _compress_bucket(state: CompressionHookState, bucket,
                     to_send: bool = False) -> tuple[BucketLayout, Selection, np.ndarray | None]:
    """Compress the bucket, count it; end the step after the last bucket. `to_send`: also
    write the selection into the bucket's send array (timed with the compression) and return
    that array, else None."""
    t0 = time.perf_counter()
    buf = bucket.buffer()
    layout = bucket_layout(bucket, state.compressor.block_size)
    data = buf.detach().reshape(-1).to(torch.float32).numpy()  # a copy for half buckets only
    kept = state.send_array(bucket, layout) if to_send else None
    sel = state.compressor.compress(layout, data, kept)
    send = None
    if to_send:  # a dense selection is its own fresh array: the kept one stays unused
        send = sel.send
    if not hasattr(bucket, "is_last") or bucket.is_last():
        state.compressor.end_step()
    state.add(blocks_total=sel.nblocks,
              blocks_sent=sel.nblocks if sel.blocks is None else len(sel.blocks),
              compress_seconds=time.perf_counter() - t0)
    return layout, sel, send


def spina_compressed_hook(state: CompressionHookState,
                          bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress a DDP gradient bucket and average it over all ranks through the SpINA switch.

    Args:
        state: a `CompressionHookState` with this rank's agent and compressor.
        bucket: DDP's GradBucket (`buffer()`, `parameters()`, `is_last()`).

    Returns:
        A future of the averaged bucket (same dtype and length): the sum over ranks of what
        each sent, divided by the world size. Blocks no rank sent are exact zeros. A float32
        bucket gets it in place (the future's tensor is DDP's bucket buffer, as with
        torch's allreduce hook; the compressor has read the gradient by then), written by
        kernels.unpack, which also clears the state's send array for the next step.

    Example (with `agent`, e.g. from `host_agent.assignment.agent_from_env()`):
        >>> comp = make_compressor(method="topk", ratio=0.01,
        ...                        block_size=agent.job.block_size)  # doctest: +SKIP
        >>> model.register_comm_hook(CompressionHookState(comp, agent),
        ...                          spina_compressed_hook)  # doctest: +SKIP
    """
    buf = bucket.buffer()
    layout, sel, send = _compress_bucket(state, bucket, to_send=True)
    result, out = hook_future()

    def done(f):
        try:
            res = f.result()
            if buf.dtype == torch.float32 and buf.is_contiguous():
                # into DDP's bucket in place (the compressor has read it), and the send
                # array cleared for the next step in the same pass
                kernels.unpack(layout, res, buf.detach().reshape(-1).numpy(), state.world_size)
                avg = buf
            else:
                avg = unpack_aligned(res, layout.src, layout.dst, buf, state.world_size)
                send.fill(0)
            # this call's stats: calls run one at a time, and this runs before the next starts
            state.count_call(state.agent.last_stats, buf.numel())
            result.set_result(avg)
        except Exception as e:  # surfaces in DDP's backward on this rank
            send.fill(0)  # whatever the failed call wrote: the next step needs zeros
            fail(result, e)

    state.agent.allreduce_async(send, inplace=True, blocks=sel.blocks).add_done_callback(done)
    return out


def gloo_compressed_hook(state: CompressionHookState,
                         bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The control: the same compression, the blocks exchanged by gloo all_gather.

    Every rank sends (block indices as int32 bits, then the blocks' values) in one float32
    tensor; every rank adds all ranks' blocks in rank order, so results are bit-identical.
    All ranks send the same number of blocks (a ratio agreed through the config and, for
    LossComp, the averaged loss). Dense ("none") buckets go through all_reduce.

    Args:
        state: a `CompressionHookState` (no agent needed: the process group's).
        bucket: DDP's GradBucket.

    Returns:
        A future of the averaged bucket (same dtype and length), as `spina_compressed_hook`'s.
    """
    buf = bucket.buffer()
    layout, sel, _ = _compress_bucket(state, bucket)
    B, world, group = layout.block_size, state.world_size, state.process_group
    t0 = time.perf_counter()
    if sel.blocks is None:
        dense = torch.from_numpy(sel.rows)
        fut = dist.all_reduce(dense, group=group, async_op=True).get_future()

        def finish_dense(f):
            state.add(calls=1, elements=buf.numel(), seconds=time.perf_counter() - t0,
                      bytes_sent=2 * (world - 1) * dense.numel() * 4 // world)  # ring all-reduce
            return unpack_aligned(dense.numpy(), layout.src, layout.dst, buf, world)
        return fut.then(finish_dense)
    k = len(sel.blocks)
    packed = np.empty(k * (B + 1), np.float32)
    packed[:k] = sel.blocks.astype(np.int32).view(np.float32)  # bits travel unchanged
    packed[k:] = sel.rows.reshape(-1)
    mine = torch.from_numpy(packed)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    fut = dist.all_gather(gathered, mine, group=group, async_op=True).get_future()

    def finish(f):
        both = torch.stack(gathered)  # (world, k * (B + 1))
        idx = both[:, :k].contiguous().view(torch.int32).reshape(-1).long()
        rows = both[:, k:].reshape(world * k, B)
        total = torch.zeros(layout.nblocks, B)
        total.index_add_(0, idx, rows)  # rank order, the same on every rank
        state.add(calls=1, elements=buf.numel(), seconds=time.perf_counter() - t0,
                  bytes_sent=(world - 1) * packed.nbytes)  # ring all-gather
        return unpack_aligned(total.numpy().reshape(-1), layout.src, layout.dst, buf, world)
    return fut.then(finish)


__all__ = ["CompressionHookState", "check_single_momentum", "bucket_layout",
           "spina_compressed_hook", "gloo_compressed_hook"]
