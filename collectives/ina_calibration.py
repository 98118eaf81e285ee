"""The SpINA model's calibration on this machine, and its error at every measured point.

    from collectives import ina_calibration as cal
    points = cal.load()                  # every committed SpINA point (bench/results/)
    a = cal.fit(points)                  # collectives.ina_model.Assumptions, fitted
    rows = cal.errors(a, points)         # each point's prediction and error

The runs it reads are today's code's (`bench/results/ina_calibration/`, and the
reduce-scatter's own runs): the harness's all_reduce, all_gather and reduce_scatter WHATs on
loopback and on the namespace stars. The agents' and the switch's CPU columns give the CPU
per call, per value, per datagram and per IPv4 fragment (least squares of the relative
error), the all-gather runs the switch's CPU per copy out. Fitted to the all-reduces'
times: the share of the 2 cores the runs got and a round's wait (`machine_share`,
`machine_round_s`: the agents and the switch wait on one another every round, and other
sessions' work shares the cores), then an all-reduce's fixed time (the small loopback
calls less what the rest prices for them); an all-gather's fixed time likewise. Every
point's time, the reduce-scatters' and all-gathers' too, is then predicted with
`ina_model.machine` and compared with its measured median. Runs of older code are listed
in EXCLUDED, with why.
"""
from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collectives import ina_model as m, plan
from spina import topology
from spina.topology import parse_rate

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
TOPOLOGIES = RESULTS.parents[0] / "topologies"
# the runs the calibration reads, each with its network: a topology file, or None (loopback);
# every one of today's code (a call's setup rounds only in the slots it uses, 8f974a4)
ALL_REDUCE_RUNS = {"ina_calibration/loopback_small": None,
                   "ina_calibration/loopback_large": None,
                   "ina_calibration/star4_200mbit": "star4.yaml",
                   "ina_calibration/star4_lanes": "star4.yaml",
                   "ina_calibration/star8": "star8.yaml"}
REDUCE_SCATTER_RUNS = {"ina_calibration/reduce_scatter_star4": "star4.yaml",
                       "ina_calibration/reduce_scatter_star8": "star8.yaml",
                       "reduce_scatter/star4_compiled": "star4.yaml",  # its own runs
                       "reduce_scatter/star8_1gbit": "star8.yaml"}
GATHER_RUNS = {"ina_calibration/all_gather_star4": "star4.yaml"}
CALL_RUN, CALL_BYTES = "ina_calibration/loopback_small", 4096  # its small calls: the fixed time
HIER_RUN = "hier_gather"  # SpINA's all-gathers on a topology: the topology planner's points
HIER_TOPOLOGY = str(TOPOLOGIES / "two_groups_switch.yaml")
LOOPBACK_MTU = 65536
SWITCH_CPU_FLOOR_S = 0.05  # a point's switch CPU (all its calls) is read in 10 ms ticks
OLD_CODE = "measured before a call ran setup rounds only in the slots it uses (8f974a4); " \
    "re-measured in ina_calibration/"
EXCLUDED = {  # run -> why its SpINA points are not in the table
    "all_reduce_net/" + r: "the Python switch (replaced by the compiled one since d656634)"
    for r in ("python_switch_quiet", "python_switch_loaded", "fast_scan", "batched_agent",
              "compiled_scan", "floor")}
EXCLUDED.update({
    "all_reduce_loopback/" + r: "the Python switch (replaced by the compiled one since d656634)"
    for r in ("quick_python_switch", "quick_floor_load4", "quick_floor_load10", "sweep")})
EXCLUDED["all_reduce_loopback/sweep"] += "; its packet counts check ina_model.rounds"
EXCLUDED.update({r: OLD_CODE for r in (
    "all_reduce_net/compiled_switch", "all_reduce_net/lanes_merged_quiet",
    "all_reduce_net/lane_widths", "all_reduce_loopback/quick_compiled_switch",
    "all_reduce_loopback/quick_compiled_switch_rerun", "collectives_planner/four_topologies",
    "all_gather_net")})
EXCLUDED["reduce_scatter/star4_1gbit, star4_1gbit_lanes, loopback4"] = \
    "the switch's Python pipeline took the reduce-scatter rounds (their README)"
EXCLUDED["all_reduce_loopback/slots_in_use_16k, timeline_1pct; all_reduce_net/timeline_1pct"] = \
    "profiles of one size (docs/profile.md)"
