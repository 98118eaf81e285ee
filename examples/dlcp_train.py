"""Training with bounded loss: accuracy vs step at loss bounds 0, 1% and 10% (DLCP, docs/dlcp.md).

    python examples/dlcp_train.py             # writes bench/results/dlcp_training/digits.{json,png}
    python examples/dlcp_train.py --steps 5 --out /tmp/x.png   # a smoke run
    python examples/dlcp_train.py --task mlp  # writes bench/results/dlcp_training/mlp.{json,png}

Tasks: `digits`, a 64-64-10 MLP in numpy on scikit-learn's digits; `mlp`, the larger model of
the compression work (examples/train_compressed.py --task mlp: a 5.3M-parameter 512-2048-2048-10
MLP in torch on the synthetic teacher task, SGD with momentum 0.9 and a cosine schedule), the
loss deadline `auto` by default (from the measured round latency).

One process: N data-parallel workers (threads, each with its own SpINA agent and its own copy
of the model) train on scikit-learn's digits through the in-process software
switch. Each step every worker all-reduces its gradient, one call per layer, with the layer's
position (the first layer is needed first by the next forward pass) and the job's policies
`priority_policy: layer`, `loss_tolerant_policy: magnitude`.

Congestion is emulated, not real: the software switch's ingress drops each arriving
loss-tolerant packet with probability --drop (a stand-in for a congested queue; in a
single-switch deployment contributions never queue, see docs/dlcp.md "Switch"). A round
missing a dropped packet completes as PARTIAL after the job's loss deadline; a resend may get
through first. What was actually lost is counted per run (CallStats.blocks_lost).
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import numpy as np

from examples.digits import flat_split
from host_agent.local import LocalCluster
from softswitch.udp import Faults, UdpSwitch
from spina import cli, wire

BOUNDS = (0.0, 0.01, 0.1)


def init(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((64, 64)) * np.sqrt(2 / 64)).astype(np.float32),
            np.zeros(64, np.float32),
            (rng.standard_normal((64, 10)) * np.sqrt(1 / 64)).astype(np.float32),
            np.zeros(10, np.float32)]


def gradients(params, x, y) -> list[np.ndarray]:
    """Cross-entropy gradients of the MLP on one batch (mean over the batch)."""
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0)
    z = h @ w2 + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    dz = p / len(y)
    dh = (dz @ w2.T) * (h > 0)
    return [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]


def accuracy(params, x, y) -> float:
    w1, b1, w2, b2 = params
    return float(((np.maximum(x @ w1 + b1, 0) @ w2 + b2).argmax(1) == y).mean() * 100)


def run(bound: float, args, data) -> dict:
    xtr, ytr, xte, yte = data
    n = args.workers
    congested, dropped = _congestion(args)
    policy = {} if bound == 0 else dict(bounded_loss=bound, loss_deadline=args.deadline,
                                        loss_tolerant_policy="magnitude")
    hist = {"bound": bound, "step": [], "test_acc": [], "blocks_lost": 0, "blocks_sent": 0,
            "partial_rounds": 0, "loss_tolerant_packets": 0}
    params = [init(args.seed) for _ in range(n)]  # every worker's own copy
    t0 = time.perf_counter()
    with UdpSwitch(port=0, faults=Faults(drop_in_match=congested)) as sw:
        with LocalCluster(n, switch=sw, timeout=60, block_size=8, nlanes=args.nlanes, nslots=8,
                          priority_policy="layer", **policy) as c:
            rng = np.random.default_rng(args.seed)
            for step in range(1, args.steps + 1):
                batch = rng.choice(len(ytr), (n, args.batch), replace=False)
                grads = [gradients(params[r], xtr[batch[r]], ytr[batch[r]]) for r in range(n)]
                for layer in range(2):  # (weights, bias) of a layer in one call
                    flats = [np.concatenate([g[2 * layer].ravel(), g[2 * layer + 1]])
                             for g in grads]
                    futs = [c.agents[r].allreduce_async(flats[r], layer=(layer, 2))
                            for r in range(n)]
                    sums = [f.result(timeout=120) for f in futs]
                    _tally(hist, c.agents)
                    for r in range(n):
                        w = params[r][2 * layer]
                        avg = sums[r] / n
                        w -= args.lr * avg[:w.size].reshape(w.shape)
                        params[r][2 * layer + 1] -= args.lr * avg[w.size:]
                if step % args.every == 0 or step == args.steps:
                    hist["step"].append(step)
                    hist["test_acc"].append(accuracy(params[0], xte, yte))
    return _finish(hist, t0, dropped, params)


def _finish(hist: dict, t0: float, dropped: list, params: list) -> dict:
    hist["seconds"] = round(time.perf_counter() - t0, 2)
    hist["dropped_at_switch"] = dropped[0]
    hist["lost_fraction"] = hist["blocks_lost"] / max(1, hist["blocks_sent"])
    hist["weights_identical_across_workers"] = all(
        all(np.array_equal(a, b) for a, b in zip(params[0], p)) for p in params[1:])
    return hist


def _congestion(args):
    """The stand-in for a congested queue: drops arriving loss-tolerant packets w.p. --drop."""
    coin = random.Random(args.seed)
    dropped = [0]

    def congested(h):
        if h.flags & wire.FLAG_LOSS_TOLERANT and coin.random() < args.drop:
            dropped[0] += 1
            return True
        return False
    return congested, dropped


def run_mlp(bound: float, args, data) -> dict:
    """The larger synthetic model (examples/train_compressed.py --task mlp): each worker its own
    torch copy and its own batches; one all-reduce per Linear layer (weight and bias), in
    backward order (last layer first, as DDP's buckets), with its layer position."""
    import torch
    import torch.nn.functional as F

    from train_compressed import MLP
    teacher, xte, yte = data
    n = args.workers
    torch.set_num_threads(1)
    congested, dropped = _congestion(args)
    policy = {} if bound == 0 else dict(bounded_loss=bound, loss_deadline=args.deadline,
                                        loss_tolerant_policy="magnitude")
    hist = {"bound": bound, "step": [], "test_acc": [], "blocks_lost": 0, "blocks_sent": 0,
            "partial_rounds": 0, "loss_tolerant_packets": 0, "loss_deadline_ms": []}
    models, opts, scheds, gens = [], [], [], []
    for r in range(n):
        torch.manual_seed(args.seed)  # every worker starts from the same weights
        models.append(MLP(2048))
        opts.append(torch.optim.SGD(models[-1].parameters(), lr=args.lr, momentum=0.9))
        scheds.append(torch.optim.lr_scheduler.CosineAnnealingLR(opts[-1], args.steps))
        gens.append(torch.Generator().manual_seed(1000 * args.seed + r))
    linears = [[m for m in model if isinstance(m, torch.nn.Linear)] for model in models]
    nl = len(linears[0])
    t0 = time.perf_counter()
    with UdpSwitch(port=0, faults=Faults(drop_in_match=congested)) as sw:
        with LocalCluster(n, switch=sw, timeout=120, block_size=256, nlanes=args.nlanes, nslots=16,
                          priority_policy="layer", **policy) as c:
            for step in range(1, args.steps + 1):
                for r in range(n):
                    x, y = teacher.sample(args.batch, gens[r])
                    opts[r].zero_grad(set_to_none=True)
                    F.cross_entropy(models[r](x), y).backward()
                for i in reversed(range(nl)):  # backward order: the last layer's first
                    flats = [torch.cat([lin[i].weight.grad.reshape(-1), lin[i].bias.grad]).numpy()
                             for lin in linears]
                    futs = [c.agents[r].allreduce_async(flats[r], layer=(i, nl))
                            for r in range(n)]
                    sums = [f.result(timeout=300) for f in futs]
                    _tally(hist, c.agents)
                    if bound:
                        hist["loss_deadline_ms"].append(
                            round(1e3 * c.agents[0].last_stats.loss_deadline, 2))
                    for r in range(n):
                        w = linears[r][i].weight
                        avg = torch.from_numpy(sums[r] / n)
                        w.grad.copy_(avg[:w.numel()].reshape(w.shape))
                        linears[r][i].bias.grad.copy_(avg[w.numel():])
                for r in range(n):
                    opts[r].step()
                    scheds[r].step()
                if step % args.every == 0 or step == args.steps:
                    hist["step"].append(step)
                    with torch.no_grad():
                        acc = (models[0](xte).argmax(1) == yte).float().mean().item() * 100
                    hist["test_acc"].append(acc)
                    print(f"  bound {bound:.0%} step {step}: test accuracy {acc:.2f}%", flush=True)
    params = [[p.detach().numpy() for p in m.parameters()] for m in models]
    if hist["loss_deadline_ms"]:
        d = hist.pop("loss_deadline_ms")
        hist["loss_deadline_ms"] = {"min": min(d), "median": float(np.median(d)), "max": max(d)}
    else:
        hist.pop("loss_deadline_ms")
    return _finish(hist, t0, dropped, params)


def mlp_data():
    """The synthetic task's teacher and its test set (examples/train_compressed.py)."""
    import torch
    sys.path.insert(0, str(ROOT / "examples"))
    from train_compressed import Teacher
    teacher = Teacher()
    xte, yte = teacher.sample(2048, torch.Generator().manual_seed(99))
    return teacher, xte, yte


def plot(runs: list[dict], out: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for h in runs:
        ax.plot(h["step"], h["test_acc"], "-o", ms=2,
                label=f"bound {h['bound']:.0%}: {h['test_acc'][-1]:.2f}% "
                      f"(lost {h['lost_fraction']:.2%} of blocks)")
    ax.set(xlabel="step", ylabel="test accuracy (%)")
    ax.set_title(f"{'MLP on digits' if args.task == 'digits' else '5.3M MLP, synthetic task'}, "
                 f"{args.workers} workers, tolerant packets dropped "
                 f"w.p. {args.drop:g} (emulated)", fontsize=9)
    ax.set_ylim(max(0, min(min(h["test_acc"]) for h in runs) - 5), 100)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def _tally(hist: dict, agents) -> None:
    """Add the last call's loss counters of every rank to `hist` (partial rounds: rank 0's,
    which every rank shares)."""
    for r, a in enumerate(agents):
        s = a.last_stats
        hist["blocks_lost"] += s.blocks_lost
        hist["blocks_sent"] += s.nonzero_blocks
        hist["partial_rounds"] += s.partial_rounds if r == 0 else 0
        hist["loss_tolerant_packets"] += s.loss_tolerant_packets


def parser(prog: str = "examples/dlcp_train.py") -> cli.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=("digits", "mlp"), default="digits",
                    help="digits: 64-64-10 MLP on digits; mlp: the 5.3M-parameter MLP of "
                         "examples/train_compressed.py on its synthetic task")
    ap.add_argument("--workers", type=cli.int_range(2, 8), default=4)
    ap.add_argument("--steps", type=cli.int_range(1, 100000), default=None,
                    help="default: 300 (digits), 200 (mlp)")
    ap.add_argument("--every", type=cli.int_range(1, 100000), default=10,
                    help="test accuracy every this many steps")
    ap.add_argument("--batch", type=cli.int_range(1, 256), default=32, help="per worker")
    ap.add_argument("--lr", type=cli.positive_float, default=None,
                    help="default: 0.5 (digits), 0.05 (mlp, as examples/train_compressed.py)")
    ap.add_argument("--drop", type=cli.unit_interval, default=0.5,
                    help="probability that an arriving loss-tolerant packet is dropped")
    ap.add_argument("--deadline", type=cli.seconds_or_auto, default=None, metavar="SECONDS|auto",
                    help="the job's loss_deadline: seconds, or 'auto' (twice the measured round "
                         "latency, 2-50 ms); default 0.005 (digits), auto (mlp)")
    ap.add_argument("--nlanes", type=cli.int_range(1, wire.MAX_LANES), default=None,
                    help="blocks per packet: default 1 (digits, blocks of 8), 8 (mlp, blocks of "
                         "256, as bench/dlcp_bench/: loss-tolerant packets are whole packets, "
                         "so at 56 a 1%% bound marks almost none)")
    ap.add_argument("--seed", type=cli.int_range(0), default=0)
    ap.add_argument("--out", type=cli.output_file,
                    help="default bench/results/dlcp_training/<task>.png (JSON beside it)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    mlp = args.task == "mlp"
    args.steps = args.steps or (200 if mlp else 300)
    args.lr = args.lr or (0.05 if mlp else 0.5)
    args.deadline = args.deadline or ("auto" if mlp else 0.005)
    args.nlanes = args.nlanes or (8 if mlp else 1)
    args.out = args.out or str(ROOT / "bench" / "results" / "dlcp_training" / f"{args.task}.png")
    if not 0 <= args.drop <= 1:
        return cli.fail(ap.prog, f"--drop: {args.drop} is not a probability in [0, 1]")
    data = mlp_data() if mlp else flat_split(args.seed)
    runs = []
    for bound in BOUNDS:
        h = (run_mlp if mlp else run)(bound, args, data)
        runs.append(h)
        print(f"bound {bound:.0%}: final test accuracy {h['test_acc'][-1]:.2f}%, lost "
              f"{h['blocks_lost']} of {h['blocks_sent']} blocks ({h['lost_fraction']:.3%}), "
              f"{h['partial_rounds']} partial rounds, {h['seconds']} s, weights identical: "
              f"{h['weights_identical_across_workers']}", flush=True)
    out = Path(args.out)
    plot(runs, out, args)
    summary = {"command": "python examples/dlcp_train.py " + " ".join(argv or sys.argv[1:]),
               "args": {k: v for k, v in vars(args).items() if k != "out"},
               "congestion": "emulated: the software switch drops each arriving loss-tolerant "
                             f"packet with probability {args.drop}",
               "final_test_acc": {f"{h['bound']:g}": h["test_acc"][-1] for h in runs},
               "runs": runs}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out} and {out.with_suffix('.json')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
