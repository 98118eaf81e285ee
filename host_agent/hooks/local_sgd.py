"""Fewer rounds: local SGD and post-local SGD, the weights averaged through SpINA.

    state = LocalSGDState(agent, period=4, warmup_steps=100)
    model.register_comm_hook(state, spina_local_sgd_hook)    # DDP: synchronous while warming up
    opt = LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), state)

Local SGD (Stich 2019): every rank steps on its own gradient and every `period` (H) steps the
ranks replace their weights by the mean over ranks, one all-reduce of the parameters instead
of one of the gradients per step: 1/H of the rounds. Post-local SGD (Lin et al. 2020): the
first `warmup_steps` (S) steps are ordinary synchronous data-parallel SGD (the DDP hook sums
each gradient bucket through SpINA), local SGD after. The same split as torch's
PostLocalSGDOptimizer with its post-local-SGD hook and PeriodicModelAverager, with one state
object for both halves, so the step the hook switches at and the step averaging starts at
cannot disagree.

Averaging: all the optimiser's parameters go in one call, each starting on a block boundary
(`block_aligned_layout`); every rank divides the same int32 sums by N, so after averaging the
weights are bit-identical at every rank and within the quantization bound of the true mean
(docs/aggregation.md: |sum error| <= N 2**(-S-1) plus float32's last rounding). Only the
parameters are averaged: optimiser state (momentum buffers) stays each rank's own, as in
torch's averager; buffers (BatchNorm statistics) are DDP's (broadcast from rank 0).
"""
# No `from __future__ import annotations`: DDP compares the hook's annotations as objects.
import time

import numpy as np
import torch
import torch.distributed as dist

from host_agent.hooks.common import processes_summed, sum_async
from host_agent.hooks.layout import block_aligned_layout, segment_sizes
from spina.communication import LocalSGDConfig


class LocalSGDState:
    """What the local-SGD hook and optimiser share: the step count, H, S and the agent.

    Args:
        agent: this rank's `Agent` (or `DaemonClient`).
        period: H >= 1, local steps between two averagings (1: average after every step).
        warmup_steps: S >= 0, synchronous steps first (post-local SGD; 0: local SGD).
        world_size: divisor for averaging; default the agent's job size.

    Attributes:
        step: optimiser steps completed.
        sync_calls / sync_rounds / sync_bytes: gradient buckets the hook summed while
            synchronous, and the switch rounds and bytes they cost this rank.
        averages / average_rounds / average_bytes / average_seconds: averagings of the
            weights, and their rounds, bytes and time.
    """

    __slots__ = ("agent", "period", "warmup_steps", "world_size", "step", "sync_calls",
                 "sync_rounds", "sync_bytes", "averages", "average_rounds", "average_bytes",
                 "average_seconds")

    def __init__(self, agent, period: int, warmup_steps: int = 0, world_size: int | None = None):
        LocalSGDConfig(period, warmup_steps).validate()  # the job file's section checks alike
        self.agent = agent
        self.period = period
        self.warmup_steps = warmup_steps
        self.world_size = world_size or processes_summed(agent)
        self.step = 0
        self.sync_calls = self.sync_rounds = self.sync_bytes = 0
        self.averages = self.average_rounds = self.average_bytes = 0
        self.average_seconds = 0.0

    @property
    def synchronous(self) -> bool:
        """The step under way sums its gradients (still warming up)."""
        return self.step < self.warmup_steps

    def averaging_due(self) -> bool:
        """After the step just completed: is it time to average the weights?"""
        local = self.step - self.warmup_steps
        return local > 0 and local % self.period == 0

    @property
    def rounds(self) -> int:
        """Switch rounds this rank took part in, gradients and weights together."""
        return self.sync_rounds + self.average_rounds

    def _count_sync(self, _n: int) -> None:
        s = self.agent.last_stats  # this call's: the agent runs calls one at a time
        self.sync_calls += 1
        self.sync_rounds += s.rounds
        self.sync_bytes += s.bytes_sent


def spina_local_sgd_hook(state: LocalSGDState,
                         bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook of (post-)local SGD: the bucket averaged through SpINA while synchronous,
    this rank's own gradient untouched after (no communication at all).

    Args:
        state: the `LocalSGDState` the `LocalSGDOptimizer` steps.
        bucket: DDP's `torch.distributed.GradBucket`.

    Returns:
        A `torch.futures.Future` of the bucket: averaged over the ranks (as
        `spina_allreduce_hook`'s) while `state.synchronous`, else this rank's own, at once.
    """
    buf = bucket.buffer()
    if state.synchronous:
        return sum_async(state.agent, buf, segment_sizes(bucket, buf.numel()),
                         divide_by=state.world_size, on_done=state._count_sync)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


class LocalSGDOptimizer(torch.optim.Optimizer):
    """Wraps an optimiser: its step, then, when due, the weights averaged through SpINA.

    Args:
        optim: the local optimiser (any torch.optim.Optimizer).
        state: the `LocalSGDState` (the same one the DDP hook has, for post-local SGD).

    The wrapper shares the optimiser's param_groups and state, so LR schedulers and
    state_dict work on it as on the optimiser.
    """

    def __init__(self, optim: torch.optim.Optimizer, state: LocalSGDState):
        # no super().__init__(): the wrapper shares optim's param_groups and state
        self.optim = optim
        self.local = state
        self.param_groups = optim.param_groups
        self.defaults = optim.defaults
        self.state = optim.state

    def __repr__(self):
        return f"LocalSGDOptimizer({self.optim!r}, period={self.local.period}, " \
               f"warmup_steps={self.local.warmup_steps})"

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    def step(self, closure=None):
        loss = self.optim.step(closure)
        self.local.step += 1
        if self.local.averaging_due():
            self.average()
        return loss

    @torch.no_grad()
    def average(self) -> None:
        """Replace every parameter by its mean over the ranks (one SpINA call)."""
        t0 = time.perf_counter()
        params = [p for g in self.param_groups for p in g["params"]]
        sizes = [p.numel() for p in params]
        _, dst, length = block_aligned_layout(sizes, self.local.agent.job.block_size)
        flat = np.zeros(length, np.float32)
        for p, d, k in zip(params, dst.tolist(), sizes):  # a loop per parameter
            flat[d:d + k] = p.detach().reshape(-1).to(torch.float32).numpy()
        flat = self.local.agent.allreduce(flat, inplace=True)
        flat /= np.float32(self.local.world_size)
        for p, d, k in zip(params, dst.tolist(), sizes):
            p.copy_(torch.from_numpy(flat[d:d + k]).reshape(p.shape))
        s = self.local.agent.last_stats
        self.local.averages += 1
        self.local.average_rounds += s.rounds
        self.local.average_bytes += s.bytes_sent
        self.local.average_seconds += time.perf_counter() - t0


__all__ = ["LocalSGDState", "LocalSGDOptimizer", "spina_local_sgd_hook"]
