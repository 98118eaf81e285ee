"""Parameter-server training with stragglers: BSP, SSP, GSSP and GSSP+GDTopK compared.

    python examples/ps_train.py --task digits  --workers 4 --stragglers 2 --slowdown 3 --seconds 60
    python examples/ps_train.py --task seq2seq --workers 4 --stragglers 2 --slowdown 3 --seconds 90

Each policy trains the same model from the same initial weights for the same wall-clock
budget on a LocalPS (2 shards and a coordinator, gRPC on loopback), workers as threads
(ps/train.py). The last `--stragglers` workers compute `--slowdown` times slower and push
over an uplink `--slowdown` times slower than the others' `--uplink-mbps`; `--slow-midrun W@K`
slows worker W from its iteration K on. Writes OUT.json (every number, including the load
average) and OUT.png (test accuracy over time; bytes pushed per worker; iterations per
second per worker).

Tasks: `digits` is LeNet-5 on scikit-learn's digits (examples/train_digits.py's model and
data, 32 images per step); `seq2seq` is a GRU encoder-decoder with dot-product attention
that learns to reverse sequences of digits (synthetic, generated per step), scored by the
per-token accuracy of greedy decoding on 512 held-out sequences.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ps.config import PolicyConfig
from ps.train import Straggler, train
from spina import cli

POLICIES = {
    "bsp": dict(policy="bsp"),
    "asp": dict(policy="asp"),
    "ssp": dict(policy="ssp", staleness=3),
    "gssp": dict(policy="gssp", staleness=3, ngroups=2),
    "gssp+gdtopk": dict(policy="gssp", staleness=3, ngroups=2, gdtopk=True, min_ratio=0.05),
}


def _worker_at(text: str) -> tuple[int, int]:
    """W@K: worker W from its iteration K on."""
    w, sep, k = text.partition("@")
    if not (sep and w.isdigit() and k.isdigit()):
        raise ValueError(f"{text!r}: expected W@K, a worker and an iteration, e.g. 0@50")
    return int(w), int(k)


class Digits:
    """LeNet-5 on digits: each worker draws its batches from its own interleaved shard."""

    def __init__(self, nworkers: int, batch: int = 32, seed: int = 0):
        from train_digits import LeNet5, load_data
        self.net = LeNet5
        self.xtr, self.ytr, self.xte, self.yte = load_data(seed)
        self.n, self.bs, self.seed = nworkers, batch, seed

    def make_model(self):
        return self.net()

    def batch(self, w, step):
        mine = np.arange(w, len(self.ytr), self.n)
        idx = np.random.default_rng((self.seed, w, step)).choice(mine, self.bs, replace=False)
        return self.xtr[idx], self.ytr[idx]

    def loss(self, model, b):
        return F.cross_entropy(model(b[0]), b[1])

    def accuracy(self, model):
        with torch.no_grad():
            return (model(self.xte).argmax(1) == self.yte).float().mean().item() * 100


class Seq2Seq(nn.Module):
    """GRU encoder, GRU decoder with dot-product (Luong) attention over the encoder states."""

    def __init__(self, vocab: int, hidden: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab + 1, hidden)  # + BOS
        self.enc = nn.GRU(hidden, hidden, batch_first=True)
        self.dec = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(2 * hidden, vocab)
        self.bos = vocab

    def _attend(self, h, mem):
        a = torch.softmax(h @ mem.transpose(1, 2), dim=-1)  # (B, T_out, T_in)
        return self.out(torch.cat([h, a @ mem], -1))

    def forward(self, src, tgt):  # teacher forcing
        mem, hn = self.enc(self.emb(src))
        inp = torch.cat([torch.full_like(tgt[:, :1], self.bos), tgt[:, :-1]], 1)
        h, _ = self.dec(self.emb(inp), hn)
        return self._attend(h, mem)

    @torch.no_grad()
    def greedy(self, src):
        mem, hn = self.enc(self.emb(src))
        tok, out = torch.full_like(src[:, :1], self.bos), []
        for _ in range(src.shape[1]):
            h, hn = self.dec(self.emb(tok), hn)
            tok = self._attend(h, mem).argmax(-1)
            out.append(tok)
        return torch.cat(out, 1)


class Reverse:
    """Synthetic seq2seq: reverse a sequence of `length` digits."""

    def __init__(self, nworkers: int, batch: int = 32, length: int = 8, vocab: int = 10,
                 seed: int = 0):
        self.bs, self.L, self.V, self.seed = batch, length, vocab, seed
        g = torch.Generator().manual_seed(10 ** 6 + seed)
        self.test = torch.randint(0, vocab, (512, length), generator=g)

    def make_model(self):
        return Seq2Seq(self.V)

    def batch(self, w, step):
        g = torch.Generator().manual_seed(hash((self.seed, w, step)) & 0x7FFFFFFF)
        src = torch.randint(0, self.V, (self.bs, self.L), generator=g)
        return src, src.flip(1)

    def loss(self, model, b):
        return F.cross_entropy(model(*b).reshape(-1, self.V), b[1].reshape(-1))

    def accuracy(self, model):
        return (model.greedy(self.test) == self.test.flip(1)).float().mean().item() * 100


TASKS = {"digits": Digits, "seq2seq": Reverse}


def time_to(evals, target):
    """Seconds until the test accuracy first reached `target` (None: never)."""
    return next((t for t, acc, _ in evals if acc >= target), None)


def summarize(runs: dict) -> dict:
    """Time-to-accuracy against BSP's final accuracy (mean of its last 3 evaluations) - 1."""
    out = {}
    base = runs.get("bsp")
    target = float(np.mean([a for _, a, _ in base["evals"][-3:]])) - 1.0 if base else None
    for name, r in runs.items():
        tta = time_to(r["evals"], target) if target is not None else None
        rate = [s / max(r["seconds"], 1e-9) for s in r["steps"]]
        out[name] = {"final_acc": round(float(np.mean([a for _, a, _ in r["evals"][-3:]])), 2),
                     "time_to_target_s": tta,
                     "speedup_vs_bsp": (round(base_tta / tta, 2) if target is not None and tta
                                        and (base_tta := time_to(base["evals"], target)) else None),
                     "mb_pushed": round(sum(r["bytes_pushed"]) / 1e6, 1),
                     "mb_pulled": round(sum(r["bytes_pulled"]) / 1e6, 1),
                     "iters_per_s": [round(x, 2) for x in rate],
                     "mean_ratio": r["mean_ratio"], "groups": r["groups"]}
    if target is not None:
        out["target_acc"] = round(target, 2)
    return out


