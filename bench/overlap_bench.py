"""Priority overlap against DDP's default order, over rate-limited links (issue 31 item 4).

Run from the repository root as root:

    python -m bench.overlap_bench                                  # 4 workers, 1 Gbit/s
    python -m bench.overlap_bench --workers 2 --width 64 --depth 2 --batch 8 --rounds 2 \\
        --steps 2 --out /tmp/o           # a smoke run (tests/test_overlap.py)

The fabric and processes are bench/train_bench.py's: one namespace per worker, a tbf-limited
veth each to a switch namespace with SpINA's software switch (bench/net_topo.py Star,
bench/paired.py Cluster); the data is its digits (train_bench.digits) and the model its MLP
(examples/train_compressed.py) with `--depth` hidden W x W layers: 1024-W-...-W-10 (W
2304: 5.3M parameters each).

Every worker process trains every method side by side, each its own model from the same
seed and the same batches:

  ddp           DDP with the SpINA hook (host_agent.hooks.spina_allreduce_hook): buckets sent
                whole in DDP's order (last layers first), backward returns when all are
                summed, then optimizer.step()
  overlap       host_agent/hooks/overlap.py PriorityOverlap: chunks by priority (front layers
                first, negotiated), backward returns at once, per-parameter steps in the
                next forward's pre-hooks
  overlap_fifo  the same with order="fifo": the chunks in DDP's order (what priority adds)
  compute       the model without DDP: the compute alone

A round runs --steps consecutive steps of each method (the order rotating round by round)
between two barriers, timed as a whole (the first round a warm-up, checked, not timed):
an overlap method's last step ends with synchronize() (its last sums applied), so every
method's round does the same work. A
method's step time in a round = the slowest worker's round time / steps; overlap's ratio to
ddp is paired per round. After every round the three synchronised methods' weights are
compared (crc32): ddp and overlap must be bit-identical (same sums, same float operations),
and the same on every rank, or the run stops.

Rank 0 traces its last round of each method: forward, backward, optimiser step and waits on
the main thread, every SpINA call (chunk or negotiation) on the sending thread.
Outputs in --out: overlap_results.csv (a row per method), overlap_trace.json,
overlap_summary.md, overlap_timeline_<N>w_<rate>.png per point.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass

from bench.net_bench import add_star_args, run_meta
from bench.net_topo import SWITCH_IP, Star, dev_bytes, kernel_losses_total, parse_rate, tbf_params
from bench.paired import BenchError, Cluster, Gloo, Place, paired_ratios, rotation
from bench.report import page_head
from bench.train_bench import digits, quartiles, write_csv

METHODS = ("ddp", "overlap", "overlap_fifo", "compute")
SYNCED = ("ddp", "overlap", "overlap_fifo")
WORKER_PORT = 50000
GLOO_PORT = 29600
COLUMNS = ("workers", "rate", "method", "params", "layers", "rounds", "steps_per_round",
           "step_median_s", "step_q1_s", "step_q3_s", "ratio_ddp_median", "ratio_ddp_q1",
           "ratio_ddp_q3", "tx_bytes_per_step", "rx_bytes_per_step", "link_s",
           "wait_s_per_step", "weights_identical", "tbf_drops", "udp_drops", "load_start",
           "load_end")


@dataclass(frozen=True)
class OverlapRequest:
    """One comparison, sent to every worker."""
    methods: tuple[str, ...]
    width: int
    depth: int
    batch: int
    lr: float
    momentum: float
    rounds: int
    steps: int
    chunk: int
    bucket_mb: float
    seed: int


# ----------------------------------------------------------------------------- worker side
class TracingAgent:
    """An agent as the plain hook sees it, every allreduce recorded as ("chunk", bucket, 0,
    t0, t1) (a whole bucket: one call), on a one-thread executor like Agent's own."""

    def __init__(self, agent):
        self.agent, self.job, self.events = agent, agent.job, []
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trace")

    def __getattr__(self, name):
        return getattr(self.agent, name)

    def allreduce_async(self, x, inplace=False, blocks=None, layer=None, residual=None):
        def call():
            t0 = time.perf_counter()
            out = self.agent.allreduce(x, inplace, blocks, layer, residual)
            key = -1 if layer is None else layer[1] - 1 - layer[0]  # DDP's bucket index
            self.events.append(("chunk", key, 0, t0, time.perf_counter()))
            return out
        return self._pool.submit(call)

    def close(self):
        self._pool.shutdown()


