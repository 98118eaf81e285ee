"""The compressed hook's arithmetic, traced step by step in one process (no agent, no network).

    python -m bench.compression_trace --model cnn --width 1475 --lr 0.05 --steps 150 \
        --out /tmp/cnn_trace.csv

N ranks are simulated in turn on one model (every rank holds the same weights after a
synchronous step): each rank's batch (drawn as bench/training.py draws it), its gradient cut
into DDP's buckets (the first step one bucket of every parameter, then the buckets DDP
rebuilds: torch's own assignment, 1 MiB then 25 MiB, the parameters in reverse order), its
own compressor (`make_compressor(compression_defaults(...))`, the settings
bench/training.py gives top-k) compressing each bucket, the ranks' send arrays summed in
float32 and divided by N (SpINA sums int32 under a shared scale: that rounding is left out),
then SGD without momentum (the compressor holds it). `--method dense` is the reference:
the mean gradient, SGD with --momentum.

Per step and parameter a CSV row: the loss (mean over ranks), the test accuracy (every
--eval steps), the gradient's norm (the ranks' mean gradient), the residual's and the
velocity's norm (rank 0's compressor), the update's norm (lr x the averaged sum), the
parameter's blocks and how many of them any rank sent (coverage). docs/compression.md,
"Why top-k at 1% failed on the CNN", reads these.
"""
from __future__ import annotations

import csv
import sys

import numpy as np

COLUMNS = ("step", "param", "blocks", "sent_blocks", "loss", "test_acc", "grad_norm",
           "residual_norm", "velocity_norm", "update_norm", "ratio")


def bucket_plan(params: list, first: bool) -> list[list[int]]:
    """DDP's buckets as parameter indices in bucket order: one bucket of all of them on the
    first step, then torch's assignment over the reversed parameters (1 MiB, then 25 MiB)."""
    import torch.distributed as dist
    if first:
        return [list(range(len(params)))]
    rev = list(reversed(params))
    groups, _ = dist._compute_bucket_assignment_by_size(
        rev, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2 ** 20])
    return [[len(params) - 1 - i for i in g] for g in groups]


