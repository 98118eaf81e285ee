"""The command line: the options (each checked, a bad one a one-line error) and `main`, the
step-time experiment or `--train`'s time to accuracy, writing the outputs."""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from bench import dlcp_bench
from bench.dlcp_bench.configs import (
    COLUMNS,
    CONFIGS,
    DEFAULT_CONFIGS,
    STEP_COLUMNS,
    TRAIN_COLUMNS,
    TRAIN_SUMMARY,
)
from bench.dlcp_bench.fabric import MTU, NLANES
from bench.dlcp_bench.model import layer_sizes
from bench.dlcp_bench.report import (
    paired_lines,
    plot,
    summary,
    table,
    target_lines,
    train_outputs,
    train_plot,
    write_csv,
)
from bench.dlcp_bench.run import run
from bench.net_topo import parse_rate, tbf_params
from bench.paired import BenchError


def _widths(text: str) -> list[int]:
    try:
        w = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated layer widths, "
                                         "e.g. 64,64,10") from None
    if len(w) < 2 or min(w) < 1 or sum(layer_sizes(w)) > 50_000_000:
        raise argparse.ArgumentTypeError(f"{text!r}: need at least two widths >= 1 and at most "
                                         "50M parameters")
    return w


def _rate(text: str) -> str:
    try:
        parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _port_rate(text: str):
    from softswitch.egress import parse_port_rate
    try:
        return parse_port_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(kind, lo, hi):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} outside {lo}..{hi}")
        return v
    parse.__name__ = kind.__name__
    return parse


def _configs(text: str) -> list[str]:
    names = [c.name for c in CONFIGS]
    got = text.split(",")
    bad = [g for g in got if g not in names]
    if bad:
        raise argparse.ArgumentTypeError(f"{','.join(bad)}: not a configuration (choose from "
                                         f"{', '.join(names)})")
    return got