EXCLUDED["collectives_planner/torus4x4, leafspine"] = "no SpINA point (not a star)"
EXCLUDED["training_net, overlap, dlcp_*, compression, bits, ps, train_digits, scale_out, " \
         "fsdp, training_families"] = "training steps, accuracy or bytes: no single call's time"
TARGET = 0.20  # issue 47: within 20% of every measured SpINA point
FITTED = ("agent_s_per_call", "agent_s_per_element", "agent_s_per_narrow_value",
          "agent_s_per_datagram", "agent_s_per_fragment", "switch_s_per_datagram",
          "switch_s_per_fragment", "gather_s_per_copy", "machine_share", "machine_round_s",
          "call_s", "gather_call_s")  # the Assumptions fit() sets


@dataclass(frozen=True)
class Point:
    run: str
    collective: str
    workers: int
    nbytes: int          # the whole tensor (all_gather: the gathered result)
    rate: float          # bits per second; inf on loopback
    mtu: int
    density: float
    lane_bits: int
    block: int
    measured_s: float    # median of the repeats
    agent_cpu_s: float | None   # per rank and call
    switch_cpu_s: float | None  # per call
    topology: str = ""   # a topology file: priced by the topology planner (collectives.plan)
    algorithm: str = ""  # ... as this algorithm
    nlanes: int = 56     # blocks per datagram
    nslots: int = 16     # the window
    burst: float = 0.0   # tbf's bucket on the links (bytes)
    fastest_s: float = math.nan  # the repeats' range
    slowest_s: float = math.nan
    resends: int = 0     # datagrams the agents sent again (every call of the point)

    @property
    def cells(self) -> list[str]:
        """The table's columns that name the point."""
        rate = "loopback" if math.isinf(self.rate) else f"{self.rate / 1e9:g} Gbit/s"
        if self.topology:
            rate = Path(self.topology).stem
        what = f"{self.collective} ({self.algorithm})" if self.algorithm else self.collective
        return [what, str(self.workers), _size(self.nbytes), rate, str(self.mtu),
                f"{self.density:g}", f"{self.lane_bits} x {self.block}", str(self.nslots)]