def simulate(model: str, width: int, *, seed: int = 0, steps: int = 150, lr: float = 0.05,
             momentum: float = 0.9, batch: int = 32, workers: int = 4, method: str = "topk",
             ratio: float = 0.01, eval_every: int = 5, config=None, rows=None,
             optimizer_momentum: float | None = None) -> list[float]:
    """Train `model` (bench/train_models.py) for `steps` steps as `workers` ranks with
    `method` ("dense" or a compressor by compression_defaults; `config` overrides it);
    append the module docstring's rows to `rows` (a list) if given. Returns the test
    accuracies (%) at every eval step and after the last."""
    import torch
    import torch.nn.functional as F

    from bench.train_models import FAMILIES
    from host_agent.compression import make_compressor
    from host_agent.compression.compressors import BucketLayout
    from spina.communication import compression_defaults

    fam = FAMILIES[model]
    xtr, ytr, xte, yte = fam.data(seed, width)
    torch.manual_seed(seed)
    net = fam.build(width)
    params = list(net.parameters())
    names = [n for n, _ in net.named_parameters()]
    dense = method == "dense"
    if optimizer_momentum is None:
        optimizer_momentum = momentum if dense else 0.0
    opt = torch.optim.SGD(params, lr=lr, momentum=optimizer_momentum)
    if not dense and config is None:
        config = compression_defaults(method, steps=steps, momentum=momentum, ratio=ratio)
    comps = [] if dense else [make_compressor(config) for _ in range(workers)]
    gens = [torch.Generator().manual_seed(1000 * seed + r) for r in range(workers)]
    B = 256
    accs = []

    def accuracy() -> float:
        with torch.no_grad():
            return 100.0 * float((net(xte).argmax(1) == yte).sum()) / len(yte)

    for step in range(steps):
        grads, losses = [], []
        for r in range(workers):
            idx = torch.randint(len(ytr), (batch,), generator=gens[r])
            net.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append([p.grad.detach().reshape(-1).numpy().copy() for p in params])
        mean_grad = [np.mean([g[i] for g in grads], axis=0) for i in range(len(params))]
        sent = np.zeros(len(params), np.int64)
        update = [None] * len(params)
        ratio_now = 1.0
        if dense:
            update = mean_grad
        else:
            ratio_now = comps[0].current_ratio()
            for bucket in bucket_plan(params, step == 0):
                sizes = [params[i].numel() for i in bucket]
                layout = BucketLayout.of(tuple(id(params[i]) for i in bucket), sizes, B)
                total = np.zeros(layout.length, np.float32)
                for r in range(workers):
                    flat = np.concatenate([grads[r][i] for i in bucket]).astype(np.float32)
                    total += comps[r].compress(layout, flat).send
                for (_, d, k), i in zip(layout.pieces(), bucket):
                    piece = total[d:d + k] / np.float32(workers)
                    update[i] = piece
                    nb = -(-k // B)
                    sent[i] = int(np.count_nonzero(np.any(
                        total[d:d + nb * B].reshape(nb, B) != 0, axis=1)))
            for c in comps:  # the loss averaged over the ranks, as bench/training.py tells it
                c.end_step()
                c.observe_loss(float(np.mean(losses)))
        for p, u in zip(params, update):
            p.grad = torch.from_numpy(np.ascontiguousarray(u, np.float32)).reshape(p.shape)
        opt.step()
        last = step == steps - 1
        acc = accuracy() if (step + 1) % eval_every == 0 or last else None
        if acc is not None:
            accs.append(acc)
        if rows is not None:
            mem = _memory_by_param(comps[0], params) if comps else {}
            for i, p in enumerate(params):
                res, vel = mem.get(i, (0.0, 0.0))
                rows.append(dict(step=step + 1, param=names[i], blocks=-(-p.numel() // B),
                                 sent_blocks=int(sent[i]) if not dense else -(-p.numel() // B),
                                 loss=round(float(np.mean(losses)), 5),
                                 test_acc="" if acc is None else round(acc, 2),
                                 grad_norm=float(np.linalg.norm(mean_grad[i])),
                                 residual_norm=res, velocity_norm=vel,
                                 update_norm=lr * float(np.linalg.norm(update[i])),
                                 ratio=round(ratio_now, 5)))
    return accs


def _memory_by_param(comp, params) -> dict:
    """{parameter index: (residual norm, velocity norm)} of one compressor's memory."""
    out = {}
    for i, p in enumerate(params):
        bufs = comp.memory.of_param(id(p))
        if bufs:
            out[i] = tuple(float(np.linalg.norm(bufs[n])) if n in bufs else 0.0
                           for n in ("residual", "momentum"))
    return out


def _config_field(text: str) -> tuple[str, object]:
    """An argparse type: FIELD=JSON, FIELD a CompressionConfig field."""
    import argparse
    import dataclasses
    import json

    from spina.communication import CompressionConfig
    name, eq, value = text.partition("=")
    known = {f.name for f in dataclasses.fields(CompressionConfig)}
    if not eq or name not in known:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIELD=JSON with FIELD one of "
                                         f"{', '.join(sorted(known))}")
    try:
        return name, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the value is not JSON") from None


def parser(prog: str = "python -m bench.compression_trace"):
    """The trace's options (tests/test_bad_input.py walks them)."""
    from bench.train_models import FAMILIES
    from spina import cli
    ap = cli.ArgumentParser(prog=prog, description=__doc__)
    ap.add_argument("--model", choices=tuple(FAMILIES), default="cnn")
    ap.add_argument("--width", type=cli.int_range(1, 10 ** 7), default=1475)
    ap.add_argument("--method", choices=("dense", "topk", "losscomp"), default="topk")
    ap.add_argument("--seed", type=cli.int_range(0, 2 ** 31), default=0)
    ap.add_argument("--steps", type=cli.int_range(1, 100_000), default=150)
    ap.add_argument("--lr", type=cli.positive_float, default=0.05)
    ap.add_argument("--momentum", type=cli.unit_interval, default=0.9)
    ap.add_argument("--batch", type=cli.int_range(1, 100_000), default=32)
    ap.add_argument("--workers", type=cli.int_range(1, 64), default=4)
    ap.add_argument("--ratio", type=cli.fraction, default=0.01)
    ap.add_argument("--eval", type=cli.int_range(1, 100_000), default=5,
                    help="test accuracy every EVAL steps (default %(default)s)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    type=cli.refuses("x", "ratio", "no_such_field=1", "ratio=[")(_config_field),
                    help="a CompressionConfig field over the rule's, its value JSON "
                    "(repeatable)")
    ap.add_argument("--out", type=cli.output_file, required=True, help="the CSV")
    return ap


def main(argv=None) -> int:
    from bench.train_models import FAMILIES
    from spina import cli
    ap = parser()
    a = ap.parse_args(argv)
    config = None
    if a.set:
        import dataclasses

        from spina.communication import compression_defaults
        from spina.fields import ConfigError
        base = compression_defaults(a.method, steps=a.steps, momentum=a.momentum, ratio=a.ratio)
        try:
            config = dataclasses.replace(base, **dict(a.set)).validate()
        except (TypeError, ConfigError) as e:
            return cli.fail(ap.prog, f"argument --set: {e}")
    if a.model == "seq" and a.width < FAMILIES["seq"].min_width:
        return cli.fail(ap.prog, f"argument --width: seq needs at least "
                        f"{FAMILIES['seq'].min_width}")
    rows: list[dict] = []
    accs = simulate(a.model, a.width, seed=a.seed, steps=a.steps, lr=a.lr,
                    momentum=a.momentum, batch=a.batch, workers=a.workers, method=a.method,
                    ratio=a.ratio, eval_every=a.eval, config=config, rows=rows)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"{a.model} {a.method}: test accuracy {', '.join(f'{x:.1f}' for x in accs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
