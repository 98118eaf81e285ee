"""The planner: each algorithm's time on a topology by an alpha-beta cost model; pick the least.

    from collectives import plan
    from spina import topology
    topo = topology.load("bench/topologies/two_groups.yaml")
    choice = plan.plan(topo, "all_reduce", 64 << 20)        # bytes of float32
    choice.best, choice.seconds                             # 'ring', {'ring': 0.61, ...}

The model prices the very schedule collectives.p2p runs (collectives/schedule.py), step by
step. In a step every transfer follows its fixed route (spina/topology.py); a directed
link carries the wire bytes of every transfer that crosses it in that step, and a transfer
ends when its busiest link has sent them all:

    step = alpha + max(network, cpu)
    network = max over transfers (route latency + max over its links (load / rate))
    cpu = cpu_per_byte * (most bytes one rank sends plus receives in the step)
    time = sum of the steps

A link with a `burst` (a token bucket, as tc's tbf has) sends what its bucket holds at once
and the rest at its rate; the bucket is full when the collective starts and refills at the
rate while the link is idle.

alpha is the fixed cost of a step at a rank (posting, waiting, Python), the network term
counts TCP's wire bytes (payload plus Ethernet, IPv4 and TCP headers per MSS segment of the
link MTU), the cpu term what a rank's processor does per byte it moves (kernel copies,
gloo, the adds and concatenations; it overlaps the network). bench/plan.py
measures alpha and cpu_per_byte on loopback, where no link limits (docs/collectives.md).

In-network aggregation ("ina", all-reduce only, when a switch has `aggregate: true`) is
SpINA through that switch: every rank sends its non-zero blocks as int32 once up and receives
the union of all ranks' non-zero blocks once down, in the protocol's rounds (one datagram
per round each way, lanes of `ina_elements` values in all: collectives.ina_model.rounds);
the switch and each agent pay this machine's calibrated CPU per datagram, per IPv4
fragment and per payload byte (`ina_model.switch_cpu`, `agent_cpu`), and the agent its scan
per value (collectives.ina_model.Assumptions; or a flat
`ina_switch_packet_s` and `ina_agent_packet_s` per datagram when given); the three
pipeline (a link's full token bucket goes at once here too), so

    ina = ina_call_s + 2 x route latency + max(link term, switch term, agent term)

The all-gather through the switch ("switch", Agent.allgather, when a switch aggregates) is
priced the same way: every rank sends its shard up once in datagrams of `ina_elements` values
and receives every other rank's down, after a fixed cost per call (`gather_call_s`); the
switch pays its CPU per datagram in and per copy it sends out (`gather_copy_s`: it
replicates each one to the job's other workers), each agent its CPU per datagram it sends or
receives (all calibrated unless given). "leader-switch" is the
leader all-gather whose middle phase is that multicast among the group leaders alone, each
sending its group's chunks: its inside
and out phases are priced as schedule steps ("leader-ring"'s first and last), its middle as
"switch" on the leaders.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from collectives import ina_model
from collectives.schedule import (
    ALGORITHMS,
    HIERARCHICAL,
    LEADER,
    chunk_bounds,
    leader_phases,
    schedule,
)
from spina import wire
from spina.config import JOB_DEFAULTS
from spina.topology import TCP_HEADERS, UDP_HEADERS, Topology

INA = "ina"
SWITCH, LEADER_SWITCH = "switch", "leader-switch"  # collectives.p2p's names
DTYPE_SIZES = {"float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_CALIBRATED = ("ina_switch_packet_s", "ina_agent_packet_s", "gather_copy_s", "gather_call_s")


@dataclass(frozen=True)
class CostParams:
    """The model's constants (seconds, bytes). alpha and cpu_per_byte are bench/plan.py's
    loopback calibration on this 2-core machine with 4 ranks and other sessions' load of
    about 8 (docs/collectives.md); ina_call_s is SpINA's model's (ina_model.Assumptions.call_s,
    its one owner). A quieter or larger machine has smaller ones, so measure yours and pass
    them (`spina plan --alpha ...`)."""
    alpha: float = 4.7e-3              # per step and rank, the p2p collectives
    cpu_per_byte: float = 3.0e-9       # per byte a rank sends or receives
    ina_call_s: float = ina_model.Assumptions().call_s  # SpINA's fixed cost per call
    # SpINA's CPU: None prices it with this machine's calibration (collectives.ina_model:
    # per datagram and per IPv4 fragment, the agent's scan; the switch's copies out for an
    # all-gather); a number is the seconds per datagram, flat
    ina_switch_packet_s: float | None = None  # the software switch, per datagram in
    ina_agent_packet_s: float | None = None   # an agent, per datagram it sends or receives
    # values per datagram and the bytes around them (header, one 4-byte `next` per lane) of a
    # job with the schema's default nlanes and block_size
    ina_elements: int = JOB_DEFAULTS["nlanes"] * JOB_DEFAULTS["block_size"]
    ina_overhead: int = wire.data_offset(JOB_DEFAULTS["nlanes"])
    density: float = 1.0               # fraction of each rank's blocks that are non-zero (ina)
    gather_copy_s: float | None = None  # the switch, per all-gather datagram it sends out
    gather_call_s: float | None = None  # an all-gather's fixed cost per call

    def check(self) -> "CostParams":
        for k, v in self.__dict__.items():
            if v is None and k in _CALIBRATED:
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{k}: must be a number >= 0, got {v!r}")
        if not 0 < self.density <= 1:
            raise ValueError(f"density: must be in (0, 1], got {self.density!r}")
        if self.ina_elements < 1:
            raise ValueError(f"ina_elements: must be at least 1, got {self.ina_elements!r}")
        return self


@dataclass(frozen=True)
class StepCost:
    seconds: float
    bottleneck: str  # "a->b": the slowest transfer's busiest link; "cpu"; "" if nothing sent
    bytes: int       # payload bytes sent in the step, all ranks


@dataclass(frozen=True)
class Prediction:
    algorithm: str
    seconds: float
    steps: tuple[StepCost, ...]

    @property
    def bottleneck(self) -> str:
        """The link that bounds most of the time (the slowest steps' busiest link)."""
        total: dict[str, float] = {}
        for s in self.steps:
            total[s.bottleneck] = total.get(s.bottleneck, 0.0) + s.seconds
        return max(total, key=total.get) if total else ""


@dataclass(frozen=True)
class Plan:
    collective: str
    nbytes: int
    best: str
    predictions: dict[str, Prediction] = field(default_factory=dict)

    @property
    def seconds(self) -> dict[str, float]:
        return {a: p.seconds for a, p in self.predictions.items()}


def tcp_wire_bytes(payload: int, mtu: int) -> int:
    """Bytes a TCP payload puts on a link: every MSS segment carries its headers."""
    return payload + math.ceil(payload / (mtu - 52)) * TCP_HEADERS


def udp_wire_bytes(datagram: int, mtu: int) -> int:
    """Bytes one UDP datagram of `datagram` payload bytes puts on a link, IPv4 fragments
    (each at most mtu - 20 bytes of IP payload) with their headers."""
    frags = math.ceil((datagram + 8) / ((mtu - 20) // 8 * 8))
    return datagram + 8 + frags * UDP_HEADERS


def algorithms(topo: Topology, collective: str) -> list[str]:
    """The algorithms the planner weighs for `collective` on `topo`."""
    out = [a for a in ALGORITHMS if a not in HIERARCHICAL or topo.groups is not None]
    if collective == "all_reduce" and topo.aggregating:
        out.append(INA)
    if collective == "all_gather":
        out += [LEADER] if topo.groups is not None else []
        if topo.aggregating:
            out += [SWITCH] + ([LEADER_SWITCH] if topo.groups is not None else [])
    return out


def _link_name(topo: Topology, hop) -> str:
    a, b = topo.link_end(hop)
    return f"{a}->{b}"


def predict(topo: Topology, collective: str, nbytes: int, algorithm: str,
            params: CostParams = CostParams(), itemsize: int = 4) -> Prediction:
    """The predicted time of `algorithm` for `collective` of `nbytes` (the whole tensor)."""
    if algorithm == INA:
        return _predict_ina(topo, collective, nbytes, params, itemsize)
    if algorithm in (SWITCH, LEADER_SWITCH):
        return _predict_switch_gather(topo, collective, nbytes, algorithm, params, itemsize)
    sched = schedule(collective, algorithm, topo.world, topo.groups)
    steps: list[StepCost] = []
    now = _price_steps(topo, sched.steps, nbytes // itemsize, params, itemsize, steps)
    return Prediction(algorithm, now, tuple(steps))


def _price_steps(topo, sched_steps, elements: int, params, itemsize: int, steps: list,
                 now: float = 0.0, bucket=None) -> float:
    """Price schedule steps from time `now` (token buckets in `bucket`, link -> (bytes, at
    time); None: full); appends a StepCost per step to `steps`, returns the end time."""
    p = topo.world
    bounds = chunk_bounds(elements, p)
    bucket = {} if bucket is None else bucket
    for step in sched_steps:
        load: dict[tuple[int, int], float] = {}
        moves, moved = [], [0] * p
        for t in step:
            size = sum(bounds[c + 1] - bounds[c] for c in t.chunks) * itemsize
            if size == 0:
                continue
            route = topo.path(topo.ranks[t.src], topo.ranks[t.dst])
            wire = tcp_wire_bytes(size, topo.mtu)
            for hop in route:
                load[hop] = load.get(hop, 0) + wire
            moves.append((route, size))
            moved[t.src] += size
            moved[t.dst] += size
        start = now + params.alpha
        busy = {h: _drain(topo.links[h[0]], bucket, h, start, b) for h, b in load.items()}
        slowest, neck = 0.0, ""
        for route, _ in moves:
            lat = sum(topo.links[i].latency for i, _ in route)
            worst = max(route, key=busy.get)
            if lat + busy[worst] > slowest:
                slowest, neck = lat + busy[worst], _link_name(topo, worst)
        cpu = params.cpu_per_byte * max(moved)
        if cpu > slowest:
            slowest, neck = cpu, "cpu"
        end = start + slowest
        steps.append(StepCost(end - now, neck, sum(s for _, s in moves)))
        now = end
    return now


def _predict_switch_gather(topo, collective, nbytes, algorithm, params, itemsize) -> Prediction:
    if collective != "all_gather" or not topo.aggregating:
        raise ValueError(f"algorithm: {algorithm} needs an all_gather and a switch with "
                         "aggregate: true")
    p, elements = topo.world, nbytes // itemsize
    bounds = chunk_bounds(elements, p)
    if algorithm == SWITCH:
        inside, out, senders = [], [], [(r,) for r in range(p)]
    else:
        if topo.groups is None:
            raise ValueError(f"algorithm: {LEADER_SWITCH} needs groups in the topology")
        inside, _, out = leader_phases(topo.groups)
        senders = list(topo.groups)
    best = None
    for sw in topo.aggregating:
        steps: list[StepCost] = []
        bucket: dict = {}
        now = _price_steps(topo, inside, elements, params, itemsize, steps, 0.0, bucket)
        mid = _multicast(topo, sw, senders, bounds, params, itemsize, now, bucket)
        steps.append(mid)
        now = _price_steps(topo, out, elements, params, itemsize, steps, now + mid.seconds,
                           bucket)
        if best is None or now < best.seconds:
            best = Prediction(algorithm, now, tuple(steps))
    return best


def _multicast(topo, switch, senders, bounds, params, itemsize, now, bucket) -> StepCost:
    """One Agent.allgather through `switch` among the ranks senders[i][0], each sending the
    chunks senders[i] (padded to the longest, as collectives.p2p sends them)."""
    size = max(sum(bounds[c + 1] - bounds[c] for c in cs) for cs in senders) * itemsize
    per = params.ina_elements * 4  # the agent sends raw bytes in datagrams of this payload
    n = math.ceil(size / per)
    full, last = n - 1, size - (n - 1) * per
    wire = full * udp_wire_bytes(per + params.ina_overhead, topo.mtu) + (
        udp_wire_bytes(last + params.ina_overhead, topo.mtu) if n else 0)
    m = len(senders)
    a = ina_model.Assumptions()
    frags = ina_model.fragments(per + params.ina_overhead, topo.mtu)  # of a full datagram
    agent_s = m * n * (a.agent_s_per_datagram + frags * a.agent_s_per_fragment
                       + per * a.agent_s_per_byte
                       if params.ina_agent_packet_s is None else params.ina_agent_packet_s)
    switch_s = m * n * (m - 1) * params.gather_copy_s if params.gather_copy_s is not None \
        else m * n * ((m - 1) * a.gather_s_per_copy + ina_model.switch_cpu(a, 1, frags, per))
    load: dict[tuple[int, int], float] = {}
    lat = 0.0
    for cs in senders:
        node = topo.ranks[cs[0]]
        up, down = topo.path(node, switch), topo.path(switch, node)
        for route, b in ((up, wire), (down, (m - 1) * wire)):
            for hop in route:
                load[hop] = load.get(hop, 0) + b
        lat = max(lat, sum(topo.links[i].latency for i, _ in up + down))
    call = a.gather_call_s if params.gather_call_s is None else params.gather_call_s
    start = now + call
    link = {h: _drain(topo.links[h[0]], bucket, h, start, b) for h, b in load.items()}
    neck = max(link, key=link.get)
    bound = max((link[neck], _link_name(topo, neck)),
                (switch_s, f"switch {switch} CPU"), (agent_s, "agent CPU"))
    return StepCost(call + lat + bound[0], bound[1], m * size)


def _drain(link, bucket, hop, start: float, nbytes: float) -> float:
    """Seconds `link` needs from `start` to send `nbytes`: what its token bucket holds goes
    at once (a link idle before the collective starts full), the rest at its rate. Updates
    `bucket[hop]` to (bytes left, when the link is done)."""
    held, since = bucket.get(hop, (link.burst, start))
    held = min(link.burst, held + (start - since) * link.rate / 8)
    seconds = max(0.0, nbytes - held) * 8 / link.rate
    bucket[hop] = (max(0.0, held - nbytes), start + seconds)
    return seconds


def _predict_ina(topo, collective, nbytes, params, itemsize) -> Prediction:
    if collective != "all_reduce" or not topo.aggregating:
        raise ValueError(f"algorithm: {INA} needs an all_reduce and a switch with "
                         "aggregate: true")
    best = None
    for sw in topo.aggregating:  # the aggregating switch that serves this job fastest
        pred = _ina_via(topo, sw, nbytes // itemsize, params)
        if best is None or pred.seconds < best.seconds:
            best = pred
    return best


def _ina_via(topo, switch, elements, params) -> Prediction:
    p = topo.world
    a = ina_model.Assumptions()  # SpINA's block and slots (lanes: ina_elements / block)
    packets = ina_model.rounds(p, elements, params.density, params.ina_elements // a.block,
                               a.block, a.slots)
    up, down = params.density * elements * 4, ina_model.union(params.density, p) * elements * 4
    frags_up, wire_up = ina_model.stream(up, packets, params.ina_overhead, topo.mtu)
    frags_down, wire_down = ina_model.stream(down, packets, params.ina_overhead, topo.mtu)
    load: dict[tuple[int, int], float] = {}
    lat = 0.0
    for r in topo.ranks:
        up_route, down_route = topo.path(r, switch), topo.path(switch, r)
        for route, on_wire in ((up_route, wire_up), (down_route, wire_down)):
            for hop in route:
                load[hop] = load.get(hop, 0) + on_wire
        lat = max(lat, sum(topo.links[i].latency for i, _ in up_route + down_route))
    # full token buckets at the start, as for the host algorithms' first step
    link = {h: max(0.0, b - topo.links[h[0]].burst) * 8 / topo.links[h[0]].rate
            for h, b in load.items()}
    neck = max(link, key=link.get)
    link_s = link[neck]
    switch_s = p * packets * params.ina_switch_packet_s \
        if params.ina_switch_packet_s is not None \
        else p * ina_model.switch_cpu(a, packets, frags_up, up)
    agent_s = 2 * packets * params.ina_agent_packet_s if params.ina_agent_packet_s is not None \
        else ina_model.agent_cpu(a, elements, 0, 2 * packets, frags_up + frags_down, up + down)
    bound = max((link_s, _link_name(topo, neck)), (switch_s, f"switch {switch} CPU"),
                (agent_s, "agent CPU"))
    seconds = params.ina_call_s + lat + bound[0]
    return Prediction(INA, seconds, (StepCost(seconds, bound[1], round(p * up)),))


def plan(topo: Topology, collective: str, nbytes: int, params: CostParams = CostParams(),
         itemsize: int = 4, candidates=None) -> Plan:
    """Every candidate's prediction (default: `algorithms(topo, collective)`) and the pick:
    the least predicted time (ties: the earlier in ALGORITHMS)."""
    params.check()
    if not isinstance(nbytes, int) or nbytes < itemsize:
        raise ValueError(f"size: need at least one element ({itemsize} bytes), got {nbytes!r}")
    fits = algorithms(topo, collective)
    names = fits if candidates is None else list(candidates)
    for a in names:
        if a not in fits:
            raise ValueError(f"algorithms: {a!r} is not available for {collective} on "
                             f"{topo.source} (available: {', '.join(fits)})")
    preds = {a: predict(topo, collective, nbytes, a, params, itemsize) for a in names}
    best = min(names, key=lambda a: preds[a].seconds)
    return Plan(collective, nbytes, best, preds)


def with_params(params: CostParams, **changes) -> CostParams:
    """`params` with the given fields changed (None: keep), checked."""
    return replace(params, **{k: v for k, v in changes.items() if v is not None}).check()
