"""DDP training where the network is the limit: gloo, SpINA dense and SpINA with block top-k.

Run from the repository root as root (`make bench-train` does):

    python -m bench.train_bench                        # 4 and 8 workers, 1 and 10 Gbit/s
    python -m bench.train_bench --workers 4 --rates 1gbit --max-steps 60     # one point
    python -m bench.train_bench --workers 2 --rates 1gbit --width 64 --max-steps 4 \\
        --min-steps 4 --out /tmp/t         # a smoke run (tests/test_train_bench.py)

The network is bench.net_bench's: one namespace per worker, one tbf-limited veth each (both
directions) to a switch namespace that routes IPv4 (gloo's ring) and runs SpINA's software
switch in UDP mode (bench/net_topo.py Star; the processes: bench/paired.py Cluster).

The task: a 6.3M-parameter MLP (1024-2048-2048-10, examples/train_compressed.py's MLP) on
scikit-learn's digits upsampled to 32x32 (examples/train_digits.py's load_data: 1438 training
and 359 test images; nothing is downloaded). SGD, momentum 0.9, a constant learning rate, a
per-rank batch drawn with replacement from the whole training set.

Every worker process trains every method side by side (each its own model from the same
seed, its own optimiser, the same batches): a round runs one step of each method, the order
rotating round by round, each step between two barriers, only the step timed (forward,
backward with DDP's communication, optimiser step):

  gloo     DDP's own all-reduce (the gloo ring)
  spina    DDP with the SpINA hook (host_agent/hooks/dense.py spina_allreduce_hook)
  topk     DDP with the compression hook (host_agent/hooks/compressed.py
           spina_compressed_hook): block top-k of 256-element blocks at --ratio, error
           feedback and DGC momentum correction (the optimiser then has none)
  compute  the same model without DDP (no communication): the step's compute alone

A step's time is the slowest worker's. After every round each method's test accuracy is
measured (each rank a share of the test set, the counts summed over gloo; not timed). Time
to accuracy = the method's summed step times up to the first step at which its test accuracy
reaches --target. A method stops once it has reached the target and run --min-steps steps
(compute: after --min-steps); the run ends when all have, or after --max-steps rounds.
Step-time ratios are paired: per round, a method's step over gloo's in the same round.
At the end every rank's weights are compared (crc32): each synchronised method must end
bit-identical on all ranks, or the run stops.

Outputs in --out: train_results.csv (a row per workers, rate and method), train_curves.csv
(a row per step: time, cumulative time, test accuracy), train_summary.md (targets met / not
met), train.png.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, replace

from bench.net_bench import add_star_args, run_meta
from bench.net_topo import (
    SWITCH_IP,
    Star,
    dev_bytes,
    kernel_losses_total,
    parse_rate,
    tbf_params,
)
from bench.paired import (
    BenchError,
    Cluster,
    Gloo,
    Place,
    paired_ratios,
    proc_cpu,
    rotation,
)
from bench.procs import cpu_seconds
from bench.report import page_head

METHODS = ("gloo", "spina", "topk", "compute")
SYNCED = ("gloo", "spina", "topk")  # trained with DDP: same weights on every rank, accuracy
WORKER_PORT = 50000
GLOO_PORT = 29500
TARGET_RATE = "1gbit"
STEP_TARGET = 0.75  # SpINA dense step / gloo's at 1 Gbit/s, at most (issue 27)
TIME_TARGET = 0.3   # top-k's time to the target accuracy / gloo's, at most (issue 27)
COLUMNS = ("mtu", "workers", "rate", "method", "params", "steps", "step_median_s",
           "step_q1_s", "step_q3_s", "step_ratio_median", "step_ratio_q1", "step_ratio_q3",
           "target_acc", "steps_to_target", "time_to_target_s", "time_ratio",
           "final_acc", "best_acc", "tx_bytes_per_step", "rx_bytes_per_step", "link_s",
           "agent_bytes_per_step", "resends", "blocks_fraction", "agent_s_per_step",
           "compress_s_per_step", "worker_cpu_s_per_step",
           "switch_cpu_s_per_step", "weights_identical", "tbf_drops", "udp_drops",
           "tcp_retrans", "load_start", "load_end")
CURVE_COLUMNS = ("mtu", "workers", "rate", "method", "step", "step_s", "cum_s", "test_acc")


@dataclass(frozen=True)
class TrainRequest:
    """One training comparison, sent to every worker."""
    methods: tuple[str, ...]
    width: int          # the MLP's hidden width (2048: 6.3M parameters)
    batch: int          # per rank and step
    lr: float
    momentum: float
    ratio: float        # top-k's fraction of blocks
    target: float       # test accuracy (%) that ends a method
    max_steps: int
    min_steps: int
    seed: int
    switch_pid: int | None = None  # read its CPU time around every step (rank 0)
    count_dev: bool = True         # eth0's tx/rx bytes around every step (namespaces)


# ----------------------------------------------------------------------------- worker side
class Run:
    """One method's model, optimiser, hook state and batches at one rank."""

    def __init__(self, method: str, req: TrainRequest, agent, rank: int, data):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        from examples.train_compressed import MLP
        from host_agent.compression import make_compressor
        from host_agent.hooks import (
            CompressionHookState,
            SpinaHookState,
            spina_allreduce_hook,
            spina_compressed_hook,
        )

        self.method, self.xtr, self.ytr = method, data[0], data[1]
        torch.manual_seed(req.seed)  # the same initial weights for every method
        self.module = MLP(req.width, inputs=self.xtr.shape[1])
        self.model = self.module if method == "compute" else DDP(self.module)
        compressed = method == "topk"
        self.opt = torch.optim.SGD(self.module.parameters(), lr=req.lr,
                                   momentum=0.0 if compressed else req.momentum)
        self.state = None
        if method == "spina":
            self.state = SpinaHookState(agent)
            self.model.register_comm_hook(self.state, spina_allreduce_hook)
        elif compressed:
            comp = make_compressor(method="topk", ratio=req.ratio, momentum=req.momentum,
                                   block_size=agent.job.block_size)
            self.state = CompressionHookState(comp, agent, optimizer=self.opt)
            self.model.register_comm_hook(self.state, spina_compressed_hook)
        self.gen = torch.Generator().manual_seed(1000 * req.seed + rank)  # same for every method
        self.batch = req.batch

    def next_batch(self):
        import torch
        idx = torch.randint(len(self.ytr), (self.batch,), generator=self.gen)
        return self.xtr[idx], self.ytr[idx]

    def step(self, x, y) -> None:
        import torch.nn.functional as F
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: returns once every bucket is all-reduced
        self.opt.step()

    def correct(self, x, y) -> int:
        import torch
        with torch.no_grad():
            return int((self.module(x).argmax(1) == y).sum())

    def weights_crc(self) -> int:
        import torch
        flat = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])
        return zlib.crc32(flat.numpy().tobytes())


