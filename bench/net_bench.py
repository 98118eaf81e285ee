"""The network-bound regime: SpINA against gloo's ring over the same rate-limited links.

Run from the repository root as root (`make bench-net` does):

    python -m bench.net_bench                                   # 4 and 8 workers, 1 and 10 Gbit/s
    python -m bench.net_bench --workers 4 --rates 1gbit --densities 1,0.01 --repeats 3
    python -m bench.net_bench --workers 2 --rates 1gbit --densities 1,0.01 \\
        --elements 65536 --repeats 1 --out /tmp/n           # a smoke run (tests/test_net_bench.py)
    python -m bench.net_bench --lane-bits 32,16,8 --densities 1 --mtus 65535   # narrow lanes

Every worker is a network namespace with one link to a switch namespace (bench/net_topo.py),
each link limited by tbf in both directions. The switch namespace routes IPv4 between the
workers (gloo's TCP ring crosses it) and runs SpINA's software switch in UDP mode
(softswitch.udp.UdpSwitch, bench.procs.switch_main) on an address of its own.

Each worker process holds both a SpINA Agent and a gloo process group (bench/paired.py, the
same measurement as the loopback benchmark), and a socket of the floor (bench/floor.py: the
simplest compiled star all-reduce of the dense tensor, its one relay process in the switch
namespace, so over the same links). Per repeat it runs the three methods on the same tensor,
the order rotating, each between barriers: SpINA `Agent.allreduce(buf, inplace=True)`, gloo
`dist.all_reduce(t)` and the floor's allreduce on the same buffer (refilled from the worker's
tensor outside the timer), nothing else inside the timed region. A repeat's time is the
slowest worker's; the ratios SpINA/gloo, SpINA/floor and floor/gloo are taken per repeat
(paired) and reported as median [min-max]. Every result is checked (SpINA and the floor:
rank 0 within the quantization bound, all ranks bit-identical; gloo: rank 0 within float32
rounding), the bytes each worker's eth0 sent and received are read around every call,
resends counted.
`--lane-bits 32,16,8` measures each lane width (docs/bits.md) with a cluster of its own on
the same star: SpINA's job has that width, gloo and the floor (int32) are measured again
beside it, paired as always.
Outputs in --out: net_results.csv, net_summary.md, net_ratio.png.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time

from bench.harness import page_head
from bench.net_topo import SWITCH_IP, Star, kernel_losses_total, parse_rate, tbf_params
from bench.paired import (
    Cluster,
    Gloo,
    Place,
    Request,
    mean_over_workers,
    paired_ratios,
    proc_cpu,
    slowest,
)
from bench.procs import Point
from spina.wire import LANE_BITS

METHODS = ("spina", "gloo", "floor")  # the CSV's column prefixes
PAIRED_METHODS = ("spina", "gloo_allreduce", "floor")  # bench.paired's names for them
WORKER_PORT = 50000
GLOO_PORT = 29400
# Issue 27's targets: (rate, density) -> (SpINA/gloo at most, the worker counts it is set for).
# At 1 Gbit/s the links' own ratio at 100% is 2(n-1)/n's inverse share, 0.57-0.67 (link theory).
TARGETS = {("1gbit", 1.0): (0.7, (4, 8)), ("1gbit", 0.01): (0.05, (4, 8)),
           ("10gbit", 1.0): (1.0, (4,)), ("10gbit", 0.01): (0.1, (4,))}
# Issue 32's, for narrow lanes: the dense call at 1 Gbit/s, 4 and 8 workers: lane bits -> at most.
LANE_TARGETS = {16: 0.4, 8: 0.25}
COLUMNS = ("mtu", "workers", "lane_bits", "block_size", "rate", "density", "elements", "repeats",
           "spina_median_s", "spina_min_s", "spina_max_s", "gloo_median_s", "gloo_min_s",
           "gloo_max_s", "ratio_median", "ratio_min", "ratio_max", "ratio_link_theory",
           "floor_median_s", "floor_min_s", "floor_max_s", "spina_floor_median",
           "spina_floor_min", "spina_floor_max", "floor_gloo_median", "floor_gloo_min",
           "floor_gloo_max",
           "spina_line_rate_s", "gloo_line_rate_s",
           "spina_tx_bytes", "spina_rx_bytes", "gloo_tx_bytes", "gloo_rx_bytes",
           "floor_tx_bytes", "floor_rx_bytes",
           "tx_bytes_ratio", "tx_bytes_ratio_theory",
           "spina_payload_bytes", "spina_resends", "tbf_drops", "udp_drops", "tcp_retrans",
           "spina_cpu_s", "gloo_cpu_s", "switch_cpu_s_per_spina_call",
           "floor_cpu_s", "relay_cpu_s_per_floor_call",
           "spina_max_err", "gloo_max_err", "floor_max_err", "verified",
           "spina_times_s", "gloo_times_s", "floor_times_s", "load_start", "load_end")


# ----------------------------------------------------------------------------- measuring
def run_workers(n: int, rates, densities, elements: int, repeats: int, tag: str, mtu: int,
                nslots: int, nlanes: int, profile_dir: str | None = None,
                log=print, lane_bits=(32,), block_size: int = 256) -> list[dict]:
    """Every (lane width, rate, density) point for `n` workers on one star; a row per point.

    The switch, the floor's relay and the workers (bench.paired.Cluster, one per lane width)
    live in the star's namespaces, each worker with an Agent, a gloo group and a floor socket
    on its eth0. profile_dir: also write the switch's cProfile (CPU time of its thread)
    there."""
    rows = []
    with Star(n, tag, mtu) as star:
        for bits in lane_bits:
            rows += _run_lanes(star, n, bits, rates, densities, elements, repeats, mtu, nslots,
                               nlanes, block_size, profile_dir, log)
    return rows


def _run_lanes(star: Star, n: int, bits: int, rates, densities, elements: int, repeats: int,
               mtu: int, nslots: int, nlanes: int, block_size: int, profile_dir: str | None,
               log) -> list[dict]:
    """run_workers' points of one lane width, with a cluster of its own."""
    rows = []
    star.set_rate(rates[0])
    prof = (os.path.join(profile_dir, f"switch-mtu{mtu}-n{n}-l{bits}.prof") if profile_dir
            else None)
    places = [Place(star.worker_ns(r), star.worker_ip(r), WORKER_PORT) for r in range(n)]
    with Cluster(n, nslots=nslots, block_size=block_size, nlanes=nlanes, lane_bits=bits,
                 gloo=Gloo(star.worker_ip(0), GLOO_PORT, "eth0"),
                 switch_place=Place(star.switch_ns, SWITCH_IP), worker_places=places,
                 switch_profile=prof, floor=True) as cl:
        for rate in rates:
            star.set_rate(rate)
            for d in densities:
                p = Point("net", n, elements, d, block_size, nlanes, 256, nslots)
                load0 = os.getloadavg()
                drops0, sw0 = star.tbf_drops(), proc_cpu(cl.switch_pid)
                relay0 = proc_cpu(cl.relay_pid)
                k0 = kernel_losses_total(cl.pids)
                res = cl.measure(Request(p, repeats, PAIRED_METHODS, count_dev=True))
                sw_cpu = (proc_cpu(cl.switch_pid) - sw0) / (repeats + 1)  # per SpINA call
                relay_cpu = (proc_cpu(cl.relay_pid) - relay0) / (repeats + 1)  # per floor call
                row = dict(mtu=mtu, **make_row(p, rate, repeats, res, star.tbf_drops() - drops0,
                                               sw_cpu, load0, os.getloadavg(), bits),
                           relay_cpu_s_per_floor_call=relay_cpu)
                row.update({k: v - k0[k] for k, v in kernel_losses_total(cl.pids).items()})
                rows.append(row)
                log(f"  MTU {mtu}, {n} workers, {bits}-bit lanes, {rate} {d:>6.2%}: "
                    f"SpINA {row['spina_median_s']:.4f} s, "
                    f"gloo {row['gloo_median_s']:.4f} s, ratio {row['ratio_median']:.3f} "
                    f"[{row['ratio_min']:.3f}-{row['ratio_max']:.3f}], theory "
                    f"{row['ratio_link_theory']:.3f}; floor {row['floor_median_s']:.4f} s, "
                    f"SpINA/floor {row['spina_floor_median']:.3f}, floor/gloo "
                    f"{row['floor_gloo_median']:.3f}; tx {row['tx_bytes_ratio']:.3f}x gloo's; "
                    f"resends {row['spina_resends']}, "
                    f"tbf/udp drops {row['tbf_drops']}/{row['udp_drops']}, "
                    f"TCP retrans {row['tcp_retrans']}; load {load0[0]:.1f}", flush=True)
    return rows


