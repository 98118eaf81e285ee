"""Gradient compression riding SpINA: accuracy vs bytes vs time, per method and ratio.

    torchrun --standalone --nproc_per_node 4 examples/train_compressed.py --task digits
    torchrun --standalone --nproc_per_node 4 examples/train_compressed.py --task mlp
    torchrun --standalone --nproc_per_node 4 examples/train_compressed.py --task largebatch

Tasks (data ship or are generated; nothing is downloaded):
  digits      LeNet-5 on scikit-learn's digits (as examples/train_digits.py), SGD, --epochs.
  digits-wide the same data and schedule with WideLeNet (5.4M parameters: 32/64 channels,
              1600-2048-1024-10), a second model of at least 5M parameters on real data.
  mlp         a 5.3M-parameter MLP (512-2048-2048-10) on a synthetic task: inputs N(0, 1),
              labels from a fixed random teacher network; SGD, --steps.
  largebatch  a 1.6M-parameter MLP (512-1024-1024-10) on the same task with 8x the batch and
              LAMB, the layer-wise optimiser whose trust ratio top-k compression disturbs.

Runs (--runs, comma-separated): `dense-gloo` (DDP's own all-reduce), `dense-spina` (the
SpINA hook, no compression), `<method>@<ratio>` (compressed, through SpINA:
spina_compressed_hook), `gloo-<method>@<ratio>` (the same compressor over gloo all_gather:
the control), with method topk, randomk, scaled or losscomp. With SGD, compressed runs move
the momentum into the compressor (DGC momentum correction) and the optimiser runs without.
Flags after a run's name (LAMB runs; see parse_run): `+mask` makes LAMB leave its moments
untouched where no rank sent; `+dense<W>` sends the first W steps dense through SpINA, then
compresses; `+freeze<W>` freezes LAMB's second moment after W steps and `+trust<W>` each
layer's trust ratio (1-bit LAMB), e.g. `topk@0.01+dense10+freeze10+trust10`.
`:FIELD=VALUE` after a compressed run's name sets one of LossComp's knobs (CompressionConfig's
ratio_min, ratio_max, ratio_step, trend_threshold, temperature, credit_weight, loss_window),
e.g. `losscomp@0.01:ratio_max=0.01:trend_threshold=0.01`.

Every run of a seed (--seeds 0,1,2) starts from that seed: the model's weights, the batches,
the digits' split and the compressor's random stream (random-k, LossComp). Rank 0 writes
bench/results/compression/<task>.json (all numbers, per run and seed) and
bench/results/compression/<task>.png (accuracy over training; accuracy vs bytes per step;
time per step; with several seeds the mean and min..max) and prints a table: the mean over
seeds, its min..max and each seed's value.
`--merge A.json B.json --out C.png` merges earlier results (one command per seed, say) into
C.json and C.png and prints the table. Bytes are per rank and step: SpINA as its agent counted
them (UDP payloads), gloo computed for a ring (all-reduce 2 (N-1)/N x the tensor, all-gather
(N-1) x the message).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from host_agent.assignment import JOB_FILE_ENV, agent_from_env
from host_agent.compression import CompressionConfig, make_compressor
from host_agent.hooks import (
    CompressionHookState,
    SpinaHookState,
    gloo_compressed_hook,
    spina_allreduce_hook,
    spina_compressed_hook,
)
from host_agent.launch import finish_shared_job, shared_job_file
from spina import cli
from train_digits import LeNet5, WideLeNet, load_data

TASKS = {  # default runs, optimiser and schedule per task
    "digits": dict(runs="dense-gloo,dense-spina,topk@0.01,topk@0.001,randomk@0.01,losscomp@0.01,"
                        "gloo-topk@0.01", opt="sgd", lr=0.02, batch=32),
    "digits-wide": dict(runs="dense-gloo,dense-spina,topk@0.01", opt="sgd", lr=0.02, batch=32),
    "mlp": dict(runs="dense-gloo,dense-spina,topk@0.01,topk@0.001,randomk@0.01,losscomp@0.01,"
                     "gloo-topk@0.01", opt="sgd", lr=0.05, batch=32),
    "largebatch": dict(runs="dense-gloo,topk@0.01,scaled@0.01+mask,topk@0.01+mask,scaled@0.01",
                       opt="lamb", lr=0.01, batch=256),
}


class MLP(nn.Sequential):
    """inputs-width-...-width-classes with `depth` hidden width x width layers."""

    def __init__(self, width: int, inputs: int = 512, classes: int = 10, depth: int = 1):
        hidden = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
        super().__init__(nn.Linear(inputs, width), nn.ReLU(), *hidden, nn.Linear(width, classes))


class Teacher:
    """Synthetic classification: x ~ N(0, I_512), label = argmax of a fixed random 2-layer net."""

    def __init__(self, seed: int = 1234, inputs: int = 512, hidden: int = 64, classes: int = 10):
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(inputs, hidden, generator=g) / math.sqrt(inputs)
        self.w2 = torch.randn(hidden, classes, generator=g) / math.sqrt(hidden)
        self.inputs = inputs

    def sample(self, n: int, gen: torch.Generator):
        x = torch.randn(n, self.inputs, generator=gen)
        return x, (torch.tanh(x @ self.w1) @ self.w2).argmax(1)


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020): Adam's direction, scaled per layer by ||w|| / ||direction||.

    mask_unsent: elements whose gradient is exactly zero (no rank sent their block) keep their
        moments and do not move, so that compression's zeros do not decay LAMB's state.
    freeze_after: after this many steps the second moment v stays as it is (1-bit Adam /
        1-bit LAMB: a variance learnt in a warm-up, then frozen, makes the update linear in
        the gradient, so that error feedback's delayed blocks add up to what they would have
        moved; a live v turns each delayed block into a full-size step and decays between its
        visits). Its bias correction stays that of the step it froze at. None: never.
    trust_after: after this many steps each layer's trust ratio is the mean of its trust
        ratios over those steps (1-bit LAMB's frozen LAMB coefficient): a live ratio
        ||w|| / ||update|| gives a layer the same step norm whether its update holds all its
        elements or the few blocks compression delivered, which is again not linear in the
        gradient. None: never.
    """

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                 mask_unsent=False, freeze_after=None, trust_after=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.mask_unsent = mask_unsent
        self.freeze_after = freeze_after
        self.trust_after = trust_after

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, st = p.grad, self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                m, v = st["m"], st["v"]
                learn_v = self.freeze_after is None or st["t"] <= self.freeze_after
                if learn_v:
                    st["tv"] = st["t"]  # v's bias correction: the step v last learnt at
                if self.mask_unsent:
                    live = g != 0
                    m.copy_(torch.where(live, b1 * m + (1 - b1) * g, m))
                    if learn_v:
                        v.copy_(torch.where(live, b2 * v + (1 - b2) * g * g, v))
                else:
                    m.mul_(b1).add_(g, alpha=1 - b1)
                    if learn_v:
                        v.mul_(b2).addcmul_(g, g, value=1 - b2)
                r = (m / (1 - b1 ** st["t"])) / ((v / (1 - b2 ** st["tv"])).sqrt() + group["eps"])
                r.add_(p, alpha=group["weight_decay"])
                if self.mask_unsent:
                    r.mul_(live)
                if self.trust_after is None or st["t"] <= self.trust_after:
                    wn, rn = p.norm().item(), r.norm().item()
                    trust = wn / rn if wn > 0 and rn > 0 else 1.0
                    st["trust_sum"] = st.get("trust_sum", 0.0) + trust
                else:
                    trust = st["trust_sum"] / self.trust_after
                p.sub_(r, alpha=group["lr"] * trust)


