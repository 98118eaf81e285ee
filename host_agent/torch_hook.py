"""PyTorch DDP communication hook: gradient buckets are summed by a SpINA switch.

DDP hands each gradient bucket to a hook `hook(state, bucket) -> torch.futures.Future[Tensor]`
(torch.distributed.GradBucket; the future's value replaces the bucket's contents). This hook
sums `bucket.buffer()` over all ranks with the SpINA agent (`Agent.allreduce`) and divides by
the world size. Everything else DDP communicates (the initial parameter broadcast, buffer
broadcasts, the unused-parameter bitmap) stays on the process group, i.e. gloo; so does any
collective the training script calls itself.

One line in a training script under `torchrun`:

    model.register_comm_hook(SpinaHookState(agent_from_env()), spina_allreduce_hook)

`agent_from_env` reads the job file that the launcher wrote (`python -m host_agent.launch`,
spina.config.JobFile) from `$SPINA_JOB_FILE` and binds this rank's address from it.

Why the sum is done in float32 and averaged afterwards: DDP's default hook divides every
gradient by the world size before all-reduce; SpINA quantizes with a shared exponent, so
dividing first buys nothing, and dividing the float32 sum once, then rounding once to the
bucket's dtype (float16/bfloat16 buckets), loses less than rounding twice. Every rank gets
bit-identical sums from the switch and applies the same float operations, so gradients stay
bit-identical across ranks.
"""
# No `from __future__ import annotations` here: DDP.register_comm_hook compares the hook's
# annotations with dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.
import os
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from host_agent import dlcp
from host_agent.agent import Agent
from spina.config import ConfigError, load_worker_file

JOB_FILE_ENV = "SPINA_JOB_FILE"
DAEMON_SOCKET_ENV = "SPINA_AGENT_SOCKET"
TIMEOUT_ENV = "SPINA_TIMEOUT"  # the agent's per-call timeout in seconds (agent_from_env)
DEFAULT_TIMEOUT = 30.0


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
    buckets) starts a new residual of zeros.
    """

    COUNTERS = HookCounters.COUNTERS + ("rounds",)
    _CALL_FIELDS = COUNTERS[2:]  # each call's CallStats.rounds too
    __slots__ = ("agent", "world_size", "nbuckets", "residuals", "rounds")

    def __init__(self, agent: Agent, world_size: int | None = None):
        self.agent = agent
        self.world_size = world_size or processes_summed(agent)
        self.nbuckets = 0  # DDP's buckets per backward pass, once a last bucket was seen
        self.residuals: dict[int, np.ndarray] = {}  # narrow lanes: bucket index -> residual
        super().__init__()

    def residual_for(self, bucket, n: int) -> np.ndarray | None:
        """The bucket's error feedback residual (float32, `n`: its block-aligned length), or
        None: int32 lanes, no bucket index, or an agent that cannot take one (the daemon's)."""
        if not isinstance(self.agent, Agent) or self.agent.job.lane_bits == 32:
            return None
        try:
            index = bucket.index()
        except AttributeError:
            return None
        got = self.residuals.get(index)
        if got is None or got.size != n:
            got = self.residuals[index] = np.zeros(n, np.float32)
        return got

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


def spina_allreduce_hook(state: SpinaHookState,
                         bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP gradient bucket over all ranks through the SpINA switch.

    The all-reduce runs on the agent's worker thread (calls keep DDP's bucket order, which is
    the same on every rank), so backward computation goes on while the bucket is on the wire.

    Args:
        state: a `SpinaHookState` holding this rank's agent.
        bucket: DDP's `torch.distributed.GradBucket`: `bucket.buffer()` (a flat float32,
            float16 or bfloat16 CPU tensor) and `bucket.parameters()` (to start every
            parameter's gradient on a block boundary, see `block_aligned_layout`).

    Returns:
        A `torch.futures.Future` whose value is the averaged flat tensor, same dtype and
        length as `bucket.buffer()`. It fails with the agent's `SpinaError` (for example
        `SpinaTimeout` naming the ranks that never contributed), which DDP raises in backward.

    Example (save as demo.py in the repository root, run `torchrun --standalone
    --nproc_per_node 2 demo.py`; rank 0 starts a software switch and writes the job file,
    as `python -m host_agent.launch` does for a real deployment):

        import torch, torch.distributed as dist
        from host_agent.launch import start_subprocess
        from host_agent.torch_hook import SpinaHookState, agent_from_env, spina_allreduce_hook
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
    return sum_async(state.agent, buf, _segment_sizes(bucket, buf.numel()),
                     divide_by=state.world_size, on_done=state._count,
                     layer=_layer(state, bucket), residual=lambda n: state.residual_for(bucket, n),
                     inplace=True)  # DDP's bucket, as torch's own allreduce hook does


