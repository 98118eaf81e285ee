"""`spina plan`: predict every collective algorithm's time on a topology and pick one;
or SpINA's against the ring at cluster scale (--scale), or the model's error on this
machine's measured points (--calibration).

    spina plan bench/topologies/two_groups.yaml --size 8MiB
    spina plan topo.yaml --collective all_gather --size 1GiB --dtype bfloat16 --json
    spina plan --scale --size 1GiB --rate 100gbit --compute 0.2 --overlap
    spina plan --calibration
"""
from __future__ import annotations

import argparse
import json
import sys

from collectives import ina_model, plan as planner
from collectives.schedule import ALGORITHMS, COLLECTIVES, LEADER
from spina import cli, topology

EPILOG = """\
The topology file (YAML or JSON) lists hosts (with their local devices), switches (which
aggregate: SpINA in the network), links with rate and latency, and optionally groups for the
hierarchical algorithms; spina/topology.py documents the format and
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

--scale needs no topology: SpINA through a tree of Tofinos or of software switches on
servers, against the bandwidth-optimal ring, for each number of workers and density, with
every assumption printed (collectives/ina_model.py; docs/collectives.md, "SpINA at cluster
scale"). --calibration prints the model's error at every SpINA point measured on this
machine (bench/results/).

Exit status 0; 2 on bad input (one line naming the option or field)."""


# every algorithm name the planner knows (which fit a topology and collective: planner.plan)
KNOWN = (*ALGORITHMS, LEADER, planner.INA, planner.SWITCH, planner.LEADER_SWITCH)


def parser(prog: str = "spina plan") -> argparse.ArgumentParser:
    d = planner.CostParams()
    ap = cli.ArgumentParser(prog=prog, description="Predict the time of every "
                            "collective algorithm on a topology and pick the fastest.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topology", nargs="?", type=cli.input_file,
                    help="topology file (YAML or JSON); not with "
                    "--scale or --calibration")
    ap.add_argument("--collective", choices=COLLECTIVES, default="all_reduce",
                    help="default: %(default)s")
    ap.add_argument("--size", type=cli.parsed_by(topology.parse_size, "size",
                                                 bad=("x", "0", "-5")),
                    help="the whole tensor: bytes, or with B, KiB, MiB, GiB, KB, MB, GB "
                         "(required with a topology; --scale: default 1GiB)")
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
                    help="ina: switch seconds per datagram in, flat (default: this machine's "
                         "calibration per datagram and IPv4 fragment, collectives/ina_model.py)")
    ap.add_argument("--agent-packet-cost", type=cli.non_negative_float, dest="ina_agent_packet_s",
                    help="ina: agent seconds per datagram, flat (default: the calibration)")
    ap.add_argument("--ina-call-cost", type=cli.non_negative_float, dest="ina_call_s",
                    help=f"ina: fixed seconds per call (default {d.ina_call_s:g})")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    a = ina_model.Assumptions()
    sc = ap.add_argument_group("cluster scale (--scale)")
    sc.add_argument("--scale", action="store_true",
                    help="SpINA against the ring from 8 to 1024 workers (no topology)")
    sc.add_argument("--calibration", action="store_true",
                    help="the model's error at every SpINA point measured here")
    sc.add_argument("--rate", type=cli.parsed_by(topology.parse_rate, "rate", bad=("x", "0mbit")),
                    default=100e9, help="every link's rate (default 100gbit)")
    sc.add_argument("--workers", type=cli.comma_list(cli.int_range(2, 1 << 20), "workers"),
                    default=list(ina_model.WORKERS), help="comma-separated (default "
                    f"{','.join(map(str, ina_model.WORKERS))})")
    sc.add_argument("--densities", type=cli.comma_list(cli.fraction, "densities"),
                    default=list(ina_model.DENSITIES), help="comma-separated block "
                    f"densities (default {','.join(map(str, ina_model.DENSITIES))})")
    sc.add_argument("--lane-bits", type=int, choices=ina_model.LANE_BITS, default=32,
                    dest="lane_bits", help="software switches' lane width (default 32; "
                    "the TNA program has 32 only)")
    sc.add_argument("--switches", type=cli.comma_list(_switch, "switches"),
                    default=["tofino", "software"],
                    help=f"comma-separated, of {', '.join(ina_model.SWITCHES)} "
                         "(default tofino,software)")
    sc.add_argument("--compute", type=cli.non_negative_float,
                    help="seconds of compute per training step: adds the step's time")
    sc.add_argument("--overlap", action="store_true",
                    help="the step overlaps communication with compute")
    sc.add_argument("--agent-cores", type=cli.int_range(1, 1024), dest="agent_cores",
                    help=f"each worker agent's cores (default {a.agent_cores})")
    sc.add_argument("--server-cores", type=cli.int_range(1, 1024), dest="server_cores",
                    help=f"a software switch server's cores (default {a.server_cores})")
    sc.add_argument("--fan-in", type=cli.int_range(2, 1024), dest="software_fan_in",
                    help=f"children per software switch (default {a.software_fan_in})")
    return ap


