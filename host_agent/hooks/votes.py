"""The votes' hook: sign or ternary votes on each gradient bucket, summed exactly by SpINA.

    comp = make_compressor(method="sign", block_size=agent.job.block_size)   # or "ternary"
    model.register_comm_hook(VoteHookState(comp, agent), spina_vote_hook)

The votes themselves (the scale message, the int32 votes, their decoding, error feedback) are
the compressors `SignVote` and `TernGrad` of host_agent/compression/votes.py, whose docstring
has the method; this hook runs a bucket's two calls (the scale, then the votes) one after the
other on the state's own thread, so every rank makes them in the same order.
"""
# No `from __future__ import annotations`: DDP compares the hook's annotations as objects.
import concurrent.futures
import time

import torch
import torch.distributed as dist

from host_agent.compression.votes import VoteCompressor
from host_agent.hooks.common import fail, hook_future, unpack_aligned
from host_agent.hooks.compressed import CompressionHookState, bucket_layout


class VoteHookState(CompressionHookState):
    """State of `spina_vote_hook`: a `CompressionHookState` plus the hook's own thread.

    Args: as `CompressionHookState` (the agent is required; an optimiser given is checked to
    add no momentum to a vote's: Signum's momentum is the vote's). blocks_sent counts the
    blocks of votes that were not all zero; bytes_sent, resends, seconds and `rounds` (switch
    rounds) add up both calls.
    """

    COUNTERS = CompressionHookState.COUNTERS + ("rounds",)
    __slots__ = ("executor", "rounds")

    def __init__(self, compressor: VoteCompressor, agent, world_size: int | None = None,
                 optimizer=None):
        if not isinstance(compressor, VoteCompressor):
            raise TypeError("spina_vote_hook needs method 'sign' or 'ternary', got "
                            f"{compressor.config.method!r}")
        # refuses another block size, and an optimiser's momentum on top of the vote's
        super().__init__(compressor, agent, world_size, optimizer=optimizer)
        compressor.rank = agent.rank
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spina-vote")

    def close(self) -> None:
        self.executor.shutdown(wait=True)


def spina_vote_hook(state: VoteHookState,
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Vote on a DDP gradient bucket through the SpINA switch (sign or ternary).

    Args:
        state: a `VoteHookState` with this rank's agent and a `SignVote` or `TernGrad`.
        bucket: DDP's GradBucket.

    Returns:
        A future of the decoded bucket (same dtype and length), bit-identical at every rank.

    Example (with `agent`, e.g. from `host_agent.assignment.agent_from_env()`):
        >>> comp = make_compressor(method="sign", block_size=agent.job.block_size)  # doctest: +SKIP
        >>> model.register_comm_hook(VoteHookState(comp, agent), spina_vote_hook)  # doctest: +SKIP
    """
    t0 = time.perf_counter()
    comp, agent, world = state.compressor, state.agent, state.world_size
    buf = bucket.buffer()
    layout = bucket_layout(bucket, comp.block_size)
    data = buf.detach().reshape(-1).to(torch.float32).numpy()
    ballot, message = comp.prepare(layout, data)  # reads the bucket now: DDP may reuse it
    if not hasattr(bucket, "is_last") or bucket.is_last():
        comp.end_step()
    state.add(compress_seconds=time.perf_counter() - t0)
    result, out = hook_future()

    def run():
        try:
            summed = agent.allreduce(message, inplace=True)
            s1 = agent.last_stats
            t1 = time.perf_counter()
            scale = comp.agreed_scale(ballot, summed, world)
            votes = comp.encode(ballot, scale)
            t2 = time.perf_counter()
            total = agent.allreduce(votes, inplace=True)
            s2 = agent.last_stats
            t3 = time.perf_counter()
            res = unpack_aligned(comp.decode(ballot, total, scale, world), layout.src,
                                 layout.dst, buf)
            state.count_call(s2, buf.numel())  # the votes' call, as the dense state counts
            state.add(compress_seconds=(t2 - t1) + (time.perf_counter() - t3),
                      seconds=s1.seconds, bytes_sent=s1.bytes_sent,
                      payload_bytes_sent=s1.payload_bytes_sent, resends=s1.resends,
                      rounds=s1.rounds + s2.rounds, blocks_total=layout.nblocks,
                      blocks_sent=s2.nonzero_blocks)
            result.set_result(res)
        except Exception as e:  # surfaces in DDP's backward on this rank
            fail(result, e)

    state.executor.submit(run)
    return out


__all__ = ["VoteHookState", "spina_vote_hook"]