def sum_async(agent, t: torch.Tensor, sizes: list[int] | None = None, divide_by: int = 1,
              on_done=None, layer: tuple[int, int] | None = None,
              residual=None, inplace: bool = False) -> torch.futures.Future:
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
            over the bucket, and a third for the division, saved per call).

    Returns:
        A `torch.futures.Future` of a tensor like `t` holding the (averaged) sum: `t` itself
        when it was summed in place, else a new one. The values are the same either way.
    """
    n = t.numel()
    src, dst, aligned = block_aligned_layout(sizes or [n], agent.job.block_size)
    # A failure must fail the future DDP holds (see hook_future).
    result, out = hook_future()
    if (inplace and residual is None and t.dtype == torch.float32 and t.is_contiguous()
            and np.array_equal(src, dst)):
        return _sum_in_place(agent, t, divide_by, on_done, layer, result, out)
    flat = pack_aligned(t, src, dst, aligned)

    def done(f):
        try:
            res = unpack_aligned(f.result(), src, dst, t, divide_by)
            if on_done is not None:
                on_done(n)  # before set_result: DDP may go on (and read the stats) right after
            result.set_result(res)
        except Exception as e:  # surfaces in DDP's backward on this rank
            fail(result, e)

    res = residual(len(flat)) if residual is not None else None
    fut = (agent.allreduce_async(flat, inplace=True, layer=layer) if res is None  # flat is ours
           else agent.allreduce_async(flat, layer=layer, residual=res))
    fut.add_done_callback(done)
    return out


def _sum_in_place(agent, t: torch.Tensor, divide_by: int, on_done, layer, result,
                  out) -> torch.futures.Future:
    """sum_async for a block-aligned float32 `t` that may hold the result: the agent sums
    `t`'s memory in place (its blocks are the aligned copy's: the padding after the last
    piece is the agent's own, zeros), then one in-place division, as unpack_aligned
    divides its copy, so the values are bit for bit those of the copying path."""
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
    agent.allreduce_async(flat, inplace=True, layer=layer).add_done_callback(done)
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


def pack_aligned(t: torch.Tensor, src: np.ndarray, dst: np.ndarray, aligned: int) -> np.ndarray:
    """A new float32 array of `aligned` elements: the pieces of flat `t` at offsets `dst`."""
    n = t.numel()
    flat = np.zeros(aligned, np.float32)
    data = t.detach().reshape(-1).to(torch.float32).numpy()  # widening copy for halves only
    for s, d, k in zip(src, dst, np.diff(np.append(src, n))):  # a loop per parameter
        flat[d:d + k] = data[s:s + k]
    return flat


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


def _layer(state: SpinaHookState, bucket) -> tuple[int, int] | None:
    """The bucket's layer position (SpinaHookState.layer_of); None if it has no index."""
    try:
        index, last = bucket.index(), bucket.is_last()
    except AttributeError:
        return None
    return state.layer_of(index, last)


def _segment_sizes(bucket, n: int) -> list[int]:
    """Element counts of the bucket's parameters in buffer order ([n] if unknown)."""
    try:
        sizes = [p.numel() for p in bucket.parameters()]
    except AttributeError:
        return [n]
    return sizes if sum(sizes) == n and sizes else [n]