def digits(seed: int):
    """examples/train_digits.py's data (32x32, normalised), flattened to 1024 inputs."""
    from examples.train_digits import load_data
    xtr, ytr, xte, yte = load_data(seed)
    return xtr.flatten(1), ytr, xte.flatten(1), yte


def train_point(rank: int, req: TrainRequest, agent, dist, torch, barrier, floor=None) -> dict:
    """This worker's side of one comparison (see the module docstring): {method: record}."""
    n = agent.job.nworkers
    xtr, ytr, xte, yte = digits(req.seed)
    runs = {m: Run(m, req, agent, rank, (xtr, ytr)) for m in req.methods}
    mine_x, mine_y = xte[rank::n], yte[rank::n]  # this rank's share of the test set
    rec = {m: dict(times=[], tx=[], rx=[], cpu=[], switch_cpu=[], acc=[]) for m in req.methods}
    reached = {m: False for m in req.methods}
    active = list(req.methods)
    step = 0
    while active and step < req.max_steps:
        for m in rotation(tuple(active), step):
            r, run = rec[m], runs[m]
            x, y = run.next_batch()
            barrier.wait()
            tx0, rx0 = dev_bytes() if req.count_dev else (0, 0)
            s0 = proc_cpu(req.switch_pid) if req.switch_pid and rank == 0 else 0.0
            c0, t0 = cpu_seconds(), time.perf_counter()
            run.step(x, y)
            dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
            barrier.wait()  # every worker done (the switch too: every rank has its sums)
            tx1, rx1 = dev_bytes() if req.count_dev else (0, 0)
            s1 = proc_cpu(req.switch_pid) if req.switch_pid and rank == 0 else 0.0
            r["times"].append(dt)
            r["cpu"].append(dc)
            r["tx"].append(tx1 - tx0)
            r["rx"].append(rx1 - rx0)
            r["switch_cpu"].append(s1 - s0)
        step += 1
        # not timed: each rank counts its share of the test set, gloo sums the counts
        synced = [m for m in active if m in SYNCED]
        counts = torch.tensor([runs[m].correct(mine_x, mine_y) for m in synced],
                              dtype=torch.int64)
        if synced:
            dist.all_reduce(counts)
        for m, c in zip(synced, counts.tolist()):
            rec[m]["acc"].append(100.0 * c / len(yte))
            reached[m] = reached[m] or rec[m]["acc"][-1] >= req.target
        # the same decision on every rank: the accuracies are the summed counts
        active = [m for m in active if step < req.min_steps
                  or (m in SYNCED and not reached[m])]
        if not any(m in SYNCED for m in active):
            active = []
    for m, run in runs.items():
        r = rec[m]
        r["crc"] = run.weights_crc()
        if run.state is not None:
            st = run.state
            r.update(agent_bytes=st.bytes_sent, resends=st.resends, calls=st.calls,
                     agent_s=st.seconds)
            if m == "topk":
                r.update(blocks_fraction=st.blocks_sent / max(1, st.blocks_total),
                         compress_s=st.compress_seconds)
    rec["params"] = sum(p.numel() for p in runs[req.methods[0]].module.parameters())
    return rec


