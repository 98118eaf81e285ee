"""Priority overlap against DDP's default order, over rate-limited links (issue 31 item 4).

    python -m bench overlap -t bench/topologies/star4.yaml --rates 1gbit      # root
    python -m bench overlap -t STAR2.yaml -b 298280 -e 298280 --depth 2 --batch 8 -n 1 \
        --steps 2 --out /tmp/o           # a smoke run (tests/test_overlap.py): width 64

The fabric and processes are the training WHAT's (bench/training.py): a star topology file
(default bench/topologies/star4.yaml; its hosts are the ranks) in namespaces, a tbf-limited
veth per rank to the switch's namespace with SpINA's software switch (spina/netgraph.py
Graph, bench/paired.py Cluster); the data is its digits (train_models.digits_flat) and the model its
MLP (examples/train_compressed.py) with `--depth` hidden W x W layers: 1024-W-...-W-10, W the
width whose float32 gradient comes nearest the size (-b/-e; the default W 2304 at depth 3:
5.3M parameters per hidden layer, 18.3M in all, 73 MB).

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
between two barriers, timed as a whole (-n rounds after a warm-up round, checked, not timed):
an overlap method's last step ends with synchronize() (its last sums applied), so every
method's round does the same work. A
method's step time in a round = the slowest worker's round time / steps; overlap's ratio to
ddp is paired per round (`vs_ddp`). After the rounds the synchronised methods' weights are
compared (crc32): ddp and overlap must be bit-identical (same sums, same float operations),
and the same on every rank; `wrong` counts the ranks (and methods against ddp) that were not.

Rank 0 traces its last round of each method: forward, backward, optimiser step and waits on
the main thread, every SpINA call (chunk or negotiation) on the sending thread.
Besides the harness's outputs: overlap_trace.json, overlap_summary.md (overlap against ddp)
and overlap_timeline_<N>w_<rate>.png per point.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import os
import statistics
import time
import zlib
from dataclasses import asdict, dataclass

from bench.harness import method_rows, page_head
from bench.net_topo import dev_bytes, kernel_losses_total
from bench.paired import paired_ratios, rotation
from bench.train_models import digits_flat
from bench.training import add_ddp_options, check_ddp, ddp_star, quartiles
from spina.netgraph import tbf_params
from spina.topology import parse_rate

METHODS = ("ddp", "overlap", "overlap_fifo", "compute")
SYNCED = ("ddp", "overlap", "overlap_fifo")
GLOO_PORT = 29600
DESCRIPTION = "priority overlap vs DDP's default order over a topology's links (root)"
DEFAULTS = dict(methods=",".join(METHODS), densities="1", repeats=5,
                # width 2304 at depth 3: 18,316,810 parameters
                begin="73267240", end="73267240",
                topology="bench/topologies/star4.yaml", rates="1gbit")
EXTRA_COLUMNS = ("vs_ddp", "vs_ddp_q1", "vs_ddp_q3", "params", "width", "layers",
                 "steps_per_round", "step_q1_us", "step_q3_us", "rx_bytes_per_link", "link_s",
                 "wait_s_per_step", "tbf_drops", "udp_drops")


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--depth", type=cli.int_range(1, 64), default=3,
                    help="hidden width x width layers (default %(default)s)")
    ap.add_argument("--steps", type=cli.int_range(1, 10_000), default=4,
                    help="consecutive steps per round (default %(default)s)")
    ap.add_argument("--chunk", type=cli.int_range(1, 1 << 30), default=1 << 20,
                    help="overlap: elements per chunk, rounded up to lane spans (default 1M)")
    ap.add_argument("--bucket-mb", type=cli.positive_float, default=16.0,
                    help="DDP's bucket cap in MiB, every method (default 16: one hidden layer "
                         "of 21 MB per bucket)")
    add_ddp_options(ap, batch=128, lr=0.02)


def check_options(a) -> str | None:
    return check_ddp(a)


def width_for(size: int, depth: int) -> int:
    """The width W whose MLP 1024-W-...-W-10 (`depth` W x W layers) has the float32 gradient
    nearest `size` bytes: depth W^2 + (1035 + depth) W + 10 parameters."""
    b = 1035 + depth
    return max(1, round((-b + math.sqrt(b * b + 4 * depth * (size / 4 - 10))) / (2 * depth)))


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
    xtr, ytr, _, _ = digits_flat(req.seed)
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
def wrong_weights(recs: list[dict], methods) -> dict:
    """Per method: the ranks whose weights differ from rank 0's, and (the overlaps) 1 if rank
    0's differ from the first synchronised method's (ddp: the same sums, bit for bit)."""
    synced = [m for m in methods if m in SYNCED]
    out = {m: 0 for m in methods}
    for m in synced:
        out[m] = sum(w[m]["crc"] != recs[0][m]["crc"] for w in recs[1:])
    for m in synced[1:]:
        out[m] += recs[0][m]["crc"] != recs[0][synced[0]]["crc"]
    return out


def make_rows(recs: list[dict], req: OverlapRequest, point: dict, what: str, load: str,
              common: dict) -> list[dict]:
    """The harness's rows, one per method."""
    wrong = wrong_weights(recs, req.methods)
    times = {m: [max(v) for v in zip(*(w[m]["times"] for w in recs))] for m in req.methods}
    extras, sent = {}, {}
    rate = parse_rate(point["rate"])
    for m in req.methods:
        q1, _, q3 = quartiles(times[m])
        tx = statistics.fmean(x for w in recs for x in w[m]["tx"])
        rx = statistics.fmean(x for w in recs for x in w[m]["rx"])
        sent[m] = round(tx)
        e = dict(common, params=recs[0]["params"], width=req.width, layers=req.depth + 2,
                 steps_per_round=req.steps, step_q1_us=round(q1 * 1e6, 1),
                 step_q3_us=round(q3 * 1e6, 1), rx_bytes_per_link=round(rx),
                 # the step's bytes at line rate, the busier direction
                 link_s=round(max(tx, rx) * 8 / rate, 5),
                 wait_s_per_step=round(statistics.fmean(x for w in recs for x in w[m]["wait"]),
                                       5))
        if "ddp" in times:
            rq1, rmed, rq3 = quartiles(paired_ratios(times[m], times["ddp"]))
            e.update(vs_ddp=round(rmed, 4), vs_ddp_q1=round(rq1, 4), vs_ddp_q3=round(rq3, 4))
        extras[m] = e
    return method_rows(what, point, times, bus="all_reduce", sent=sent, wrong=wrong, load=load,
                       extras=extras)