KNOBS = {"ratio_min": float, "ratio_max": float, "ratio_step": float, "trend_threshold": float,
         "temperature": float, "credit_weight": float, "loss_window": int}  # `:FIELD=VALUE`


def usage_error(msg: str) -> None:
    """Bad input on the command line: one line naming it, exit status 2."""
    raise SystemExit(cli.fail("examples/train_compressed.py", msg))


RUN_FLAGS = ("mask", "dense<W>", "freeze<W>", "trust<W>")


def parse_run(name: str) -> dict:
    """'gloo-topk@0.01+mask' -> transport gloo, method topk, ratio 0.01, mask True;
    'losscomp@0.01:ratio_max=0.01' -> knobs {'ratio_max': 0.01}.

    Flags after the name, each '+FLAG' (LAMB runs): `mask` (LAMB leaves the moments of unsent
    elements untouched), `dense<W>` (the first W steps dense through SpINA, then compressed),
    `freeze<W>` (LAMB's second moment frozen after W steps), `trust<W>` (each layer's trust
    ratio, after W steps, the mean of its first W). Knobs after the flags, each ':FIELD=VALUE'.
    Anything wrong: ValueError naming --runs, the run and the flag or field.
    """
    head, *knob_specs = name.split(":")
    base, *flags = head.split("+")
    where = f"run {name!r}"
    run = dict(name=name, mask=False, dense_steps=0, freeze_after=None, trust_after=None,
               knobs={})
    for flag in flags:
        m = re.fullmatch(r"(mask|dense|freeze|trust)(\d*)", flag)
        if m is None or (m[1] == "mask") != (m[2] == "") or (m[2] and int(m[2]) < 1):
            raise ValueError(f"{where}: flag '+{flag}': expected one of "
                             + ", ".join("+" + f for f in RUN_FLAGS) + ", W >= 1")
        if m[1] == "mask":
            run["mask"] = True
        else:
            run[{"dense": "dense_steps", "freeze": "freeze_after",
                 "trust": "trust_after"}[m[1]]] = int(m[2])
    if base in ("dense-gloo", "dense-spina"):
        if run["dense_steps"]:
            raise ValueError(f"{where}: flag '+dense': compressed runs only")
        if knob_specs:
            raise ValueError(f"{where}: only a compressed run takes :FIELD=VALUE")
        return dict(run, transport=base.split("-")[1], method="none", ratio=1.0)
    transport = "gloo" if base.startswith("gloo-") else "spina"
    method, _, ratio = base.removeprefix("gloo-").partition("@")
    if run["dense_steps"] and transport != "spina":
        raise ValueError(f"{where}: flag '+dense': compressed SpINA runs only")
    for spec in knob_specs:
        field, _, value = spec.partition("=")
        if field not in KNOBS:
            raise ValueError(f"{where}: unknown field {field!r}; choose one of "
                             f"{', '.join(KNOBS)}")
        try:
            run["knobs"][field] = KNOBS[field](value)
        except ValueError:
            raise ValueError(f"{where}: field {field!r} needs a number, got {value!r}") from None
    try:
        ratio = float(ratio or 0.01)
    except ValueError:
        raise ValueError(f"{where}: the ratio after @ must be a number") from None
    CompressionConfig(method=method, ratio=ratio, **run["knobs"]).validate(where)
    return dict(run, transport=transport, method=method, ratio=ratio)


