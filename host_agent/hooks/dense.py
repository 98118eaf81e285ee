"""The dense hook: every gradient bucket summed by a SpINA switch as it is.

DDP hands each gradient bucket to a hook `hook(state, bucket) -> torch.futures.Future[Tensor]`
(torch.distributed.GradBucket; the future's value replaces the bucket's contents). This hook
sums `bucket.buffer()` over all ranks with the SpINA agent (`Agent.allreduce`) and divides by
the world size. Everything else DDP communicates (the initial parameter broadcast, buffer
broadcasts, the unused-parameter bitmap) stays on the process group, i.e. gloo; so does any
collective the training script calls itself.

One line in a training script under `torchrun`:

    model.register_comm_hook(SpinaHookState(agent_from_env()), spina_allreduce_hook)

`host_agent.assignment.agent_from_env` reads the job file that the launcher wrote (`python -m
host_agent.launch`, spina.config.JobFile) from `$SPINA_JOB_FILE` and binds this rank's address
from it.

Why the sum is done in float32 and averaged afterwards: DDP's default hook divides every
gradient by the world size before all-reduce; SpINA quantizes with a shared exponent, so
dividing first buys nothing, and dividing the float32 sum once, then rounding once to the
bucket's dtype (float16/bfloat16 buckets), loses less than rounding twice. Every rank gets
bit-identical sums from the switch and applies the same float operations, so gradients stay
bit-identical across ranks.
"""
# No `from __future__ import annotations` here: DDP.register_comm_hook compares the hook's
# annotations with dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.
import numpy as np
import torch
import torch.distributed as dist

from host_agent.agent import Agent
from host_agent.hooks.common import HookCounters, processes_summed, sum_async
from host_agent.hooks.layout import segment_sizes


class SpinaHookState(HookCounters):
    """State of `spina_allreduce_hook`: the rank's agent and running wire statistics.

    Args:
        agent: this rank's `host_agent.agent.Agent` (see `agent_from_env`).
        world_size: divisor for averaging; default `processes_summed(agent)` (the job's ranks,
            or a daemon client's processes when they attach as local ranks of a host).

    Attributes: the counters of `HookCounters` (calls, elements, bytes_sent,
    payload_bytes_sent, resends, seconds, partial_rounds, blocks_lost, loss_tolerant_packets)
    and `rounds` (switch rounds this rank took part in).

    The hook also learns DDP's bucket count (the last bucket of a backward pass says it is
    last) to give each bucket its layer position (`layer_of`).

    With narrow lanes (the job's lane_bits 16 or 8, an `Agent`) each bucket keeps an error
    feedback residual (`residuals`, by bucket index, docs/bits.md): what its lanes did not
    carry goes with the bucket's next call. A bucket whose size changes (DDP rebuilt its
    buckets) starts a new residual of zeros. A bucket whose pieces are off block boundaries
    is packed into an array kept by bucket index (`scratch`) and its sums copied back into
    the bucket.
    """

    COUNTERS = HookCounters.COUNTERS + ("rounds",)
    _CALL_FIELDS = COUNTERS[2:]  # each call's CallStats.rounds too
    __slots__ = ("agent", "world_size", "nbuckets", "residuals", "scratch", "rounds")

    def __init__(self, agent: Agent, world_size: int | None = None):
        self.agent = agent
        self.world_size = world_size or processes_summed(agent)
        self.nbuckets = 0  # DDP's buckets per backward pass, once a last bucket was seen
        self.residuals: dict[int, np.ndarray] = {}  # narrow lanes: bucket index -> residual
        self.scratch: dict[int, np.ndarray] = {}  # bucket index -> its aligned copy's array
        super().__init__()

    def residual_for(self, bucket, n: int) -> np.ndarray | None:
        """The bucket's error feedback residual (float32, `n`: the length summed: the bucket's
        own when it is summed in place, else its block-aligned copy's), or
        None: int32 lanes, no bucket index, or an agent that cannot take one (the daemon's)."""
        if not isinstance(self.agent, Agent) or self.agent.job.lane_bits == 32:
            return None
        return _kept(self.residuals, bucket, n, np.zeros)

    def scratch_for(self, bucket, n: int) -> np.ndarray | None:
        """The float32 array of `n` elements that a bucket which is not summed where it lies
        (its pieces off block boundaries, e.g. DDP's rebuilt bucket that starts with a bias)
        is packed into, kept by bucket index across steps (DDP waits for every bucket's
        future before the next backward pass); None without a bucket index (a new array)."""
        return _kept(self.scratch, bucket, n, np.empty)

    def _count(self, n: int) -> None:
        self.count_call(self.agent.last_stats, n)

    def layer_of(self, index: int, is_last: bool) -> tuple[int, int] | None:
        """The layer position (i, n) of DDP bucket `index` (host_agent/dlcp.py): DDP fills
        buckets from the model's last layers, so its LAST bucket holds the FIRST layers, the
        ones the next forward pass needs first (i = 0). None (the job's base priority) while
        the count is unknown: until a backward pass has shown its last bucket, which DDP's
        first pass and the pass after it rebuilds its buckets do only at their end."""
        if is_last:
            self.nbuckets = index + 1
        elif index + 1 >= self.nbuckets:  # more buckets than known: DDP rebuilt them
            self.nbuckets = 0
            return None
        return self.nbuckets - 1 - index, self.nbuckets