def _size(n: int) -> str:
    for unit, b in (("MB", 10 ** 6), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= b and n % b == 0:
            return f"{n // b} {unit}"
    return f"{n} B"


def _rows(path: Path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _network(topo: str | None, rate: str) -> dict:
    """A run's links: rate (bits per second), MTU and tbf's bucket (bytes) on loopback or
    on its topology file's links at `rate` (spina/netgraph.Graph.set_rate's bucket)."""
    if topo is None:
        return dict(rate=math.inf, mtu=LOOPBACK_MTU)
    from spina.netgraph import tbf_params
    t = topology.load(str(TOPOLOGIES / topo))
    return dict(rate=parse_rate(rate), mtu=t.mtu,
                burst=max(max(ln.burst for ln in t.links), tbf_params(rate, t.mtu)["burst"]))


def _opt(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def _timed(r: dict) -> dict:
    """A harness row's median, fastest and slowest repeat (s) and resends."""
    return dict(measured_s=float(r["time_us"]) * 1e-6, fastest_s=float(r["time_min_us"]) * 1e-6,
                slowest_s=float(r["time_max_us"]) * 1e-6, resends=int(r["resends"] or 0))


def load(root: Path = RESULTS) -> list[Point]:
    """Every SpINA point of the runs above, in file order."""
    out = []
    for run, topo in ALL_REDUCE_RUNS.items():
        for r in _rows(root / run / "results.csv"):
            if r["method"] != "spina":
                continue
            # the runs time SpINA alone: the switch's CPU is of its repeats and a warm-up
            sw = _opt(r["switch_cpu_s"])
            out.append(Point(run, "all_reduce", int(r["workers"]), int(r["size"]),
                             density=float(r["density"]), lane_bits=int(r["lane_bits"]),
                             block=int(r["block_size"]), agent_cpu_s=float(r["cpu_s_per_rank"]),
                             switch_cpu_s=sw / (int(r["repeats"]) + 1)
                             if sw and sw >= SWITCH_CPU_FLOOR_S else None,
                             nlanes=int(r["nlanes"]), nslots=int(r["nslots"]),
                             **_timed(r), **_network(topo, r["rate"])))
    for run, topo in REDUCE_SCATTER_RUNS.items():
        for r in _rows(root / run / "results.csv"):
            if r["method"] == "spina":
                out.append(Point(run, "reduce_scatter", int(r["workers"]), int(r["size"]),
                                 density=float(r["density"]), lane_bits=int(r["lane_bits"]),
                                 block=256, agent_cpu_s=None, switch_cpu_s=None,
                                 **_timed(r), **_network(topo, r["rate"])))
    for run, topo in GATHER_RUNS.items():
        for r in _rows(root / run / "results.csv"):
            if r["method"] == "spina":
                out.append(Point(run, "all_gather", int(r["workers"]), int(r["size"]),
                                 density=1.0, lane_bits=32, block=256, agent_cpu_s=None,
                                 switch_cpu_s=_opt(r["switch_cpu_s_per_call"]), nslots=8,
                                 **_timed(r), **_network(topo, r["rate"])))
    for r in _rows(root / HIER_RUN / "hier_gather.csv"):
        if r["method"] in (plan.SWITCH, plan.LEADER_SWITCH):
            out.append(Point(HIER_RUN, "all_gather", 4, int(r["bytes"]), 0.0, 9000, 1.0, 32, 256,
                             float(r["median_s"]), None, None, HIER_TOPOLOGY, r["method"],
                             fastest_s=float(r["min_s"]), slowest_s=float(r["max_s"])))
    return out


def _job(a: m.Assumptions, p: Point) -> m.Assumptions:
    """The assumptions with the point's job: its block size, lanes and window."""
    return a.with_(block=p.block, lanes=p.nlanes, slots=p.nslots)


def _counts(a: m.Assumptions, p: Point):
    """(values, values in narrow lanes, datagrams, fragments) one rank handles, and
    (datagrams, fragments) the switch takes in, as ina_model.machine counts them."""
    nu, nd, fu, fd, _, _ = m.machine_streams(_job(a, p), p.collective, p.workers, p.nbytes,
                                             p.density, p.lane_bits, p.mtu)
    values = p.nbytes // 4
    return (1, values, values * (p.lane_bits < 32), nu + nd, fu + fd), \
        (p.workers * nu, p.workers * fu)


def _least_squares(x: list, y: list) -> np.ndarray:
    """Coefficients c >= 0 minimising the relative errors of x @ c against y (a negative
    coefficient's column is dropped and the rest refitted)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = list(range(x.shape[1]))
    while True:
        c, *_ = np.linalg.lstsq(x[:, keep] / y[:, None], np.ones(len(y)), rcond=None)
        if (c >= 0).all():
            out = np.zeros(x.shape[1])
            out[keep] = c
            return out
        keep.pop(int(np.argmin(c)))


def fit(points: list[Point], base: m.Assumptions | None = None) -> m.Assumptions:
    """The machine constants from the points' CPU columns and times (module docstring)."""
    base = base or m.Assumptions()
    points = [p for p in points if not p.topology]  # the topology planner's: not fitted
    ar = [p for p in points if p.collective == "all_reduce" and p.agent_cpu_s is not None]
    agent = _least_squares([_counts(base, p)[0] for p in ar], [p.agent_cpu_s for p in ar])
    sw = [p for p in ar if p.switch_cpu_s is not None]
    switch = _least_squares([_counts(base, p)[1] for p in sw], [p.switch_cpu_s for p in sw])
    a = base.with_(agent_s_per_call=float(agent[0]), agent_s_per_element=float(agent[1]),
                   agent_s_per_narrow_value=float(agent[2]),
                   agent_s_per_datagram=float(agent[3]), agent_s_per_fragment=float(agent[4]),
                   switch_s_per_datagram=float(switch[0]),
                   switch_s_per_fragment=float(switch[1]))
    # all-gather: the switch's CPU beyond the datagrams in is its copies out
    copies = []
    for p in points:
        if p.collective == "all_gather" and p.switch_cpu_s:
            dg_in, fr_in = _counts(a, p)[1]
            inbound = dg_in * a.switch_s_per_datagram + fr_in * a.switch_s_per_fragment
            copies.append(max(0.0, p.switch_cpu_s - inbound) / (dg_in * (p.workers - 1)))
    a = a.with_(gather_s_per_copy=statistics.median(copies), gather_call_s=0.0)
    # the cores' share these runs got and a round's wait: the pair that leaves the fewest
    # all-reduce points outside the target (then the least median error), each with its
    # fixed time
    pairs = [a.with_(machine_share=i / 20, machine_round_s=j * 2.5e-4)
             for i in range(4, 21) for j in range(24)]
    pairs = [s.with_(call_s=call_time(s, points)) for s in pairs]
    a = min(pairs, key=lambda s: _miss(s, ar))
    # the all-gather's fixed time, the same way
    gathers = [p for p in points if p.collective == "all_gather"]
    return min((a.with_(gather_call_s=i * 1e-4) for i in range(201)),
               key=lambda s: _miss(s, gathers))


def _miss(a: m.Assumptions, points: list[Point]) -> tuple[int, float]:
    """(points outside the target, median |error|) of `points` priced with `a`."""
    errs = [abs(predict(a, p).seconds / p.measured_s - 1) for p in points]
    return sum(e > TARGET for e in errs), statistics.median(errs)


def call_time(a: m.Assumptions, points: list[Point]) -> float:
    """SpINA's fixed time per all-reduce call: over CALL_RUN's calls of at most CALL_BYTES
    (4 ranks on loopback, one slot), the median of their times less what `a` (with no fixed
    time) prices for their datagrams and values."""
    small = [p for p in points if p.run == CALL_RUN and p.nbytes <= CALL_BYTES]
    return max(0.0, statistics.median(
        p.measured_s - predict(a.with_(call_s=0.0), p).seconds for p in small))


def predict(a: m.Assumptions, p: Point) -> m.Cost:
    """`p` as ina_model.machine prices it (its job's block, lanes and window), or on its
    topology file as the topology planner does (its default constants, which take SpINA's
    from Assumptions)."""
    if p.topology:
        got = plan.predict(topology.load(p.topology), p.collective, p.nbytes, p.algorithm)
        return m.Cost(got.seconds, got.bottleneck, {})
    return m.machine(_job(a, p), p.collective, p.workers, p.nbytes, p.rate, p.density,
                     p.lane_bits, p.mtu, p.burst)


def _key(p: Point):
    return (p.collective, p.algorithm, p.topology, p.workers, p.nbytes, p.rate, p.mtu,
            p.density, p.lane_bits, p.block, p.nlanes, p.nslots)


def errors(a: m.Assumptions, points: list[Point]) -> list[dict]:
    """Each point's prediction, error (predicted / measured - 1), bottleneck, and the spread
    of its configuration's medians over the runs that measured it (largest / smallest)."""
    seen: dict = {}
    for p in points:
        seen.setdefault(_key(p), []).append(p.measured_s)
    out = []
    for p in points:
        c = predict(a, p)
        same = seen[_key(p)]
        out.append(dict(point=p, predicted_s=c.seconds, error=c.seconds / p.measured_s - 1,
                        bottleneck=c.bottleneck, spread=max(same) / min(same),
                        runs=len(same)))
    return out


def table(rows: list[dict]) -> str:
    """The error table as markdown, then the counts: within the target, and of the rest
    those whose prediction lies within their repeats' range."""
    lines = ["| run | collective | workers | size | link | MTU | density | lane bits x block | "
             "slots | measured ms [repeats] | resends | predicted ms | error | bottleneck |",
             "|---" * 14 + "|"]
    for r in rows:
        p = r["point"]
        mark = "" if abs(r["error"]) <= TARGET else " (outside 20%)"
        lines.append(f"| {p.run} | {' | '.join(p.cells)} | {p.measured_s * 1e3:.1f} "
                     f"[{p.fastest_s * 1e3:.1f}-{p.slowest_s * 1e3:.1f}] | {p.resends} | "
                     f"{r['predicted_s'] * 1e3:.1f} | {r['error']:+.0%}{mark} | "
                     f"{r['bottleneck']} |")
    inside = [abs(r["error"]) <= TARGET for r in rows]
    ranged = sum(not ok and r["point"].fastest_s <= r["predicted_s"] <= r["point"].slowest_s
                 for ok, r in zip(inside, rows))
    noisy = [r for r in rows if r["runs"] > 1]
    errs = sorted(abs(r["error"]) for r in rows)
    lines.append("")
    lines.append(f"{sum(inside)} of {len(rows)} points within {TARGET:.0%} of their median; "
                 f"median |error| {statistics.median(errs):.0%}, largest {errs[-1]:.0%}. Of "
                 f"the {len(rows) - sum(inside)} others, {ranged} predict a time within "
                 "their repeats' range." + (
                     f" {len(noisy)} points were measured in more than one run; their "
                     f"medians differ by up to {max(r['spread'] for r in noisy):.2f}x."
                     if noisy else ""))
    lines += ["", "Not in the table (bench/results/):"]
    lines += [f"- {run}: {why}" for run, why in EXCLUDED.items()]
    return "\n".join(lines)