class DenseThenCompressed:
    """Hook state: the first `dense_steps` steps dense through SpINA, the rest compressed.

    1-bit Adam's warm-up: the uncompressed steps let LAMB learn its second moment (and the
    model leave its first steps) before compression starts. Counters: each phase's state.
    """

    def __init__(self, dense: SpinaHookState, compressed: CompressionHookState,
                 dense_steps: int):
        self.dense, self.compressed, self.dense_steps = dense, compressed, dense_steps
        self.step = 0  # completed steps (the last bucket of each)


def dense_then_compressed_hook(state: DenseThenCompressed, bucket):
    if state.step < state.dense_steps:
        fut = spina_allreduce_hook(state.dense, bucket)
    else:
        fut = spina_compressed_hook(state.compressed, bucket)
    if bucket.is_last():
        state.step += 1
    return fut


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; anything else is a ValueError (--seeds' type names it)."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"{text!r}: expected distinct non-negative integers")
    return seeds


def _runs(text: str) -> str:
    """--runs, each run checked by parse_run (its ValueError names the run and the flag)."""
    for name in text.split(","):
        parse_run(name)
    return text


class Task:
    """Model, data and evaluation of one task at one rank."""

    def __init__(self, task: str, args, rank: int, world: int):
        self.task, self.args, self.rank, self.world = task, args, rank, world
        if task.startswith("digits"):
            self.xtr, self.ytr, self.xte, self.yte = load_data(args.seed)
            self.steps_per_epoch = len(self.ytr) // (world * args.batch)
            self.steps = args.epochs * self.steps_per_epoch
            self.eval_every = self.steps_per_epoch
        else:
            self.teacher = Teacher()
            self.xte, self.yte = self.teacher.sample(2048, torch.Generator().manual_seed(99))
            self.steps = args.steps
            self.eval_every = max(1, args.steps // 5)

    def model(self) -> nn.Module:
        torch.manual_seed(self.args.seed)
        if self.task.startswith("digits"):
            return WideLeNet() if self.task == "digits-wide" else LeNet5()
        return MLP(2048 if self.task == "mlp" else 1024)

    def batches(self):
        """This rank's batches, the same sequence for every run."""
        a = self.args
        if self.task.startswith("digits"):
            for step in range(self.steps):
                epoch, s = divmod(step, self.steps_per_epoch)
                g = torch.Generator().manual_seed(a.seed + epoch)
                perm = torch.randperm(len(self.ytr), generator=g)
                idx = perm[self.rank::self.world][s * a.batch:(s + 1) * a.batch]
                yield self.xtr[idx], self.ytr[idx]
        else:
            gen = torch.Generator().manual_seed(1000 * a.seed + self.rank)
            for _ in range(self.steps):
                yield self.teacher.sample(a.batch, gen)

    def accuracy(self, model) -> float:
        model.eval()
        with torch.no_grad():
            acc = (model(self.xte).argmax(1) == self.yte).float().mean().item() * 100
        model.train()
        return acc


def compute_seconds(task: Task, nsteps: int = 5) -> float:
    """Forward + backward of one step without any communication (median of a few)."""
    model = task.model()
    times = []
    for (x, y), _ in zip(task.batches(), range(nsteps + 1)):
        t0 = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))  # the first step pays for allocations


