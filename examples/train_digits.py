"""LeNet-5 on scikit-learn's digits, data-parallel under torchrun, gradients through SpINA.

    torchrun --standalone --nproc_per_node 4 examples/train_digits.py --backend-compare

Every rank trains on its shard of the data with DistributedDataParallel on a gloo process
group. With `--backend spina` (default) the gradient buckets go through the SpINA DDP hook
and a software switch; everything else (initial broadcast, the loss average for the log)
goes through gloo. `--backend-compare` trains twice from the same seed, first through SpINA,
then with DDP's plain gloo all-reduce, and rank 0 writes
bench/results/train_digits/train_digits.png (loss and test accuracy of both runs) and
bench/results/train_digits/train_digits.json.

The switch: without `--job-file`, rank 0 starts `python -m host_agent.launch` as a
subprocess (a software switch on 127.0.0.1 with this job admitted) and stops it at the end.
With `--job-file F` (or $SPINA_JOB_FILE) the ranks join a job launched beforehand.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from examples import digits
from host_agent.assignment import JOB_FILE_ENV, agent_from_env
from host_agent.hooks import SpinaHookState, spina_allreduce_hook
from host_agent.launch import shared_job_file, start_subprocess
from spina import cli


class LeNet5(nn.Module):
    """LeCun et al. 1998: two 5x5 conv + pool stages, then 120-84-10 (on 32x32 inputs)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class WideLeNet(LeNet5):
    """LeNet-5's layout at 5.4M parameters (32 and 64 channels, 1600-2048-1024-10): a second
    model of at least 5M parameters on real data (issue 32), cheap enough for 2 cores."""

    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(1, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * 5 * 5, 2048)
        self.fc2 = nn.Linear(2048, 1024)
        self.fc3 = nn.Linear(1024, 10)


def load_data(seed: int):
    """Digits (1797 8x8 images, bundled with scikit-learn) upsampled to 32x32; 80/20 split."""
    images, labels = digits.images()
    x = torch.from_numpy(images).unsqueeze(1)
    x = F.interpolate(x, size=32, mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std()
    y = torch.from_numpy(labels)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    ntest = len(y) // 5
    test, train = perm[:ntest], perm[ntest:]
    return x[train], y[train], x[test], y[test]


def train(backend: str, args, data, state: SpinaHookState | None) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr, xte, yte = data
    torch.manual_seed(args.seed)
    model = DDP(LeNet5())  # DDP broadcasts rank 0's initial weights (gloo)
    if backend == "spina":
        state.reset_stats()
        model.register_comm_hook(state, spina_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    hist = {"backend": backend, "step_loss": [], "epoch": [], "test_acc": []}
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        # Same permutation on every rank; each rank takes its interleaved shard.
        perm = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(args.seed + epoch))
        mine = perm[rank::world]
        nsteps = len(perm) // (world * args.batch)
        model.train()
        for s in range(nsteps):
            idx = mine[s * args.batch:(s + 1) * args.batch]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg)  # the log's loss average: gloo, not SpINA
            hist["step_loss"].append(avg.item() / world)
        sched.step()
        model.eval()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item() * 100
        hist["epoch"].append(epoch + 1)
        hist["test_acc"].append(acc)
        if rank == 0:
            loss = np.mean(hist['step_loss'][-nsteps:])
            print(f"[{backend}] epoch {epoch + 1:2d} loss {loss:.4f} test acc {acc:.2f}%",
                  flush=True)
    hist["seconds"] = time.perf_counter() - t0
    # Every rank must hold the same weights (SpINA results are bit-identical across ranks).
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    hist["weights_identical_across_ranks"] = all(torch.equal(g, gathered[0]) for g in gathered)
    if state is not None and backend == "spina":
        hist["spina"] = {"calls": state.calls, "elements": state.elements,
                         "bytes_sent": state.bytes_sent,
                         "payload_bytes_sent": state.payload_bytes_sent,
                         "seconds_in_allreduce": round(state.seconds, 3)}
    return hist


