"""Run a collectives.schedule over torch.distributed point-to-point (isend/irecv; gloo).

    import collectives
    collectives.all_reduce(t, "ring")                     # in place, like dist.all_reduce
    mine = collectives.reduce_scatter(t, "2d-direct", groups=2)   # chunk `rank` of the sum
    full = collectives.all_gather(mine, t.numel(), "halving-doubling")

Every rank must call with the same algorithm, groups and length, as with torch's own
collectives. Ranks are those of `group` (default: the world); groups of the 2d algorithms
are lists of those ranks, or one group size (consecutive ranks). A step posts all its
receives and sends, waits for all, then adds or copies what arrived in the order the
schedule lists it (collectives/schedule.py): the sums' order never depends on timing.
Arithmetic is torch's on the tensor's dtype (any dtype torch adds; int32 wraps as numpy's).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from collectives.schedule import (
    LEADER,
    Schedule,
    ScheduleError,
    check_groups,
    chunk_bounds,
    leader_phases,
    schedule,
)

SWITCH, LEADER_SWITCH = "switch", "leader-switch"  # all-gathers through Agent.allgather


def _views(flat: torch.Tensor, bounds) -> list[torch.Tensor]:
    return [flat[bounds[c]:bounds[c + 1]] for c in range(len(bounds) - 1)]


def _length(bounds, chunks) -> int:
    return sum(bounds[c + 1] - bounds[c] for c in chunks)


def run(sched: Schedule, flat: torch.Tensor, rank: int, group=None) -> torch.Tensor:
    """Execute `sched` as `rank` on the 1-D contiguous `flat` (every chunk's current value,
    the whole tensor's length); returns `flat`, updated in place."""
    bounds = chunk_bounds(flat.numel(), sched.world)
    chunk = _views(flat, bounds)
    to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    for tag, step in enumerate(sched.steps):
        works, arrived = [], []
        # Every receive before any send: gloo may write a large send out before isend
        # returns, and a peer whose receive is not posted yet would make the two directions
        # of an exchange take turns (measured: twice the time of a 4 MiB swap).
        for t in step:
            size = _length(bounds, t.chunks)
            if t.dst == rank and size:
                buf = torch.empty(size, dtype=flat.dtype)
                works.append(dist.irecv(buf, to_global(t.src), group=group, tag=tag))
                arrived.append((t, buf))
        for t in step:
            if t.src == rank and _length(bounds, t.chunks):
                parts = [chunk[c] for c in t.chunks]
                payload = parts[0] if len(parts) == 1 else torch.cat(parts)
                works.append(dist.isend(payload, to_global(t.dst), group=group, tag=tag))
        for w in works:
            w.wait()
        _apply(arrived, chunk, bounds)
    return flat


def _apply(arrived, chunk, bounds) -> None:
    """Copy or add what arrived; contributions to one chunk added in listed order, own last."""
    sums: dict[int, torch.Tensor] = {}
    for t, buf in arrived:
        off = 0
        for c in t.chunks:
            n = bounds[c + 1] - bounds[c]
            part = buf[off:off + n]
            off += n
            if not t.reduce:
                chunk[c].copy_(part)
            elif c in sums:
                sums[c] = sums[c] + part
            else:
                sums[c] = part
    for c, s in sums.items():
        chunk[c].add_(s)


def _world(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _flat(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: the tensor must be contiguous")
    return tensor.view(-1)


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", group=None,
               groups=None) -> torch.Tensor:
    """Sum `tensor` over the ranks of `group`, in place; returns it.

    Args:
        tensor: a contiguous CPU tensor, the same shape and dtype on every rank.
        algorithm: one of collectives.ALGORITHMS.
        group: a torch.distributed process group (default: the world).
        groups: for the 2d algorithms, a group size or lists of ranks of `group`.
    """
    rank, p = _world(group)
    run(schedule("all_reduce", algorithm, p, groups), _flat(tensor, "tensor"), rank, group)
    return tensor


def reduce_scatter(tensor: torch.Tensor, algorithm: str = "ring", group=None,
                   groups=None) -> torch.Tensor:
    """Chunk `rank` (numpy.array_split layout over the flattened tensor) of the sum of
    `tensor` over all ranks, as a new 1-D tensor; `tensor` is left unchanged."""
    rank, p = _world(group)
    work = _flat(tensor, "tensor").clone()
    run(schedule("reduce_scatter", algorithm, p, groups), work, rank, group)
    b = chunk_bounds(work.numel(), p)
    return work[b[rank]:b[rank + 1]].clone()


def all_gather(shard: torch.Tensor, total: int, algorithm: str = "ring", group=None,
               groups=None, agent=None) -> torch.Tensor:
    """All ranks' shards concatenated in rank order: a new 1-D tensor of `total` elements.
    Rank r's shard is chunk r of numpy.array_split(range(total), p), so
    all_gather(reduce_scatter(t), t.numel()) is all_reduce(t).

    Besides the schedules' algorithms (and "leader-ring"), two go through the switch by
    Agent.allgather (host_agent/allgather.py), with `agent`:
        "switch"         every rank's agent, of a job whose workers are the ranks in order
        "leader-switch"  the leader-ring all-gather whose middle phase (the leaders'
                         exchange) is an Agent.allgather among the leaders: each group's
                         leader (its first rank) passes its agent, of a job whose worker i is
                         the leader of groups[i]; the other ranks pass none
    Both are bit for bit the same tensor as every other algorithm's."""
    rank, p = _world(group)
    flat = _flat(shard, "shard")
    if not isinstance(total, int) or total < 0:
        raise ValueError(f"total: expected a length >= 0, got {total!r}")
    b = chunk_bounds(total, p)
    if flat.numel() != b[rank + 1] - b[rank]:
        raise ValueError(f"shard: rank {rank} of {p} holds {b[rank + 1] - b[rank]} of "
                         f"{total} elements, got {flat.numel()}")
    out = torch.empty(total, dtype=flat.dtype)
    out[b[rank]:b[rank + 1]] = flat
    if algorithm == SWITCH:
        return _switch_gather(out, b, range(p), _agent(agent, p, rank, "switch"), rank)
    if algorithm == LEADER_SWITCH:
        return _leader_switch(out, p, rank, group, groups, agent)
    return run(schedule("all_gather", algorithm, p, groups), out, rank, group)


def _agent(agent, workers: int, rank: int, algorithm: str):
    """`agent`, checked against what the call needs of its job: `workers` workers, `rank`."""
    if agent is None:
        raise ValueError(f"agent: algorithm {algorithm} needs this rank's Agent")
    if agent.job.nworkers != workers or agent.rank != rank:
        raise ValueError(f"agent: algorithm {algorithm} needs rank {rank} of a job of "
                         f"{workers} workers here, got rank {agent.rank} of job "
                         f"{agent.job.job}'s {agent.job.nworkers}")
    return agent


def _switch_gather(out: torch.Tensor, bounds, ranks, agent, me: int) -> torch.Tensor:
    """Agent.allgather of this worker's chunks (worker `me` of the agent's job, whose worker i
    holds the chunks of ranks[i]) into `out` (every chunk at its place). Equal shards on the
    wire: each padded to the longest, the padding dropped on arrival."""
    ranks = [r if isinstance(r, tuple) else (r,) for r in ranks]
    sizes = [sum(bounds[c + 1] - bounds[c] for c in cs) for cs in ranks]
    if not max(sizes):  # nothing anywhere (every rank knows): no call
        return out
    mine = torch.zeros(max(sizes), dtype=out.dtype)
    if sizes[me]:
        mine[:sizes[me]] = torch.cat([out[bounds[c]:bounds[c + 1]] for c in ranks[me]])
    rows = agent.allgather(mine)
    for i, cs in enumerate(ranks):
        at = 0
        for c in cs:
            n = bounds[c + 1] - bounds[c]
            out[bounds[c]:bounds[c + 1]] = rows[i, at:at + n]
            at += n
    return out


def _leader_switch(out: torch.Tensor, p: int, rank: int, group, groups, agent) -> torch.Tensor:
    if groups is None:
        raise ScheduleError(f"groups: algorithm {LEADER_SWITCH} needs the groups of ranks")
    groups = check_groups(groups, p)
    inside, _, fan_out = leader_phases(groups)
    run(Schedule("all_gather", LEADER, p, groups, tuple(map(tuple, inside))), out, rank, group)
    leaders = [grp[0] for grp in groups]
    if rank in leaders:
        i = leaders.index(rank)
        _switch_gather(out, chunk_bounds(out.numel(), p), groups,
                       _agent(agent, len(groups), i, LEADER_SWITCH), i)
    return run(Schedule("all_gather", LEADER, p, groups, tuple(map(tuple, fan_out))), out, rank,
               group)