def train(run: dict, task: Task, args, agent) -> dict:
    rank, world = task.rank, task.world
    sgd = args.opt == "sgd"
    model = DDP(task.model())
    nparams = sum(p.numel() for p in model.parameters())
    if sgd:  # compressed runs: the momentum lives in the compressor (DGC momentum correction)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr,
                              momentum=args.momentum if run["method"] == "none" else 0.0)
    else:
        opt = Lamb(model.parameters(), lr=args.lr, mask_unsent=run["mask"],
                   freeze_after=run["freeze_after"], trust_after=run["trust_after"])
    state = phased = None
    if run["method"] == "none":
        if run["transport"] == "spina":
            state = SpinaHookState(agent)
            model.register_comm_hook(state, spina_allreduce_hook)
    else:
        fields = dict(method=run["method"], ratio=run["ratio"],
                      momentum=args.momentum if sgd else 0.0,
                      momentum_masking=not args.no_momentum_masking,
                      warmup_steps=args.warmup_steps, warmup_ratio=max(run["ratio"], 0.25),
                      loss_window=args.loss_window, seed=args.seed)
        comp = make_compressor(block_size=agent.job.block_size, **{**fields, **run["knobs"]})
        state = CompressionHookState(comp, agent if run["transport"] == "spina" else None,
                                     optimizer=opt)  # refuses a double momentum
        if run["dense_steps"]:
            phased = DenseThenCompressed(SpinaHookState(agent), state, run["dense_steps"])
            model.register_comm_hook(phased, dense_then_compressed_hook)
        else:
            model.register_comm_hook(state, spina_compressed_hook if run["transport"] == "spina"
                                     else gloo_compressed_hook)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, task.steps)
    hist = dict(run, seed=args.seed, params=nparams, step_loss=[], eval_step=[], test_acc=[],
                step_seconds=[])
    for step, (x, y) in enumerate(task.batches()):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hist["step_seconds"].append(time.perf_counter() - t0)
        sched.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)  # the log's (and LossComp's) loss: the same on every rank
        hist["step_loss"].append(avg.item() / world)
        if isinstance(state, CompressionHookState):
            state.observe_loss(hist["step_loss"][-1])
        if rank == 0 and ((step + 1) % task.eval_every == 0 or step + 1 == task.steps):
            # Rank 0 only: the weights are the same on every rank (checked below).
            hist["eval_step"].append(step + 1)
            hist["test_acc"].append(task.accuracy(model.module))
            if rank == 0:
                print(f"[seed {args.seed}] [{run['name']}] step {step + 1} loss "
                      f"{hist['step_loss'][-1]:.4f} test acc {hist['test_acc'][-1]:.2f}%",
                      flush=True)
    steps = task.steps
    dense_bytes = 2 * (world - 1) * nparams * 4 / world  # ring all-reduce, per rank and step
    if state is None:
        bytes_per_step = dense_bytes
    else:
        bytes_per_step = (state.bytes_sent + (phased.dense.bytes_sent if run["dense_steps"]
                                              else 0)) / steps
    hist.update(bytes_per_step=bytes_per_step, ring_dense_bytes_per_step=dense_bytes,
                seconds_per_step=float(np.median(hist["step_seconds"])),
                final_test_acc=hist["test_acc"][-1] if hist["test_acc"] else None)
    if isinstance(state, CompressionHookState):
        # the dense steps sent every block: as many per step as the compressed steps had
        dense = run["dense_steps"] * state.blocks_total / max(1, steps - run["dense_steps"])
        hist.update(blocks_fraction=(state.blocks_sent + dense) / (state.blocks_total + dense),
                    compress_seconds_per_step=state.compress_seconds / steps)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    hist["weights_identical_across_ranks"] = all(torch.equal(g, gathered[0]) for g in gathered)
    # Every rank's view of bytes and time, averaged (the report is per rank and step).
    nums = torch.tensor([hist["bytes_per_step"], hist["seconds_per_step"],
                         hist.get("compress_seconds_per_step", 0.0)], dtype=torch.float64)
    dist.all_reduce(nums)
    hist["bytes_per_step"], hist["seconds_per_step"], cs = (nums / world).tolist()
    if "compress_seconds_per_step" in hist:
        hist["compress_seconds_per_step"] = cs
    return hist


