"""FSDP2's collectives through SpINA: one call makes a `fully_shard` model gather its
parameters and reduce-scatter its gradients through the switch.

    from torch.distributed.fsdp import fully_shard
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    fsdp = shard_on_spina(model, agent_from_env())               # dense gradients
    fsdp = shard_on_spina(model, agent, compression={"method": "topk", "ratio": 0.01})

PyTorch 2.13's FSDP2 lets a program replace its two collectives per FSDP module
(`FSDPModule.set_custom_all_gather`, `set_custom_reduce_scatter`, the `AllGather` and
`ReduceScatter` interfaces of torch.distributed.fsdp): before a module's forward (and again in
backward) every rank's shard of its flat parameters is gathered, after its backward the flat
gradient is reduce-scattered, each rank keeping its shard of the sum (FSDP's even split, rank
r's shard the r-th of N equal chunks). `shard_on_spina` installs, on every FSDP module of the
model:

  SpinaAllGather      `agent.allgather` (host_agent/allgather.py): each rank sends its shard
                      once and the switch replicates it; bit for bit, any dtype (the shards
                      travel as bytes, so mixed-precision bf16 parameters gather unchanged)
  SpinaReduceScatter  `agent.reduce_scatter`: the switch sums the ranks' gradients and sends
                      each rank only its shard; dense (within the quantization bound of
                      docs/aggregation.md), with the job's narrow lanes (16/8-bit, docs/bits.md)
                      and their error feedback kept per module, or block top-k with error
                      feedback (`compression`: host_agent/compression, the DDP compressors'
                      selection, one compressor per module), the selected blocks as the
                      agent's block hint. AVG (FSDP's default for fp32 and bf16) divides the
                      shard of the sum by the world size, as gloo's does.

What SpINA does not carry goes through gloo (the model's process group): a reduction other
than SUM or AVG (a PREMUL_SUM from `set_gradient_divide_factor`) and a gradient dtype the agent
has no lanes for. The state's counters say how many calls went which way. Through the daemon
(`DaemonClient`) both collectives go through the switch too, the local ranks of a host summed
(reduce-scatter) or joined (all-gather) on it; narrow lanes then round without error feedback
(the daemon's call keeps no residual, as for the DDP hooks). Everything else FSDP does (its
own broadcasts, `full_tensor`, the optimiser) stays torch's. The ranks' order must be the
agent's: rank r of the model's group is the agent's process r (checked on the first call).

Not a DDP hook (`hook(state, bucket)`), so not in registry.HOOKS: FSDP takes objects with
`allocate` and `__call__`, one per module. Importing this module imports torch (the package
loads it on first use).
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from host_agent.agent import Agent
from host_agent.compression.compressors import BucketLayout, Compressor
from host_agent.compression.methods import make_compressor
from host_agent.hooks.common import HookCounters, processes_summed
from spina.config import ConfigError

# gradient dtypes the agent sums (Agent.allreduce's; bf16 and fp16 through float32)
_SUMMED = (torch.float32, torch.bfloat16, torch.float16)
_CARRIED_OPS = ("SUM", "AVG")


class FSDPCounters(HookCounters):
    """What a model's SpINA collectives did, summed over modules and steps (HookCounters'
    lock and `add`, with counters of its own).

    Attributes:
        gather_calls, gather_bytes_sent, gather_seconds: all-gathers through the switch, the
            UDP payload bytes this rank sent for them (GatherStats), wall time in them.
        scatter_calls, scatter_bytes_sent, scatter_seconds: reduce-scatters through the switch
            (CallStats' bytes_sent), as above.
        resends: packets both sent again (the all-gather's chunks on request, the
            reduce-scatter's after a timeout).
        blocks_sent, blocks_total, compress_seconds: with compression, blocks this rank
            sent / had, and the time in the compressor (inside scatter_seconds).
        gloo_calls: reduce-scatters gloo carried (what SpINA does not: see the module).
    """

    COUNTERS = ("gather_calls", "gather_bytes_sent", "gather_seconds", "scatter_calls",
                "scatter_bytes_sent", "scatter_seconds", "resends", "blocks_sent",
                "blocks_total", "compress_seconds", "gloo_calls")
    __slots__ = COUNTERS

    def as_dict(self) -> dict:
        with self._lock:
            return {name: getattr(self, name) for name in self.COUNTERS}


def _check_group(agent, group) -> None:
    """The model's group must be the agent's processes, in the same order."""
    world = processes_summed(agent)
    if group.size() != world:
        raise ConfigError(f"field 'workers': the FSDP group has {group.size()} ranks, the SpINA "
                          f"job {agent.job.job} {world} processes")


class _Alloc:
    """FSDP's buffers: plain tensors (gloo and the agent need no special memory)."""

    def allocate(self, size, *, dtype, device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class SpinaAllGather(_Alloc, AllGather):
    """FSDP2's all-gather through `agent.allgather` (an Agent or a DaemonClient).

    Args:
        agent: this rank's agent; its processes are the model's group in order.
        counters: where the calls are counted (shared by the model's modules).
    """

    def __init__(self, agent, counters: FSDPCounters):
        self.agent, self.counters = agent, counters
        self._checked = False

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False):
        if not self._checked:
            _check_group(self.agent, group)
            self._checked = True
        t0 = time.perf_counter()
        rows = self.agent.allgather(input_tensor)  # (N, n): rank r's shard in row r
        output_tensor.copy_(rows.reshape(-1))
        st = self.agent.last_gather_stats
        self.counters.add(gather_calls=1, gather_seconds=time.perf_counter() - t0,
                          gather_bytes_sent=st.bytes_sent, resends=st.resends)
        return None  # done: FSDP waits on a Work only


class SpinaReduceScatter(_Alloc, ReduceScatter):
    """FSDP2's reduce-scatter of one module through `agent.reduce_scatter`.

    Args:
        agent: this rank's Agent or DaemonClient.
        counters: where the calls are counted.
        compressor: block top-k (or any `Compressor` of host_agent.compression) with error
            feedback for this module's gradients, or None: dense (with the job's narrow lanes
            and their residual when job.lane_bits < 32).
    """

    def __init__(self, agent, counters: FSDPCounters, compressor: Compressor | None = None):
        self.agent, self.counters, self.compressor = agent, counters, compressor
        self.residual: np.ndarray | None = None  # narrow lanes' error feedback
        self.send: np.ndarray | None = None      # compression: the block-aligned send array
        self._checked = False

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op, async_op: bool = False):
        if not self._checked:
            _check_group(self.agent, group)
            self._checked = True
        name = _op_name(op)
        if name not in _CARRIED_OPS or input_tensor.dtype not in _SUMMED:
            self.counters.add(gloo_calls=1)
            dist.reduce_scatter_single(output=output_tensor, input=input_tensor, op=op,
                                       group=group)
            return None
        t0 = time.perf_counter()
        grad = input_tensor.detach().reshape(-1).to(torch.float32).numpy()
        shard = self._compressed(grad) if self.compressor is not None else self._dense(grad)
        out = torch.from_numpy(shard)
        if name == "AVG":
            out = out / group.size()
        output_tensor.copy_(out.reshape(output_tensor.shape))
        st = self.agent.last_stats
        self.counters.add(scatter_calls=1, scatter_seconds=time.perf_counter() - t0,
                          scatter_bytes_sent=st.bytes_sent, resends=st.resends)
        return None

    def _dense(self, grad: np.ndarray) -> np.ndarray:
        if self.agent.job.lane_bits == 32 or not isinstance(self.agent, Agent):
            return self.agent.reduce_scatter(grad)
        if self.residual is None or len(self.residual) != len(grad):
            self.residual = np.zeros(len(grad), np.float32)
        return self.agent.reduce_scatter(grad, residual=self.residual)

    def _compressed(self, grad: np.ndarray) -> np.ndarray:
        """The compressor's blocks of (gradient + residual) through the switch; what it did
        not select stays in its residual for the next step."""
        comp = self.compressor
        layout = BucketLayout.of((id(self),), [len(grad)], comp.block_size)
        if self.send is None or len(self.send) != layout.length:
            self.send = np.zeros(layout.length, np.float32)
        t0 = time.perf_counter()
        sel = comp.compress(layout, grad, self.send)
        comp.end_step()  # one call per module and step: the compressor is this module's
        self.counters.add(compress_seconds=time.perf_counter() - t0)
        send = sel.send
        try:
            return self.agent.reduce_scatter(send[:len(grad)], blocks=sel.blocks)
        finally:
            if sel.blocks is not None:  # the kept array: +0.0 everywhere for the next step
                send.reshape(-1, comp.block_size)[sel.blocks] = 0.0
            self.counters.add(blocks_total=sel.nblocks,
                              blocks_sent=sel.nblocks if sel.blocks is None
                              else len(sel.blocks))


def _op_name(op) -> str:
    """'SUM', 'AVG', ... for a ReduceOp or its RedOpType (a PREMUL_SUM is an object)."""
    text = str(getattr(op, "op", op))
    return text.rsplit(".", 1)[-1]


def fsdp_modules(model: torch.nn.Module) -> list:
    """The FSDP modules of `model` (fully_shard applied), the root included."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_on_spina(model: torch.nn.Module, agent, compression=None, all_gather: bool = True,
                   reduce_scatter: bool = True) -> FSDPCounters:
    """Make every FSDP module of `model` use SpINA's all-gather and reduce-scatter.

    Args:
        model: a model `fully_shard` has been applied to (its submodules and/or itself), on
            CPU with a gloo process group of the agent's processes in the agent's order.
        agent: this rank's `Agent` (`host_agent.assignment.agent_from_env()`), or a
            `DaemonClient` (both collectives through the daemon).
        compression: None (dense gradients; narrow lanes with error feedback when the job's
            lane_bits is 16 or 8), or a CompressionConfig or its mapping (e.g. {"method":
            "topk", "ratio": 0.01}): each module's gradient compressed by its own compressor
            (`make_compressor`, the job's block size; error feedback by default).
        all_gather, reduce_scatter: False leaves that collective on gloo (a control, or
            parameters through SpINA with gradients on gloo).

    Returns:
        The counters every module's calls add to (`FSDPCounters`).

    Raises:
        ConfigError: no FSDP module in `model`, or a compression config that is not valid
            (naming the field).

    Example:
        >>> fully_shard(model)                               # doctest: +SKIP
        >>> counters = shard_on_spina(model, agent_from_env())  # doctest: +SKIP
    """
    modules = fsdp_modules(model)
    if not modules:
        raise ConfigError("model: no FSDP module (apply torch.distributed.fsdp.fully_shard "
                          "to it or its layers first)")
    counters = FSDPCounters()
    gather = SpinaAllGather(agent, counters)
    for m in modules:
        if all_gather:
            m.set_custom_all_gather(gather)
        if reduce_scatter:
            comp = None if compression is None else make_compressor(
                compression, block_size=agent.job.block_size)
            m.set_custom_reduce_scatter(SpinaReduceScatter(agent, counters, comp))
    return counters


__all__ = ["FSDPCounters", "SpinaAllGather", "SpinaReduceScatter", "fsdp_modules",
           "shard_on_spina"]
