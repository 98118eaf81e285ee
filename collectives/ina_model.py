"""SpINA's cost at cluster scale, and on this machine: one set of assumptions, written out.

    from collectives import ina_model as m
    a = m.Assumptions()                                  # every constant, with its source
    m.predict(a, workers=1024, nbytes=1 << 30, rate=100e9, density=0.01, switch="tofino")
    m.ring(a, workers=1024, nbytes=1 << 30, rate=100e9)  # the bandwidth-optimal ring
    m.scale_table(a, nbytes=1 << 30, rate=100e9)         # what `spina plan --scale` prints

The link arithmetic (issue 45; N ranks, a tensor of S bytes of float32, d its block density,
w its lane width, u = 1 - (1 - d)^N the union of N ranks' independent non-zero blocks):

    collective        through the switch, per rank        ring, per rank (each way)
    all_reduce        up d w/32 S, down u w/32 S          2 (N-1)/N S in 2 (N-1) steps
    reduce_scatter    up d w/32 S, down u w/32 S / N      (N-1)/N S in N-1 steps
    all_gather        up S / N, down (N-1)/N S            (N-1)/N S in N-1 steps

(S is the whole tensor: for all_gather the gathered result, each rank holding S/N. A
reduce-scatter's rank receives every round, the other ranks' shards header-only: the
software switch strips them; the TNA program does not, so through a Tofino it receives
the all-reduce's u w/32 S.) Through
the switch the terms below stream together, so a call takes its fixed cost plus the path's
latency plus the largest of them (the bottleneck):

- the worker's link: its wire bytes up, and down, at the rate;
- the worker's agent: a scan of the tensor per element and a cost per packet and per
  payload byte it sends or receives, on `agent_cores` cores (measured on this machine);
- the window: a slot's packets follow one another, a round trip each.

The packets are the protocol's rounds (docs/aggregation.md, `rounds`): per slot the call's
length fills a setup round, then one round per position of its lanes that some rank holds,
every rank sending a packet in each (header-only where it holds no block); so a sparse
call's packets follow the union of the ranks' blocks. The last term is

- each switch of the aggregation tree (fan-in k: `software_fan_in` children, or on Tofino
  the smaller of `tofino_ports_per_pipe` and `ranks_per_switch`; levels = ceil(log_k N)),
  whose children send their unions up and receive the result down:
  * "software": a server with one NIC at the rate (its children's streams in, a copy of the
    result per child out) and `server_cores` cores at this machine's CPU per datagram;
  * "tofino": the TNA program (tofino/README.md): 64 int32 per packet; every aggregated
    packet crosses the pipe's recirculation port once and a reply once more (its second of
    three passes), so a switch's packets share that one port's line rate; a pipe has
    `tofino_ports_per_pipe` ports (a job's workers share one pipe);
  * "tofino-line": the same packets if the pipe aggregated at its ports' line rate (no
    recirculation share): a prediction of a program not built.

The ring is the bandwidth-optimal ring on the same links (TCP's headers, a fixed cost per
step), with no CPU term: what NCCL-class collectives approach; gloo's ring on this machine is
slower (its CPU per byte, collectives/plan.py). A training step is compute + communication,
or with overlap max(compute, communication): the communication hidden behind the backward
pass up to the compute time.

On this machine (`machine`: 2 cores shared by every agent and the software switch) the
same terms add up on the cores instead: call + max(link, cores(N x agent + switch)) +
rounds per slot x a round's wait, where cores(W) runs a call's first `machine_burst_s` of
CPU on every core (its processes slept between calls) and the rest at the share the load
average leaves (`share`: other sessions' work competes for the cores);
collectives/ina_calibration.py fits the constants from bench/results/ and reports every
point's error (docs/collectives.md, "Calibration on this machine").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

# plan prices `ina` with rounds() and stream(); its wire constants are read at call time
from collectives.schedule import COLLECTIVES
from spina.topology import TCP_HEADERS, UDP_HEADERS
from spina.wire import LANE_BITS

SWITCHES = ("tofino", "software", "tofino-line")
NOT_BUILT = {"tofino-line": "a TNA program without the recirculation share is not built",
             "tofino levels": "the TNA program has no leaf or spine role (docs/scale_out.md)",
             "software levels": "the fabric has two levels (docs/scale_out.md)"}


def _c(value, source: str):
    """A constant with its source."""
    return field(default=value, metadata={"source": source})


def source(name: str) -> str:
    """Where an assumption comes from."""
    return {f.name: f.metadata["source"] for f in fields(Assumptions)}[name]


@dataclass(frozen=True)
class Assumptions:
    """Every constant of the model (seconds, bytes, bits per second), with its source
    (`source(name)`; `spina plan --scale` prints them all)."""
    # SpINA's datagrams through the software switch
    lanes: int = _c(56, "blocks per datagram: spina/config.JobConfig.nlanes")
    block: int = _c(256, "values per block: JobConfig.block_size")
    header: int = _c(48, "bytes: spina/wire.HEADER_LEN (and a 4-byte next per lane)")
    slots: int = _c(16, "datagrams in flight per rank: JobConfig.nslots")
    # this machine: collectives/ina_calibration.py fits them from bench/results/;
    # tests/test_ina_model.py checks that these are its fit
    agent_s_per_call: float = _c(0.00033, "measured here: the agent's CPU per call (its "
                                 "plan, buffers, Python)")
    agent_s_per_element: float = _c(2.27e-10, "measured here: the agent's CPU per value "
                                     "(scan, quantize, unpack)")
    agent_s_per_narrow_value: float = _c(1.17e-10, "measured here: more per value in 16- or "
                                         "8-bit lanes (the shift, the rounding and the pack)")
    agent_s_per_datagram: float = _c(6.07e-06, "measured here: the agent's CPU per datagram "
                                      "sent or received (kernel UDP)")
    agent_s_per_fragment: float = _c(7.28e-06, "measured here: ... and per IPv4 fragment")
    agent_s_per_byte: float = _c(1.05e-10, "measured here: ... and per payload byte it sends or "
                                 "receives (pack, copy, unpack)")
    switch_s_per_datagram: float = _c(7.72e-06, "measured here: the compiled software "
                                       "switch's CPU per datagram in")
    switch_s_per_fragment: float = _c(6.78e-06, "measured here: ... and per IPv4 fragment")
    switch_s_per_byte: float = _c(7.36e-11, "measured here: ... and per payload byte in (the adds, "
                                  "the result's copies out)")
    gather_s_per_copy: float = _c(5.41e-05, "measured here: the switch's CPU per all-gather "
                                   "datagram copied out (its compiled path)")
    call_s: float = _c(0.000278, "measured here: an all-reduce's fixed time (calls of 4 KiB "
                       "at most, 4 ranks on loopback, less their CPU and rounds)")
    gather_call_s: float = _c(0.000168, "fitted here: an all-gather's fixed time")
    scatter_call_s: float = _c(0.00111, "fitted here: a reduce-scatter's fixed time (its shard "
                               "split, its owners per round)")
    machine_cores: int = _c(2, "this machine: every agent and the switch share them")
    machine_burst_s: float = _c(0.005, "fitted here: a call's first CPU-seconds run on every "
                                "core (its processes slept between calls: the scheduler "
                                "owes them that much)")
    machine_share_load: float = _c(3.4, "fitted here: beyond that a call gets this over the "
                                   "1-minute load average of the cores (all of them at most: "
                                   "other sessions' work shares them too)")
    machine_load: float = _c(8.0, "assumed: the load average when a call runs here (the "
                             "calibration's runs: 4.5 to 12.5, each point's own)")
    machine_round_s: float = _c(0.0001, "fitted here: a slot's round waits this long more (its "
                                "agents and the switch each wake up)")
    # the Tofino program
    tofino_values: int = _c(64, "int32 per packet, one block: tofino/size.p4 BLOCK_SIZE")
    tofino_packet: int = _c(350, "bytes on the wire: 14 + 20 + 8 + 48 + 4 + 256 "
                            "(tofino/README.md)")
    tofino_slots: int = _c(256, "the window in blocks: tofino/size.p4 POOL_SLOTS")
    tofino_recirc_bps: float = _c(100e9, "the pipe's recirculation port, which every "
                                  "aggregated packet crosses (tofino/README.md)")
    tofino_ports_per_pipe: int = _c(16, "Tofino 1: 64 ports of 100G in 4 pipes; a job's "
                                    "workers share one pipe")
    ranks_per_switch: int = _c(32, "a job's ranks per switch: the 32-bit bitmap")
    # the cluster: assumed, not measured (there is no cluster here)
    frame_gap: int = _c(24, "assumed: Ethernet FCS, preamble and gap per frame")
    mtu: int = _c(9000, "assumed: jumbo frames on every link")
    agent_cores: int = _c(1, "the agent's cores per worker: its all-reduce is one thread")
    server_cores: int = _c(16, "assumed: a software switch server's cores")
    software_fan_in: int = _c(32, "children per software switch: a leaf's rack of 32 "
                              "(docs/scale_out.md)")
    rtt_s: float = _c(20e-6, "assumed: a round trip host-switch-host over kernel UDP")
    tofino_rtt_s: float = _c(5e-6, "assumed: the same through a Tofino, kernel-bypass hosts")
    level_rtt_s: float = _c(4e-6, "assumed: more per extra level of switches")
    tofino_agent_s_per_packet: float = _c(1e-7, "assumed: a kernel-bypass agent, 10 M "
                                          "packets per core-second (not built: the agent "
                                          "sends kernel UDP datagrams)")
    ring_step_s: float = _c(10e-6, "assumed: the ring's fixed cost per step")

    def check(self) -> "Assumptions":
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 \
                    or not math.isfinite(v):
                raise ValueError(f"{f.name}: must be a number >= 0, got {v!r}")
        for k in ("lanes", "block", "slots", "tofino_values", "tofino_slots", "machine_cores",
                  "agent_cores", "server_cores", "software_fan_in", "ranks_per_switch",
                  "tofino_ports_per_pipe"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}: must be at least 1, got {getattr(self, k)!r}")
        for k in ("machine_share_load", "machine_load"):
            if not getattr(self, k) > 0:
                raise ValueError(f"{k}: must be above 0, got {getattr(self, k)!r}")
        if self.software_fan_in < 2 or self.ranks_per_switch < 2:
            raise ValueError("software_fan_in: a switch needs at least 2 children")
        return self

    def with_(self, **changes) -> "Assumptions":
        """These assumptions with some changed (None: keep), checked."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None}).check()