def run(a, log):
    """Per rate one comparison on the star."""
    n = a.topo.world
    w = width_for(a.sizes[0], a.depth)
    req = OverlapRequest(methods=tuple(a.methods), width=w, depth=a.depth, batch=a.batch,
                         lr=a.lr, momentum=a.momentum, rounds=a.repeats + 1, steps=a.steps,
                         chunk=a.chunk, bucket_mb=a.bucket_mb, seed=a.seed)
    a.overlap = dict(traces={}, rows=[], req=req)
    with ddp_star(a, GLOO_PORT, overlap_point) as (g, cl):
        for rate in g.each_rate(a.rates):
            log(f"{n} workers, {rate}: {req.rounds} rounds of {req.steps} steps, width {w}")
            load0, drops0, k0 = os.getloadavg()[0], g.tbf_drops(), kernel_losses_total(cl.pids)
            recs = cl.ask(req, f"{n} workers, {rate}")
            k1 = kernel_losses_total(cl.pids)
            common = dict(tbf_drops=g.tbf_drops() - drops0,
                          udp_drops=k1["udp_drops"] - k0["udp_drops"])
            params = recs[0]["params"]
            point = dict(size=4 * params, elements=params, dtype="float32", density=1.0,
                         workers=n, lane_bits=32, rate=rate)
            rows = make_rows(recs, req, point, a.what,
                             f"{load0:.2f}-{os.getloadavg()[0]:.2f}", common)
            a.overlap["traces"][f"{n} workers, {rate}"] = recs[0]["trace"]
            a.overlap["rows"] += rows
            yield rows


def finish(rows, a) -> list[str]:
    """overlap_trace.json, overlap_summary.md and a timeline per point."""
    if not getattr(a, "overlap", None) or not rows:
        return []
    o = a.overlap
    paths = [os.path.join(a.out, "overlap_trace.json"), os.path.join(a.out, "overlap_summary.md")]
    with open(paths[0], "w") as f:
        json.dump(o["traces"], f)
    req = o["req"]
    task = (f"MLP 1024-{'-'.join([str(req.width)] * (req.depth + 1))}-10 "
            f"({rows[0]['params']:,} parameters) on train_models.py's digits; SGD lr {req.lr:g}, "
            f"momentum {req.momentum:g}, batch {req.batch} per rank; {req.rounds} rounds (the "
            f"first a warm-up) of {req.steps} consecutive steps per method")
    meta = {"command": a.command, "task": task,
            "network": f"{a.topology} in namespaces (netgraph.Graph), tbf on both ends of "
                       f"every link, MTU {a.topo.mtu}; " + "; ".join(
                           f"{r}: burst {p['burst']} B, latency {p['latency_ms']} ms"
                           for r, p in ((r, tbf_params(r, a.topo.mtu))
                                        for r in dict.fromkeys(x["rate"] for x in rows))),
            "SpINA": f"block 256, {a.nlanes} blocks per datagram, {a.nslots} slots; overlap "
                     f"chunks of {req.chunk} elements rounded up to lane spans; DDP buckets "
                     f"of at most {req.bucket_mb:g} MiB",
            "request": json.dumps(asdict(req))}
    with open(paths[1], "w") as f:
        f.write(summary(rows, meta))
    for key, tr in ({} if a.no_plots else o["traces"]).items():
        paths.append(os.path.join(a.out, timeline_name(key)))
        timeline(tr, paths[-1], f"{key}, rank 0: {task}")
    return paths


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
        v = o["vs_ddp"]
        out.append(f"- {pt[0]} workers, {pt[1]}: priority overlap's step = **{v:.3f}x** DDP's "
                   f"default order (paired, median; quartiles {o['vs_ddp_q1']:.3f}-"
                   f"{o['vs_ddp_q3']:.3f}): **{'faster' if v < 1 else 'not faster'}**")
    return out


def summary(rows, meta: dict) -> str:
    lines = page_head("Priority overlap against DDP's default order", meta,
                      "Result", target_lines(rows), "overlap and ddp not both run")
    lines += ["", "| workers | rate | method | step ms [quartiles] | /ddp | tx MB/step | link s "
              "| waits s/step | wrong | load |", "|---" * 10 + "|"]
    for r in rows:
        ratio = r.get("vs_ddp")
        lines.append(f"| {r['workers']} | {r['rate']} | {r['method']} | "
                     f"{r['time_us'] / 1e3:.1f} [{r['step_q1_us'] / 1e3:.1f}-"
                     f"{r['step_q3_us'] / 1e3:.1f}] | "
                     f"{'-' if ratio in (None, '') else f'{ratio:.3f}'} | "
                     f"{r['bytes_per_link'] / 1e6:.1f} | {r['link_s']:.3f} | "
                     f"{r['wait_s_per_step']:.3f} | {r['wrong']} | {r['load']} |")
    return "\n".join(lines) + "\n"
