"""All-gather through the switch (Agent.allgather, docs/protocol.md "All-gather") against gloo's
all_gather, on the namespace star of bench/net_topo.py with tbf-limited links.

Run from the repository root as root:

    python -m bench.allgather_bench                                  # 4 workers, 1 Gbit/s
    python -m bench.allgather_bench --workers 4 --rates 1gbit --sizes 64KiB,1MiB,8MiB \\
        --repeats 5 --out bench/out/allgather
    python -m bench.allgather_bench --sizes 16KiB --repeats 1 --out /tmp/ag   # smoke

One worker process per namespace (bench.paired.Cluster: each with an Agent and a gloo group on
its eth0), the software switch in the switch namespace (UDP mode; it routes gloo's TCP too, so
both methods cross the same links). Per shard size the two methods alternate repeat by repeat
(a warm-up first, checked too): every rank's result must be every shard bit for bit (the
shards differ per rank and per size). Each call runs between two barriers; only the call is
timed; a repeat's time is the slowest rank's. Bytes per link: each worker's eth0 tx and rx
bytes around the call (link-layer, every header and any resend included). Outputs in --out:
allgather.csv, summary.md, allgather.png.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

import numpy as np

from bench.net_bench import _rates
from bench.net_topo import SWITCH_IP, Star, kernel_losses_total
from bench.paired import Cluster, Gloo, Place, proc_cpu
from collectives.topology import parse_rate, parse_size
from spina import cli
from spina.netns import unique_tag, why_no_namespaces

METHODS = ("spina", "gloo")
COLUMNS = ("workers", "rate", "shard_bytes", "method", "median_s", "min_s", "max_s",
           "tx_bytes_per_worker", "rx_bytes_per_worker", "link_time_s", "requests", "resends",
           "tbf_drops", "udp_drops", "tcp_retrans", "switch_cpu_s_per_call", "times_s",
           "load_start", "load_end")
GLOO_PORT = 29531


def shard(rank: int, nbytes: int) -> np.ndarray:
    """Rank `rank`'s float32 shard of `nbytes` bytes (different per rank and size)."""
    return np.random.default_rng([rank, nbytes]).standard_normal(nbytes // 4).astype(np.float32)


def serve(rank, req, agent, dist, torch, barrier, floor=None) -> dict:
    """A worker's side of one size: {method: {times, tx, rx[, requests, resends]}}."""
    from bench.net_topo import dev_bytes
    nbytes, repeats = req["shard_bytes"], req["repeats"]
    n = agent.job.nworkers
    x = shard(rank, nbytes)
    want = np.stack([shard(r, nbytes) for r in range(n)])
    t = torch.from_numpy(x)
    outs = [torch.empty_like(t) for _ in range(n)]
    calls = {"spina": lambda: agent.allgather(x),
             "gloo": lambda: (dist.all_gather(outs, t), torch.stack(outs).numpy())[1]}
    rec = {m: dict(times=[], tx=[], rx=[], requests=[], resends=[]) for m in METHODS}
    for i in range(repeats + 1):  # i == 0: warm-up, checked, not recorded
        for m in METHODS if i % 2 == 0 else METHODS[::-1]:
            barrier.wait()  # the last call is over everywhere: the links are quiet
            tx0, rx0 = dev_bytes()
            barrier.wait()
            t0 = time.perf_counter()
            got = calls[m]()
            dt = time.perf_counter() - t0
            barrier.wait()  # every worker done: late resends are counted with this call
            tx1, rx1 = dev_bytes()
            if got.tobytes() != want.tobytes():
                raise RuntimeError(f"rank {rank}: {m} all-gather of {nbytes} B is not every "
                                   "shard bit for bit")
            if not i:
                continue
            r = rec[m]
            r["times"].append(dt)
            r["tx"].append(tx1 - tx0)
            r["rx"].append(rx1 - rx0)
            if m == "spina":
                r["requests"].append(agent.last_gather_stats.requests)
                r["resends"].append(agent.last_gather_stats.resends)
    return rec


def run(n: int, rates, sizes, repeats: int, nslots: int, mtu: int, tag: str,
        log=print) -> list[dict]:
    rows = []
    with Star(n, tag, mtu) as star:
        star.set_rate(rates[0])
        places = [Place(star.worker_ns(r), star.worker_ip(r)) for r in range(n)]
        with Cluster(n, nslots=nslots, gloo=Gloo(star.worker_ip(0), GLOO_PORT, "eth0"),
                     switch_place=Place(star.switch_ns, SWITCH_IP), worker_places=places,
                     serve=serve) as cl:
            for rate in rates:
                star.set_rate(rate)
                for nbytes in sizes:
                    load0 = os.getloadavg()[0]
                    drops0, k0 = star.tbf_drops(), kernel_losses_total(cl.pids)
                    cpu0 = proc_cpu(cl.switch_pid)
                    recs = cl.ask(dict(shard_bytes=nbytes, repeats=repeats),
                                  f"{rate} {nbytes} B")
                    load1 = os.getloadavg()[0]
                    # the switch process works for SpINA alone (gloo's TCP is routed by the
                    # kernel): its CPU per SpINA call, the warm-up included
                    switch_cpu = (proc_cpu(cl.switch_pid) - cpu0) / (repeats + 1)
                    # losses of the point (both methods; UDP: SpINA's, TCP: gloo's): where
                    # they happened, tbf's queues or a socket's receive buffer
                    losses = dict(tbf_drops=star.tbf_drops() - drops0,
                                  **{k: v - k0[k] for k, v in
                                     kernel_losses_total(cl.pids).items()})
                    for m in METHODS:
                        times = [max(r[m]["times"][i] for r in recs) for i in range(repeats)]
                        tx = statistics.mean(statistics.mean(r[m]["tx"]) for r in recs)
                        rx = statistics.mean(statistics.mean(r[m]["rx"]) for r in recs)
                        rows.append(dict(
                            workers=n, rate=rate, shard_bytes=nbytes, method=m,
                            median_s=statistics.median(times), min_s=min(times),
                            max_s=max(times), tx_bytes_per_worker=round(tx),
                            rx_bytes_per_worker=round(rx),
                            # the busiest direction of a worker's link at the rate
                            link_time_s=max(tx, rx) * 8 / parse_rate(rate),
                            requests=sum(sum(r[m]["requests"]) for r in recs),
                            resends=sum(sum(r[m]["resends"]) for r in recs), **losses,
                            switch_cpu_s_per_call=switch_cpu if m == "spina" else 0.0,
                            times_s=" ".join(f"{v:.4f}" for v in times),
                            load_start=load0, load_end=load1))
                        row = rows[-1]
                        log(f"{n} workers {rate} shard {nbytes} B {m}: median "
                            f"{row['median_s']:.4f} s [{row['min_s']:.4f}-{row['max_s']:.4f}], "
                            f"tx {tx / nbytes:.2f}x shard, rx {rx / nbytes:.2f}x shard, "
                            f"requests {row['requests']}; point's drops: tbf "
                            f"{losses['tbf_drops']}, udp {losses['udp_drops']}, tcp retrans "
                            f"{losses['tcp_retrans']}; switch CPU per SpINA call "
                            f"{switch_cpu:.3f} s; load {load0:.1f}", flush=True)
    return rows


def write(rows, out: str, meta: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "allgather.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    lines = ["# All-gather: SpINA (switch multicast) vs gloo all_gather", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()] + [""]
    lines += ["| workers | rate | shard | method | median s | min-max s | tx / worker | "
              "rx / worker | link time s | requests | time / gloo's | drops: tbf, udp, tcp "
              "retrans (the point's) | switch CPU s / call |", "|" + "---|" * 13]
    gloo = {(r["rate"], r["shard_bytes"]): r for r in rows if r["method"] == "gloo"}
    for r in rows:
        g = gloo[(r["rate"], r["shard_bytes"])]
        lines.append(f"| {r['workers']} | {r['rate']} | {r['shard_bytes']} | {r['method']} | "
                     f"{r['median_s']:.4f} | {r['min_s']:.4f}-{r['max_s']:.4f} | "
                     f"{r['tx_bytes_per_worker']} | {r['rx_bytes_per_worker']} | "
                     f"{r['link_time_s']:.4f} | {r['requests']} | "
                     f"{r['median_s'] / g['median_s']:.2f} | {r['tbf_drops']}, "
                     f"{r['udp_drops']}, {r['tcp_retrans']} | "
                     f"{r['switch_cpu_s_per_call']:.3f} |")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(rows, os.path.join(out, "allgather.png"))


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for rate in dict.fromkeys(r["rate"] for r in rows):
        for m in METHODS:
            pts = [r for r in rows if r["rate"] == rate and r["method"] == m]
            x = [r["shard_bytes"] for r in pts]
            a.plot(x, [r["median_s"] for r in pts], "o-", label=f"{m} {rate}")
            b.plot(x, [r["tx_bytes_per_worker"] / r["shard_bytes"] for r in pts], "o-",
                   label=f"{m} tx {rate}")
            b.plot(x, [r["rx_bytes_per_worker"] / r["shard_bytes"] for r in pts], "x--",
                   label=f"{m} rx {rate}")
    a.set(xscale="log", yscale="log", xlabel="shard bytes", ylabel="call time (s, median)",
          title="all-gather time")
    b.set(xscale="log", xlabel="shard bytes", ylabel="bytes on a worker's link / shard",
          title="bytes per worker link")
    for ax in (a, b):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sizes(text: str) -> list[int]:
    """--sizes: a comma list of sizes (collectives/topology.py's units), each checked here."""
    return [cli.parsed_by(parse_size, "size")(v) for v in text.split(",")]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.allgather_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=cli.int_range(2, 32), default=4)
    ap.add_argument("--rates", type=_rates, default=["1gbit"],
                    help="comma list of link rates in tc's units (default 1gbit)")
    ap.add_argument("--sizes", type=_sizes, default=[64 << 10, 1 << 20, 8 << 20],
                    help="comma list of shard sizes per worker (default 64KiB,1MiB,8MiB)")
    ap.add_argument("--repeats", type=cli.int_range(1, 1000), default=5)
    ap.add_argument("--nslots", type=cli.int_range(1, 256), default=8,
                    help="the job's window: chunks per worker in flight (default 8)")
    ap.add_argument("--mtu", type=cli.int_range(1280, 65535), default=9000)
    ap.add_argument("--tag", default=unique_tag("ag"),
                    help="prefix of the namespaces this run makes")
    ap.add_argument("--out", default=os.path.join("bench", "out", "allgather"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    why = why_no_namespaces()
    if why:
        print(f"allgather_bench: {why}", file=sys.stderr)
        return 2
    t0, load0 = time.time(), os.getloadavg()
    rows = run(args.workers, args.rates, args.sizes, args.repeats, args.nslots, args.mtu,
               args.tag)
    meta = {"command": "python -m bench.allgather_bench " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            + f"; took {time.time() - t0:.0f} s",
            "load average": f"{load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
            "star": f"{args.workers} workers, MTU {args.mtu}, job nslots {args.nslots} "
                    "(chunks of 56 lanes x 256 words, 57 KB, IP-fragmented)"}
    write(rows, args.out, meta)
    print(f"wrote {args.out}/allgather.csv, summary.md, allgather.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