# ----------------------------------------------------------------------------- parent side
def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); a single value thrice."""
    if len(xs) < 2:
        return (xs[0],) * 3
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def per_step(recs: list[dict], method: str, key: str) -> list[float]:
    """Per step, the slowest worker's value of `key` (times: the step's time)."""
    return [max(v) for v in zip(*(w[method][key] for w in recs))]


def mean_per_step(recs: list[dict], method: str, key: str) -> float:
    """Mean over workers and steps."""
    return statistics.fmean(statistics.fmean(w[method][key]) for w in recs)


def time_to_target(times: list[float], acc: list[float], target: float):
    """(steps, seconds) up to the first step whose accuracy reaches `target`, or (None, None)."""
    for i, a in enumerate(acc):
        if a >= target:
            return i + 1, sum(times[:i + 1])
    return None, None


def make_rows(recs: list[dict], req: TrainRequest, common: dict) -> tuple[list, list]:
    """CSV rows (one per method) and curve rows (one per method and step) of one point."""
    for m in req.methods:
        if m in SYNCED:
            crcs = [w[m]["crc"] for w in recs]
            if len(set(crcs)) != 1:
                raise BenchError(f"{common['workers']} workers, {common['rate']}: {m}'s "
                                 f"weights differ across ranks (crc32 {crcs})")
            if any(w[m]["acc"] != recs[0][m]["acc"] for w in recs):
                raise BenchError(f"{m}: the ranks measured different test accuracies")
    times = {m: per_step(recs, m, "times") for m in req.methods}
    rows, curves = [], []
    ttt = {}
    for m in req.methods:
        t, acc = times[m], recs[0][m]["acc"]
        ttt[m] = time_to_target(t, acc, req.target) if m in SYNCED else (None, None)
    for m in req.methods:
        t = times[m]
        q1, med, q3 = quartiles(t)
        row = dict(common, method=m, params=recs[0]["params"], steps=len(t), step_median_s=med,
                   step_q1_s=q1, step_q3_s=q3, target_acc=req.target,
                   tx_bytes_per_step=mean_per_step(recs, m, "tx"),
                   rx_bytes_per_step=mean_per_step(recs, m, "rx"),
                   # the step's bytes at line rate, the busier direction of the busiest link
                   link_s=max(statistics.fmean(w[m][k]) for w in recs for k in ("tx", "rx"))
                   * 8 / parse_rate(common["rate"]),
                   worker_cpu_s_per_step=mean_per_step(recs, m, "cpu"),
                   switch_cpu_s_per_step=statistics.fmean(recs[0][m]["switch_cpu"]),
                   weights_identical=(m in SYNCED) or "")
        if "gloo" in times:
            k = min(len(t), len(times["gloo"]))
            rq1, rmed, rq3 = quartiles(paired_ratios(t[:k], times["gloo"][:k]))
            row.update(step_ratio_median=rmed, step_ratio_q1=rq1, step_ratio_q3=rq3)
        if m in SYNCED:
            acc = recs[0][m]["acc"]
            steps, secs = ttt[m]
            gsecs = ttt.get("gloo", (None, None))[1]
            row.update(steps_to_target=steps if steps is not None else "",
                       time_to_target_s=secs if secs is not None else "",
                       time_ratio=secs / gsecs if secs is not None and gsecs else "",
                       final_acc=acc[-1], best_acc=max(acc))
        if "agent_bytes" in recs[0][m]:
            row.update(agent_bytes_per_step=statistics.fmean(w[m]["agent_bytes"] for w in recs)
                       / len(t), resends=sum(w[m]["resends"] for w in recs))
            row["agent_s_per_step"] = statistics.fmean(w[m]["agent_s"] for w in recs) / len(t)
        if "blocks_fraction" in recs[0][m]:
            row["blocks_fraction"] = statistics.fmean(w[m]["blocks_fraction"] for w in recs)
            row["compress_s_per_step"] = (statistics.fmean(w[m]["compress_s"] for w in recs)
                                          / len(t))
        rows.append(row)
        cum = 0.0
        acc = recs[0][m]["acc"] if m in SYNCED else [""] * len(t)
        for i, (dt, a) in enumerate(zip(t, acc)):
            cum += dt
            curves.append(dict(mtu=common["mtu"], workers=common["workers"], rate=common["rate"],
                               method=m, step=i + 1, step_s=dt, cum_s=cum, test_acc=a))
    return rows, curves


def run_workers(n: int, rates, req: TrainRequest, tag: str, mtu: int, nslots: int, nlanes: int,
                log=print) -> tuple[list, list]:
    """Every rate for `n` workers on one star: rows and curves."""
    rows, curves = [], []
    with Star(n, tag, mtu) as star:
        star.set_rate(rates[0])
        places = [Place(star.worker_ns(r), star.worker_ip(r), WORKER_PORT) for r in range(n)]
        with Cluster(n, nslots=nslots, block_size=256, nlanes=nlanes, agent_kw=dict(rto=0.2),
                     gloo=Gloo(star.worker_ip(0), GLOO_PORT, "eth0"),
                     switch_place=Place(star.switch_ns, SWITCH_IP), worker_places=places,
                     serve=train_point) as cl:
            for rate in rates:
                star.set_rate(rate)
                load0, drops0, k0 = os.getloadavg(), star.tbf_drops(), kernel_losses_total(cl.pids)
                t0 = time.perf_counter()
                recs = cl.ask(replace(req, switch_pid=cl.switch_pid),
                              f"{n} workers, {rate}")
                k1 = kernel_losses_total(cl.pids)
                common = dict(mtu=mtu, workers=n, rate=rate, tbf_drops=star.tbf_drops() - drops0,
                              load_start=" ".join(f"{x:.2f}" for x in load0),
                              load_end=" ".join(f"{x:.2f}" for x in os.getloadavg()),
                              **{k: k1[k] - k0[k] for k in k0})
                r, c = make_rows(recs, req, common)
                rows += r
                curves += c
                log(f"  {n} workers, {rate} ({time.perf_counter() - t0:.0f} s, load "
                    f"{load0[0]:.1f}):", flush=True)
                for row in r:
                    log("    " + row_line(row), flush=True)
    return rows, curves


def _f(v, fmt: str, none: str = "-") -> str:
    return none if v in ("", None) else format(float(v), fmt)


def row_line(r: dict) -> str:
    return (f"{r['method']:>7}: step {_f(r['step_median_s'], '.3f')} s "
            f"({_f(r.get('step_ratio_median'), '.3f')}x gloo), {r['steps']} steps, "
            f"{_f(r.get('target_acc'), 'g')}% after {r.get('steps_to_target') or '-'} steps, "
            f"{_f(r.get('time_to_target_s'), '.2f')} s ({_f(r.get('time_ratio'), '.3f')}x "
            f"gloo); final {_f(r.get('final_acc'), '.2f')}%; tx "
            f"{float(r['tx_bytes_per_step']) / 1e6:.2f} MB/step")


# ----------------------------------------------------------------------------- outputs
def write_csv(rows, path: str, columns) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)


def point(r) -> tuple[int, int, str]:
    """(MTU, workers, rate) of a row: one comparison."""
    return int(r["mtu"]), int(r["workers"]), r["rate"]


def _get(rows, pt, method):
    return next((r for r in rows if point(r) == pt and r["method"] == method), None)


def target_lines(rows) -> list[str]:
    """Per MTU and worker count at the target rate: issue 27's two targets, met or not met."""
    out = []
    for pt in sorted({point(r) for r in rows if r["rate"] == TARGET_RATE}):
        sp, tk = _get(rows, pt, "spina"), _get(rows, pt, "topk")
        at = f"- MTU {pt[0]}, {TARGET_RATE}, {pt[1]} workers"
        if sp is not None and sp.get("step_ratio_median") not in ("", None):
            v = float(sp["step_ratio_median"])
            out.append(f"{at}: SpINA dense step = **{v:.3f}x** gloo's "
                       f"(paired, median; quartiles {float(sp['step_ratio_q1']):.3f}-"
                       f"{float(sp['step_ratio_q3']):.3f}), target <= {STEP_TARGET}x: "
                       f"**{'met' if v <= STEP_TARGET else 'NOT met'}**")
        if tk is not None:
            tr = tk.get("time_ratio")
            if tr in ("", None):
                g = _get(rows, pt, "gloo")
                who = "top-k" if tk.get("steps_to_target") in ("", None) else "gloo"
                steps = (tk if who == "top-k" else g)["steps"]
                out.append(f"{at}: {who} did not reach "
                           f"{float(tk['target_acc']):g}% within {steps} steps: the time "
                           "target (<= 0.3x gloo's) **NOT met** (not measurable)")
            else:
                v, g = float(tr), _get(rows, pt, "gloo")
                out.append(f"{at}: SpINA top-k reaches "
                           f"{float(tk['target_acc']):g}% in **{v:.3f}x** gloo's time "
                           f"({float(tk['time_to_target_s']):.2f} s, {tk['steps_to_target']} "
                           f"steps, against {float(g['time_to_target_s']):.2f} s, "
                           f"{g['steps_to_target']} steps), target <= {TIME_TARGET}x: "
                           f"**{'met' if v <= TIME_TARGET else 'NOT met'}**")
    return out


