"""Compression overhead on the 5.3M-parameter MLP: compressor time against forward + backward.

    python examples/compression_overhead.py   # writes bench/results/compression/overhead.json

One process, one thread, no communication: each repetition runs forward + backward of one
batch, then each compressor on that gradient exactly as spina_compressed_hook does before it
calls the agent (the bucket read piece by piece into the residual, block norms, selection,
the selected blocks copied from the residual straight into the bucket's send array). That
array is kept across steps as the hook keeps it; the hook's kernels.unpack clears the blocks
the sum wrote while it copies the sum into DDP's bucket, a pass it makes anyway: here the
clearing happens after the timed part. Interleaving the two measurements spreads the
machine's load over both. Reports medians and the 1-minute load average at the start and
the end (the same numbers `uptime` prints).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np
import torch
import torch.nn.functional as F

from host_agent.compression import BucketLayout, make_compressor
from spina import cli
from train_compressed import MLP, Teacher

METHODS = {"topk@0.01": dict(method="topk", ratio=0.01),
           "topk@0.01 + momentum correction": dict(method="topk", ratio=0.01, momentum=0.9),
           "randomk@0.01": dict(method="randomk", ratio=0.01),
           "scaled@0.01": dict(method="scaled", ratio=0.01),
           "losscomp@0.01": dict(method="losscomp", ratio=0.01)}


def parser(prog: str = "examples/compression_overhead.py") -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=cli.int_range(1), nargs="+", default=[32, 64],
                    help="per-rank batch sizes")
    ap.add_argument("--reps", type=cli.int_range(2), default=41,
                    help="repetitions (medians of all but the first)")
    ap.add_argument("--out", type=cli.output_file,
                    default=str(ROOT / "bench" / "results" / "compression" / "overhead.json"))
    return ap


def main():
    ap = parser()
    args = ap.parse_args()
    load_start = os.getloadavg()
    torch.set_num_threads(1)  # as each of the 4 ranks in the examples
    torch.manual_seed(0)
    model = MLP(2048)
    params = list(model.parameters())[::-1]  # DDP's bucket order: reversed
    layout = BucketLayout.of(tuple(range(len(params))), [p.numel() for p in params], 256)
    comps = {name: make_compressor(block_size=256, **cfg) for name, cfg in METHODS.items()}
    sends = {name: np.zeros(layout.length, np.float32) for name in METHODS}
    teacher, gen = Teacher(), torch.Generator().manual_seed(0)
    compute = {b: [] for b in args.batches}
    compress = {name: [] for name in METHODS}
    for _ in range(args.reps):
        for b in args.batches:
            x, y = teacher.sample(b, gen)
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            compute[b].append(time.perf_counter() - t0)
        bucket = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
        for name, comp in comps.items():
            t0 = time.perf_counter()
            sel = comp.compress(layout, bucket, sends[name])  # the blocks into the array
            comp.end_step()
            compress[name].append(time.perf_counter() - t0)
            sends[name].reshape(layout.nblocks, -1)[sel.blocks] = 0  # as kernels.unpack does
    ms = lambda v: round(float(np.median(v[1:])) * 1e3, 2)  # noqa: E731  (first rep warms up)
    result = {"params": sum(p.numel() for p in params), "reps": args.reps,
              "load_1min": [round(x, 2) for x in (load_start[0], os.getloadavg()[0])],
              "compute_ms": {str(b): ms(v) for b, v in compute.items()},
              "compress_ms": {n: ms(v) for n, v in compress.items()}}
    result["overhead_percent"] = {str(b): {n: round(100 * c / result["compute_ms"][str(b)], 1)
                                           for n, c in result["compress_ms"].items()}
                                  for b in args.batches}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