def block_aligned_layout(sizes: list[int], block_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Where each parameter of a bucket goes so that each starts at a block boundary.

    DDP packs a bucket's gradients back to back; a parameter that starts mid-block shifts
    every row of an embedding table against SpINA's blocks, so a touched row often straddles
    two blocks and both travel (measured: about 25% more blocks for 64-wide rows). Starting
    every parameter on a block boundary costs at most block_size - 1 zeros per parameter,
    which are never sent.

    Returns:
        (source offsets in the bucket, destination offsets in the aligned array, its length).
    """
    sizes = np.asarray(sizes, np.int64)
    src = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    padded = -(-sizes // block_size) * block_size
    dst = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
    return src, dst, int(padded.sum())


def agent_from_env(job_file: str | None = None, rank: int | None = None, wait: float = 60.0,
                   timeout: float | None = None, rto: float = 0.2,
                   daemon_socket: str | None = None,
                   bounded_loss: float | None = None, priority_policy: str | None = None,
                   loss_tolerant_policy: str | None = None,
                   loss_deadline: float | str | None = None):
    """Create this rank's SpINA agent from the job file the launcher wrote.

    Args:
        job_file: path of the JSON job file (spina.config.JobFile), or of this rank's assignment
            (spina.config.Assignment: a two-level job's ranks each have one); default
            `$SPINA_JOB_FILE`. `{rank}` in it is this rank: one setting for every node of a
            multi-host torchrun names each rank's assignment
            (`/srv/spina/agents/job7-rank{rank}.json`).
        rank: this worker's rank; default `$RANK` as set by torchrun, else the initialised
            process group's rank.
        wait: seconds to wait for the file to appear (the launcher may still be starting).
        timeout: the agent's per-call timeout in seconds; default `$SPINA_TIMEOUT`, else
            30.
        rto: first retransmission timeout. Ranks reach a bucket tens of milliseconds apart
            (their backward passes drift), and a packet waiting at the switch for a slower
            rank is not lost: the agent's 5 ms default (recovery.MIN_RTO) would resend most
            of them.
        daemon_socket: go through the host's agent daemon at this Unix socket instead of an
            in-process agent; default `$SPINA_AGENT_SOCKET` (unset: in-process).
        bounded_loss, priority_policy, loss_tolerant_policy, loss_deadline: override the job
            file's DLCP settings for this rank (None: the file's; spina.config.JobConfig,
            docs/dlcp.md). 0 = exact. loss_deadline: seconds, or "auto" (twice the measured
            round latency, 2-50 ms). Every rank must pass the same. With a daemon, set them in the
            daemon's config instead (it owns the agent).

    Returns:
        An `Agent` bound to the job's address for `rank`, talking to the file's switch; or,
        with a daemon socket, a `host_agent.daemon.DaemonClient` attached to `rank` (same
        interface as far as the hook is concerned; timeout and rto are then the daemon's).

    Raises:
        ConfigError: no job file given, the file never appeared, its worker count differs
            from torchrun's `$WORLD_SIZE`, or `$SPINA_TIMEOUT` is not a positive number, or
            `$SPINA_METRICS` (an in-process agent's metrics at [HOST:]PORT + `$LOCAL_RANK`,
            host_agent/metrics.py) is not an address.

    Example:
        >>> agent = agent_from_env("/tmp/spina-job.json")  # doctest: +SKIP
        >>> agent.allreduce(torch.ones(4))                   # doctest: +SKIP
    """
    job_file = job_file or os.environ.get(JOB_FILE_ENV)
    if not job_file:
        raise ConfigError(f"no job file: pass job_file or set ${JOB_FILE_ENV} "
                          "(python -m host_agent.launch writes one)")
    if timeout is None:
        timeout = timeout_from_env()
    if rank is None:
        if "RANK" in os.environ:
            rank = int(os.environ["RANK"])
        elif dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
        else:
            raise ConfigError("rank unknown: pass rank, run under torchrun, or init the "
                              "process group")
    job_file = job_file.replace("{rank}", str(rank))
    deadline = time.monotonic() + wait
    while not os.path.exists(job_file):
        if time.monotonic() > deadline:
            raise ConfigError(f"job file {job_file} did not appear within {wait:g} s")
        time.sleep(0.05)
    jf = load_worker_file(job_file, rank)  # a job file, or a two-level job's assignment
    world = os.environ.get("WORLD_SIZE")
    if world is not None and int(world) != jf.job.nworkers:
        raise ConfigError(f"job file {job_file}: field 'job.workers': {jf.job.nworkers} workers, "
                          f"but torchrun's WORLD_SIZE is {world}")
    daemon_socket = daemon_socket or os.environ.get(DAEMON_SOCKET_ENV)
    overrides = {"bounded_loss": bounded_loss, "priority_policy": priority_policy,
                 "loss_tolerant_policy": loss_tolerant_policy, "loss_deadline": loss_deadline}
    if daemon_socket:
        given = [k for k, v in overrides.items() if v is not None]
        if given:
            raise ConfigError(f"field '{given[0]}': the agent daemon at {daemon_socket} owns "
                              "the agent: set it in the daemon's config")
        from host_agent.daemon import DaemonClient
        return DaemonClient(job_file, rank, daemon_socket)
    try:
        job = dlcp.with_policy(jf.job, **overrides)
    except ConfigError as e:
        raise ConfigError(f"agent_from_env: {e}") from None
    from host_agent.metrics import env_address
    where = env_address()
    agent = Agent(job, rank, jf.switch, timeout=timeout, rto=rto, rendezvous=jf.rendezvous)
    if where is not None:  # $SPINA_METRICS: this process's agent serves its metrics
        agent.serve_metrics(where)
    return agent


def timeout_from_env() -> float:
    """The per-call timeout `$SPINA_TIMEOUT` sets (seconds), else DEFAULT_TIMEOUT."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"${TIMEOUT_ENV}: {text!r} is not a positive number of seconds")
    return value


__all__ = ["HookCounters", "SpinaHookState", "spina_allreduce_hook", "sum_async", "agent_from_env",
           "block_aligned_layout", "pack_aligned", "unpack_aligned",
           "JOB_FILE_ENV", "DAEMON_SOCKET_ENV", "TIMEOUT_ENV", "timeout_from_env"]