class Run:
    """One method's model, optimiser or overlap state, and batches at one rank."""

    def __init__(self, method: str, req: OverlapRequest, agent, rank: int, data, torch):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from examples.train_compressed import MLP
        from host_agent.hooks import PriorityOverlap, SpinaHookState, spina_allreduce_hook
        self.method, self.xtr, self.ytr, self.torch = method, data[0], data[1], torch
        torch.manual_seed(req.seed)
        self.module = MLP(req.width, inputs=self.xtr.shape[1], depth=req.depth)
        self.model = (self.module if method == "compute"
                      else DDP(self.module, bucket_cap_mb=req.bucket_mb))
        sgd = dict(lr=req.lr, momentum=req.momentum)
        self.opt = self.overlap = self.tracer = None
        if method in ("ddp", "compute"):
            self.opt = torch.optim.SGD(self.module.parameters(), **sgd)
        if method == "ddp":
            self.tracer = TracingAgent(agent)
            self.model.register_comm_hook(SpinaHookState(self.tracer), spina_allreduce_hook)
        elif method != "compute":
            self.overlap = PriorityOverlap(self.model, agent, torch.optim.SGD,
                                           chunk_elements=req.chunk, trace=True,
                                           order="fifo" if method == "overlap_fifo"
                                           else "priority", **sgd)
        self.gen = torch.Generator().manual_seed(1000 * req.seed + rank)
        self.batch = req.batch
        self.phases: list = []  # (kind, t0, t1) on the main thread

    def step(self) -> None:
        torch = self.torch
        idx = torch.randint(len(self.ytr), (self.batch,), generator=self.gen)
        t0 = time.perf_counter()
        out = self.model(self.xtr[idx])
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(out, self.ytr[idx])
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        self.phases += [("forward", t0, t1), ("backward", t1, t2)]
        if self.opt is not None:
            self.opt.step()
            self.phases.append(("step", t2, time.perf_counter()))

    def finish_round(self) -> None:
        if self.overlap is not None:
            t0 = time.perf_counter()
            self.overlap.synchronize()
            self.phases.append(("sync", t0, time.perf_counter()))

    def events(self) -> list:
        """The communication thread's calls: (kind, key, chunk, t0, t1)."""
        if self.tracer is not None:
            return list(self.tracer.events)
        if self.overlap is not None:
            return [(e.kind, e.key, e.chunk, e.t0, e.t1) for e in self.overlap.sender.events]
        return []

    def main_events(self) -> list:
        """Main-thread phases, and the overlap's waits and steps inside the forward passes."""
        extra = [] if self.overlap is None else [(e.kind, e.t0, e.t1) for e in self.overlap.events]
        return self.phases + extra

    def clear_trace(self) -> None:
        self.phases.clear()
        if self.tracer is not None:
            self.tracer.events.clear()
        if self.overlap is not None:
            self.overlap.sender.events.clear()
            self.overlap.events.clear()

    def weights_crc(self) -> int:
        flat = self.torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])
        return zlib.crc32(flat.numpy().tobytes())

    def close(self) -> None:
        if self.overlap is not None:
            self.overlap.close()
        if self.tracer is not None:
            self.tracer.close()


def overlap_point(rank: int, req: OverlapRequest, agent, dist, torch, barrier,
                  floor=None) -> dict:
    """This worker's side of one comparison (the module docstring): {method: record}."""
    xtr, ytr, _, _ = digits(req.seed)
    runs = {m: Run(m, req, agent, rank, (xtr, ytr), torch) for m in req.methods}
    rec = {m: dict(times=[], tx=[], rx=[], wait=[], crc=[]) for m in req.methods}
    trace = {}
    try:
        for rnd in range(req.rounds):
            for m in rotation(req.methods, rnd):
                run, r = runs[m], rec[m]
                run.clear_trace()
                barrier.wait()
                tx0, rx0 = dev_bytes()
                w0 = run.overlap.wait_seconds if run.overlap is not None else 0.0
                t0 = time.perf_counter()
                for _ in range(req.steps):
                    run.step()
                run.finish_round()
                dt = time.perf_counter() - t0
                barrier.wait()
                tx1, rx1 = dev_bytes()
                r["crc"].append(run.weights_crc() if m in SYNCED else 0)
                if rnd == 0:  # warm-up (DDP rebuilds its buckets after its first step)
                    continue
                r["times"].append(dt / req.steps)
                r["tx"].append((tx1 - tx0) / req.steps)
                r["rx"].append((rx1 - rx0) / req.steps)
                r["wait"].append(((run.overlap.wait_seconds if run.overlap is not None
                                   else 0.0) - w0) / req.steps)
                if rank == 0:  # each method's last round stays
                    trace[m] = dict(t0=t0, t1=t0 + dt, main=run.main_events(),
                                    comm=run.events())
    finally:
        for run in runs.values():
            run.close()
    rec["params"] = sum(p.numel() for p in runs[req.methods[0]].module.parameters())
    rec["trace"] = trace
    return rec