def _kept(store: dict, bucket, n: int, make) -> np.ndarray | None:
    """The float32 array of `n` elements kept in `store` by the bucket's index across steps
    (made by `make` when missing or resized); None without a bucket index."""
    try:
        index = bucket.index()
    except AttributeError:
        return None
    got = store.get(index)
    if got is None or got.size != n:
        got = store[index] = make(n, np.float32)
    return got


def spina_allreduce_hook(state: SpinaHookState,
                         bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP gradient bucket over all ranks through the SpINA switch.

    The all-reduce runs on the agent's worker thread (calls keep DDP's bucket order, which is
    the same on every rank), so backward computation goes on while the bucket is on the wire.

    Args:
        state: a `SpinaHookState` holding this rank's agent.
        bucket: DDP's `torch.distributed.GradBucket`: `bucket.buffer()` (a flat float32,
            float16 or bfloat16 CPU tensor) and `bucket.parameters()` (to start every
            parameter's gradient on a block boundary, see `hooks.layout.block_aligned_layout`).

    Returns:
        A `torch.futures.Future` whose value is the averaged flat tensor, same dtype and
        length as `bucket.buffer()`. It fails with the agent's `SpinaError` (for example
        `SpinaTimeout` naming the ranks that never contributed), which DDP raises in backward.

    Example (save as demo.py in the repository root, run `torchrun --standalone
    --nproc_per_node 2 demo.py`; rank 0 starts a software switch and writes the job file,
    as `python -m host_agent.launch` does for a real deployment):

        import torch, torch.distributed as dist
        from host_agent.assignment import agent_from_env
        from host_agent.hooks import SpinaHookState, spina_allreduce_hook
        from host_agent.launch import start_subprocess
        dist.init_process_group("gloo")
        box = [None]
        if dist.get_rank() == 0:
            switch, box[0] = start_subprocess(dist.get_world_size())  # switch + job file
        dist.broadcast_object_list(box)
        torch.manual_seed(dist.get_rank())
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
        model.register_comm_hook(SpinaHookState(agent_from_env(box[0])), spina_allreduce_hook)
        model(torch.randn(8, 10)).sum().backward()  # gradients averaged through the switch
        print(dist.get_rank(), model.module.weight.grad[0, :3])  # the same on every rank
        dist.barrier()
        if dist.get_rank() == 0:
            switch.terminate()
            switch.wait()
    """
    buf = bucket.buffer()
    return sum_async(state.agent, buf, segment_sizes(bucket, buf.numel()),
                     divide_by=state.world_size, on_done=state._count,
                     layer=_layer(state, bucket), residual=lambda n: state.residual_for(bucket, n),
                     inplace=True,  # DDP's bucket, as torch's own allreduce hook does
                     scratch=lambda n: state.scratch_for(bucket, n))


def _layer(state: SpinaHookState, bucket) -> tuple[int, int] | None:
    """The bucket's layer position (SpinaHookState.layer_of); None if it has no index."""
    try:
        index, last = bucket.index(), bucket.is_last()
    except AttributeError:
        return None
    return state.layer_of(index, last)


__all__ = ["SpinaHookState", "spina_allreduce_hook"]
