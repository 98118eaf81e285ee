"""Fewer bits and fewer rounds through SpINA: narrow lanes, sign and ternary votes, local SGD.

    torchrun --standalone --nproc_per_node 4 examples/train_bits.py --task mlp --seeds 0,1,2

Tasks are examples/train_compressed.py's (mlp: the 5.3M-parameter MLP on the synthetic
teacher task; digits: LeNet-5; digits-wide: the 5.4M-parameter WideLeNet on the same digits).
Runs (--runs, comma-separated):
  dense-gloo          DDP's own all-reduce (the reference)
  dense-spina         every gradient bucket summed by SpINA (spina_local_sgd_hook, always
                      synchronous: the same hook local SGD warms up with, so rounds are counted)
  dense-spina16/8     every bucket summed by SpINA in 16- or 8-bit lanes: a job of its own with
                      lane_bits 16 or 8 (stochastic rounding), the dense hook
                      (spina_allreduce_hook) keeping each bucket's error feedback residual
  sign, ternary       votes through spina_vote_hook (error feedback on; `-noef` turns it off;
                      ternary clips to 2.5 x each layer's rms first, as TernGrad)
  signum              sign on each rank's local momentum (Signum with majority vote); the
                      optimiser then runs without momentum
  local@H             local SGD, the weights averaged through SpINA every H steps
  postlocal@H:S       post-local SGD: S synchronous steps, then local SGD with period H
SGD with momentum in the optimiser for every run but signum. Each SpINA run's hook is
registered by `host_agent.hooks.register_from_job` from the "communication" section a job
file would carry (docs/bits.md). Rank 0 starts one software switch per lane width the runs need;
with --job-file (a deployed switch) every SpINA run uses that job, whose lane_bits must then be
the width of every run.

Every run of every seed starts from that seed; rank 0 writes bench/results/bits/<task>.json (all
numbers: per run and seed the final test accuracy, bytes and switch rounds per step and rank)
and .png (accuracy with its spread, rounds per step), and prints a table with the mean and
spread (min..max) over seeds. `--replot A.json B.json --out C.png` merges earlier results.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from host_agent.assignment import JOB_FILE_ENV, agent_from_env
from host_agent.hooks import LocalSGDState, SpinaHookState, VoteHookState, register_from_job
from host_agent.launch import finish_shared_job, shared_job_file
from spina import cli
from train_compressed import TASKS, Task, merge_results

DEFAULT_RUNS = "dense-gloo,dense-spina,sign,ternary,local@4,postlocal@4:40"


NARROW = {"dense-spina16": 16, "dense-spina8": 8}  # run -> the lane width of its job


def parse_run(name: str) -> dict:
    """'local@4' -> local SGD, H 4; 'postlocal@4:50' -> S 50; 'sign-noef' -> no feedback;
    'dense-spina8' -> dense SpINA on a job with 8-bit lanes. `lane_bits`: the job's width."""
    if name in NARROW:
        return dict(name=name, kind="dense-narrow", lane_bits=NARROW[name])
    return dict(_parse_int32_run(name), lane_bits=32)


def _parse_int32_run(name: str) -> dict:
    if name in ("dense-gloo", "dense-spina"):
        return dict(name=name, kind=name)
    base, _, ef = name.partition("-")
    if base in ("sign", "signum", "ternary"):
        if ef not in ("", "noef"):
            raise ValueError(f"run {name!r}: only '-noef' may follow {base}")
        return dict(name=name, kind="vote", method=base.replace("signum", "sign"),
                    signum=base == "signum", error_feedback=ef != "noef")
    kind, _, spec = name.partition("@")
    period, _, warmup = spec.partition(":")
    if kind == "local" and period.isdigit() and not warmup:
        return dict(name=name, kind="local", period=int(period), warmup=0)
    if kind == "postlocal" and period.isdigit() and warmup.isdigit():
        return dict(name=name, kind="local", period=int(period), warmup=int(warmup))
    raise ValueError(f"run {name!r}: expected dense-gloo, dense-spina, dense-spina16, "
                     "dense-spina8, sign[-noef], signum[-noef], ternary[-noef], local@H or "
                     "postlocal@H:S")


def _runs(text: str) -> str:
    """--runs, each run checked by parse_run (a ValueError naming the run)."""
    for name in text.split(","):
        parse_run(name)
    return text


