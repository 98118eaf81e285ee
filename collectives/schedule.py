"""Every collective algorithm as a schedule: steps of point-to-point transfers of chunks.

A tensor of n elements on p ranks is cut into p chunks in numpy's `array_split` layout (the
first n % p chunks one element longer). Chunk c is what rank c holds after a reduce-scatter
and what it contributes to an all-gather. A schedule is a list of steps; in a step every rank
posts all its sends and receives at once, waits for them, then applies what it received:

    Transfer(src, dst, chunks, reduce)   src sends its current value of `chunks` to dst;
                                         reduce: dst adds them to its own, else dst overwrites

One schedule owns an algorithm: `collectives.p2p` executes it over torch.distributed and
`collectives.plan` prices the same steps on a topology, so the cost model prices exactly what
runs. Ranks here are 0..p-1 of the process group.

The order of every float sum is fixed by the schedule alone, never by arrival times: within a
step a rank adds the contributions to a chunk in the order the step lists them, its own value
last, (((r1 + r2) + r3) + own). Each chunk's final sum is computed by exactly one rank and then
copied bit for bit, so every rank's result is bit-identical. The orders, for chunk c:

    ring, direct     cyclic from c + 1:  ((x[c+1] + x[c+2]) + ...) + x[c]   (both the same bits)
    halving-doubling a butterfly: level m (p/2, p/4, ..., 1) adds partner q ^ m, v[q] + v[q^m];
                     world sizes not a power of two first fold rank p'+k into rank k
    2d-ring, 2d-direct  inside each group cyclic from the chunk's local index + 1, then across
                     the groups cyclic from the chunk's group + 1 (both the same bits)

Algorithms (ALGORITHMS): "ring"; "halving-doubling" (recursive halving reduce-scatter,
recursive doubling all-gather); "direct" (full mesh: one step, every pair exchanges);
"2d-ring" / "2d-direct" (hierarchical: a ring or a full mesh inside each group of ranks, a
ring across the groups among the ranks with the same index in their group). All-reduce is the
reduce-scatter followed by the all-gather of the same algorithm.

"leader-ring" is an all-gather only (LEADER): inside each group the members exchange their
chunks over a full mesh (the fast links), then only each group's first rank, its leader,
crosses the groups: a ring among the leaders passing whole groups' chunks, then each leader
sends the chunks of the other groups to its members. Between the groups it moves what the
2-D all-gather moves, but on the leaders' links alone; `leader_phases` gives its three
phases, so that collectives.p2p can run the middle one through the switch instead
("leader-switch", Agent.allgather among the leaders).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

ALGORITHMS = ("ring", "halving-doubling", "direct", "2d-ring", "2d-direct")
HIERARCHICAL = ("2d-ring", "2d-direct")
LEADER = "leader-ring"  # all-gather only; groups required
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


class ScheduleError(ValueError):
    """A collective, algorithm, world size or grouping that no schedule exists for."""


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    chunks: tuple[int, ...]
    reduce: bool


Step = tuple[Transfer, ...]


@dataclass(frozen=True)
class Schedule:
    collective: str
    algorithm: str
    world: int
    groups: tuple[tuple[int, ...], ...] | None
    steps: tuple[Step, ...]


def chunk_bounds(n: int, p: int) -> tuple[int, ...]:
    """p + 1 offsets of the p chunks of n elements (numpy.array_split's layout)."""
    q, r = divmod(n, p)
    return tuple(c * q + min(c, r) for c in range(p + 1))


# ---------------------------------------------------------------------------- building blocks
# Each works on `members` (ranks, in order) and `units` (units[i]: the chunks members[i] holds
# after a reduce-scatter / contributes to an all-gather) and returns a list of steps, each a
# list of transfers.

def _ring_rs(members, units):
    m = len(members)
    return [[Transfer(members[i], members[(i + 1) % m], units[(i - s - 1) % m], True)
             for i in range(m)] for s in range(m - 1)]


def _ring_ag(members, units):
    m = len(members)
    return [[Transfer(members[i], members[(i + 1) % m], units[(i - s) % m], False)
             for i in range(m)] for s in range(m - 1)]


def _direct_rs(members, units):
    # Listed by receiver, senders cyclic from the receiver + 1: the ring's order of sums.
    m = len(members)
    if m == 1:
        return []
    return [[Transfer(members[(j + k) % m], members[j], units[j], True)
             for j in range(m) for k in range(1, m)]]


def _direct_ag(members, units):
    m = len(members)
    if m == 1:
        return []
    return [[Transfer(members[i], members[j], units[i], False)
             for i in range(m) for j in range(m) if j != i]]


def _pow2_below(m: int) -> int:
    return 1 << (m.bit_length() - 1)


def _halving_ranges(m: int) -> list[list[tuple[int, int, int]]]:
    """Per level (mask m'/2 .. 1): per core member q, (mask, lo, hi) of the unit range it keeps
    after that level. Member q with the mask's bit clear keeps the lower part."""
    core = _pow2_below(m)
    rng = [(0, m)] * core
    levels = []
    mask = core // 2
    while mask:
        new = []
        for q in range(core):
            lo, hi = rng[q]
            mid = lo + (hi - lo) // 2
            new.append((mid, hi) if q & mask else (lo, mid))
        levels.append([(mask, lo, hi) for lo, hi in new])
        rng = new
        mask //= 2
    return levels


def _flat(units, lo, hi):
    return tuple(c for u in units[lo:hi] for c in u)


def _hd_owner_ranges(m):
    levels = _halving_ranges(m)
    return [(lo, hi) for _, lo, hi in levels[-1]] if levels else [(0, m)]


def _hd_rs(members, units):
    m = len(members)
    core = _pow2_below(m)
    everything = _flat(units, 0, m)
    steps = []
    if m > core:  # fold the extra members into the first ones
        steps.append([Transfer(members[core + k], members[k], everything, True)
                      for k in range(m - core)])
    prev = [(0, m)] * core
    for level in _halving_ranges(m):
        # q sends the part of its previous range it gives away to its partner
        steps.append([Transfer(members[q], members[q ^ mask], _flat(units, *_rest(prev[q], lo, hi)),
                               True) for q, (mask, lo, hi) in enumerate(level)])
        prev = [(lo, hi) for _, lo, hi in level]
    if m > core:  # hand each unit to its member
        steps.append([Transfer(members[q], members[u], units[u], False)
                      for q, (lo, hi) in enumerate(prev) for u in range(lo, hi) if u != q])
    return steps


def _rest(prev, lo, hi):
    """The part of range `prev` outside [lo, hi) (always one contiguous side)."""
    plo, phi = prev
    return (hi, phi) if lo == plo else (plo, lo)


def _hd_ag(members, units):
    m = len(members)
    core = _pow2_below(m)
    levels = _halving_ranges(m)
    own = _hd_owner_ranges(m)
    steps = []
    if m > core:  # every unit to the core member that owns its range
        steps.append([Transfer(members[u], members[q], units[u], False)
                      for q, (lo, hi) in enumerate(own) for u in range(lo, hi) if u != q])
    for level in reversed(levels):  # doubling: send all you hold, receive your partner's
        steps.append([Transfer(members[q], members[q ^ mask], _flat(units, lo, hi), False)
                      for q, (mask, lo, hi) in enumerate(level)])
    if m > core:
        everything = _flat(units, 0, m)
        steps.append([Transfer(members[k], members[core + k], everything, False)
                      for k in range(m - core)])
    return steps


_BLOCKS = {"ring": (_ring_rs, _ring_ag), "halving-doubling": (_hd_rs, _hd_ag),
           "direct": (_direct_rs, _direct_ag)}


def _parallel(*schedules):
    """Steps of independent sub-schedules (disjoint members) run side by side."""
    n = max((len(s) for s in schedules), default=0)
    return [[t for s in schedules if k < len(s) for t in s[k]] for k in range(n)]


def _two_d(groups, inner: str, rs: bool):
    """Reduce-scatter (rs) or all-gather over `groups` (equal sizes): `inner` inside each
    group, a ring across the groups among the members of the same local index."""
    g = len(groups[0])
    # inside group i, member j ends with (starts from) the chunks of local index j everywhere
    in_units = [tuple(grp[j] for grp in groups) for j in range(g)]
    across = [[grp[j] for grp in groups] for j in range(g)]
    f_in = _BLOCKS[inner][0 if rs else 1]
    f_x = _BLOCKS["ring"][0 if rs else 1]
    inside = _parallel(*(f_in(list(grp), in_units) for grp in groups))
    cross = _parallel(*(f_x(mem, [(c,) for c in mem]) for mem in across))
    return inside + cross if rs else cross + inside


def check_groups(groups, p: int) -> tuple[tuple[int, ...], ...]:
    """`groups` as a tuple of tuples; a ScheduleError unless they partition 0..p-1 into groups
    of one size. An int g means consecutive groups of g ranks."""
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 1 or p % groups:
            raise ScheduleError(f"groups: a group size of {groups} does not divide the "
                                f"world size {p}")
        return tuple(tuple(range(i, i + groups)) for i in range(0, p, groups))
    try:
        out = tuple(tuple(int(r) for r in grp) for grp in groups)
    except (TypeError, ValueError):
        raise ScheduleError(f"groups: expected a group size or lists of ranks, got "
                            f"{groups!r}") from None
    if not out or len({len(grp) for grp in out}) != 1:
        raise ScheduleError(f"groups: every group needs the same number of ranks, got sizes "
                            f"{[len(grp) for grp in out]}")
    if sorted(r for grp in out for r in grp) != list(range(p)):
        raise ScheduleError(f"groups: must hold each rank 0..{p - 1} exactly once, got "
                            f"{[list(grp) for grp in out]}")
    return out


def leader_phases(groups) -> tuple[list, list, list]:
    """The leader all-gather's three phases over `groups` (checked, equal sizes), each a list
    of steps: inside (every member gets its group's chunks over a full mesh), across (a ring
    among the leaders, grp[0], passing whole groups' chunks), out (each leader sends its
    members the other groups' chunks, one transfer each)."""
    inside = _parallel(*(_direct_ag(list(grp), [(c,) for c in grp]) for grp in groups))
    across = _ring_ag([grp[0] for grp in groups], [tuple(grp) for grp in groups])
    out = [[Transfer(grp[0], m, tuple(c for j, other in enumerate(groups) if j != i
                                      for c in other), False)
            for i, grp in enumerate(groups) for m in grp[1:]]]
    return inside, across, out if len(groups) > 1 else []


@functools.lru_cache(maxsize=256)
def _build(collective: str, algorithm: str, p: int, groups) -> Schedule:
    if algorithm == LEADER:
        rs, ag = [], [s for phase in leader_phases(groups) for s in phase]
    elif algorithm in HIERARCHICAL:
        inner = algorithm[3:]
        rs = _two_d(groups, inner, True)
        ag = _two_d(groups, inner, False)
    else:
        members = list(range(p))
        units = [(c,) for c in range(p)]
        f_rs, f_ag = _BLOCKS[algorithm]
        rs, ag = f_rs(members, units), f_ag(members, units)
    steps = {"reduce_scatter": rs, "all_gather": ag, "all_reduce": rs + ag}[collective]
    return Schedule(collective, algorithm, p, groups,
                    tuple(tuple(s) for s in steps if s))


def schedule(collective: str, algorithm: str, p: int, groups=None) -> Schedule:
    """The schedule of `collective` by `algorithm` on p ranks (groups: for the 2d algorithms,
    a group size or lists of ranks, see check_groups)."""
    if collective not in COLLECTIVES:
        raise ScheduleError(f"collective: {collective!r} is not one of {', '.join(COLLECTIVES)}")
    if algorithm == LEADER:
        if collective != "all_gather":
            raise ScheduleError(f"algorithm: {LEADER} is an all_gather, not a {collective}")
    elif algorithm not in ALGORITHMS:
        raise ScheduleError(f"algorithm: {algorithm!r} is not one of "
                            f"{', '.join(ALGORITHMS + (LEADER,))}")
    if not isinstance(p, int) or p < 1:
        raise ScheduleError(f"world size: need at least 1 rank, got {p!r}")
    if algorithm in HIERARCHICAL or algorithm == LEADER:
        if groups is None:
            raise ScheduleError(f"groups: algorithm {algorithm} needs the groups of ranks")
        groups = check_groups(groups, p)
    else:
        groups = None
    return _build(collective, algorithm, p, groups)
