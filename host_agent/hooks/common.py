"""What every hook family shares: the running counters of a hook's state, the divisor for
averaging, a tensor's sum through the agent without blocking (`sum_async`), the future DDP
holds and how a failure reaches it, and a bucket's copy to and from its block-aligned array.
"""
# No `from __future__ import annotations`: the hooks built on these keep their annotations
# objects (DDP.register_comm_hook compares them with dist.GradBucket and Future[Tensor]).
import threading

import numpy as np
import torch

from host_agent.hooks.layout import block_aligned_layout


class HookCounters:
    """Running totals of a comm hook's state, summed over buckets since construction or
    `reset_stats()`. Updated only under the state's lock: a hook's buckets may finish on
    several threads at once (the gloo control's callbacks), and `x += f()` can lose an update
    when another thread runs between the read and the write.

    Attributes:
        calls: buckets all-reduced.
        elements: gradient elements all-reduced.
        bytes_sent / payload_bytes_sent: UDP payload bytes this rank sent / of those, block data.
        resends: packets sent again after a retransmission timeout (included in bytes_sent).
        seconds: wall time inside `Agent.allreduce`.
        partial_rounds: rounds the switch completed without every worker (bounded loss).
        blocks_lost: this rank's blocks missing from the sums (bounded loss; CallStats).
        loss_tolerant_packets: packets this rank sent flagged loss-tolerant (host_agent/dlcp.py).
    """

    COUNTERS = ("calls", "elements", "bytes_sent", "payload_bytes_sent", "resends", "seconds",
                "partial_rounds", "blocks_lost", "loss_tolerant_packets")
    # The CallStats fields summed per call (calls and elements are the hook's own).
    _CALL_FIELDS = COUNTERS[2:]
    __slots__ = COUNTERS + ("_lock",)

    def __init__(self):
        self._lock = threading.Lock()
        self.reset_stats()

    def reset_stats(self) -> None:
        with self._lock:
            for name in self.COUNTERS:
                setattr(self, name, 0.0 if name.endswith("seconds") else 0)

    def add(self, **amounts) -> None:
        """Add to the named counters, all in one step under the lock."""
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def count_call(self, stats, n: int) -> None:
        """One bucket of `n` elements went through an agent call whose CallStats are `stats`."""
        self.add(calls=1, elements=n, **{f: getattr(stats, f) for f in self._CALL_FIELDS})


def processes_summed(agent) -> int:
    """How many training processes a sum through `agent` adds up: a daemon client's
    `world_size` (hosts x local ranks, host_agent/daemon/hier.py), else the job's ranks. The
    hooks' default divisor for averaging."""
    return getattr(agent, "world_size", None) or agent.job.nworkers


def sum_async(agent, t: torch.Tensor, sizes: list[int] | None = None, divide_by: int = 1,
              on_done=None, layer: tuple[int, int] | None = None,
              residual=None, inplace: bool = False, scratch=None) -> torch.futures.Future:
    """Sum the flat float tensor `t` over all ranks through `agent`, without blocking.

    Args:
        agent: an `Agent` (or `DaemonClient`); calls run on its worker thread in call order.
        t: a flat float32/float16/bfloat16 CPU tensor (read, not written unless `inplace`).
        sizes: lengths of the parameters packed in `t` (each starts on a block boundary on
            the wire, see `block_aligned_layout`); None: one piece.
        divide_by: divide the float32 sum by this before the one rounding to `t.dtype`.
        on_done: called with `t.numel()` after the agent finished, before the future is set.
        layer: the tensor's layer position (Agent.allreduce), for DLCP priorities.
        residual: None, or a function of the block-aligned length giving the error feedback
            residual of narrow lanes (Agent.allreduce's `residual`) or None.
        inplace: `t` may hold the result: a contiguous float32 `t` whose pieces already
            start on block boundaries (every size but the last a multiple of the block) is
            then summed where it lies, without the aligned copy there and back (two passes
            over the bucket, and a third for the division, saved per call); with a residual
            too (t + residual formed in t). Another float32 `t` gets the result copied back
            into it, divided on the way (no new tensor, no separate division pass).
        scratch: None, or a function of the block-aligned length giving a float32 array of
            that length that the caller keeps (a DDP bucket's, by its index) to pack `t`
            into when `t` is not summed where it lies: no new array (and no first touch of
            its pages) per call. It must not be in use by another call.

    Returns:
        A `torch.futures.Future` of a tensor like `t` holding the (averaged) sum: `t` itself
        when `inplace` and `t` is a contiguous float32 tensor, else a new one. The values are
        the same either way.
    """
    n = t.numel()
    src, dst, aligned = block_aligned_layout(sizes or [n], agent.job.block_size)
    # A failure must fail the future DDP holds (see hook_future).
    result, out = hook_future()
    if (inplace and t.dtype == torch.float32 and t.is_contiguous()
            and np.array_equal(src, dst)):
        res = residual(n) if residual is not None else None
        return _sum_in_place(agent, t, divide_by, on_done, layer, result, out, res)
    flat = pack_aligned(t, src, dst, aligned, None if scratch is None else scratch(aligned))
    into = inplace and t.dtype == torch.float32 and t.is_contiguous()

    def done(f):
        try:
            res = (_unpack_into(f.result(), src, dst, t, divide_by) if into
                   else unpack_aligned(f.result(), src, dst, t, divide_by))
            if on_done is not None:
                on_done(n)  # before set_result: DDP may go on (and read the stats) right after
            result.set_result(res)
        except Exception as e:  # surfaces in DDP's backward on this rank
            fail(result, e)

    res = residual(len(flat)) if residual is not None else None
    fut = (agent.allreduce_async(flat, inplace=True, layer=layer) if res is None  # flat is ours
           else agent.allreduce_async(flat, inplace=True, layer=layer, residual=res))
    fut.add_done_callback(done)
    return out