def union_fraction(density: float, n: int) -> float:
    """Expected fraction of blocks non-zero at some worker (independent draws per worker)."""
    return 1.0 - (1.0 - density) ** n


def make_row(p: Point, rate: str, repeats: int, res: list[dict], drops: int, sw_cpu: float,
             load0, load1, lane_bits: int = 32) -> dict:
    """One CSV row: paired times (slowest worker per repeat), bytes, checks, CPU. SpINA's
    link theory counts its values at lane_bits each (gloo's at 32)."""
    n, size = p.workers, 4 * p.elements
    t = {m: slowest(res, pm) for m, pm in zip(METHODS, PAIRED_METHODS)}
    ratios = paired_ratios(t["spina"], t["gloo"])
    vs_floor = paired_ratios(t["spina"], t["floor"])
    floor_gloo = paired_ratios(t["floor"], t["gloo"])
    ring = 2 * (n - 1) / n
    u = union_fraction(p.density, n)
    bps = parse_rate(rate)
    narrow = lane_bits / 32  # SpINA's bytes a value against gloo's float32
    row = dict(workers=n, lane_bits=lane_bits, block_size=p.block_size, rate=rate,
               density=p.density,
               elements=p.elements, repeats=repeats,
               ratio_median=statistics.median(ratios), ratio_min=min(ratios),
               ratio_max=max(ratios),
               spina_floor_median=statistics.median(vs_floor), spina_floor_min=min(vs_floor),
               spina_floor_max=max(vs_floor), floor_gloo_median=statistics.median(floor_gloo),
               floor_gloo_min=min(floor_gloo), floor_gloo_max=max(floor_gloo),
               # link-bound: the busier direction of a worker's link. SpINA: its union of
               # non-zero blocks comes back (>= what it sends); gloo: 2(n-1)/n each way.
               ratio_link_theory=u * narrow / ring,
               spina_line_rate_s=u * narrow * size * 8 / bps,
               gloo_line_rate_s=ring * size * 8 / bps,
               tx_bytes_ratio=(mean_over_workers(res, "spina", "tx")
                               / mean_over_workers(res, "gloo_allreduce", "tx")),
               tx_bytes_ratio_theory=p.density * narrow / ring,
               spina_payload_bytes=mean_over_workers(res, "spina", "bytes_sent"),
               # resends of the warm-up count too
               spina_resends=sum(w["spina"]["warmup"]["resends"] + sum(w["spina"]["resends"])
                                 for w in res),
               tbf_drops=drops, switch_cpu_s_per_spina_call=sw_cpu,
               spina_max_err=res[0]["spina"]["max_err"],
               gloo_max_err=res[0]["gloo_allreduce"]["max_err"],
               floor_max_err=res[0]["floor"]["max_err"],
               verified=True, load_start=" ".join(f"{x:.2f}" for x in load0),
               load_end=" ".join(f"{x:.2f}" for x in load1))
    for m, pm in zip(METHODS, PAIRED_METHODS):
        row.update({f"{m}_median_s": statistics.median(t[m]), f"{m}_min_s": min(t[m]),
                    f"{m}_max_s": max(t[m]), f"{m}_times_s": " ".join(f"{x:.6f}" for x in t[m]),
                    f"{m}_tx_bytes": mean_over_workers(res, pm, "tx"),
                    f"{m}_rx_bytes": mean_over_workers(res, pm, "rx"),
                    f"{m}_cpu_s": mean_over_workers(res, pm, "cpu")})
    return row