# ----------------------------------------------------------------------------- parent side
def check_weights(recs: list[dict], methods) -> bool:
    """Every rank's synchronised methods hold the same weights after every round."""
    synced = [m for m in methods if m in SYNCED]
    for m in synced:
        for r, w in enumerate(recs[1:], 1):
            if w[m]["crc"] != recs[0][m]["crc"]:
                raise BenchError(f"{m}: rank {r}'s weights differ from rank 0's")
    for m in synced[1:]:
        if recs[0][m]["crc"] != recs[0][synced[0]]["crc"]:
            raise BenchError(f"{m}'s weights differ from {synced[0]}'s (crc32 "
                             f"{recs[0][m]['crc']} vs {recs[0][synced[0]]['crc']})")
    return True


def make_rows(recs: list[dict], req: OverlapRequest, common: dict) -> list[dict]:
    """One row per method."""
    identical = check_weights(recs, req.methods)
    times = {m: [max(v) for v in zip(*(w[m]["times"] for w in recs))] for m in req.methods}
    rows = []
    for m in req.methods:
        q1, med, q3 = quartiles(times[m])
        row = dict(common, method=m, params=recs[0]["params"], layers=req.depth + 2,
                   rounds=req.rounds, steps_per_round=req.steps, step_median_s=med,
                   step_q1_s=q1, step_q3_s=q3,
                   tx_bytes_per_step=statistics.fmean(x for w in recs for x in w[m]["tx"]),
                   rx_bytes_per_step=statistics.fmean(x for w in recs for x in w[m]["rx"]),
                   wait_s_per_step=statistics.fmean(x for w in recs for x in w[m]["wait"]),
                   weights_identical=identical if m in SYNCED else "")
        row["link_s"] = (max(row["tx_bytes_per_step"], row["rx_bytes_per_step"]) * 8
                         / parse_rate(common["rate"]))
        if "ddp" in times:
            rq1, rmed, rq3 = quartiles(paired_ratios(times[m], times["ddp"]))
            row.update(ratio_ddp_median=rmed, ratio_ddp_q1=rq1, ratio_ddp_q3=rq3)
        rows.append(row)
    return rows


