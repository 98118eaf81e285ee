"""dlcp's own options of the harness (`python -m bench dlcp`; each checked, a bad one a
one-line error) and the uplink's description."""
from __future__ import annotations

import argparse

from bench.dlcp_bench.model import layer_sizes
from spina import cli


@cli.refuses("x", "10", "0,10")
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


@cli.refuses("x", "0mbit")
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
    return cli.refuses("x", str(lo - 1), str(hi * 2))(parse)


def add_options(ap) -> None:
    """dlcp's own options (the harness gives -g workers, -n repeats, -m configurations,
    --rates the worker links' rate, --tag, --out, --no-plots)."""
    from spina import cli
    ap.add_argument("--model", type=_widths, default=[784, 512, 256, 10],
                    help="MLP layer widths whose gradient one step all-reduces, one call per "
                         "layer (default 784,512,256,10: 536K float32, 2.1 MB, 3 calls; "
                         "64,64,10 is the digits MLP); the size is its gradient's bytes")
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
    ap.add_argument("-v", "--verbose", action="store_true", help="print every step")


def uplink_text(a) -> str:
    if a.uplink == "shaper":
        return (f"a port shaper of {a.port_rate} (one rate for the port, strict priority "
                "between its queues, link time taken after egress; 64-frame tail drop per "
                "priority queue)")
    return (f"BMv2's model: each priority queue drained at {a.queue_rate:g} frames/s on its own "
            "(64-frame tail drop)")