def parse_args(argv=None):
    from spina import cli
    ap = cli.ArgumentParser(prog="python -m bench.dlcp_bench",
                            description=dlcp_bench.__doc__.split("\n\n")[0],
                            epilog="Needs root (network namespaces, veth, tc, raw sockets). "
                                   "bench/dlcp_bench/__init__.py: the fabric and what is measured.")
    ap.add_argument("--workers", type=_positive(int, 2, 16), default=4,
                    help="workers (2..16, default %(default)s)")
    ap.add_argument("--model", type=_widths, default=[784, 512, 256, 10],
                    help="MLP layer widths whose gradient one step all-reduces, one call per "
                         "layer (default 784,512,256,10: 536K float32, 2.1 MB, 3 calls; "
                         "64,64,10 is the digits MLP)")
    ap.add_argument("--steps", type=_positive(int, 1, 10000), default=50,
                    help="repeats; each runs every configuration once, order rotating "
                         "(default %(default)s, after one warm-up repeat)")
    ap.add_argument("--configs", type=_configs, default=list(DEFAULT_CONFIGS),
                    help="comma list of configurations (default all: "
                         f"{','.join(DEFAULT_CONFIGS)})".replace("%", "%%"))
    ap.add_argument("--rate", type=_rate, default="1gbit",
                    help="tbf rate of every worker link, both ways (default %(default)s)")
    ap.add_argument("--uplink", choices=("shaper", "bmv2"), default="shaper",
                    help="the leaf uplink's model: shaper = a port shaper (one link rate "
                         "--port-rate, strict priority between the queues, a congestion-dropped "
                         "frame takes no link time: a real port's model); bmv2 = BMv2's traffic "
                         "manager (each priority queue drained at --queue-rate on its own, the "
                         "drop decided after the frame's departure slot; the model of the first "
                         "run in docs/dlcp.md). Default %(default)s")
    ap.add_argument("--port-rate", type=_port_rate, default="400mbit",
                    help="--uplink shaper: the uplink's rate, bits/s (400mbit), frames/s "
                         "(8000pps) or both (default %(default)s)")
    ap.add_argument("--queue-rate", type=_positive(float, 100, 1e6), default=8000,
                    help="--uplink bmv2: frames a second each priority queue of the leaf's "
                         "uplink drains (default %(default)s)")
    ap.add_argument("--background", type=_positive(float, 0, 1e6), default=4000,
                    help="background frames a second through the uplink, open loop "
                         "(priority 0; default %(default)s)")
    ap.add_argument("--bg-size", type=_positive(int, 64, 8900), default=6000,
                    help="background UDP payload bytes (default %(default)s: with the default "
                         "rates 4000 x 6042 B = 194 Mbit/s on the wire, half the uplink; the first "
                         "run, --uplink bmv2, used 1000)")
    ap.add_argument("--qdepth", type=_positive(int, 0, 1000), default=16,
                    help="the congestion entry's threshold: frames queued at the uplink above "
                         "which a loss-tolerant contribution may be dropped (default "
                         "%(default)s)")
    ap.add_argument("--loss-deadline", type=cli.seconds_or_auto, default=0.03,
                    metavar="SECONDS|auto",
                    help="seconds a round may wait before the agents flush it PARTIAL "
                         "(bounded modes without /auto in their name; default %(default)s), or "
                         "'auto': twice the measured round latency, 2-50 ms")
    ap.add_argument("--nslots", type=_positive(int, 1, 64), default=16,
                    help="SpINA slots per job (the window; default %(default)s)")
    ap.add_argument("--train", type=_positive(int, 0, 100000), default=0, metavar="STEPS",
                    help="instead of the step-time experiment: train --train-model on "
                         "scikit-learn's digits for STEPS steps per configuration through the "
                         "same congested fabric (configurations one after another), and report "
                         "the time to --target-accuracy (default 0: off)")
    ap.add_argument("--train-model", type=_widths, default=[64, 1024, 512, 10],
                    help="--train: MLP widths, 64 inputs and 10 outputs (default "
                         "64,1024,512,10: 596K float32, about the step-time gradient's size)")
    ap.add_argument("--eval-every", type=_positive(int, 1, 100000), default=10,
                    help="--train: steps between test-accuracy evaluations (default "
                         "%(default)s; the clock stops while rank 0 evaluates)")
    ap.add_argument("--lr", type=_positive(float, 1e-6, 10), default=0.1,
                    help="--train: SGD learning rate, batch 32 per worker (default %(default)s)")
    ap.add_argument("--target-accuracy", type=_positive(float, 1, 100), default=97.0,
                    help="--train: test accuracy (%%) whose first reaching is the time to "
                         "accuracy (default %(default)s)")
    ap.add_argument("--tag", default=f"dlb{os.getpid() % 100000}",
                    help="prefix of the namespaces this run makes")
    ap.add_argument("--out", default="bench/out/dlcp", help="output directory")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every step")
    return ap.parse_args(argv)


def uplink_text(a) -> str:
    if a.uplink == "shaper":
        return (f"a port shaper of {a.port_rate} (one rate for the port, strict priority "
                "between its queues, link time taken after egress; 64-frame tail drop per "
                "priority queue)")
    return (f"BMv2's model: each priority queue drained at {a.queue_rate:g} frames/s on its own "
            "(64-frame tail drop)")