# ----------------------------------------------------------------------------- outputs
def write_csv(rows, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f} MB" if x >= 1e5 else f"{x / 1e3:.1f} KB"


def target_lines(rows) -> list[str]:
    """One line per point that has a target: int32 lanes issue 27's (TARGETS: rate, density,
    workers), narrow lanes issue 32's (LANE_TARGETS: the dense call at 1 Gbit/s); met or not."""
    out = []
    for r in rows:
        bits = int(r["lane_bits"])
        if bits == 32:
            want, workers = TARGETS.get((r["rate"], float(r["density"])), (None, ()))
        else:
            dense_1g = float(r["density"]) == 1.0 and r["rate"] == "1gbit"
            want, workers = (LANE_TARGETS[bits], (4, 8)) if dense_1g else (None, ())
        if want is None or int(r["workers"]) not in workers:
            continue
        ok = float(r["ratio_median"]) <= want
        out.append(f"- MTU {r['mtu']}, {r['rate']}, {int(r['workers'])} workers, {bits}-bit lanes, "
                   f"{float(r['density']) * 100:g}% density: "
                   f"SpINA/gloo = **{float(r['ratio_median']):.3f}x** "
                   f"[{float(r['ratio_min']):.3f}-{float(r['ratio_max']):.3f}], target "
                   f"<= {want}x: **{'met' if ok else 'NOT met'}** (median)")
    return out