@dataclass(frozen=True)
class Cost:
    """A predicted call: seconds, the bottleneck's name, and every term (seconds)."""
    seconds: float
    bottleneck: str
    terms: dict


def union(density: float, n: int) -> float:
    """The fraction of blocks some rank of n holds, each holding `density` at random."""
    return 1.0 - (1.0 - density) ** n


def rank_bytes(collective: str, n: int, nbytes: int, density: float = 1.0,
               lane_bits: int = 32) -> tuple[float, float]:
    """Payload bytes one rank sends up and receives down through the switch (the table in
    the module docstring)."""
    w = lane_bits / 32
    if collective == "all_reduce":
        return density * w * nbytes, union(density, n) * w * nbytes
    if collective == "reduce_scatter":
        return density * w * nbytes, union(density, n) * w * nbytes / n
    if collective == "all_gather":
        return nbytes / n, (n - 1) / n * nbytes
    raise ValueError(f"collective: one of {', '.join(COLLECTIVES)}, got {collective!r}")


def fragments(size: int, mtu: int) -> int:
    """IPv4 fragments of a UDP datagram of `size` bytes of payload at `mtu`."""
    return math.ceil((size + 8) / ((mtu - 20) // 8 * 8))


def expected_max(k: int, m: int, p: float) -> float:
    """E[the largest of k independent Binomial(m, p)] = sum over j < m of 1 - F(j)^k."""
    if p <= 0 or m == 0:
        return 0.0
    if p >= 1:
        return float(m)
    if k == 1:
        return m * p
    j = np.arange(m + 1)
    steps = np.log((m - j[:-1]) / (j[:-1] + 1)) + math.log(p) - math.log1p(-p)
    logpmf = m * math.log1p(-p) + np.concatenate(([0.0], np.cumsum(steps)))
    cdf = np.minimum(np.cumsum(np.exp(logpmf - logpmf.max())) * math.exp(logpmf.max()), 1.0)
    return float(np.sum(1.0 - cdf[:-1] ** k))


def active_slots(elements: int, lanes: int, block: int, slots: int) -> int:
    """The slots a call of `elements` values uses: those whose lanes hold a block of the
    tensor (host_agent/agent.py: slot s is empty when s x lanes >= blocks); slot 0 always."""
    return max(1, min(slots, math.ceil(math.ceil(elements / block) / lanes)))


def rounds(n: int, elements: int, density: float, lanes: int, block: int,
           slots: int) -> float:
    """Packets one rank sends in an all-reduce (docs/aggregation.md): a setup round per
    slot in use (`active_slots`), then in each slot that holds blocks one round per
    position its `lanes` lanes visit: the largest count of blocks some rank holds among a
    lane's positions. Block b is lane b mod (slots x lanes): the first `extra` lanes have
    one position more."""
    blocks, total = math.ceil(elements / block), slots * lanes
    m, extra = divmod(blocks, total)
    full, part = divmod(extra, lanes)  # slots whose lanes all have m + 1 positions; one more
    shorter = slots - full - (part > 0) if m else 0
    u = union(density, n)
    # the slot of `part` longer lanes: its lanes of m positions are empty when m is 0
    partial = expected_max(part if m == 0 else lanes, m + 1, u) if part else 0.0
    return active_slots(elements, lanes, block, slots) \
        + full * expected_max(lanes, m + 1, u) + partial + shorter * expected_max(lanes, m, u)


def stream(payload: float, packets: float, header: int, mtu: int, gap: int = 0):
    """(fragments, wire bytes) of `packets` UDP datagrams of `header` bytes each carrying
    `payload` bytes in all (evenly), IPv4-fragmented at `mtu`, `gap` more per frame."""
    if packets <= 0:
        return 0.0, 0.0
    f = fragments(math.ceil(header + payload / packets), mtu)
    return packets * f, payload + packets * (header + 8 + f * (UDP_HEADERS + gap))


def _packets(collective: str, n: int, nbytes: int, density: float, lanes: int, block: int,
             slots: int) -> tuple[float, float]:
    """Packets one rank sends up and receives down: an all-reduce's rounds, a
    reduce-scatter's (`by_shard`: each shard an all-reduce of its own on its slots), an
    all-gather's chunks."""
    if collective == "all_gather":
        per = lanes * block * 4
        return math.ceil(nbytes / n / per), (n - 1) * math.ceil(nbytes / n / per)
    if by_shard(collective, n, slots):
        d = n * rounds(n, nbytes // 4 // n, density, lanes, block, slots // n)
    else:
        d = rounds(n, nbytes // 4, density, lanes, block, slots)
    return d, d  # a reduce-scatter's rank gets every round: others' shards header-only


def by_shard(collective: str, n: int, slots: int) -> bool:
    """Whether a call lays its lanes out by shard: a reduce-scatter with at least as many
    slots as ranks (host_agent/scatter.py `Owners.lanes`; priced as slots // n per shard)."""
    return collective == "reduce_scatter" and slots >= n


def _in_flight(collective: str, n: int, nbytes: int, lanes: int, block: int,
               slots: int) -> int:
    """Slots in use: an all-gather's window, or the slots a call's length fills (by shard:
    each shard's, on its slots)."""
    if collective == "all_gather":
        return slots
    if by_shard(collective, n, slots):
        return n * active_slots(nbytes // 4 // n, lanes, block, slots // n)
    return active_slots(nbytes // 4, lanes, block, slots)


def agent_cpu(a: Assumptions, elements: float, narrow: float, datagrams: float,
              frags: float, payload: float, per_datagram: float | None = None) -> float:
    """An agent's CPU for one call: its fixed part, a scan per value (more per value in
    narrow lanes), and per datagram (`per_datagram`, default the kernel UDP one), IPv4
    fragment and payload byte it sends or receives."""
    return (a.agent_s_per_call + elements * a.agent_s_per_element
            + narrow * a.agent_s_per_narrow_value + frags * a.agent_s_per_fragment
            + datagrams * (a.agent_s_per_datagram if per_datagram is None else per_datagram)
            + payload * a.agent_s_per_byte)


def switch_cpu(a: Assumptions, datagrams: float, frags: float, payload: float) -> float:
    """The software switch's CPU for the datagrams, IPv4 fragments and payload bytes it
    takes in (the result's copies out included; an all-gather's: `gather_s_per_copy`)."""
    return datagrams * a.switch_s_per_datagram + frags * a.switch_s_per_fragment \
        + payload * a.switch_s_per_byte


def cores_time(cpu_s, cores: int, share, burst_s):
    """Seconds `cores` cores take for `cpu_s` CPU-seconds of one call: the first `burst_s`
    on every core, the rest at `share` of them (floats, or numpy arrays: the calibration's
    grid)."""
    burst = np.minimum(cpu_s, burst_s)
    return burst / cores + (cpu_s - burst) / (cores * share)


def share(a: Assumptions, load: float | None = None):
    """The share of this machine's cores a call gets beyond its burst at `load` (the load
    average; default `machine_load`): machine_share_load / load, all of them at most."""
    return np.minimum(1.0, a.machine_share_load / (a.machine_load if load is None else load))


def machine_streams(a: Assumptions, collective: str, n: int, nbytes: int, density: float,
                    lane_bits: int, mtu: int):
    """One rank's packets up and down, their IPv4 fragments and wire bytes through the
    software switch: (up, down, fragments up, fragments down, wire up, wire down)."""
    up, down = rank_bytes(collective, n, nbytes, density, lane_bits)
    nu, nd = _packets(collective, n, nbytes, density, a.lanes, a.block, a.slots)
    (fu, wu), (fd, wd) = (stream(b, k, a.header + 4 * a.lanes, mtu)
                          for b, k in ((up, nu), (down, nd)))
    return nu, nd, fu, fd, wu, wd


def machine(a: Assumptions, collective: str, n: int, nbytes: int, rate: float,
            density: float = 1.0, lane_bits: int = 32, mtu: int = 9000,
            burst: float = 0.0, load: float | None = None) -> Cost:
    """One call on this machine's namespace star (or loopback: rate inf): n agents and the
    software switch share `machine_cores` cores, the first `machine_burst_s` of their CPU on
    all of them, the rest at the share the load average `load` leaves (`share`); each link
    sends `burst` bytes at once (tbf's bucket, full when a call starts: the harness checks
    each result between calls, longer than the bucket takes to refill) and the rest at its
    rate."""
    nu, nd, fu, fd, wu, wd = machine_streams(a, collective, n, nbytes, density, lane_bits,
                                             mtu)
    up, down = rank_bytes(collective, n, nbytes, density, lane_bits)
    elements = 0 if collective == "all_gather" else nbytes // 4
    agents = n * agent_cpu(a, elements, elements * (lane_bits < 32), nu + nd, fu + fd,
                           up + down)
    switch = n * switch_cpu(a, nu, fu, up)
    if collective == "all_gather":
        switch += n * nu * (n - 1) * a.gather_s_per_copy
    # where the bucket runs dry, the last round's result follows its contributions: one
    # datagram down more (store and forward through the switch)
    over = max(wu, wd) - burst
    link = (over + wd / max(nd, 1)) * 8 / rate if over > 0 else 0.0
    cpu = float(cores_time(agents + switch, a.machine_cores, share(a, load),
                           a.machine_burst_s))
    slot_rounds = max(nu, nd) / _in_flight(collective, n, nbytes, a.lanes, a.block, a.slots)
    window = slot_rounds * a.machine_round_s  # a slot's rounds, one after another
    terms = {"link": link, "cpu": cpu, "agents": agents, "switch": switch, "window": window,
             "slot_rounds": slot_rounds}
    call = {"all_gather": a.gather_call_s, "reduce_scatter": a.scatter_call_s}.get(
        collective, a.call_s)
    return Cost(call + max(link, cpu) + window, "link" if link >= cpu else "cpu", terms)


def _levels(n: int, fan_in: int) -> list[int]:
    """Children per switch at each level of the aggregation tree, leaves first."""
    out, below = [], n
    while below > 1:
        k = min(fan_in, below)
        out.append(k)
        below = math.ceil(below / k)
    return out or [1]


def predict(a: Assumptions, workers: int, nbytes: int, rate: float, density: float = 1.0,
            lane_bits: int = 32, switch: str = "tofino",
            collective: str = "all_reduce") -> Cost:
    """One call through a tree of `switch` switches at cluster scale (module docstring)."""
    if switch not in SWITCHES:
        raise ValueError(f"switch: one of {', '.join(SWITCHES)}, got {switch!r}")
    if lane_bits not in LANE_BITS:
        raise ValueError(f"lane_bits: one of {LANE_BITS}, got {lane_bits!r}")
    if switch != "software" and lane_bits != 32:
        raise ValueError("lane_bits: the TNA program carries 32-bit lanes only "
                         "(tofino/size.p4)")
    if switch == "tofino" and collective == "all_gather":
        raise ValueError("switch: the TNA program drops all-gather packets as malformed "
                         "(tofino/README.md); price tofino-line or software")
    if workers < 2:
        raise ValueError(f"workers: need at least 2, got {workers!r}")
    n, up, down = workers, *rank_bytes(collective, workers, nbytes, density, lane_bits)
    if collective == "reduce_scatter" and switch != "software":
        down = rank_bytes("all_reduce", n, nbytes, density, lane_bits)[1]  # no ScatterStrip
    fan = a.software_fan_in if switch == "software" else min(a.tofino_ports_per_pipe,
                                                                 a.ranks_per_switch)
    levels = _levels(n, fan)
    rtt = (a.rtt_s if switch == "software" else a.tofino_rtt_s) \
        + (len(levels) - 1) * a.level_rtt_s
    if switch == "software":
        lanes, block, slots, gap = a.lanes, a.block, a.slots, a.frame_gap
        header, mtu, agent_pkt = a.header + 4 * a.lanes, a.mtu, a.agent_s_per_datagram
    else:  # one block of 64 int32 per packet, in frames below any MTU
        lanes, block, slots, gap = 1, a.tofino_values, a.tofino_slots, a.frame_gap
        header, mtu = a.tofino_packet - 4 * a.tofino_values - UDP_HEADERS - 8, 1 << 20
        agent_pkt = a.tofino_agent_s_per_packet
    nu, nd = _packets(collective, n, nbytes, density, lanes, block, slots)

    def wire(payload, packets):
        return stream(payload, packets, header, mtu, gap)[1]
    terms: dict[str, float] = {"link": max(wire(up, nu), wire(down, nd)) * 8 / rate}
    elements = 0 if collective == "all_gather" else nbytes / 4
    # kernel UDP (software) pays per IPv4 fragment too; a Tofino's packets fit one frame
    frags = sum(stream(b, k, header, mtu)[0] for b, k in ((up, nu), (down, nd))) \
        if switch == "software" else 0
    terms["agent"] = agent_cpu(a, elements, elements * (lane_bits < 32), nu + nd, frags,
                               up + down, agent_pkt) / a.agent_cores
    # a slot's packets follow one another
    terms["window"] = max(nu, nd) / _in_flight(collective, n, nbytes, lanes, block, slots) * rtt
    # each level's switches: k children, each with `sub` workers under it, send up what
    # their subtrees hold and receive what their subtrees need, in as many packets as a
    # rank (the rounds are the job's: every child sends one per round)
    def give(sub):  # payload bytes a subtree of `sub` workers sends up
        sub = min(sub, n)
        return sub * up if collective == "all_gather" else \
            lane_bits / 32 * nbytes * union(density, sub)

    def need(sub):  # payload bytes a subtree of `sub` workers receives down
        sub = min(sub, n)
        strip = collective == "reduce_scatter" and switch == "software"
        return {"all_reduce": down, "reduce_scatter": down * sub if strip else down,
                "all_gather": (n - sub) / n * nbytes}[collective]

    def sent(sub):  # packets a subtree sends up
        return nu * min(sub, n) if collective == "all_gather" else nu

    def got(sub):  # packets a subtree receives down (a reduce-scatter's: every round)
        return nd

    sub = 1
    for i, k in enumerate(levels):
        top = i == len(levels) - 1
        name = f"L{i + 1} switch"
        child = max(wire(give(sub), sent(sub)), wire(need(sub), got(sub)))
        parent = 0 if top else max(wire(give(sub * k), sent(sub * k)),
                                   wire(need(sub * k), got(sub * k)))
        ports = max(child, parent) * 8 / rate  # a child's link, the link to the parent
        if switch == "software":
            nic_in = k * wire(give(sub), sent(sub)) + (0 if top else wire(need(sub * k),
                                                                           got(sub * k)))
            nic_out = k * wire(need(sub), got(sub)) + (0 if top else wire(give(sub * k),
                                                                           sent(sub * k)))
            dg_in = k * sent(sub) + (0 if top else got(sub * k))
            frags_in = k * stream(give(sub), sent(sub), header, mtu)[0]
            cpu = switch_cpu(a, dg_in, frags_in, k * give(sub)
                             + (0 if top else need(sub * k)))
            if collective == "all_gather":  # it copies each datagram out to the others
                cpu += (k * got(sub) + (0 if top else sent(sub * k))) * a.gather_s_per_copy
            terms[name] = max(max(nic_in, nic_out) * 8 / rate, cpu / a.server_cores)
        elif switch == "tofino":
            # every contribution crosses the recirculation port once, a reply once more
            crossings = k * wire(give(sub), sent(sub)) + wire(give(sub * k), sent(sub))
            terms[name] = max(ports, crossings * 8 / a.tofino_recirc_bps)
        else:
            terms[name] = ports
        sub *= k
    neck = max(terms, key=terms.get)
    seconds = a.call_s + rtt + terms[neck]
    return Cost(seconds, neck, {**terms, "levels": len(levels), "fan_in": fan})


def caveats(switch: str, collective: str, levels: int) -> list[str]:
    """What a prediction prices that is not built (NOT_BUILT's entries that apply)."""
    out = []
    if switch == "tofino-line":
        out.append(NOT_BUILT["tofino-line"])
    if switch != "software" and levels > 1:
        out.append(NOT_BUILT["tofino levels"])
    if switch == "software" and levels > 2:
        out.append(NOT_BUILT["software levels"])
    return out


def ring(a: Assumptions, workers: int, nbytes: int, rate: float,
         collective: str = "all_reduce") -> Cost:
    """The bandwidth-optimal ring on links of `rate` (TCP headers, a fixed cost per step)."""
    n = workers
    steps = 2 * (n - 1) if collective == "all_reduce" else n - 1
    payload = steps * nbytes / n
    mss = a.mtu - 52
    wire = payload + math.ceil(payload / mss) * (TCP_HEADERS + a.frame_gap)
    link = wire * 8 / rate
    return Cost(steps * a.ring_step_s + link, "link", {"link": link,
                                                        "steps": steps * a.ring_step_s})


def step(compute_s: float, comm_s: float, overlap: bool) -> float:
    """A training step: compute, then the communication; or overlapped with the backward
    pass (the communication beyond the compute time shows)."""
    return max(compute_s, comm_s) if overlap else compute_s + comm_s


WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
DENSITIES = (1.0, 0.1, 0.01)


def scale_table(a: Assumptions, nbytes: int, rate: float, collective: str = "all_reduce",
                workers=WORKERS, densities=DENSITIES, lane_bits: int = 32,
                switches=("tofino", "software"), compute_s: float | None = None,
                overlap: bool = False) -> list[dict]:
    """One row per (workers, density, switch): SpINA's predicted call against the ring's
    (and the training step's, given the compute time)."""
    rows = []
    for n in workers:
        r = ring(a, n, nbytes, rate, collective)
        for d in densities:
            for sw in switches:
                c = predict(a, n, nbytes, rate, d, lane_bits, sw, collective)
                row = dict(workers=n, density=d, switch=sw, lane_bits=lane_bits,
                           spina_s=c.seconds, ring_s=r.seconds, ratio=c.seconds / r.seconds,
                           bottleneck=c.bottleneck, levels=c.terms["levels"])
                if compute_s is not None:
                    row["spina_step_s"] = step(compute_s, c.seconds, overlap)
                    row["ring_step_s"] = step(compute_s, r.seconds, overlap)
                rows.append(row)
    return rows
