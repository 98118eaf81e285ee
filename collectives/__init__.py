"""Collective algorithms over point-to-point messages, and a planner that picks one.

    import collectives
    collectives.all_reduce(t, "ring")       # torch.distributed isend/irecv (collectives/p2p.py)

    from collectives import plan
    from spina import topology
    plan.plan(topology.load("topo.yaml"), "all_reduce", 64 << 20).best

The schedules (collectives/schedule.py) import no torch; `all_reduce`, `reduce_scatter` and
`all_gather` load collectives.p2p (and torch) on first use, so the planner stays light.
"""
from collectives.schedule import ALGORITHMS, COLLECTIVES, ScheduleError, chunk_bounds, schedule

_P2P = ("all_reduce", "reduce_scatter", "all_gather")
__all__ = ["ALGORITHMS", "COLLECTIVES", "ScheduleError", "chunk_bounds", "schedule", *_P2P]


def __getattr__(name):
    if name in _P2P:
        from collectives import p2p
        return getattr(p2p, name)
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")
