"""Hierarchical reduction and all-gather: the L local processes of one host rank, summed (or
their shards joined) on the host.

Processes that attach with {rank, local_rank, local_size} are local ranks 0..L-1 of ONE rank of
the job (the job file's workers are hosts): each call waits until every local rank has handed
its segment over, the last to arrive sums them on the host (`host_sum`), runs the one agent
call of the host rank (one contribution through the switch, as any rank's) and writes the same
result into every local segment (`fan_out`), so all local processes read the same bits.

Why the float sum is taken on the host before quantization (not the quantized ints): the
shift S every worker quantizes with is agreed by the agent's setup round, inside the call, and
the host's contribution is quantized after it; summing ints would need the agreed exponent
before the local sum, a round trip more per call. The headroom still covers all H x L
processes: the agent measures the exponent on the host sums themselves, whose magnitude
already carries the L-fold growth, and the shift's headroom covers the H host sums the switch
adds (spina's quant_shift for the job's nworkers = H), so no int32 sum can overflow. The host
sum is accumulated in float64 in local-rank order and rounded once to float32, so a result is
within H * 2**(-S-1) (quantization, as today with N = H) plus one float32 rounding of each
host's sum (at most half an ulp of it) plus the result's own float32 rounding of the exact
sum. int32 sums wrap mod 2**32 as the switch's do: exact, bit-identical to one rank per process.
A host sum beyond float32's range is Inf, so its block is NaN at every rank (as for NaN/Inf).

A local process that dies: after its request, the call goes on with its part (its segment
stays mapped; the other hosts need this host's contribution) and only its reply is lost, as
for one process per rank. Before its request, the local ranks waiting in that call fail at
once naming it (the daemon sees its connection close); the host sends nothing, so the other
hosts' call fails after the agent's timeout naming this rank. A local rank that stays
attached but never calls fails the others after the daemon's `timeout`, naming it.
Local ranks whose lengths or dtypes disagree all fail, naming the field.

All-gather: the L local shards (n bytes each, local-rank order) are joined into the host
rank's shard of L*n bytes (`host_shard`), the rank's one agent all-gather carries it through
the switch (one copy per host on the wire, replicated to the H hosts), and every local segment
gets all H*L shards in the order of the job's processes, h*L + l (`gather_out`): process p's
shard at bytes p*n.. of every segment, the same bytes everywhere.

Reduce-scatter: the local segments are summed on the host as for an all-reduce, the host
rank's one agent reduce-scatter returns the host's part of the sum, and each local segment
gets its process's shard at its start: torch.chunk's split of the n elements over all H*L
processes (FSDP2's), process h*L + l. The agent splits over the H hosts, so the host sum is
first padded with zeros to H*L*c elements (c = ceil(n / (H*L)); zero blocks are never sent)
whenever that split would not fall on the processes' (`scatter_input`, `scatter_out`).
"""
from __future__ import annotations

import threading

import numpy as np

_CHUNK = 1 << 16  # elements per float64 accumulation pass: 512 KiB, stays in cache


def host_sum(views: list[np.ndarray]) -> np.ndarray:
    """views[0] = the element-wise sum of `views` (float32: in float64, local-rank order,
    rounded once; int32: wrapping). Vectorised per chunk; returns views[0]."""
    out = views[0]
    if out.dtype == np.int32:
        for v in views[1:]:
            np.add(out, v, out=out)
        return out
    acc = np.empty(min(len(out), _CHUNK), np.float64)
    for a in range(0, len(out), _CHUNK):
        b = min(a + _CHUNK, len(out))
        t = acc[:b - a]
        np.copyto(t, out[a:b])
        for v in views[1:]:
            np.add(t, v[a:b], out=t)
        np.copyto(out[a:b], t, casting="same_kind")
    return out


def host_shard(views: list[np.ndarray], n: int) -> np.ndarray:
    """The host rank's all-gather shard: the first `n` bytes of each local segment, joined in
    local-rank order (a new array: the gathered result overwrites the segments)."""
    return np.concatenate([v[:n] for v in views])


def gather_out(views: list[np.ndarray], rows: np.ndarray) -> None:
    """Every local segment gets the gathered shards (the host ranks' rows, in order)."""
    flat = rows.reshape(-1)
    for v in views:
        v[:len(flat)] = flat