def plot(runs: list[dict], out: Path, steps_per_epoch: int, world: int, ntest: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    label = {"spina": "SpINA (software switch)", "gloo": "gloo all-reduce",
             "spina-pg": "SpINA process group"}
    style = {"spina": "-", "gloo": "--", "spina-pg": ":"}
    for h in runs:
        b = h["backend"]
        steps = np.arange(1, len(h["step_loss"]) + 1) / steps_per_epoch
        a1.plot(steps, h["step_loss"], style[b], label=label[b], lw=1)
        a2.plot(h["epoch"], h["test_acc"], style[b] + "o",
                label=f"{label[b]}: {h['test_acc'][-1]:.2f}%", ms=3)
    a1.set(xlabel="epoch", ylabel="training loss (mean over ranks)", yscale="log",
           title=f"LeNet-5 on digits, {world} workers, DDP under torchrun")
    a2.set(xlabel="epoch", ylabel="test accuracy (%)",
           title=f"held-out 20% ({ntest} images), zoomed to 80-100%")
    a2.set_ylim(80, 100)
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def parser(prog: str = "examples/train_digits.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["spina", "gloo", "spina-pg"], default="spina",
                    help="spina: gloo process group + SpINA DDP hook (default); gloo: plain DDP; "
                         "spina-pg: the 'spina' process-group backend, no hook")
    ap.add_argument("--backend-compare", action="store_true",
                    help="train through SpINA, then with gloo all-reduce; plot both")
    ap.add_argument("--epochs", type=cli.int_range(1), default=20)
    ap.add_argument("--batch", type=cli.int_range(1), default=32, help="per-rank batch size")
    ap.add_argument("--lr", type=cli.positive_float, default=0.02)
    ap.add_argument("--seed", type=cli.int_range(0), default=0)
    ap.add_argument("--job-file", type=cli.job_file, default=os.environ.get(JOB_FILE_ENV),
                    help="job file of a job launched beforehand (default: rank 0 starts a switch)")
    ap.add_argument("--out", type=cli.output_file,
                    default=str(ROOT / "bench" / "results" / "train_digits" / "train_digits.png"))
    return ap


def main():
    ap = parser()
    args = ap.parse_args()

    torch.set_num_threads(1)  # 4 ranks share a small machine
    backends = ["spina", "gloo"] if args.backend_compare else [args.backend]
    switch = None
    state = None
    if args.backend == "spina-pg" and not args.backend_compare:
        # The process group itself needs the job file: no process group yet to pass its path
        # around, so rank 0 writes it where every rank of this torchrun run looks for it.
        import host_agent.torch_backend  # noqa: F401  (registers the "spina" backend)
        if args.job_file is None:
            path = os.path.join(tempfile.gettempdir(),
                                f"spina-digits-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}.json")
            if int(os.environ["RANK"]) == 0:
                switch, _ = start_subprocess(int(os.environ["WORLD_SIZE"]), path)
            os.environ[JOB_FILE_ENV] = path
        else:
            os.environ[JOB_FILE_ENV] = args.job_file
        dist.init_process_group("spina")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if "spina" in backends:
        switch, job_file = shared_job_file(args.job_file)
        state = SpinaHookState(agent_from_env(job_file))
    data = load_data(args.seed)
    runs = []
    try:
        for b in backends:
            runs.append(train(b, args, data, state))
    finally:
        dist.barrier()
        if state is not None:
            state.agent.close()
        if switch is not None:
            switch.terminate()
            switch.wait(timeout=10)  # the launcher removes its job file
    if rank == 0:
        for h in runs:
            print(f"[{h['backend']}] final test accuracy {h['test_acc'][-1]:.2f}%  "
                  f"({h['seconds']:.1f} s, weights identical across ranks: "
                  f"{h['weights_identical_across_ranks']})" +
                  (f"  SpINA: {h['spina']}" if "spina" in h else ""), flush=True)
        if len(runs) == 2:
            out = Path(args.out)
            steps_per_epoch = len(runs[0]["step_loss"]) // args.epochs
            plot(runs, out, steps_per_epoch, world, len(data[3]))
            summary = {"command": "torchrun --standalone --nproc_per_node %d "
                                  "examples/train_digits.py --backend-compare" % world,
                       "args": {k: v for k, v in vars(args).items()
                                if k not in ("job_file", "out")},
                       "world_size": world,
                       "final_test_acc": {h["backend"]: h["test_acc"][-1] for h in runs},
                       "runs": runs}
            out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
            diff = abs(runs[0]["test_acc"][-1] - runs[1]["test_acc"][-1])
            print(f"wrote {out} and {out.with_suffix('.json')}; "
                  f"|accuracy difference| = {diff:.2f} points", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
