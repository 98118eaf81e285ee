"""`spina plan`: predict every collective algorithm's time on a topology and pick one.

    spina plan bench/topologies/two_groups.yaml --size 8MiB
    spina plan topo.yaml --collective all_gather --size 1GiB --dtype bfloat16 --json
"""
from __future__ import annotations

import argparse
import json
import sys

from collectives import plan as planner, topology
from collectives.schedule import ALGORITHMS, COLLECTIVES, LEADER
from spina import cli

EPILOG = """\
The topology file (YAML or JSON) lists hosts (with their local devices), switches (which
aggregate: SpINA in the network), links with rate and latency, and optionally groups for the
hierarchical algorithms; collectives/topology.py documents the format and
bench/topologies/ has examples.

Each algorithm's steps are priced on the topology's fixed routes: per step alpha + the
slowest transfer (its route's latency + the bytes its busiest link carries in that step /
the link's rate, TCP headers included), or the busiest rank's CPU per byte moved if that
takes longer. "ina" is SpINA through an aggregating switch: its link, switch-CPU and
agent-CPU terms pipeline, the largest counts (collectives/plan.py; docs/collectives.md has
the measurements that validate the model). For all_gather, "switch" is the multicast
all-gather through an aggregating switch (each shard up once, replicated down) and, with
groups, "leader-ring" and "leader-switch" the hierarchical ones: inside the groups, then one
leader per group across (a ring, or the switch), then out to the members.

Exit status 0; 2 on bad input (one line naming the option or field)."""


# every algorithm name the planner knows (which fit a topology and collective: planner.plan)
KNOWN = (*ALGORITHMS, LEADER, planner.INA, planner.SWITCH, planner.LEADER_SWITCH)


def parser(prog: str = "spina plan") -> argparse.ArgumentParser:
    d = planner.CostParams()
    ap = cli.ArgumentParser(prog=prog, description="Predict the time of every "
                            "collective algorithm on a topology and pick the fastest.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topology", type=cli.input_file, help="topology file (YAML or JSON)")
    ap.add_argument("--collective", choices=COLLECTIVES, default="all_reduce",
                    help="default: %(default)s")
    ap.add_argument("--size", required=True,
                    type=cli.parsed_by(topology.parse_size, "size", bad=("x", "0", "-5")),
                    help="the whole tensor: bytes, or with B, KiB, MiB, GiB, KB, MB, GB")
    ap.add_argument("--dtype", choices=sorted(planner.DTYPE_SIZES), default="float32",
                    help="element type (default: %(default)s; ina sends 4-byte int32 anyway)")
    ap.add_argument("--algorithms", type=cli.names(KNOWN),
                    help="comma-separated candidates (default: every one that fits)")
    ap.add_argument("--alpha", type=cli.non_negative_float,
                    help=f"seconds per step (default {d.alpha:g})")
    ap.add_argument("--cpu-per-byte", type=cli.non_negative_float, dest="cpu_per_byte",
                    help="seconds of a rank's CPU per byte it sends or receives (default "
                         f"{d.cpu_per_byte:g})")
    ap.add_argument("--density", type=cli.fraction,
                    help="fraction of each rank's blocks that are non-zero, for ina "
                         f"(default {d.density:g})")
    ap.add_argument("--switch-packet-cost", type=cli.non_negative_float, dest="ina_switch_packet_s",
                    help="ina: switch seconds per datagram in (default "
                         f"{d.ina_switch_packet_s:g}, docs/profile.md)")
    ap.add_argument("--agent-packet-cost", type=cli.non_negative_float, dest="ina_agent_packet_s",
                    help=f"ina: agent seconds per datagram (default {d.ina_agent_packet_s:g})")
    ap.add_argument("--ina-call-cost", type=cli.non_negative_float, dest="ina_call_s",
                    help=f"ina: fixed seconds per call (default {d.ina_call_s:g})")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    return ap


def report(topo, pl: planner.Plan) -> str:
    rows = sorted(pl.predictions.values(), key=lambda p: p.seconds)
    w = max(len(p.algorithm) for p in rows)
    lines = [f"{pl.collective} of {pl.nbytes} bytes on {topo.source} ({topo.world} ranks)",
             f"  {'algorithm':<{w}}  {'steps':>5}  {'predicted':>12}  bottleneck"]
    for p in rows:
        lines.append(f"  {p.algorithm:<{w}}  {len(p.steps):>5}  {p.seconds * 1e3:>9.3f} ms  "
                     f"{p.bottleneck}")
    lines.append(f"pick: {pl.best}")
    return "\n".join(lines)


def main(argv=None, prog: str = "spina plan") -> int:
    a = parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    itemsize = planner.DTYPE_SIZES[a.dtype]
    try:
        topo = topology.load(a.topology)
        params = planner.with_params(planner.CostParams(), alpha=a.alpha,
                                     cpu_per_byte=a.cpu_per_byte, density=a.density,
                                     ina_call_s=a.ina_call_s,
                                     ina_switch_packet_s=a.ina_switch_packet_s,
                                     ina_agent_packet_s=a.ina_agent_packet_s)
        pl = planner.plan(topo, a.collective, a.size, params, itemsize, a.algorithms)
    except (topology.TopologyError, ValueError) as e:
        return cli.fail(prog, e)
    if a.json:
        print(json.dumps(dict(collective=pl.collective, bytes=pl.nbytes, dtype=a.dtype,
                              pick=pl.best, ranks=topo.world,
                              predictions={k: dict(seconds=p.seconds, steps=len(p.steps),
                                                   bottleneck=p.bottleneck)
                                           for k, p in pl.predictions.items()}), indent=1))
    else:
        print(report(topo, pl))
    return 0


if __name__ == "__main__":
    sys.exit(main())