def train(run: dict, task: Task, args, agent) -> dict:
    world = task.world
    model = DDP(task.model())
    state = None
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    # The job file's "communication" section for the run (one job file serves every run, so
    # the section is handed to register_from_job instead of read from the file).
    if run["kind"] in ("dense-spina", "local"):  # dense-spina: synchronous to the end
        period, warmup = (1, task.steps) if run["kind"] == "dense-spina" else \
            (run["period"], run["warmup"])
        section = {"local_sgd": {"period": period, "warmup_steps": warmup}}
    elif run["kind"] == "vote":
        section = {"method": run["method"], "error_feedback": run["error_feedback"],
                   "momentum": args.momentum if run["signum"] else 0.0, "seed": args.seed}
        if run["signum"]:  # the momentum moved into the compressor: the vote is on it
            opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    elif run["kind"] == "dense-narrow":  # the width is the job's: spina_allreduce_hook, with EF
        section = {"method": "dense"}
    if run["kind"] != "dense-gloo":
        comm = register_from_job(model, agent, opt, communication=section)
        state, opt = comm.state, comm.optimizer  # local SGD: the wrapper that averages
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, task.steps)
    step_seconds = []
    for x, y in task.batches():
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        step_seconds.append(time.perf_counter() - t0)
    if run["kind"] == "local" and (task.steps - state.warmup_steps) % state.period:
        opt.average()  # the last step was local: evaluate the ranks' mean (one more call)
    acc = task.accuracy(model.module)
    steps = task.steps
    nparams = sum(p.numel() for p in model.parameters())
    if isinstance(state, LocalSGDState):
        rounds, nbytes = state.rounds, state.sync_bytes + state.average_bytes
    elif isinstance(state, VoteHookState):
        rounds, nbytes = state.rounds, state.bytes_sent
        state.close()
    elif isinstance(state, SpinaHookState):  # narrow lanes
        rounds, nbytes = state.rounds, state.bytes_sent
    else:  # gloo: a ring all-reduce, per rank and step
        rounds, nbytes = None, 2 * (world - 1) * nparams * 4 / world * steps
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    nums = torch.tensor([nbytes / steps, float(np.median(step_seconds))], dtype=torch.float64)
    dist.all_reduce(nums)
    return dict(run, seed=args.seed, params=nparams, final_test_acc=acc,
                bytes_per_step=nums[0].item() / world, seconds_per_step=nums[1].item() / world,
                rounds_per_step=None if rounds is None else rounds / steps,
                weights_identical_across_ranks=all(torch.equal(g, gathered[0]) for g in gathered))


def summarise(results: list[dict]) -> list[str]:
    """A markdown row per run: mean and min..max over seeds, against dense-gloo's mean."""
    by = {}
    for r in results:
        by.setdefault(r["name"], []).append(r)
    ref = np.mean([r["final_test_acc"] for r in by.get("dense-gloo", [])] or [np.nan])
    lines = ["| run | seeds | test acc mean (min..max) | vs dense gloo | bytes/step/rank | "
             "rounds/step/rank | ms/step | weights equal |", "|---|---|---|---|---|---|---|---|"]
    for name, rs in by.items():
        acc = [r["final_test_acc"] for r in rs]
        rounds = [r["rounds_per_step"] for r in rs if r["rounds_per_step"] is not None]
        kb = np.mean([r["bytes_per_step"] for r in rs]) / 1e3
        ms = np.median([r["seconds_per_step"] for r in rs]) * 1e3
        lines.append(f"| {name} | {len(rs)} | {np.mean(acc):.2f} ({min(acc):.2f}..{max(acc):.2f}) "
                     f"| {'-' if np.isnan(ref) else f'{np.mean(acc) - ref:+.2f}'} | {kb:,.1f} kB | "
                     f"{f'{np.mean(rounds):.1f}' if rounds else '-'} | {ms:.1f} | "
                     f"{all(r['weights_identical_across_ranks'] for r in rs)} |")
    return lines


