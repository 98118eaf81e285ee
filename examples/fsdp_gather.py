"""Sharded parameters gathered before each forward pass (as FSDP / ZeRO-3 do), through the
switch's all-gather (Agent.allgather: each rank sends its shard once, the switch replicates it).

    python examples/fsdp_gather.py                      # 4 ranks, digits MLP, 5 epochs
    python examples/fsdp_gather.py --workers 2 --epochs 1 --json /tmp/fsdp.json

Each rank keeps only its 1/N of the flat parameter vector. Per step: the full parameters are
gathered from the shards (SpINA all-gather, bit for bit), loaded into the rank's replica, the
rank's slice of the batch runs forward and backward, the gradient is summed over the ranks
(SpINA all-reduce, within its quantization bound) and each rank steps its own shard with the
mean. A software switch and the ranks run in this process (host_agent.local.LocalCluster; the
ranks are threads). Checked every step: the gathered parameters are the same on every rank
(crc32). Reported: test accuracy, and the all-gather's bytes per rank and step against what a
ring all-gather (gloo's) would send.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import torch

from examples.digits import flat_split
from host_agent.local import LocalCluster
from spina import cli


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def train(workers: int, epochs: int, batch: int, lr: float) -> dict:
    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in flat_split(seed=0))
    full0 = torch.nn.utils.parameters_to_vector(model().parameters()).detach()
    nparams = full0.numel()
    shard_len = -(-nparams // workers)
    padded = torch.zeros(shard_len * workers)
    padded[:nparams] = full0
    steps = epochs * (len(xtr) // batch)
    crcs = [[0] * steps for _ in range(workers)]
    sent = [0] * workers
    received = [0] * workers
    result = {}

    def rank_main(c: LocalCluster, r: int) -> None:
        agent, net = c.agents[r], model()
        shard = padded[r * shard_len:(r + 1) * shard_len].clone()  # all this rank keeps
        loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
        for step in range(steps):
            full = agent.allgather(shard).reshape(-1)  # every rank's shard, in rank order
            st = agent.last_gather_stats
            sent[r] += st.bytes_sent
            received[r] += st.bytes_received
            crcs[r][step] = zlib.crc32(full.numpy().tobytes())
            torch.nn.utils.vector_to_parameters(full[:nparams], net.parameters())
            lo = (step * batch) % (len(xtr) - batch + 1)
            xb, yb = xtr[lo:lo + batch], ytr[lo:lo + batch]
            mine = slice(r * batch // workers, (r + 1) * batch // workers)
            net.zero_grad()
            (loss_fn(net(xb[mine]), yb[mine]) / batch).backward()
            grad = torch.zeros(shard_len * workers)
            grad[:nparams] = torch.nn.utils.parameters_to_vector(
                p.grad for p in net.parameters())
            total = agent.allreduce(grad)  # the batch's mean gradient (sum of the slices')
            shard -= lr * total[r * shard_len:(r + 1) * shard_len]
        if r == 0:
            with torch.no_grad():
                full = agent.allgather(shard).reshape(-1)
                torch.nn.utils.vector_to_parameters(full[:nparams], net.parameters())
                result["accuracy"] = float((net(xte).argmax(1) == yte).float().mean())
        else:
            agent.allgather(shard)

    t0 = time.perf_counter()
    with LocalCluster(workers) as c:
        threads = [threading.Thread(target=rank_main, args=(c, r)) for r in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if "accuracy" not in result:
        raise SystemExit("fsdp_gather: a rank failed (see above)")
    same = all(crcs[r] == crcs[0] for r in range(workers))
    shard_bytes = 4 * shard_len
    return dict(workers=workers, epochs=epochs, steps=steps, params=nparams,
                test_accuracy=result["accuracy"], gathered_identical_every_step=same,
                allgather_bytes_sent_per_rank_step=sent[0] / steps,
                allgather_bytes_received_per_rank_step=received[0] / steps,
                ring_bytes_sent_per_rank_step=(workers - 1) * shard_bytes,
                shard_bytes=shard_bytes, seconds=time.perf_counter() - t0)


def parser(prog: str = "examples/fsdp_gather.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=cli.int_range(1, 32), default=4)
    ap.add_argument("--epochs", type=cli.int_range(1), default=5)
    ap.add_argument("--batch", type=cli.int_range(1), default=64,
                    help="the global batch, at least --workers")
    ap.add_argument("--lr", type=cli.positive_float, default=0.1)
    ap.add_argument("--json", type=cli.output_file, help="also write the report here")
    return ap


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.batch < a.workers:
        ap.error(f"argument --batch: {a.batch} is less than --workers ({a.workers})")
    torch.set_num_threads(1)
    rep = train(a.workers, a.epochs, a.batch, a.lr)
    for k, v in rep.items():
        print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1) + "\n")
    return 0 if rep["gathered_identical_every_step"] else 1


if __name__ == "__main__":
    sys.exit(main())