def _sum_in_place(agent, t: torch.Tensor, divide_by: int, on_done, layer, result,
                  out, residual: np.ndarray | None = None) -> torch.futures.Future:
    """sum_async for a block-aligned float32 `t` that may hold the result: the agent sums
    `t`'s memory in place (its blocks are the aligned copy's: the padding after the last
    piece is the agent's own, zeros), then one in-place division, as unpack_aligned
    divides its copy, so the values are bit for bit those of the copying path. A narrow
    lane's `residual` (t's length: the padding's residual is zero either way, zeros
    rounding to zero) is added into `t` by the agent (Agent.allreduce's inplace)."""
    def done(f):
        try:
            f.result()
            if divide_by != 1:
                t.div_(divide_by)
            if on_done is not None:
                on_done(t.numel())  # before set_result, as in sum_async
            result.set_result(t)
        except Exception as e:  # surfaces in DDP's backward on this rank
            fail(result, e)

    flat = t.detach().view(-1).numpy()  # t's own memory
    fut = (agent.allreduce_async(flat, inplace=True, layer=layer) if residual is None
           else agent.allreduce_async(flat, inplace=True, layer=layer, residual=residual))
    fut.add_done_callback(done)  # (a DaemonClient's allreduce_async takes no residual)
    return out


def hook_future() -> tuple[torch.futures.Future, torch.futures.Future]:
    """(result, out): a comm hook returns `out` and completes `result` with set_result or
    `fail`; a failure then fails `out` itself, which DDP's C++ reducer sees (a value set by
    Future.set_exception is only a Python object there: "Unable to cast ... to Tensor")."""
    result = torch.futures.Future()
    return result, result.then(_raise_failure)


def fail(result: torch.futures.Future, error: BaseException) -> None:
    """Complete `result` (from hook_future) so that its `out` fails with `error`."""
    result.set_result(_Failure(error))


class _Failure:
    """An agent's exception travelling through a future's value to `_raise_failure`."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _raise_failure(fut: torch.futures.Future):
    v = fut.value()
    if isinstance(v, _Failure):
        raise v.error
    return v


def pack_aligned(t: torch.Tensor, src: np.ndarray, dst: np.ndarray, aligned: int,
                 out: np.ndarray | None = None) -> np.ndarray:
    """A float32 array of `aligned` elements: the pieces of flat `t` at offsets `dst`, zeros
    between them; `out` (float32, `aligned` long) if given, else a new array."""
    n = t.numel()
    if out is None:
        out = np.zeros(aligned, np.float32)
        gaps = False
    else:
        if out.dtype != np.float32 or out.shape != (aligned,):
            raise ValueError(f"scratch: need a float32 array of {aligned} elements, got "
                             f"{out.dtype} {out.shape}")
        gaps = True  # the last call's values lie between the pieces
    data = t.detach().reshape(-1).to(torch.float32).numpy()  # widening copy for halves only
    ends = np.append(dst[1:], aligned)
    for s, d, k, e in zip(src, dst, np.diff(np.append(src, n)), ends):  # a loop per parameter
        out[d:d + k] = data[s:s + k]
        if gaps:
            out[d + k:e] = 0
    return out


def unpack_aligned(res: np.ndarray, src: np.ndarray, dst: np.ndarray, like: torch.Tensor,
                   divide_by: int = 1) -> torch.Tensor:
    """Inverse of `pack_aligned`: a tensor like `like` (dtype, shape) from aligned `res`,
    divided in float32 by `divide_by` before the one rounding to `like.dtype`."""
    n = like.numel()
    total = np.empty(n, np.float32)
    for s, d, k in zip(src, dst, np.diff(np.append(src, n))):
        total[s:s + k] = res[d:d + k]
    avg = torch.from_numpy(total)
    if divide_by != 1:
        avg.div_(divide_by)
    return (avg if like.dtype == torch.float32 else avg.to(like.dtype)).reshape(like.shape)


def _unpack_into(res: np.ndarray, src: np.ndarray, dst: np.ndarray, t: torch.Tensor,
                divide_by: int = 1) -> torch.Tensor:
    """`unpack_aligned` into the contiguous float32 `t` itself, each piece divided as it is
    copied (float32 division, as unpack_aligned's: the same bits). Returns `t`."""
    n = t.numel()
    out = t.detach().view(-1).numpy()
    for s, d, k in zip(src, dst, np.diff(np.append(src, n))):
        if divide_by != 1:
            np.divide(res[d:d + k], np.float32(divide_by), out=out[s:s + k])
        else:
            out[s:s + k] = res[d:d + k]
    return t


__all__ = ["HookCounters", "processes_summed", "sum_async", "hook_future", "fail",
           "pack_aligned", "unpack_aligned"]