def run_point(req: OverlapRequest, n: int, rate: str, tag: str, mtu: int, nslots: int,
              nlanes: int, log=print) -> tuple[list, dict]:
    """The comparison on one star: rows and rank 0's traces."""
    with Star(n, tag, mtu) as star:
        star.set_rate(rate)
        places = [Place(star.worker_ns(r), star.worker_ip(r), WORKER_PORT) for r in range(n)]
        with Cluster(n, nslots=nslots, block_size=256, nlanes=nlanes, agent_kw=dict(rto=0.2),
                     gloo=Gloo(star.worker_ip(0), GLOO_PORT, "eth0"),
                     switch_place=Place(star.switch_ns, SWITCH_IP), worker_places=places,
                     serve=overlap_point) as cl:
            load0, drops0, k0 = os.getloadavg(), star.tbf_drops(), kernel_losses_total(cl.pids)
            recs = cl.ask(req, f"{n} workers, {rate}")
            k1 = kernel_losses_total(cl.pids)
            common = dict(workers=n, rate=rate, tbf_drops=star.tbf_drops() - drops0,
                          udp_drops=k1["udp_drops"] - k0["udp_drops"],
                          load_start=" ".join(f"{x:.2f}" for x in load0),
                          load_end=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    rows = make_rows(recs, req, common)
    for r in rows:
        log(f"  {r['method']:>12}: step {r['step_median_s']:.3f} s "
            f"[{r['step_q1_s']:.3f}-{r['step_q3_s']:.3f}], "
            f"{r.get('ratio_ddp_median', float('nan')):.3f}x ddp, tx "
            f"{r['tx_bytes_per_step'] / 1e6:.1f} MB/step, link {r['link_s']:.3f} s, "
            f"waits {r['wait_s_per_step']:.3f} s/step", flush=True)
    return rows, recs[0]["trace"]


# ----------------------------------------------------------------------------- outputs
def timeline(trace: dict, path: str, title: str) -> None:
    """One panel per method: rank 0's main thread (forward, backward, optimiser steps, waits)
    and its sending thread (each SpINA call, coloured by bucket) over one round."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = [m for m in METHODS if m in trace and m != "compute"]
    fig, axes = plt.subplots(len(methods), 1, figsize=(13, 1.9 * len(methods) + 0.6),
                             squeeze=False, sharex=True)
    main_colors = dict(forward="C0", backward="C1", step="C2", sync="C7", wait="C3")
    cmap = plt.get_cmap("tab10")
    for ax, m in zip(axes[:, 0], methods):
        tr = trace[m]
        t0 = tr["t0"]
        for kind, a, b in tr["main"]:
            y = 1.15 if kind in ("wait", "step") and m != "ddp" else 1.5
            h = 0.3 if y == 1.15 else 0.6
            ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3)], (y - h / 2, h),
                           color=main_colors[kind], lw=0)
        for kind, key, chunk, a, b in tr["comm"]:
            if kind == "negotiate":
                ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3)], (0.1, 0.2), color="k", lw=0)
            else:
                ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3)], (0.35, 0.5),
                               color=cmap(key % 10), alpha=0.9 if chunk % 2 else 0.6,
                               edgecolor="w", lw=0.3)
        ax.axvline((tr["t1"] - t0) * 1e3, color="k", lw=0.8, ls="--")
        ax.set_yticks([0.6, 1.15, 1.5])
        ax.set_yticklabels(["SpINA calls", "wait / step", "compute"], fontsize=8)
        ax.set_ylim(0, 1.9)
        ax.set_title(f"{m}: one round, {(tr['t1'] - t0) * 1e3:.0f} ms", fontsize=9, loc="left")
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel("ms since the round's start (rank 0)")
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=k) for k, c in main_colors.items()]
    handles += [Patch(color="k", label="negotiation")] + [
        Patch(color=cmap(k), label=f"bucket {k}") for k in
        sorted({e[1] for m in methods for e in trace[m]["comm"] if e[0] == "chunk"})[:10]]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 8), fontsize=7)
    import textwrap
    fig.suptitle(textwrap.fill(title, 170), fontsize=8, y=0.995 - 0.35 / fig.get_figheight())
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / fig.get_figheight()))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def timeline_name(point: str) -> str:
    """The timeline's file for a point "N workers, RATE": overlap_timeline_Nw_RATE.png."""
    n, rate = point.split(" workers, ")
    return f"overlap_timeline_{n}w_{rate}.png"


def target_lines(rows) -> list[str]:
    """Per point: overlap's step against ddp's, faster or not."""
    out = []
    for pt in dict.fromkeys((r["workers"], r["rate"]) for r in rows):
        by = {r["method"]: r for r in rows if (r["workers"], r["rate"]) == pt}
        if "overlap" not in by or "ddp" not in by:
            continue
        o = by["overlap"]
        v = o["ratio_ddp_median"]
        out.append(f"- {pt[0]} workers, {pt[1]}: priority overlap's step = **{v:.3f}x** DDP's "
                   f"default order (paired, median; quartiles {o['ratio_ddp_q1']:.3f}-"
                   f"{o['ratio_ddp_q3']:.3f}): **{'faster' if v < 1 else 'not faster'}**")
    return out


def summary(rows, meta: dict) -> str:
    lines = page_head("Priority overlap against DDP's default order", meta,
                      "Result", target_lines(rows), "overlap and ddp not both run")
    lines += ["", "| workers | rate | method | step s [quartiles] | /ddp | tx MB/step | link s "
              "| waits s/step | weights identical | load |", "|---" * 10 + "|"]
    for r in rows:
        ratio = r.get("ratio_ddp_median")
        lines.append(f"| {r['workers']} | {r['rate']} | {r['method']} | "
                     f"{r['step_median_s']:.3f} [{r['step_q1_s']:.3f}-{r['step_q3_s']:.3f}] | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | "
                     f"{r['tx_bytes_per_step'] / 1e6:.1f} | {r['link_s']:.3f} | "
                     f"{r['wait_s_per_step']:.3f} | {r['weights_identical']} | "
                     f"{r['load_start'].split()[0]}-{r['load_end'].split()[0]} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Needs root (network namespaces, veth, tc).")
    add_star_args(ap, "sov", "bench/out/overlap")
    ap.set_defaults(workers=[4], rates=["1gbit"])
    ap.add_argument("--methods", type=lambda s: tuple(s.split(",")), default=METHODS,
                    help=f"comma list of {', '.join(METHODS)} (default all)")
    ap.add_argument("--width", type=int, default=2304,
                    help="hidden width (default 2304: 5.3M parameters per hidden layer)")
    ap.add_argument("--depth", type=int, default=3, help="hidden width x width layers (default 3)")
    ap.add_argument("--batch", type=int, default=128, help="per rank and step (default 128)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=6,
                    help="rounds, the first a warm-up (default 6)")
    ap.add_argument("--steps", type=int, default=4, help="consecutive steps per round (default 4)")
    ap.add_argument("--chunk", type=int, default=1 << 20,
                    help="overlap: elements per chunk, rounded up to lane spans (default 1M)")
    ap.add_argument("--bucket-mb", type=float, default=16.0,
                    help="DDP's bucket cap in MiB, every method (default 16: one hidden layer "
                         "of 21 MB per bucket)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtu", type=int, default=9000)
    a = ap.parse_args(argv)
    bad = [m for m in a.methods if m not in METHODS]
    if bad:
        ap.error(f"--methods: unknown {bad[0]!r} (choose from {', '.join(METHODS)})")
    for name in ("width", "depth", "batch", "rounds", "steps", "chunk"):
        if getattr(a, name) < 1 + (name == "rounds"):
            ap.error(f"--{name}: need at least {1 + (name == 'rounds')}, got "
                     f"{getattr(a, name)}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.overlap_bench needs root (network namespaces, veth, tc)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    req = OverlapRequest(methods=a.methods, width=a.width, depth=a.depth, batch=a.batch,
                         lr=a.lr, momentum=a.momentum, rounds=a.rounds, steps=a.steps,
                         chunk=a.chunk, bucket_mb=a.bucket_mb, seed=a.seed)
    t0, load0 = time.time(), os.getloadavg()
    rows, traces = [], {}
    for n in a.workers:
        for rate in a.rates:
            print(f"{n} workers, {rate}: {a.rounds} rounds of {a.steps} steps, methods "
                  f"{','.join(a.methods)}", flush=True)
            r, tr = run_point(req, n, rate, f"{a.tag}n{n}", a.mtu, a.nslots, a.nlanes)
            rows += r
            traces[f"{n} workers, {rate}"] = tr
            write_csv(rows, os.path.join(a.out, "overlap_results.csv"), COLUMNS)
    with open(os.path.join(a.out, "overlap_trace.json"), "w") as f:
        json.dump(traces, f)
    params = rows[0]["params"] if rows else 0
    meta = {**run_meta("bench.overlap_bench", argv, t0, load0),
            "task": f"MLP 1024-{'-'.join([str(a.width)] * (a.depth + 1))}-10 ({params:,} "
                    f"parameters) on train_bench's digits; SGD lr {a.lr:g}, momentum "
                    f"{a.momentum:g}, batch {a.batch} per rank; {a.rounds} rounds of {a.steps} "
                    "consecutive steps per method",
            "network": f"one namespace per worker, tbf on both ends of every link, MTU {a.mtu}; "
                       + "; ".join(f"{r}: burst {p['burst']} B, latency {p['latency_ms']} ms"
                                   for r, p in ((r, tbf_params(r, a.mtu)) for r in a.rates)),
            "SpINA": f"block 256, {a.nlanes} blocks per datagram, {a.nslots} slots; overlap "
                     f"chunks of {a.chunk} elements rounded up to lane spans; DDP buckets of at "
                     f"most {a.bucket_mb:g} MiB",
            "request": json.dumps(asdict(req))}
    with open(os.path.join(a.out, "overlap_summary.md"), "w") as f:
        f.write(summary(rows, meta))
    pngs = []
    for key, tr in ({} if a.no_plots else traces).items():
        pngs.append(timeline_name(key))
        timeline(tr, os.path.join(a.out, pngs[-1]), f"{key}, rank 0: {meta['task']}")
    print(f"wrote {a.out}/overlap_results.csv, overlap_trace.json, overlap_summary.md"
          + "".join(f", {p}" for p in pngs))
    print("\n".join(target_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