def summary(rows, meta: dict) -> str:
    lines = page_head("DDP training over rate-limited links: gloo, SpINA dense, SpINA top-k",
                      meta, "Targets (issue 27, at 1 Gbit/s)", target_lines(rows),
                      "no 1gbit point run")
    lines += ["", "## Results", "",
              "step = forward + backward (DDP's communication) + optimiser step, the slowest "
              "worker's, median [quartiles] over the steps; step/gloo paired per round; time to "
              "target = summed step times up to the first step at the target test accuracy; "
              "tx = bytes a worker's eth0 sent per step (headers included), mean over workers; "
              "link s = the step's bytes at the link rate (the busier direction of the "
              "busiest worker's link: the step's time if the link were the only limit); "
              "agent = UDP payload the SpINA agent sent per step; in agent, compression: seconds "
              "per step inside Agent.allreduce (on the agent's thread, overlapping backward) "
              "and in the compressor, mean over workers; CPU per step: one worker process (all "
              "threads, mean over workers), the switch process.", "",
              "| MTU | workers | rate | method | step s | step/gloo | steps | to target: steps | s "
              "| /gloo | final acc % | tx/step | link s | agent/step | resends "
              "| s in agent, compression | CPU s worker, switch | load |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        agent = r.get("agent_bytes_per_step")
        lines.append(
            f"| {r['mtu']} | {r['workers']} | {r['rate']} | {r['method']} | "
            f"{float(r['step_median_s']):.3f} "
            f"[{float(r['step_q1_s']):.3f}-{float(r['step_q3_s']):.3f}] | "
            f"{_f(r.get('step_ratio_median'), '.3f')} | {r['steps']} | "
            f"{r.get('steps_to_target') or '-'} | {_f(r.get('time_to_target_s'), '.2f')} | "
            f"{_f(r.get('time_ratio'), '.3f')} | {_f(r.get('final_acc'), '.2f')} | "
            f"{float(r['tx_bytes_per_step']) / 1e6:.2f} MB | {float(r['link_s']):.3f} | "
            f"{'-' if agent in ('', None) else f'{float(agent) / 1e6:.3f} MB'} | "
            f"{r.get('resends') if r.get('resends') not in ('', None) else '-'} | "
            f"{_f(r.get('agent_s_per_step'), '.3f')}, {_f(r.get('compress_s_per_step'), '.3f')} | "
            f"{float(r['worker_cpu_s_per_step']):.3f}, {float(r['switch_cpu_s_per_step']):.3f} | "
            f"{r['load_start'].split()[0]}-{r['load_end'].split()[0]} |")
    return "\n".join(lines) + "\n"


def plot(rows, curves, path: str) -> None:
    """Test accuracy over training time, a panel per (MTU, workers, rate); step times beside."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = sorted({point(r) for r in rows}, key=lambda p: (p[0], parse_rate(p[2]), p[1]))
    mtus = {p[0] for p in points}
    cols = min(3, len(points) + 1)
    nrows = -(-(len(points) + 1) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.6 * nrows), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[len(points) + 1:]:
        ax.set_visible(False)
    colors = dict(gloo="C0", spina="C1", topk="C2", compute="C7")
    def name(pt):
        return f"{pt[1]} workers, {pt[2]}" + (f", MTU {pt[0]}" if len(mtus) > 1 else "")

    for ax, pt in zip(axes, points):
        for m in SYNCED:
            pts = [c for c in curves if point(c) == pt and c["method"] == m]
            if pts:
                ax.plot([float(c["cum_s"]) for c in pts], [float(c["test_acc"]) for c in pts],
                        color=colors[m], lw=1.2, label=m)
        tgt = [float(r["target_acc"]) for r in rows if r["method"] in SYNCED]
        if tgt:
            ax.axhline(tgt[0], color="k", ls="--", lw=0.8)
        ax.set(xlabel="training time (s, summed steps)", ylabel="test accuracy (%)",
               title=name(pt), ylim=(0, 100))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    ax = axes[len(points)]
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ys = [_get(rows, pt, m) for pt in points]
        ax.bar([j + i * width for j in range(len(points))],
               [float(r["step_median_s"]) * 1e3 if r else 0 for r in ys], width,
               color=colors[m], label=m)
    ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(points))])
    ax.set_xticklabels([name(pt).replace(" workers,", "w") for pt in points], fontsize=7)
    ax.set(ylabel="median step (ms)", title="step time")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Needs root (network namespaces, veth, tc).")
    add_star_args(ap, "stb", "bench/out/train")
    ap.add_argument("--methods", type=lambda s: tuple(s.split(",")), default=METHODS,
                    help=f"comma list of {', '.join(METHODS)} (default all)")
    ap.add_argument("--target", type=float, default=95.0, help="test accuracy (%%) to reach")
    ap.add_argument("--max-steps", type=int, default=120, help="rounds at most (default 120)")
    ap.add_argument("--min-steps", type=int, default=20,
                    help="steps every method runs (for its step time), default 20")
    ap.add_argument("--width", type=int, default=2048,
                    help="MLP hidden width (default 2048: 6.3M parameters)")
    ap.add_argument("--batch", type=int, default=32, help="per rank and step (default 32)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--ratio", type=float, default=0.05,
                    help="top-k: fraction of 256-element blocks each rank sends (default 0.05; "
                         "bench/README.md says why)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mtus", type=lambda s: [int(v) for v in s.split(",")], default=[9000],
                    help="comma list of link MTUs, each a run of its own (default 9000: jumbo "
                         "frames; 65535: no IP fragmentation of SpINA's datagrams)")
    a = ap.parse_args(argv)
    bad = [m for m in a.methods if m not in METHODS]
    if bad:
        ap.error(f"--methods: unknown {bad[0]!r} (choose from {', '.join(METHODS)})")
    if not 1 <= a.min_steps <= a.max_steps:
        ap.error(f"--min-steps: need 1..--max-steps ({a.max_steps}), got {a.min_steps}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.train_bench needs root (network namespaces, veth, tc)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    req = TrainRequest(methods=a.methods, width=a.width, batch=a.batch, lr=a.lr,
                       momentum=a.momentum, ratio=a.ratio, target=a.target,
                       max_steps=a.max_steps, min_steps=a.min_steps, seed=a.seed)
    t0, load0 = time.time(), os.getloadavg()
    rows, curves = [], []
    for mtu in a.mtus:
        for n in a.workers:
            print(f"MTU {mtu}, {n} workers: rates {','.join(a.rates)}, methods "
                  f"{','.join(a.methods)}, target {a.target:g}%, at most {a.max_steps} steps",
                  flush=True)
            r, c = run_workers(n, a.rates, req, f"{a.tag}n{n}", mtu, a.nslots, a.nlanes)
            rows += r
            curves += c
            # keep what is done
            write_csv(rows, os.path.join(a.out, "train_results.csv"), COLUMNS)
            write_csv(curves, os.path.join(a.out, "train_curves.csv"), CURVE_COLUMNS)
    params = rows[0]["params"] if rows else 0
    meta = {
        **run_meta("bench.train_bench", argv, t0, load0),
        "task": f"MLP 1024-{a.width}-{a.width}-10 ({params:,} parameters) on scikit-learn's "
                "digits upsampled to 32x32 (1438 train, 359 test images); SGD lr "
                f"{a.lr:g}, momentum {a.momentum:g}, batch {a.batch} per rank; target "
                f"{a.target:g}% test accuracy, at most {a.max_steps} steps",
        "top-k": f"block top-k at {a.ratio:g} of 256-element blocks, error feedback, DGC "
                 "momentum correction (spina_compressed_hook)",
        "network": "one namespace per worker, tbf on both ends of every link, MTU "
                   f"{', '.join(map(str, a.mtus))}; "
                   + "; ".join(f"{r}: burst {p['burst']} B, latency {p['latency_ms']} ms"
                               for r, p in ((r, tbf_params(r, max(a.mtus))) for r in a.rates)),
        "SpINA": f"block 256, {a.nlanes} blocks per datagram, {a.nslots} slots, compiled "
                 "switch data path",
    }
    with open(os.path.join(a.out, "train_summary.md"), "w") as f:
        f.write(summary(rows, meta))
    if not a.no_plots:
        plot(rows, curves, os.path.join(a.out, "train.png"))
    print(f"wrote {a.out}/train_results.csv, train_curves.csv, train_summary.md"
          + ("" if a.no_plots else ", train.png"))
    print("\n".join(target_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