def parse_args(argv, prog: str = "spina plan"):
    """The options, with the checks between them (a topology or --scale or --calibration)."""
    ap = parser(prog)
    args = ap.parse_args(argv)
    if args.scale and args.calibration:
        ap.error("--scale and --calibration: choose one")
    if (args.scale or args.calibration) and args.topology:
        ap.error(f"topology: not with --scale or --calibration, got {args.topology!r}")
    if not (args.scale or args.calibration):
        if not args.topology:
            ap.error("topology: required (or --scale, --calibration)")
        if args.size is None:
            ap.error("the following arguments are required: --size")
    if args.overlap and args.compute is None:
        ap.error("--overlap: needs --compute")
    return args


@cli.refuses("no-such-switch")
def _switch(text: str) -> str:
    if text not in ina_model.SWITCHES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of "
                                         f"{', '.join(ina_model.SWITCHES)}")
    return text


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


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s < 100 else f"{s * 1e3:.0f}"


def scale_report(a: ina_model.Assumptions, rows: list[dict], args) -> str:
    """The scale table (markdown), its caveats and every assumption."""
    switches = list(dict.fromkeys(r["switch"] for r in rows))
    step = args.compute is not None
    lines = [f"{args.collective} of {args.size} bytes (float32) per call at "
             f"{args.rate / 1e9:g} Gbit/s; SpINA ms (x the ring's time, bottleneck)"
             + (f"; a training step of {args.compute:g} s compute, "
                f"{'overlapped' if args.overlap else 'not overlapped'}" if step else ""),
             "",
             "| workers | density | ring ms | " + " | ".join(switches)
             + (" | ring step ms | " + " | ".join(f"{s} step ms" for s in switches)
                if step else "") + " |",
             "|---" * (3 + len(switches) * (2 if step else 1) + (1 if step else 0)) + "|"]
    notes: dict[str, None] = {}
    for key in dict.fromkeys((r["workers"], r["density"]) for r in rows):
        cell = [r for r in rows if (r["workers"], r["density"]) == key]
        line = f"| {key[0]} | {key[1]:g} | {_ms(cell[0]['ring_s'])} | " + " | ".join(
            f"{_ms(r['spina_s'])} ({r['ratio']:.2f}x, {r['bottleneck']})" for r in cell)
        if step:
            line += f" | {_ms(cell[0]['ring_step_s'])} | " + " | ".join(
                f"{_ms(r['spina_step_s'])}" for r in cell)
        lines.append(line + " |")
        for r in cell:
            for c in ina_model.caveats(r["switch"], args.collective, r["levels"]):
                notes[f"{r['switch']}: {c}"] = None
    lines += ["", "Not built, priced anyway:"] + [f"- {n}" for n in notes] if notes else []
    lines += ["", "Assumptions (collectives/ina_model.py):"]
    default = ina_model.Assumptions()
    lines += [f"- {f.name} = {getattr(a, f.name):g}: " + (
        ina_model.source(f.name) if getattr(a, f.name) == getattr(default, f.name)
        else f"given (default {getattr(default, f.name):g}: {ina_model.source(f.name)})")
        for f in ina_model.fields(a)]
    return "\n".join(lines)


def run_scale(args) -> int:
    try:
        a = ina_model.Assumptions().with_(agent_cores=args.agent_cores,
                                          server_cores=args.server_cores,
                                          software_fan_in=args.software_fan_in)
        args.size = args.size or 1 << 30
        rows = ina_model.scale_table(a, args.size, args.rate, args.collective, args.workers,
                                     args.densities, args.lane_bits, args.switches,
                                     args.compute, args.overlap)
    except ValueError as e:
        return cli.fail("spina plan", e)
    if args.json:
        print(json.dumps(dict(collective=args.collective, bytes=args.size, rate=args.rate,
                              rows=rows, assumptions=vars(a)), indent=1))
    else:
        print(scale_report(a, rows, args))
    return 0


def run_calibration(args) -> int:
    from collectives import ina_calibration as cal
    try:
        rows = cal.errors(ina_model.Assumptions(), cal.load())
    except (OSError, ValueError, KeyError) as e:
        return cli.fail("spina plan", f"bench/results: {e}")
    if args.json:
        print(json.dumps([dict(run=r["point"].run, point=r["point"].cells,
                               load=r["point"].load, measured_s=r["point"].measured_s,
                               fastest_s=r["point"].fastest_s, slowest_s=r["point"].slowest_s,
                               resends=r["point"].resends, predicted_s=r["predicted_s"],
                               error=r["error"], bottleneck=r["bottleneck"],
                               verdict=cal.verdict(r)) for r in rows], indent=1))
    else:
        print(cal.table(rows))
    return 0


def main(argv=None, prog: str = "spina plan") -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv, prog)
    if a.scale:
        return run_scale(a)
    if a.calibration:
        return run_calibration(a)
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
