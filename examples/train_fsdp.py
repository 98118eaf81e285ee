"""A 21M-parameter MLP on scikit-learn's digits, sharded over the ranks by FSDP2, its
all-gathers and reduce-scatters through SpINA.

    torchrun --standalone --nproc_per_node 4 examples/train_fsdp.py --steps 40
    torchrun --standalone --nproc_per_node 4 examples/train_fsdp.py --compression topk:0.05

Every rank keeps 1/N of the parameters (`fully_shard` on each layer and on the model, a gloo
process group on CPU). `shard_on_spina` (host_agent/hooks/fsdp.py) makes FSDP2 gather each
layer's parameters before its forward and backward through the switch's all-gather and
reduce-scatter its gradients through the switch; `--compression topk:RATIO` sends only the
top RATIO of each layer's gradient blocks (error feedback keeps the rest for later steps),
`--lane-bits 16` (or 8) narrow lanes with error feedback;
`--collectives gloo` leaves FSDP2's own gloo collectives in place (the control). Each rank
trains on its slice of every global batch.

The switch: without `--job-file`, rank 0 starts `python -m host_agent.launch` (a software
switch on 127.0.0.1 with this job admitted) and stops it at the end; with `--job-file F` (or
$SPINA_JOB_FILE) the ranks join a job launched beforehand.

Rank 0 prints the parameter count, the loss of each step, the test accuracy, the seconds per
step, whether every rank gathered the same parameters at the end (crc32) and the collectives'
counters; `--json F` writes the same.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from examples.digits import flat_split
from host_agent.assignment import JOB_FILE_ENV, agent_from_env
from host_agent.hooks.fsdp import shard_on_spina
from host_agent.launch import finish_shared_job, shared_job_file
from spina import cli


def mlp(width: int) -> torch.nn.Sequential:
    """64 -> width -> width -> 1024 -> 10 (width 4096: 21,253,130 parameters)."""
    torch.manual_seed(0)
    dims = (64, width, width, 1024, 10)
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def compression_arg(text: str) -> dict:
    """topk:RATIO -> the compression mapping shard_on_spina takes."""
    method, _, ratio = text.partition(":")
    if method != "topk" or not ratio:
        raise ValueError(f"{text!r} is not topk:RATIO")
    r = float(ratio)
    if not 0 < r <= 1:
        raise ValueError(f"ratio {ratio} is not in (0, 1]")
    return {"method": "topk", "ratio": r}


def train(args) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = mlp(args.width)
    nparams = sum(p.numel() for p in model.parameters())
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    switch = agent = counters = None
    if args.collectives == "spina":
        switch, job_file = shared_job_file(args.job_file, lane_bits=args.lane_bits)
        agent = agent_from_env(job_file, rank)
        counters = shard_on_spina(model, agent, compression=args.compression)
    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in flat_split(seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_rank = args.batch // world
    losses, times = [], []
    try:
        for step in range(args.steps):
            lo = (step * args.batch) % (len(xtr) - args.batch + 1)
            mine = slice(lo + rank * per_rank, lo + (rank + 1) * per_rank)
            dist.barrier()  # a step's time is its own, not a late rank's
            t0 = time.perf_counter()
            loss = loss_fn(model(xtr[mine]), ytr[mine])
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(float(mean) / world)
            if rank == 0 and args.progress:
                print(f"step {step}: loss {losses[-1]:.4f} ({times[-1]:.2f} s)", flush=True)
        with torch.no_grad():
            accuracy = float((model(xte).argmax(1) == yte).float().mean())
            crc = 0
            for p in model.parameters():
                crc = zlib.crc32(p.full_tensor().numpy().tobytes(), crc)
        crcs = [None] * world
        dist.all_gather_object(crcs, crc)
    finally:
        if agent is not None:
            finish_shared_job(agent, switch)
    return dict(collectives=args.collectives, compression=args.compression, world=world,
                params=nparams, steps=args.steps, loss=losses, test_accuracy=accuracy,
                seconds_per_step=sorted(times)[len(times) // 2],
                parameters_identical_across_ranks=len(set(crcs)) == 1,
                counters=counters.as_dict() if counters is not None else None)


def parser(prog: str = "examples/train_fsdp.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--collectives", choices=["spina", "gloo"], default="spina",
                    help="spina: FSDP2's all-gather and reduce-scatter through the switch "
                         "(default); gloo: FSDP2's own")
    ap.add_argument("--compression", type=cli.parsed_by(compression_arg, "compression",
                                                        ("topk", "topk:0", "dense:0.1")),
                    metavar="topk:RATIO",
                    help="block top-k of each layer's gradient with error feedback (default: "
                         "dense)")
    ap.add_argument("--lane-bits", type=int, choices=(32, 16, 8), default=32,
                    help="the switch's lanes when this run starts it: 16 or 8 send narrow "
                         "lanes with error feedback (default 32; with --job-file the job's)")
    ap.add_argument("--steps", type=cli.int_range(1), default=40)
    ap.add_argument("--batch", type=cli.int_range(1), default=64,
                    help="the global batch, a multiple of the ranks")
    ap.add_argument("--lr", type=cli.positive_float, default=0.05)
    ap.add_argument("--width", type=cli.int_range(16), default=4096,
                    help="the hidden layers' width (4096: 21M parameters)")
    ap.add_argument("--job-file", type=cli.job_file, default=os.environ.get(JOB_FILE_ENV),
                    help="job file of a job launched beforehand (default: rank 0 starts a switch)")
    ap.add_argument("--json", type=cli.output_file, help="rank 0 also writes the report here")
    ap.add_argument("--progress", action="store_true", help="rank 0 prints every step")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the ranks share a small machine
    dist.init_process_group("gloo")
    if args.batch % dist.get_world_size():
        ap.error(f"argument --batch: {args.batch} is not a multiple of the "
                 f"{dist.get_world_size()} ranks")
    rep = train(args)
    if dist.get_rank() == 0:
        for k, v in rep.items():
            if k == "loss":
                print(f"loss: {v[0]:.4f} -> {v[-1]:.4f}")
            else:
                print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
        if args.json:
            Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
    dist.destroy_process_group()
    return 0 if rep["parameters_identical_across_ranks"] else 1


if __name__ == "__main__":
    sys.exit(main())