def summary(rows, meta: dict) -> str:
    lines = page_head("Network-bound regime: SpINA vs gloo over rate-limited links", meta,
                      "Targets (issue 27; narrow lanes: issue 32; rate-limited links)",
                      target_lines(rows),
                      "no target point run")
    lines += ["", "## Results", "",
              "time ratio = SpINA/gloo per repeat (paired), median [min-max]; link theory = "
              "busier direction of a worker's link, SpINA's union of non-zero blocks over the "
              "ring's 2(n-1)/n; tx = bytes a worker's eth0 sent (headers included), mean over "
              "workers and repeats; tx theory = density / (2(n-1)/n); line-rate = gloo's bytes "
              "at the link rate (time if the link were the only limit). floor: the simplest "
              "compiled star all-reduce of the dense tensor over the same links (bench/floor.py; "
              "it moves the whole tensor at every density), paired like gloo.", "",
              "| MTU | workers | lanes | rate | density | SpINA s | gloo s | gloo line-rate s "
              "| SpINA/gloo time | floor s | SpINA/floor | floor/gloo "
              "| link theory | SpINA tx/worker | gloo tx/worker | tx ratio | tx theory | "
              "resends | drops tbf, UDP | TCP retrans | CPU s/call SpINA, gloo, switch "
              "| CPU s/call floor, relay | load (1 min) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
              "---|---|---|"]
    for f in rows:
        lines.append(
            f"| {f['mtu']} | {f['workers']} | {f['lane_bits']} | {f['rate']} | "
            f"{f['density'] * 100:g}% | "
            f"{f['spina_median_s']:.4f} [{f['spina_min_s']:.4f}-{f['spina_max_s']:.4f}] | "
            f"{f['gloo_median_s']:.4f} [{f['gloo_min_s']:.4f}-{f['gloo_max_s']:.4f}] | "
            f"{f['gloo_line_rate_s']:.4f} | **{f['ratio_median']:.3f}x** "
            f"[{f['ratio_min']:.3f}-{f['ratio_max']:.3f}] | "
            f"{f['floor_median_s']:.4f} [{f['floor_min_s']:.4f}-{f['floor_max_s']:.4f}] | "
            f"**{f['spina_floor_median']:.3f}x** [{f['spina_floor_min']:.3f}-"
            f"{f['spina_floor_max']:.3f}] | {f['floor_gloo_median']:.3f}x "
            f"[{f['floor_gloo_min']:.3f}-{f['floor_gloo_max']:.3f}] | "
            f"{f['ratio_link_theory']:.3f} | "
            f"{_mb(f['spina_tx_bytes'])} | {_mb(f['gloo_tx_bytes'])} | "
            f"{f['tx_bytes_ratio']:.3f} | {f['tx_bytes_ratio_theory']:.3f} | "
            f"{int(f['spina_resends'])} | {int(f['tbf_drops'])}, {int(f['udp_drops'])} | "
            f"{int(f['tcp_retrans'])} | {f['spina_cpu_s']:.3f}, "
            f"{f['gloo_cpu_s']:.3f}, {f['switch_cpu_s_per_spina_call']:.3f} | "
            f"{f['floor_cpu_s']:.3f}, {f['relay_cpu_s_per_floor_call']:.3f} | "
            f"{f['load_start'].split()[0]}-{f['load_end'].split()[0]} |")
    return "\n".join(lines) + "\n"


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = sorted({(int(r["mtu"]), int(r["workers"]), r["rate"], int(r["lane_bits"]))
                     for r in rows})
    for i, key in enumerate(series):
        mtu, n, rate, bits = key
        pts = sorted(((float(r["density"]), r) for r in rows
                      if (int(r["mtu"]), int(r["workers"]), r["rate"], int(r["lane_bits"]))
                      == key), key=lambda dr: dr[0])
        label = f"{n} workers, {rate}, MTU {mtu}" + (f", {bits}-bit lanes" if bits != 32 else "")
        d = [x for x, _ in pts]
        med = [float(r["ratio_median"]) for _, r in pts]
        err = [[m - float(r["ratio_min"]) for m, (_, r) in zip(med, pts)],
               [float(r["ratio_max"]) - m for m, (_, r) in zip(med, pts)]]
        c = f"C{i}"
        ax1.errorbar(d, med, yerr=err, marker="o", color=c, capsize=3, label=label)
        ax1.plot(d, [float(r["ratio_link_theory"]) for _, r in pts], ls="--", color=c, lw=1)
        ax1.plot(d, [float(r["spina_floor_median"]) for _, r in pts], ls=":", marker="x",
                 color=c, lw=1)
        ax2.plot(d, [float(r["tx_bytes_ratio"]) for _, r in pts], marker="o", color=c,
                 label=label)
        ax2.plot(d, [float(r["tx_bytes_ratio_theory"]) for _, r in pts], ls="--", color=c, lw=1)
    for ax, title in ((ax1, "time SpINA / gloo (dashed: link theory; dotted: SpINA / floor)"),
                      (ax2, "bytes sent per worker, SpINA / gloo (dashed: theory)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density (non-zero blocks per worker)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for (rate, want_d), (want, _) in TARGETS.items():
        ax1.plot([want_d], [want], marker="v" if rate == "1gbit" else "^", color="k", ls="none")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Needs root (network namespaces, veth, tc).")
    add_star_args(ap, "snb", "bench/out/net")
    ap.add_argument("--densities", type=lambda s: [float(v) for v in s.split(",")],
                    default=[1.0, 0.1, 0.01], help="fractions of non-zero blocks per worker")
    ap.add_argument("--elements", type=lambda s: int(float(s)), default=8_000_000,
                    help="float32 elements per tensor (default 8M: 0.1-0.5 s at 1 Gbit/s)")
    ap.add_argument("--repeats", type=int, default=5, help="paired repeats per point")
    ap.add_argument("--mtus", type=lambda s: [int(v) for v in s.split(",")],
                    default=[9000, 65535],
                    help="comma list of link MTUs, each a run of its own (default 9000,65535: "
                         "jumbo frames, and no IP fragmentation of SpINA's datagrams)")
    ap.add_argument("--block-size", type=int, default=256,
                    help="SpINA's block size (default 256); the switch's slots grow to hold "
                         "nlanes x block_size values (narrow lanes: 512 for 16-bit, 1024 for "
                         "8-bit give int32's datagram size)")
    ap.add_argument("--lane-bits", type=lambda s: [int(v) for v in s.split(",")], default=[32],
                    help="comma list of SpINA lane widths, 32, 16, 8 (docs/bits.md), each with a "
                         "cluster of its own on the star (default 32)")
    ap.add_argument("--profile-switch", action="store_true",
                    help="cProfile the switch (CPU time of its thread) into --out")
    a = ap.parse_args(argv)
    if a.block_size < 1:
        ap.error(f"--block-size: need at least 1, got {a.block_size}")
    bad = [b for b in a.lane_bits if b not in LANE_BITS]
    if bad:
        ap.error(f"--lane-bits: {bad[0]} is not one of {', '.join(map(str, LANE_BITS))}")
    return a


def _rates(text: str) -> list[str]:
    """--rates: a comma list of tc rates, each checked here so a bad one is a usage error."""
    rates = text.split(",")
    for rate in rates:
        try:
            parse_rate(rate)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return rates


def add_star_args(ap, tag: str, out: str) -> None:
    """The options of every benchmark on bench.net_topo's Star (this one, bench.train_bench):
    worker counts, link rates, SpINA's window and datagram, the namespaces' prefix
    (`tag` + pid), the output directory."""
    ap.add_argument("--workers", type=lambda s: [int(v) for v in s.split(",")], default=[4, 8],
                    help="comma list of worker counts (default 4,8)")
    ap.add_argument("--rates", type=_rates, default=["1gbit", "10gbit"],
                    help="comma list of link rates in tc's units (default 1gbit,10gbit)")
    ap.add_argument("--nslots", type=int, default=16, help="SpINA switch slots (the window)")
    ap.add_argument("--nlanes", type=int, default=56, help="SpINA blocks per datagram")
    ap.add_argument("--tag", default=f"{tag}{os.getpid() % 100000}",
                    help="prefix of the namespaces this run makes")
    ap.add_argument("--out", default=out)
    ap.add_argument("--no-plots", action="store_true")


def run_meta(module: str, argv, t0: float, load0) -> dict:
    """The summary's first lines: the command, the date and host, the load at both ends."""
    return {
        "command": f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()) +
                f"; took {time.time() - t0:.0f} s; host {platform.node()}: {os.cpu_count()} cores, "
                f"Python {platform.python_version()}",
        "load average": f"{' '.join(f'{x:.2f}' for x in load0)} at the start, "
                        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end "
                        "(per point in the table)",
    }


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.net_bench needs root (network namespaces, veth, tc)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    load0 = os.getloadavg()
    rows = []
    for mtu in a.mtus:
        for n in a.workers:
            print(f"MTU {mtu}, {n} workers: {a.elements} float32, rates {','.join(a.rates)}, "
                  f"densities {','.join(f'{d:g}' for d in a.densities)}, {a.repeats} paired "
                  "repeats", flush=True)
            rows += run_workers(n, a.rates, a.densities, a.elements, a.repeats,
                                f"{a.tag}n{n}", mtu, a.nslots, a.nlanes,
                                a.out if a.profile_switch else None, lane_bits=a.lane_bits,
                                block_size=a.block_size)
            write_csv(rows, os.path.join(a.out, "net_results.csv"))  # keep what is done
    tbf = {r: tbf_params(r, max(a.mtus)) for r in a.rates}
    meta = {
        **run_meta("bench.net_bench", argv, t0, load0),
        "topology": "one namespace per worker, one veth each to a switch namespace that routes "
                    "IPv4 (gloo) and runs the UDP-mode software switch (SpINA); tbf on both "
                    f"ends of every link; MTU {', '.join(map(str, a.mtus))}",
        "tbf": "; ".join(f"{r}: burst {p['burst']} B, latency {p['latency_ms']} ms"
                         for r, p in tbf.items()),
        "tensor": f"{a.elements} float32 ({4 * a.elements / 1e6:.0f} MB) per worker, data "
                  "blocks of 256 chosen independently per worker",
        "SpINA": f"block {a.block_size}, {a.nlanes} blocks per datagram "
                 f"({a.nlanes * 4 * a.block_size / 1e3:.0f} KB in int32 lanes, "
                 f"lane widths {','.join(map(str, a.lane_bits))}; "
                 f"IP-fragmented below MTU 65535), {a.nslots} slots",
        "timing": f"{a.repeats} paired repeats after a warm-up, the methods' order rotating; "
                  "a repeat's time is the slowest worker's",
        "checks": "every SpINA and floor result within the quantization bound at rank 0 and "
                  "bit-identical on all ranks; every gloo result within float32 rounding at "
                  "rank 0",
        "floor": "bench/floor.py: the dense tensor in int32 chunks of SpINA's datagram size, "
                 f"{a.nslots} in flight, through one relay process in the switch namespace "
                 "(C, no protocol)",
    }
    with open(os.path.join(a.out, "net_summary.md"), "w") as f:
        f.write(summary(rows, meta))
    if not a.no_plots:
        plot(rows, os.path.join(a.out, "net_ratio.png"))
    print(f"wrote {a.out}/net_results.csv, net_summary.md" +
          ("" if a.no_plots else ", net_ratio.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