def markdown_table(summary: dict, runs: dict) -> str:
    """The docs/ps.md table of one experiment."""
    rows = ["| policy | final acc (%) | s to BSP final - 1 pt | speedup vs BSP | MB pushed "
            "| MB pulled | iterations/s per worker | mean top-k ratio per worker "
            "| load avg (1 min, end) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, m in summary.items():
        if name == "target_acc":
            continue
        ratio = " ".join(f"{x:.2f}" for x in m["mean_ratio"] if x is not None)
        rows.append(f"| {name} | {m['final_acc']:.2f} | {m['time_to_target_s']} "
                    f"| {m['speedup_vs_bsp']} | {m['mb_pushed']} | {m['mb_pulled']} "
                    f"| {' '.join(map(str, m['iters_per_s']))} "
                    f"| {ratio} | {runs[name]['loadavg_after'][0]:.1f} |")
    return "\n".join(rows)


def plot(runs: dict, summary: dict, out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 4.2))
    for name, r in runs.items():
        ev = np.array(r["evals"])
        a1.plot(ev[:, 0], ev[:, 1], label=f"{name}: {summary[name]['final_acc']:.1f}%")
    if "target_acc" in summary:
        a1.axhline(summary["target_acc"], color="grey", ls=":", lw=1, label="BSP final - 1 point")
    a1.set(xlabel="wall-clock seconds", ylabel="test accuracy (%)", title=title)
    names = list(runs)
    nw = runs[names[0]]["nworkers"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        x = np.arange(nw) + i * width
        a2.bar(x, np.array(runs[name]["bytes_pushed"]) / 1e6, width, label=name)
        a3.bar(x, summary[name]["iters_per_s"], width, label=name)
    a2.set(xlabel="worker", ylabel="MB pushed", title="bytes each worker pushed")
    a3.set(xlabel="worker", ylabel="iterations / s", title="iteration rate per worker")
    for a in (a1, a2, a3):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def parser(prog: str = "examples/ps_train.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="digits")
    ap.add_argument("--policies", default="bsp,ssp,gssp,gssp+gdtopk", type=cli.names(POLICIES),
                    help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("--workers", type=cli.int_range(1), default=4)
    ap.add_argument("--stragglers", type=cli.int_range(0), default=2,
                    help="the last N workers are slow")
    ap.add_argument("--slowdown", type=cli.positive_float, default=3.0)
    ap.add_argument("--slow-midrun", default=None,
                    type=cli.parsed_by(_worker_at, "W@K", bad=("x", "1@", "-1@5")), metavar="W@K",
                    help="also slow worker W (a fast one) by --slowdown from its iteration K on")
    ap.add_argument("--uplink-mbps", type=cli.positive_float, default=400.0,
                    help="emulated uplink of a fast worker")
    ap.add_argument("--seconds", type=cli.positive_float, default=60.0,
                    help="wall-clock budget per policy")
    ap.add_argument("--steps", type=cli.int_range(1), default=10 ** 9,
                    help="at most this many iterations per worker")
    ap.add_argument("--lr", type=cli.positive_float, default=None,
                    help="server SGD step (default per task)")
    ap.add_argument("--eval-every", type=cli.positive_float, default=1.0)
    ap.add_argument("--seed", type=cli.int_range(0), default=0)
    ap.add_argument("--out", default=None, type=cli.output_file,
                    help="OUT.json/OUT.png (default bench/results/ps/<task>)")
    ap.add_argument("--table-from", metavar="JSON", type=cli.input_file,
                    help="only print the markdown table of an earlier run")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.table_from:
        d = json.loads(Path(args.table_from).read_text())
        print(markdown_table(d["summary"], d["runs"]))
        return

    torch.set_num_threads(1)
    task = TASKS[args.task](args.workers, seed=args.seed)
    lr = args.lr or {"digits": 0.1, "seq2seq": 1.0}[args.task]
    slow = [Straggler(w, args.slowdown, 0, args.uplink_mbps / args.slowdown)
            for w in range(args.workers - args.stragglers, args.workers)]
    if args.slow_midrun:
        w, k = args.slow_midrun
        slow.append(Straggler(w, args.slowdown, k, args.uplink_mbps / args.slowdown))
    runs = {}
    for name in args.policies:
        policy = PolicyConfig(lr=lr, **POLICIES[name]).validate()
        r = train(task, policy, args.workers, args.seconds, args.steps, tuple(slow),
                  args.uplink_mbps, eval_every=args.eval_every, seed=args.seed)
        r["seconds"] = r["evals"][-1][0]
        runs[name] = r
        print(f"[{name}] final acc {r['final_acc']:.2f}% after {r['seconds']:.1f} s, "
              f"steps {r['steps']}, MB pushed {sum(r['bytes_pushed']) / 1e6:.1f}, "
              f"groups {r['groups']}, load {r['loadavg_after'][0]:.1f}", flush=True)
    summary = summarize(runs)
    out = Path(args.out or ROOT / "bench" / "results" / "ps" / args.task)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python examples/ps_train.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out.with_suffix(".json").write_text(json.dumps(
        {"command": cmd, "args": vars(args), "summary": summary, "runs": runs}, indent=1))
    plot(runs, summary, out.with_suffix(".png"),
         f"{args.task}: {args.workers} workers, {args.stragglers} at {args.slowdown:g}x slower")
    print(markdown_table(summary, runs))


if __name__ == "__main__":
    main()