def plot(results: list[dict], out: Path, title: str) -> None:
    """Accuracy (mean, min..max over seeds) and switch rounds per step, a bar per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = {}
    for r in results:
        by.setdefault(r["name"], []).append(r)
    names = list(by)
    acc = [np.array([r["final_test_acc"] for r in by[n]]) for n in names]
    mean = np.array([a.mean() for a in acc])
    spread = np.array([[m - a.min() for a, m in zip(acc, mean)],
                       [a.max() - m for a, m in zip(acc, mean)]])
    rounds = [np.mean([r["rounds_per_step"] for r in by[n]]) if by[n][0]["rounds_per_step"]
              is not None else 0.0 for n in names]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    a1.barh(names, mean, xerr=spread, color="tab:blue", capsize=3)
    a1.set(xlabel="final test accuracy (%), mean and min..max over seeds", title=title)
    a2.barh(names, rounds, color="tab:orange")
    a2.set(xlabel="switch rounds per step and rank (0: gloo, not counted)",
           title="rounds through the switch")
    for a in (a1, a2):
        a.grid(alpha=0.3, axis="x")
        a.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def replot(paths: list[str], out: str) -> None:
    """Merge earlier JSONs (a run and seed measured twice: the first one counts), plot, print."""
    results, summaries = merge_results(paths)
    task = summaries[-1]["task"]
    plot(results, Path(out), f"{task}: {', '.join(Path(p).name for p in paths)}")
    print("\n".join(summarise(results)))
    print(f"wrote {out}")


def parser(prog: str = "examples/train_bits.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=["mlp", "digits", "digits-wide"], default="mlp")
    ap.add_argument("--runs", default=DEFAULT_RUNS,
                    type=cli.parsed_by(_runs, "runs", bad=("", "sign-x", "local@")),
                    help="comma-separated: dense-gloo, dense-spina, dense-spina16, "
                         "dense-spina8, sign[-noef], signum[-noef], ternary[-noef], local@H, "
                         f"postlocal@H:S (default {DEFAULT_RUNS})")
    ap.add_argument("--seeds", default="0", type=cli.comma_list(cli.int_range(0), "seeds"),
                    help="comma-separated seeds, e.g. 0,1,2")
    ap.add_argument("--epochs", type=cli.int_range(1), default=20, help="digits: epochs")
    ap.add_argument("--steps", type=cli.int_range(1), default=200, help="mlp: steps")
    ap.add_argument("--batch", type=cli.int_range(1), help="per-rank batch (default: the task's)")
    ap.add_argument("--lr", type=cli.positive_float, help="learning rate (default: the task's)")
    ap.add_argument("--momentum", type=cli.unit_interval, default=0.9)
    ap.add_argument("--job-file", type=cli.job_file, default=os.environ.get(JOB_FILE_ENV),
                    help="a deployed switch's job file for every SpINA run (default: rank 0 "
                         "starts a software switch per lane width the runs need)")
    ap.add_argument("--out", type=cli.output_file,
                    help="output JSON (default bench/results/bits/<task>.json); PNG beside it")
    ap.add_argument("--replot", nargs="+", type=cli.input_file, metavar="JSON",
                    help="no training: merge these results, plot them to --out (a PNG), print")
    return ap


def main():
    ap = parser()
    args = ap.parse_args()
    if args.replot:
        return replot(args.replot, args.out or "bits.png")
    defaults = TASKS[args.task]
    args.batch = args.batch or defaults["batch"]
    args.lr = args.lr or defaults["lr"]
    seeds = args.seeds

    torch.set_num_threads(1)  # 4 ranks share a small machine
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    runs = [parse_run(r) for r in args.runs.split(",")]
    jobs, agents = [], {}  # (agent, switch) each; lane width -> this rank's agent
    results = []
    try:
        for bits in sorted({r["lane_bits"] for r in runs if r["kind"] != "dense-gloo"} or {32}):
            switch, job_file = shared_job_file(args.job_file, lane_bits=bits)
            jobs.append((agent_from_env(job_file), switch))
            agents[bits] = jobs[-1][0]
            if agents[bits].job.lane_bits != bits:  # a deployed job has the width it has
                raise SystemExit(f"--job-file: job.lane_bits is {agents[bits].job.lane_bits}, "
                                 f"the runs need {bits}")
        for seed in seeds:
            args.seed = seed
            task = Task(args.task, args, rank, world)
            for run in runs:
                results.append(train(run, task, args, agents.get(run["lane_bits"])))
                if rank == 0:
                    h = results[-1]
                    print(f"[seed {seed}] {h['name']:>16}: acc {h['final_test_acc']:6.2f}%  "
                          f"{h['bytes_per_step'] / 1e3:10.1f} kB/step  rounds/step "
                          f"{h['rounds_per_step']}  {h['seconds_per_step'] * 1e3:7.1f} ms/step",
                          flush=True)
    finally:
        for agent, switch in jobs:
            finish_shared_job(agent, switch)
    if rank == 0:
        out = Path(args.out or ROOT / "bench" / "results" / "bits" / f"{args.task}.json")
        cmd = f"torchrun --standalone --nproc_per_node {world} examples/train_bits.py " + \
            " ".join(sys.argv[1:])
        out.write_text(json.dumps({"command": cmd, "task": args.task, "world_size": world,
                                   "steps": task.steps, "runs": results}, indent=1))
        plot(results, out.with_suffix(".png"), f"{args.task}: {world} workers, {task.steps} steps")
        print("\n".join(summarise(results)), flush=True)
        print(f"wrote {out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