def main_train(a, argv) -> int:
    """--train: time to accuracy per configuration."""
    w = a.train_model
    if w[0] != 64 or w[-1] != 10:
        print("python -m bench.dlcp_bench: error: argument --train-model: digits need 64 "
              f"inputs and 10 outputs, got {','.join(map(str, w))}", file=sys.stderr)
        return 2
    load0, t0 = os.getloadavg(), time.time()
    print(f"training {','.join(map(str, w))} on digits, {a.train} steps per configuration, "
          f"{a.workers} workers; uplink {uplink_text(a)}, background {a.background:g} "
          f"frames/s of {a.bg_size} B", flush=True)
    try:
        train, _, info = run(a)
        curves, rows = train_outputs(train, a)
    except BenchError as e:
        print(f"python -m bench.dlcp_bench: error: {e}", file=sys.stderr)
        return 1
    write_csv(curves, TRAIN_COLUMNS, os.path.join(a.out, "dlcp_train_curves.csv"))
    write_csv(rows, TRAIN_SUMMARY, os.path.join(a.out, "dlcp_train.csv"))
    if not a.no_plots:
        train_plot(curves, rows, os.path.join(a.out, "dlcp_train.png"))
    args = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m bench.dlcp_bench {args}; "
          f"took {time.time() - t0:.0f} s; load {load0[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; background sent {info['bg_sent']}")
    for r in rows:
        print(f"  {r['config']:>15}: final {r['final_accuracy']:.2f}% after {r['seconds']:.1f} s; "
              f"{a.target_accuracy:g}% at "
              + (f"{r['seconds_to_target']:.1f} s (step {r['steps_to_target']})"
                 if r["seconds_to_target"] != "" else "never")
              + f"; blocks lost {r['blocks_lost']}, partial rounds {r['partial_rounds']}, "
                f"congestion drops {r['congestion_drops']}, load {r['load_min']:.1f}-"
                f"{r['load_max']:.1f}")
    print(f"wrote {a.out}/dlcp_train.csv, dlcp_train_curves.csv"
          + ("" if a.no_plots else ", dlcp_train.png"))
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("python -m bench.dlcp_bench: error: needs root (network namespaces, veth, tc, "
              "raw sockets)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    if a.train:
        return main_train(a, argv)
    load0 = os.getloadavg()
    t0 = time.time()
    sizes = layer_sizes(a.model)
    print(f"{a.workers} workers, model {','.join(map(str, a.model))} ({sum(sizes)} float32, "
          f"{len(sizes)} calls per step), {a.steps} repeats of {len(a.configs)} "
          f"configurations; uplink {uplink_text(a)}, background "
          f"{a.background:g} frames/s", flush=True)
    try:
        step_rows, rows, info = run(a)
    except BenchError as e:
        print(f"python -m bench.dlcp_bench: error: {e}", file=sys.stderr)
        return 1
    write_csv(step_rows, STEP_COLUMNS + ("blocks_lost_max_call", "wrong_blocks_max_call",
                                         "allowed", "within_bound", "crcs"),
              os.path.join(a.out, "dlcp_steps.csv"))
    write_csv(rows, COLUMNS, os.path.join(a.out, "dlcp_congestion.csv"))
    tbf = tbf_params(a.rate, MTU)
    meta = {
        "command": "python -m bench.dlcp_bench " + " ".join(argv if argv is not None
                                                           else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                + f"; took {time.time() - t0:.0f} s; host {platform.node()}: {os.cpu_count()} "
                  f"cores, Python {platform.python_version()}",
        "load average": f"{' '.join(f'{x:.2f}' for x in load0)} at the start, "
                        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end (per "
                        "configuration in the table)",
        "fabric": f"{a.workers} worker namespaces + a background sender on an L2-mode software "
                  f"switch (leaf) whose uplink to the core (router + UDP-mode aggregator) is "
                  f"{uplink_text(a)}; "
                  f"worker links tbf {a.rate} both ways (burst {tbf['burst']} B, "
                  f"{tbf['latency_ms']} ms), MTU {MTU}",
        "background": f"{a.background:g} UDP frames/s of {a.bg_size} B, open loop, priority 0 "
                      f"({info['bg_sent']} sent)",
        "gradient": f"MLP {','.join(map(str, a.model))}: {sum(sizes)} float32 "
                    f"({4 * sum(sizes) / 1e6:.1f} MB) per worker, {len(sizes)} calls per step "
                    "(last layer first, each with its layer position)",
        "SpINA": f"block 256, {NLANES} blocks per datagram, {a.nslots} slots, loss deadline "
                 f"{a.loss_deadline} s (configurations /auto: from the round latency); "
                 f"congestion threshold {a.qdepth} frames",
        "timing": f"{a.steps} repeats after a warm-up, each running every configuration once, "
                  "order rotating; a step's time is the slowest worker's",
    }
    with open(os.path.join(a.out, "dlcp_summary.md"), "w") as f:
        f.write(summary(rows, meta, step_rows))
    if not a.no_plots:
        plot(step_rows, rows, os.path.join(a.out, "dlcp_congestion.png"))
    for line in table(rows) + [""] + target_lines(rows) + [""] + paired_lines(step_rows):
        print(line)
    print(f"wrote {a.out}/dlcp_steps.csv, dlcp_congestion.csv, dlcp_summary.md"
          + ("" if a.no_plots else ", dlcp_congestion.png"))
    return 0
