"""loss: SpINA's all-reduce under random loss, against its own lossless time.

    python -m bench loss -b 16M -e 16M -d 0.01,1 --losses 0,0.01,0.05,0.1 -n 9   # root

The all_reduce measurement (bench/all_reduce.py) on a star topology file in namespaces
(default bench/topologies/loss_star4.yaml: 10 Gbit/s links of 65000-byte MTU, so a datagram
is one drop decision), each point at every loss of --losses: iptables drops UDP datagrams at
random with that probability on OUTPUT and INPUT in every host's namespace (both ways; this
kernel has no netem). SpINA's methods only (gloo's TCP would resend what iptables drops in
the kernel). Besides all_reduce's columns: `loss`, `dropped` (the datagrams the rules
discarded over the point), resends per rank and call, `vs_lossless` (the median time over
the same point's median at loss 0 of this run: two points, not paired).
"""
from __future__ import annotations

from bench import all_reduce

DESCRIPTION = "SpINA's all-reduce under random loss each way vs its lossless time (root)"
METHODS = ("spina", "spina_blocks")
DEFAULTS = dict(methods="spina", begin="16M", end="16M", densities="0.01,1",
                topology="bench/topologies/loss_star4.yaml", repeats=9)
EXTRA_COLUMNS = all_reduce.EXTRA_COLUMNS + ("vs_lossless",)
POINT_COLUMNS = ("loss",)  # a table and a plot panel per loss


def add_options(ap) -> None:
    from spina import cli
    all_reduce.add_options(ap)
    ap.add_argument("--losses", type=cli.comma_list(cli.non_negative_float, "losses"),
                    default="0,0.01,0.05,0.1",
                    help="comma list of random loss probabilities each way (default "
                    "%(default)s; 0 first gives vs_lossless its reference)")


def check_options(a) -> str | None:
    if a.topo is None:
        return "argument -t/--topology: loss runs in namespaces (give a star file)"
    if any(x >= 1 for x in a.losses):
        return "argument --losses: each below 1"
    return all_reduce.check_options(a)


def run(a, log):
    lossless: dict[tuple, float] = {}
    for rows in all_reduce.run(a, log):
        for r in rows:
            key = (r["method"], r["workers"], r["lane_bits"], r["rate"], r["density"],
                   r["size"])
            if r["loss"] == 0:
                lossless[key] = r["time_us"]
            ref = lossless.get(key)
            r["vs_lossless"] = round(r["time_us"] / ref, 3) if ref else ""
        yield rows