def scatter_input(total: np.ndarray, processes: int) -> np.ndarray:
    """The host sum for the agent's reduce-scatter: `total` itself, or a copy padded with
    zeros to processes * c elements (c = ceil(n / processes)), whose split over the hosts
    gives each host its local processes' c-element shards back to back."""
    c = -(-len(total) // processes)
    if c * processes == len(total):
        return total
    out = np.zeros(c * processes, total.dtype)
    out[:len(total)] = total
    return out


def scatter_out(views: list[np.ndarray], shard: np.ndarray, n: int, processes: int,
                first: int) -> None:
    """Local segment l gets process first + l's shard of the n-element sum at its start
    (torch.chunk's [p c, (p+1) c) cut at n), from `shard`, the host's c-element shards."""
    c = -(-n // processes)
    for lr, v in enumerate(views):
        lo, hi = min((first + lr) * c, n), min((first + lr + 1) * c, n)
        v[:hi - lo] = shard[lr * c:lr * c + hi - lo]


def fan_out(views: list[np.ndarray]) -> None:
    """Every local segment gets views[0]'s bits."""
    for v in views[1:]:
        np.copyto(v, views[0])


class Round:
    """One call of a host rank's local processes: each one's request, then the reply."""

    def __init__(self):
        self.requests: dict[int, tuple] = {}  # local rank -> (view, n, dtype name, layer, op)
        self.reply: dict | None = None
        self.done = threading.Event()

    def finish(self, reply: dict) -> None:
        self.reply = reply
        self.done.set()


class LocalGroup:
    """The processes attached to one host rank: their local ranks and the call being gathered.

    `size` is the local_size the attached processes agreed on (1: one process per rank, as
    before hierarchical reduction; several connections may then share the rank)."""

    def __init__(self):
        self.size = 1
        self.members: dict[int, tuple[int, int | None]] = {}  # connection -> (local rank, pid)
        self.cond = threading.Condition()
        self.round = Round()

    def join(self, conn_id: int, local_rank: int, size: int, pid: int | None) -> str | None:
        """Register a connection as `local_rank` of `size`; why not (naming the field), or None."""
        with self.cond:
            if self.members and size != self.size:
                return (f"field 'local_size': {size} differs from the {self.size} the attached "
                        f"local ranks ({', '.join(self.who())}) gave")
            if size > 1:
                for lr, p in self.members.values():
                    if lr == local_rank:
                        return (f"field 'local_rank': local rank {local_rank} is attached "
                                f"already (pid {p})")
            self.size = size
            self.members[conn_id] = (local_rank, pid)
        return None

    def leave(self, conn_id: int) -> None:
        """The connection closed. A call that waits for its local rank fails now: that process
        will never hand its part over (a new process of that local rank may attach later)."""
        with self.cond:
            lr, pid = self.members.pop(conn_id, (None, None))
            rnd = self.round
            if lr is not None and rnd.requests and lr not in rnd.requests:
                self.round = Round()
                rnd.finish({"ok": False, "error": f"{_op(rnd)}: local rank {lr} (pid {pid}) "
                                                  "went away before its call; this call fails"})

    def arrive(self, local_rank: int, request: tuple) -> tuple[Round, bool]:
        """Hand this local rank's request to the call being gathered: (its round, whether this
        caller completed it and so runs it)."""
        with self.cond:
            rnd = self.round
            rnd.requests[local_rank] = request
            last = len(rnd.requests) == self.size
            if last:
                self.round = Round()
        return rnd, last

    def wait(self, rnd: Round, timeout: float) -> dict:
        """The round's reply; after `timeout` seconds with local ranks still missing, the round
        fails naming them (a call already running is waited for: the agent times out itself)."""
        if not rnd.done.wait(timeout):
            with self.cond:
                if rnd is self.round and not rnd.done.is_set():
                    missing = [lr for lr in range(self.size) if lr not in rnd.requests]
                    self.round = Round()
                    rnd.finish({"ok": False, "error": f"{_op(rnd)}: local ranks {missing} did "
                                                      f"not call within {timeout:g} s"})
            rnd.done.wait()
        return rnd.reply

    def who(self) -> list[str]:
        return [f"local rank {lr} pid {p}" for lr, p in sorted(self.members.values(),
                                                               key=lambda m: m[0])]


def _op(rnd: Round) -> str:
    """The collective a round's requests asked for (the first one's)."""
    return next(iter(rnd.requests.values()))[4]


def check_requests(requests: dict[int, tuple]) -> str | None:
    """Why the local ranks' requests of one call cannot be served together (naming the
    field), or None."""
    order = sorted(requests)
    op = requests[order[0]][4]
    for i, field, what in ((4, "op", "collective"), (1, "n", "tensor length"),
                           (2, "dtype", "dtype")):
        values = {requests[lr][i] for lr in order}
        if len(values) > 1:
            each = ", ".join(f"local rank {lr}: {requests[lr][i]}" for lr in order)
            return f"{op}: field '{field}': the local ranks disagree on the {what} ({each})"
    return None