def by_run(runs: list[dict]) -> dict[str, list[dict]]:
    """Run name -> its results, one per seed, in the order first seen."""
    by = {}
    for h in runs:
        by.setdefault(h["name"], []).append(h)
    return by


def merge_results(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """The runs of earlier JSONs, one per (run, seed): a pair measured twice, the first one
    counts. Returns them and the files' summaries. JSONs from before --seeds carry the seed
    in their args only."""
    runs, seen, summaries = [], set(), []
    for path in paths:
        summary = json.loads(Path(path).read_text())
        summaries.append(summary)
        for h in summary["runs"]:
            h.setdefault("seed", summary.get("args", {}).get("seed", 0))
            if (h["name"], h["seed"]) not in seen:
                seen.add((h["name"], h["seed"]))
                runs.append(h)
    return runs, summaries


def _span(values, fmt: str = "{:.2f}") -> str:
    """'mean (min..max)', or the one value (one seed, or the same at every seed)."""
    if min(values) == max(values):
        return fmt.format(values[0])
    return f"{fmt.format(np.mean(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def summarise(runs: list[dict]) -> list[str]:
    """A markdown row per run: accuracy as the mean over seeds (min..max) and per seed, the
    difference to dense gloo's accuracy at the same seed, and the means of bytes and times."""
    by = by_run(runs)
    ref = {h["seed"]: h["final_test_acc"] for h in by.get("dense-gloo", [])}
    spina = [h["bytes_per_step"] for h in by.get("dense-spina", [])]
    lines = ["| run | seeds | test acc (%): mean (min..max) | per seed | vs dense gloo at "
             "the same seed | blocks sent | bytes/step/rank | vs dense SpINA | vs gloo ring | "
             "ms/step | compression ms/step |", "|---" * 11 + "|"]
    for name, hs in by.items():
        acc = [h["final_test_acc"] for h in hs]
        diff = [h["final_test_acc"] - ref[h["seed"]] for h in hs if h["seed"] in ref]
        nbytes = np.mean([h["bytes_per_step"] for h in hs])
        blocks = [h["blocks_fraction"] * 100 for h in hs if "blocks_fraction" in h]
        comp = [h["compress_seconds_per_step"] * 1e3 for h in hs
                if "compress_seconds_per_step" in h]
        lines.append(
            f"| {name} | {','.join(str(h['seed']) for h in hs)} | {_span(acc)} | "
            f"{' / '.join(f'{a:.2f}' for a in acc)} | "
            f"{_span(diff, '{:+.2f}') if diff else '-'} | "
            f"{_span(blocks) + '%' if blocks else 'all'} | {nbytes / 1e3:,.1f} kB | "
            f"{f'{nbytes / np.mean(spina):.2%}' if spina else '-'} | "
            f"{nbytes / hs[0]['ring_dense_bytes_per_step']:.2%} | "
            f"{np.mean([h['seconds_per_step'] for h in hs]) * 1e3:.1f} | "
            f"{f'{np.mean(comp):.2f}' if comp else '-'} |")
    return lines


def plot(summary: dict, out: Path) -> None:
    """Accuracy over training (the mean over seeds), final accuracy vs bytes (mean, min..max
    over seeds) and time per step (mean over seeds), one entry per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = by_run(summary["runs"])
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 4.5))
    for name, hs in by.items():
        curve = np.mean([h["test_acc"] for h in hs], axis=0)
        a1.plot(hs[0]["eval_step"], curve, "-o", ms=2, lw=1, label=name)
        acc = np.array([h["final_test_acc"] for h in hs])
        nbytes = np.mean([h["bytes_per_step"] for h in hs])
        a2.errorbar(nbytes, acc.mean(), yerr=[[acc.mean() - acc.min()], [acc.max() - acc.mean()]],
                    fmt="o", ms=5, capsize=3)
        a2.annotate(name, (nbytes, acc.mean()), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    names = list(by)
    a3.barh(names, [np.mean([h["seconds_per_step"] for h in by[n]]) * 1000 for n in names],
            color="tab:blue", label="step")
    a3.barh(names, [np.mean([h.get("compress_seconds_per_step", 0) for h in by[n]]) * 1000
                    for n in names], color="tab:orange", label="of which compression")
    seeds = sorted({h["seed"] for h in summary["runs"]})
    a1.set(xlabel="step", ylabel="test accuracy (%), mean over seeds",
           title=f"{summary['task']}: {summary['world_size']} workers, seeds "
                 f"{','.join(map(str, seeds))}")
    a2.set(xscale="log", xlabel="bytes sent per rank and step (log)",
           ylabel="final test accuracy (%): mean, min..max", title="accuracy vs bytes")
    a3.set(xlabel="median time per step (ms), mean over seeds", title="time per step")
    a1.legend(fontsize=7)
    a3.legend(fontsize=7)
    a3.invert_yaxis()
    for a in (a1, a2, a3):
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def merge(paths: list[str], out: str | None) -> None:
    """No training: merge earlier JSONs into out's JSON and PNG, print the table."""
    if not out:
        usage_error("--merge needs --out (the merged PNG; its JSON beside it)")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        usage_error(f"--merge: no such file {missing[0]!r}")
    runs, summaries = merge_results(paths)
    first = summaries[0]
    summary = dict(first, command=[s["command"] for s in summaries],
                   loadavg=[s.get("loadavg") for s in summaries],
                   merged=[Path(p).name for p in paths], runs=runs)
    out = Path(out)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    plot(summary, out)
    print("\n".join(summarise(runs)))
    print(f"wrote {out} and {out.with_suffix('.json')}")


def parser(prog: str = "examples/train_compressed.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="digits")
    ap.add_argument("--runs", type=cli.parsed_by(_runs, "runs",
                                                 bad=("", "topk@0.01+dens10")),
                    help="comma-separated run names (default: the task's set)")
    ap.add_argument("--epochs", type=cli.int_range(1), default=20, help="digits: epochs")
    ap.add_argument("--steps", type=cli.int_range(1), default=200, help="mlp/largebatch: steps")
    ap.add_argument("--batch", type=cli.int_range(1), help="per-rank batch (default: the task's)")
    ap.add_argument("--lr", type=cli.positive_float, help="learning rate (default: the task's)")
    ap.add_argument("--momentum", type=cli.unit_interval, default=0.9,
                    help="SGD momentum (compressor's if compressed)")
    ap.add_argument("--no-momentum-masking", action="store_true",
                    help="keep the compressor's velocity where blocks were sent "
                         "(see CompressionConfig)")
    ap.add_argument("--warmup-steps", type=cli.int_range(0), default=0,
                    help="compression warm-up steps (DGC)")
    ap.add_argument("--loss-window", type=cli.int_range(1), default=10,
                    help="LossComp's window in steps")
    ap.add_argument("--seeds", default="0",
                    type=cli.parsed_by(parse_seeds, "seeds", bad=("x", "-1", "1,1")),
                    help="comma-separated seeds, e.g. 0,1,2 (default 0)")
    ap.add_argument("--job-file", type=cli.job_file, default=os.environ.get(JOB_FILE_ENV))
    ap.add_argument("--out", type=cli.output_file,
                    help="output PNG (default bench/results/compression/<task>.png); JSON "
                         "beside it")
    ap.add_argument("--merge", nargs="+", type=cli.input_file, metavar="JSON",
                    help="no training: merge these results into --out (PNG and JSON), print")
    return ap


def main():
    ap = parser()
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    defaults = TASKS[args.task]
    args.opt = defaults["opt"]
    args.batch = args.batch or defaults["batch"]
    args.lr = args.lr or defaults["lr"]
    runs = [parse_run(r) for r in (args.runs or defaults["runs"]).split(",")]
    seeds = args.seeds  # (parse_seeds, as --seeds' type)

    torch.set_num_threads(1)  # 4 ranks share a small machine
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    switch, job_file = shared_job_file(args.job_file)
    agent = agent_from_env(job_file)
    results = []
    try:
        for seed in seeds:
            args.seed = seed
            task = Task(args.task, args, rank, world)
            if seed == seeds[0]:
                compute = compute_seconds(task)
            for run in runs:
                results.append(train(run, task, args, agent))
    finally:
        finish_shared_job(agent, switch)
    if rank == 0:
        out = Path(args.out or ROOT / "bench" / "results" / "compression" / f"{args.task}.png")
        summary = {"command": f"torchrun --standalone --nproc_per_node {world} "
                              "examples/train_compressed.py " + " ".join(sys.argv[1:]),
                   "task": args.task, "world_size": world, "steps": task.steps,
                   "args": {k: v for k, v in vars(args).items()
                            if k not in ("job_file", "out", "merge", "seed")},
                   "loadavg": Path("/proc/loadavg").read_text().split()[:3],
                   "compute_seconds_per_step": compute, "runs": results}
        out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
        plot(summary, out)
        for h in results:
            print(f"[seed {h['seed']}] {h['name']:>20}: acc {h['final_test_acc']:6.2f}%  "
                  f"{h['bytes_per_step'] / 1e3:10.1f} kB/step  "
                  f"{h['seconds_per_step'] * 1e3:7.1f} ms/step  compress "
                  f"{h.get('compress_seconds_per_step', 0) * 1e3:6.2f} ms  identical "
                  f"{h['weights_identical_across_ranks']}", flush=True)
        print("\n".join(summarise(results)))
        print(f"compute (forward+backward, no communication): {compute * 1e3:.1f} ms/step; "
              f"wrote {out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
