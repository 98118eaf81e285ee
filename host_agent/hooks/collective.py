"""The host collectives' hook: gradient buckets averaged by one of collectives.ALGORITHMS.

    from host_agent.hooks import CollectiveHookState, collective_allreduce_hook
    model.register_comm_hook(CollectiveHookState("2d-ring", groups=4),
                             collective_allreduce_hook)

The hook sums `bucket.buffer()` over the ranks with collectives.p2p.all_reduce, then divides
by the world size (DDP's default divides first; dividing the sum once rounds once, and every
rank applies the same float operations to bit-identical sums, so gradients stay
bit-identical across ranks). It runs inside the hook, before DDP's next bucket: no overlap
with the backward pass yet (issue 31 item 4 is to bring priority overlap).

Why here and not in collectives/: every DDP hook lives in host_agent.hooks, named by one
registry (`HOOKS`); collectives/ keeps the algorithms and their transport over
torch.distributed and imports no host_agent. This module's import of collectives is the one
place the two meet (docs/architecture.md, the module map's exceptions).
"""
# No `from __future__ import annotations`: DDP.register_comm_hook compares the hook's
# annotations with dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.
import time

import torch
import torch.distributed as dist

from collectives.p2p import all_reduce
from collectives.schedule import schedule


class CollectiveHookState:
    """State of `collective_allreduce_hook`.

    Args:
        algorithm: one of collectives.ALGORITHMS.
        groups: for the 2d algorithms, a group size or lists of ranks.
        process_group: default the world.

    Attributes: calls (buckets reduced) and seconds (wall time inside the all-reduce) since
    construction.

    Example (inside an initialised gloo job):
        >>> state = CollectiveHookState("halving-doubling")
        >>> ddp.register_comm_hook(state, collective_allreduce_hook)   # doctest: +SKIP
    """

    __slots__ = ("algorithm", "groups", "process_group", "calls", "seconds")

    def __init__(self, algorithm: str = "ring", groups=None, process_group=None):
        # fail at registration, not at the first backward pass
        schedule("all_reduce", algorithm, dist.get_world_size(process_group), groups)
        self.algorithm = algorithm
        self.groups = groups
        self.process_group = process_group
        self.calls = 0
        self.seconds = 0.0


def collective_allreduce_hook(state: CollectiveHookState,
                              bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP gradient bucket over all ranks with `state.algorithm`.

    Args:
        state: a `CollectiveHookState`.
        bucket: DDP's `torch.distributed.GradBucket`; its flat `buffer()` is reduced in place.

    Returns:
        A completed future holding the averaged buffer.
    """
    buf = bucket.buffer()
    t0 = time.perf_counter()
    all_reduce(buf, state.algorithm, state.process_group, state.groups)
    buf.div_(dist.get_world_size(state.process_group))
    state.seconds += time.perf_counter() - t0
    state.calls += 1
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


__all__ = ["CollectiveHookState", "collective_allreduce_hook"]
