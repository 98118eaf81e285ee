"""training: DDP training where the network is the limit: gloo, SpINA dense, SpINA with
block top-k and PyTorch's own compression hooks, stepped side by side in the same processes.

    python -m bench training -t bench/topologies/star4.yaml --rates 1gbit,10gbit     # root
    python -m bench training -t bench/topologies/star4.yaml --rates 1gbit -b 280K -e 280K \
        --max-steps 4 --min-steps 4 --out /tmp/t                    # a smoke run (tests)

The network is a star topology file in namespaces (spina/netgraph.py Graph: tbf both ways on
every link; the aggregating switch's namespace routes IPv4 for gloo's ring and runs SpINA's
software switch in UDP mode; the processes: bench/paired.py Cluster).

The task (--model, bench/train_models.py): by default an MLP 1024-w-w-10
(examples/train_compressed.py's MLP) whose gradient is the point's size: -b/-e give sizes in
bytes, each the float32 gradient of the width w that comes nearest (w = 2048: 6.3M
parameters, 25 MB), on scikit-learn's digits upsampled to 32x32 (examples/train_digits.py's
load_data: 1438 training and 359 test images; nothing is downloaded); `cnn` a LeNet-shaped
CNN on the same images, `seq` an embedding-heavy model with attention pooling on a
generated sequence task, their widths likewise from the size. SGD, --momentum, a constant
learning rate, a per-rank batch drawn with replacement from the whole training set.

Every rank trains every method side by side (each its own model from the same seed, its own
optimiser, the same batches): a round runs one step of each method, the order rotating
round by round, each step between two barriers, only the step timed (forward, backward with
DDP's communication, optimiser step):

  gloo     DDP's own all-reduce (the gloo ring)
  spina    DDP with the SpINA hook (host_agent/hooks/dense.py spina_allreduce_hook)
  spina16, spina8
           the same hook on a job of 16- or 8-bit lanes (docs/bits.md: stochastic rounding,
           the bucket's error feedback residual) with blocks of 512 or 1024 elements, so that
           a datagram holds int32's 57 KB (LANE_BLOCKS): a half and a quarter of the
           datagrams and bytes; each its own job and agent on the same switch
  topk     DDP with the compression hook (host_agent/hooks/compressed.py
           spina_compressed_hook): block top-k of 256-element blocks at --ratio, the rest
           by the defaults' rule (spina.communication.compression_defaults: at least a block
           per tensor of a bucket, warm-up over 10% of --max-steps, error feedback, DGC
           momentum correction masking only blocks that waited: the optimiser then has none)
  losscomp the same hook with LossComp by the same rule (its ratio held at --ratio; the
           loss averaged over the ranks with gloo after each step, not timed); not run
           unless --methods names it
  powersgd1, powersgd4
           PyTorch's own PowerSGD hook on gloo (ddp_comm_hooks.powerSGD_hook) at matrix rank
           1 and 4, its other settings its defaults (error feedback, warm start, minimum
           compression rate 2); vanilla all-reduce for the first --powersgd-start steps, by
           default 10% of --max-steps (at least 2), as its documentation advises
  fp16, bf16
           PyTorch's fp16_compress_hook and bf16_compress_hook on gloo: the bucket cast to
           16 bits, all-reduced, cast back
  compute  the same model without DDP (no communication): the step's compute alone

The torch hooks are wrapped to count what they hand to gloo per step (`allreduced_bytes`:
the 16-bit bucket; PowerSGD's uncompressed tensors, Ps and Qs, from its own counter
total_numel_after_compression, or the whole bucket in its warm-up); gloo's is 4 bytes a
parameter.

A step's time is the slowest rank's; the harness's repeats are the steps (time = the median
step, vs_gloo paired per round over the rounds both ran). After every round each method's
test accuracy is measured (each rank a share of the test set, the counts summed over gloo;
not timed). Time to accuracy = the method's summed step times up to the first step at which
its test accuracy reaches --target. A method stops once it has reached the target and run
--min-steps steps (compute: after --min-steps); a point ends when all have, or after
--max-steps rounds (-n is not used: the steps are the repeats). At the end every rank's
weights are compared (crc32) and the ranks' accuracies: each synchronised method must end
bit-identical on all ranks; `wrong` counts the ranks that did not. Besides the harness's
columns: parameters, steps, step quartiles, steps and seconds to the target and their ratio
to gloo's, accuracies, link and agent bytes, resends, top-k's block fraction, CPU per step,
drops. curves.csv (a row per step: time, cumulative time, test accuracy) and curves.png
beside the harness's outputs.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import os
import statistics
import time
import zlib
from dataclasses import dataclass

from bench.harness import method_rows
from bench.net_topo import dev_bytes, kernel_losses_total
from bench.paired import Cluster, proc_cpu, rotation
from bench.procs import cpu_seconds
from spina.topology import parse_rate


@dataclass(frozen=True)
class Method:
    """One way a step communicates. hook: None (DDP's own gloo all-reduce), "compute" (no
    DDP), "spina", a compressor on SpINA ("topk", "losscomp"), or one of PyTorch's hooks on
    gloo ("powersgd", "fp16", "bf16");
    rank: PowerSGD's matrix approximation rank; color: its curve's; default: run unless
    --methods says otherwise (LossComp is off by default, docs/compression.md); lane_bits:
    SpINA's lane width (16, 8: a narrow-lane job of LANE_BLOCKS' block size)."""
    name: str
    hook: str | None
    color: str
    rank: int = 0
    default: bool = True
    lane_bits: int = 32


METHOD_LIST = (
    Method("gloo", None, "C0"),
    Method("spina", "spina", "C1"),
    Method("spina16", "spina", "C9", lane_bits=16),
    Method("spina8", "spina", "olive", lane_bits=8),
    Method("topk", "topk", "C2"),
    Method("losscomp", "losscomp", "C8", default=False),
    Method("powersgd1", "powersgd", "C3", rank=1),
    Method("powersgd4", "powersgd", "C4", rank=4),
    Method("fp16", "fp16", "C5"),
    Method("bf16", "bf16", "C6"),
    Method("compute", "compute", "C7"),
)
BY_NAME = {m.name: m for m in METHOD_LIST}
METHODS = tuple(BY_NAME)
# trained with DDP: same weights on every rank, accuracy
SYNCED = tuple(m.name for m in METHOD_LIST if m.hook != "compute")
TORCH_HOOKS = ("powersgd", "fp16", "bf16")  # PyTorch's own, on gloo: counted by TorchHookCount
COMPRESSORS = ("topk", "losscomp")  # spina_compressed_hook, settings by compression_defaults
# A narrow lane's block: 56 rows of it fill int32's 57 KB datagram (docs/bits.md measured
# these against 256-element narrow rows: fewer, fuller datagrams paid at 10 Gbit/s).
LANE_BLOCKS = {16: 512, 8: 1024}
GLOO_PORT = 29500
DESCRIPTION = ("DDP training over a topology's links: gloo vs SpINA dense vs top-k vs "
               "PyTorch's PowerSGD and fp16/bf16 hooks (root)")
DEFAULTS = dict(methods=",".join(m.name for m in METHOD_LIST if m.default), densities="1",
                begin="25264168", end="25264168",  # 4 x params_of(2048): 6,316,042 parameters
                topology="bench/topologies/star4.yaml", rates="1gbit,10gbit")
EXTRA_COLUMNS = ("model", "seed", "params", "width", "steps", "step_q1_us", "step_q3_us",
                 "target_acc",
                 "steps_to_target", "time_to_target_s", "time_ratio", "final_acc", "best_acc",
                 "rx_bytes_per_link", "allreduced_bytes_per_step", "agent_bytes_per_step",
                 "resends", "blocks_fraction",
                 "agent_s_per_step", "compress_s_per_step", "worker_cpu_s_per_step",
                 "switch_cpu_s_per_step", "tbf_drops", "udp_drops", "tcp_retrans")
CURVE_COLUMNS = ("workers", "rate", "model", "width", "method", "step", "step_s", "cum_s",
                 "test_acc")


def add_ddp_options(ap, batch: int, lr: float) -> None:
    """The options of every WHAT that trains with DDP on a star (training, overlap)."""
    from spina import cli
    ap.add_argument("--batch", type=cli.int_range(1, 100_000), default=batch,
                    help="per rank and step (default %(default)s)")
    ap.add_argument("--lr", type=cli.positive_float, default=lr)
    ap.add_argument("--momentum", type=cli.non_negative_float, default=0.9)
    ap.add_argument("--seed", type=cli.int_range(0, 2 ** 31), default=0)
    ap.add_argument("--nslots", type=cli.int_range(1, 4096), default=16,
                    help="SpINA switch slots: the window (default %(default)s)")
    ap.add_argument("--nlanes", type=cli.int_range(1, 63), default=56,
                    help="SpINA blocks per datagram (default %(default)s)")


def check_ddp(a) -> str | None:
    """A WHAT that trains with DDP runs on a star file in namespaces, dense."""
    from bench.net_topo import check_star
    if a.topo is None:
        return f"argument -t/--topology: {a.what} runs in namespaces (give a star file)"
    if a.densities != [1.0]:
        return "argument -d/--densities: DDP's gradients are dense (give -d 1)"
    return check_star(a)


def add_run_options(ap, target: float, max_steps: int, min_steps: int) -> None:
    """The options of a run to an accuracy, shared with bench fsdp; each WHAT its defaults."""
    from spina import cli
    ap.add_argument("--target", type=cli.positive_float, default=target,
                    help="test accuracy (%%) to reach (default %(default)s)")
    ap.add_argument("--max-steps", type=cli.int_range(1, 100_000), default=max_steps,
                    help="rounds at most (default %(default)s)")
    ap.add_argument("--min-steps", type=cli.int_range(1, 100_000), default=min_steps,
                    help="steps every method runs, for its step time (default %(default)s)")
    ap.add_argument("--ratio", type=cli.fraction, default=0.05,
                    help="top-k: fraction of 256-element blocks each rank sends (default "
                    "%(default)s; bench/README.md says why)")


def add_options(ap) -> None:
    from bench.train_models import FAMILIES
    from spina import cli
    ap.add_argument("--model", choices=tuple(FAMILIES), default="mlp",
                    help="the model family and its data (bench/train_models.py; default "
                    "%(default)s); -b/-e pick its width")
    add_run_options(ap, target=95.0, max_steps=120, min_steps=20)
    ap.add_argument("--powersgd-start", type=cli.int_range(2, 100_000), default=None,
                    help="PowerSGD's start_powerSGD_iter: vanilla all-reduce before this step "
                    "(default: 10%% of --max-steps, at least 2, as torch's documentation "
                    "advises)")
    add_ddp_options(ap, batch=32, lr=0.05)


def check_options(a) -> str | None:
    if a.min_steps > a.max_steps:
        return f"argument --min-steps: above --max-steps ({a.max_steps})"
    return check_ddp(a)


def powersgd_start(max_steps: int, given: int | None = None) -> int:
    """PowerSGD's warm-up (start_powerSGD_iter): `given`, else 10% of the run's steps as
    torch's documentation suggests to start with, at least 2 (its minimum with error
    feedback and warm start)."""
    return given if given is not None else max(2, max_steps // 10)


def width_for(size: int, model: str = "mlp") -> int:
    """The width of `model` whose float32 gradient is nearest `size` bytes (the MLP
    1024-w-w-10: w^2 + 1036 w + 10 parameters)."""
    from bench.train_models import FAMILIES
    return FAMILIES[model].width_for(size)


def params_of(w: int, model: str = "mlp") -> int:
    from bench.train_models import FAMILIES
    return FAMILIES[model].params(w)


@dataclass(frozen=True)
class TrainRequest:
    """One training comparison, sent to every worker."""
    methods: tuple[str, ...]
    width: int          # the model's width (the MLP's 2048: 6.3M parameters)
    batch: int          # per rank and step
    lr: float
    momentum: float
    ratio: float        # top-k's fraction of blocks
    target: float       # test accuracy (%) that ends a method
    max_steps: int
    min_steps: int
    seed: int
    powersgd_start: int = 2  # PowerSGD's start_powerSGD_iter
    model: str = "mlp"       # bench/train_models.py FAMILIES
    switch_pid: int | None = None  # read its CPU time around every step (rank 0)
    count_dev: bool = True         # eth0's tx/rx bytes around every step (namespaces)
    reshard_after_forward: bool = True  # FSDP2's (bench/fsdp.py --no-reshard)


# ----------------------------------------------------------------------------- worker side
class TorchHookCount:
    """One of PyTorch's hooks on gloo and the bytes it handed to gloo (`bytes_sent`, per
    rank, summed over calls): fp16/bf16 2 bytes an element of the bucket; PowerSGD the
    elements its own counter adds (uncompressed tensors, Ps and Qs) or, in its warm-up, the
    float32 bucket. `pending`: PowerSGD's future of the step's previous bucket."""
    __slots__ = ("hook", "state", "powersgd", "bytes_sent", "calls", "pending")

    def __init__(self, kind: str, state):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        self.hook = dict(powersgd=powerSGD_hook.powerSGD_hook,
                         fp16=default_hooks.fp16_compress_hook,
                         bf16=default_hooks.bf16_compress_hook)[kind]
        self.state, self.powersgd = state, kind == "powersgd"
        self.bytes_sent = self.calls = 0
        self.pending = None


def counted_hook(count: TorchHookCount, bucket):
    """DDP hook: `count`'s torch hook, its bytes counted.

    PowerSGD starts a bucket only once the previous bucket's result is in: its hook starts
    the Qs' all-reduce in a callback on gloo's threads, and with two buckets in flight the
    ranks issued them in different orders (gloo: "Received data size doesn't match expected
    size", 5256 vs 1304 bytes, on the 3M MLP's two buckets)."""
    n = bucket.buffer().numel()
    st = count.state
    if count.pending is not None:
        count.pending.wait()
        count.pending = None
    if count.powersgd and st.iter >= st.start_powerSGD_iter:
        before = st.total_numel_after_compression
        fut = count.hook(st, bucket)  # counts its Ps, Qs and uncompressed tensors now
        count.bytes_sent += 4 * (st.total_numel_after_compression - before)
        count.pending = None if bucket.is_last() else fut
    else:
        fut = count.hook(st, bucket)
        count.bytes_sent += n * (4 if count.powersgd else 2)
    count.calls += 1
    return fut


class Run:
    """One method's model, optimiser, hook state and batches at one rank."""

    def __init__(self, method: str, req: TrainRequest, agent, rank: int, data,
                 lanes: dict | None = None):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        from bench.train_models import FAMILIES
        from host_agent.compression import make_compressor
        from host_agent.hooks import (
            CompressionHookState,
            SpinaHookState,
            spina_allreduce_hook,
            spina_compressed_hook,
        )
        from spina.communication import compression_defaults

        kind = BY_NAME[method].hook
        # a narrow-lane method's agent: the job of its width (bench.paired.Cluster's lanes)
        agent = {32: agent, **(lanes or {})}[BY_NAME[method].lane_bits]
        self.method, self.xtr, self.ytr = method, data[0], data[1]
        torch.manual_seed(req.seed)  # the same initial weights for every method
        self.module = FAMILIES[req.model].build(req.width)
        self.model = self.module if kind == "compute" else DDP(self.module)
        compressed = kind in COMPRESSORS
        self.opt = torch.optim.SGD(self.module.parameters(), lr=req.lr,
                                   momentum=0.0 if compressed else req.momentum)
        self.state = None
        if kind == "spina":
            self.state = SpinaHookState(agent)
            self.model.register_comm_hook(self.state, spina_allreduce_hook)
        elif compressed:
            comp = make_compressor(compression_defaults(kind, steps=req.max_steps,
                                                        momentum=req.momentum, ratio=req.ratio),
                                   block_size=agent.job.block_size)
            self.state = CompressionHookState(comp, agent, optimizer=self.opt)
            self.model.register_comm_hook(self.state, spina_compressed_hook)
        elif kind in TORCH_HOOKS:
            hook_state = None  # fp16/bf16: the default process group
            if kind == "powersgd":
                from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
                    PowerSGDState,
                )
                hook_state = PowerSGDState(process_group=None,
                                           matrix_approximation_rank=BY_NAME[method].rank,
                                           start_powerSGD_iter=req.powersgd_start)
            self.state = TorchHookCount(kind, hook_state)
            self.model.register_comm_hook(self.state, counted_hook)
        self.gen = torch.Generator().manual_seed(1000 * req.seed + rank)  # same for every method
        self.batch = req.batch

    def next_batch(self):
        import torch
        idx = torch.randint(len(self.ytr), (self.batch,), generator=self.gen)
        return self.xtr[idx], self.ytr[idx]

    def step(self, x, y):
        """One training step; its loss (a tensor)."""
        import torch.nn.functional as F
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: returns once every bucket is all-reduced
        self.opt.step()
        return loss.detach()

    def correct(self, x, y) -> int:
        import torch
        with torch.no_grad():
            return int((self.module(x).argmax(1) == y).sum())

    def weights_crc(self) -> int:
        import torch
        flat = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])
        return zlib.crc32(flat.numpy().tobytes())


def train_loop(rank: int, req: TrainRequest, agent, dist, torch, barrier, make_run):
    """The rounds of one comparison at this rank (the module docstring): every method's
    `make_run(method, req, agent, rank, (xtr, ytr))` (Run's interface; methods named as
    METHOD_LIST's) stepped side by side until the stopping rules end it. Returns (runs,
    {method: record}); each record its step times, link bytes, CPU and test accuracies."""
    n = agent.job.nworkers
    from bench.train_models import FAMILIES
    xtr, ytr, xte, yte = FAMILIES[req.model].data(req.seed, req.width)
    runs = {m: make_run(m, req, agent, rank, (xtr, ytr)) for m in req.methods}
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
            loss = run.step(x, y)
            dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
            barrier.wait()  # every worker done (the switch too: every rank has its sums)
            tx1, rx1 = dev_bytes() if req.count_dev else (0, 0)
            s1 = proc_cpu(req.switch_pid) if req.switch_pid and rank == 0 else 0.0
            for key, v in (("times", dt), ("cpu", dc), ("tx", tx1 - tx0), ("rx", rx1 - rx0),
                           ("switch_cpu", s1 - s0)):
                r[key].append(v)
            if BY_NAME[m].hook == "losscomp":  # its controller: the loss averaged over ranks
                dist.all_reduce(loss)
                run.state.observe_loss(float(loss) / n)
        step += 1
        # not timed: each rank counts its share of the test set, gloo sums the counts (every
        # rank evaluates the same methods in the same order: FSDP gathers in the forward)
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
    return runs, rec


def train_point(rank: int, req: TrainRequest, agent, dist, torch, barrier, floor=None,
                lanes=None) -> dict:
    """This worker's side of one comparison (see the module docstring): {method: record}.
    lanes: the narrow-lane jobs' agents by lane width (bench.paired.Cluster's `lanes`)."""
    runs, rec = train_loop(rank, req, agent, dist, torch, barrier,
                           functools.partial(Run, lanes=lanes))
    for m, run in runs.items():
        r = rec[m]
        r["crc"] = run.weights_crc()
        if isinstance(run.state, TorchHookCount):
            r.update(allreduced_bytes=run.state.bytes_sent)
        elif run.state is not None:
            st = run.state
            r.update(agent_bytes=st.bytes_sent, resends=st.resends, calls=st.calls,
                     agent_s=st.seconds)
            if m in COMPRESSORS:
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


def make_rows(recs: list[dict], req: TrainRequest, point: dict, what: str, load: str,
              common: dict) -> tuple[list, list]:
    """The harness's rows (one per method) and curve rows (one per method and step) of one
    point; `common`: the point's extra columns (drops)."""
    wrong = {}
    for m in req.methods:
        # synchronised methods: every rank's weights and accuracies must equal rank 0's
        wrong[m] = sum(w[m]["crc"] != recs[0][m]["crc"] or w[m]["acc"] != recs[0][m]["acc"]
                       for w in recs[1:]) if m in SYNCED else 0
    times = {m: per_step(recs, m, "times") for m in req.methods}
    ttt = {m: time_to_target(times[m], recs[0][m]["acc"], req.target) if m in SYNCED
           else (None, None) for m in req.methods}
    extras, sent, curves = {}, {}, []
    for m in req.methods:
        t = times[m]
        q1, _, q3 = quartiles(t)
        sent[m] = round(mean_per_step(recs, m, "tx"))
        e = dict(common, model=req.model, seed=req.seed, params=recs[0]["params"],
                 width=req.width, steps=len(t), lane_bits=BY_NAME[m].lane_bits,
                 step_q1_us=round(q1 * 1e6, 1), step_q3_us=round(q3 * 1e6, 1),
                 target_acc=req.target, rx_bytes_per_link=round(mean_per_step(recs, m, "rx")),
                 worker_cpu_s_per_step=round(mean_per_step(recs, m, "cpu"), 4),
                 switch_cpu_s_per_step=round(statistics.fmean(recs[0][m]["switch_cpu"]), 4))
        if m in SYNCED:
            acc = recs[0][m]["acc"]
            steps, secs = ttt[m]
            gsecs = ttt.get("gloo", (None, None))[1]
            e.update(steps_to_target=steps if steps is not None else "",
                     time_to_target_s=round(secs, 4) if secs is not None else "",
                     time_ratio=round(secs / gsecs, 4) if secs is not None and gsecs else "",
                     final_acc=acc[-1], best_acc=max(acc))
        if m == "gloo" or "allreduced_bytes" in recs[0][m]:
            # gloo: DDP all-reduces every float32 gradient once a step
            e["allreduced_bytes_per_step"] = round(statistics.fmean(
                w[m]["allreduced_bytes"] for w in recs) / len(t)) if m != "gloo" \
                else 4 * recs[0]["params"]
        if "agent_bytes" in recs[0][m]:
            e.update(agent_bytes_per_step=round(statistics.fmean(
                w[m]["agent_bytes"] for w in recs) / len(t)),
                resends=sum(w[m]["resends"] for w in recs),
                agent_s_per_step=round(statistics.fmean(w[m]["agent_s"] for w in recs)
                                       / len(t), 4))
        for k in recs[0][m].get("per_step", ()):  # a WHAT's own sums, per step (fsdp's)
            e[f"{k}_per_step"] = round(statistics.fmean(w[m]["per_step"][k] for w in recs)
                                       / len(t), 4)
        if "blocks_fraction" in recs[0][m]:
            e["blocks_fraction"] = round(statistics.fmean(w[m]["blocks_fraction"]
                                                          for w in recs), 4)
            e["compress_s_per_step"] = round(statistics.fmean(
                w[m]["compress_s"] for w in recs) / len(t), 4)
        extras[m] = e
        cum = 0.0
        acc = recs[0][m]["acc"] if m in SYNCED else [""] * len(t)
        for i, (dt, x) in enumerate(zip(t, acc)):
            cum += dt
            curves.append(dict(workers=point["workers"], rate=point["rate"], model=req.model,
                               width=req.width,
                               method=m, step=i + 1, step_s=round(dt, 6), cum_s=round(cum, 6),
                               test_acc=x))
    rows = method_rows(what, point, times, bus="all_reduce", sent=sent, wrong=wrong, load=load,
                       extras=extras)
    return rows, curves


def lane_jobs(methods) -> tuple[tuple[int, int], ...]:
    """bench.paired.Cluster's `lanes` for `methods`: (lane_bits, block_size) of every narrow
    width a method of METHOD_LIST's names (spina16, spina8)."""
    bits = {BY_NAME[m].lane_bits for m in methods if m in BY_NAME} - {32}
    return tuple((b, LANE_BLOCKS[b]) for b in sorted(bits))


@contextlib.contextmanager
def ddp_star(a, gloo_port: int, serve):
    """(graph, cluster): the star file -t in namespaces (tbf queues of 20 ms) and a worker per
    host serving `serve` (a module-level point function), the agents' window and lanes
    add_ddp_options' (every WHAT that trains on a star: training, fsdp, overlap)."""
    from bench.paired import star_places
    from spina.netgraph import Graph
    with Graph(a.topo, a.tag, queue_ms=20) as graph:
        places, gloo = star_places(graph, gloo_port)
        with Cluster(a.workers[0], nslots=a.nslots, block_size=256, nlanes=a.nlanes,
                     lanes=lane_jobs(a.methods), agent_kw=dict(rto=0.2), gloo=gloo,
                     serve=serve, **places) as cl:
            yield graph, cl


def run(a, log, serve=None, gloo_port: int = GLOO_PORT, **request):
    """Per rate and size (a model width) one comparison in one cluster on the star, its
    workers serving `serve` (default train_point; bench/fsdp.py passes its own and the
    TrainRequest fields of its own options, `request`)."""
    n = a.workers[0]
    a.curves = []
    with ddp_star(a, gloo_port, serve or train_point) as (graph, cl):
        for rate in graph.each_rate(a.rates):
            for size in a.sizes:
                w = width_for(size, a.model)
                req = TrainRequest(methods=tuple(a.methods), width=w, batch=a.batch,
                                   lr=a.lr, momentum=a.momentum, ratio=a.ratio,
                                   target=a.target, max_steps=a.max_steps,
                                   min_steps=a.min_steps, seed=a.seed,
                                   powersgd_start=powersgd_start(a.max_steps,
                                                                 a.powersgd_start),
                                   model=a.model, switch_pid=cl.switch_pid, **request)
                load0, drops0 = os.getloadavg()[0], graph.tbf_drops()
                k0 = kernel_losses_total(cl.pids)
                recs = cl.ask(req, f"{n} workers, {rate}, {a.model} width {w}")
                k1 = kernel_losses_total(cl.pids)
                common = dict(tbf_drops=graph.tbf_drops() - drops0,
                              **{k: k1[k] - k0[k] for k in k0})
                params = params_of(w, a.model)
                point = dict(size=4 * params, elements=params, dtype="float32",
                             density=1.0, workers=n, lane_bits=32, rate=rate)
                rows, curves = make_rows(recs, req, point, a.what,
                                         f"{load0:.2f}-{os.getloadavg()[0]:.2f}", common)
                a.curves += curves
                yield rows


def finish(rows, a) -> list[str]:
    """curves.csv (every step of every method) and curves.png."""
    path = os.path.join(a.out, "curves.csv")
    write_csv(getattr(a, "curves", []), path, CURVE_COLUMNS)
    out = [path]
    if not a.no_plots and rows:
        out.append(os.path.join(a.out, "curves.png"))
        plot(rows, a.curves, out[-1])
    return out


def write_csv(rows, path: str, columns) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)


def _point(r) -> tuple:
    """(workers, rate, width) of a row or curve: one comparison."""
    return int(r["workers"]), r["rate"], int(r["width"])


def plot(rows, curves, path: str) -> None:
    """Test accuracy over training time, a panel per (workers, rate, width)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = sorted({_point(r) for r in rows}, key=lambda p: (parse_rate(p[1]), p[0], p[2]))
    cols = min(3, len(points))
    nrows = -(-len(points) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.6 * nrows), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[len(points):]:
        ax.set_visible(False)
    for ax, pt in zip(axes, points):
        for m in SYNCED:
            pts = [c for c in curves if _point(c) == pt and c["method"] == m]
            if pts:
                ax.plot([c["cum_s"] for c in pts], [c["test_acc"] for c in pts],
                        color=BY_NAME[m].color, lw=1.2, label=m)
        tgt = [r["target_acc"] for r in rows if r["method"] in SYNCED]
        if tgt:
            ax.axhline(tgt[0], color="k", ls="--", lw=0.8)
        ax.set(xlabel="training time (s, summed steps)", ylabel="test accuracy (%)",
               title=f"{pt[0]} workers, {pt[1]}, width {pt[2]}", ylim=(0, 100))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def seed_table(paths: list[str], rerun: list[str] = (), replaced: tuple = ()) -> str:
    """A markdown table over runs that differ only by --seed (their results.csv files), a
    row per model and method: final test accuracy, mean (min..max) over the seeds and its
    difference to gloo at the same seed, bytes per link and step (mean; and as a share of
    gloo's), the median step time (mean over the seeds). The `replaced` methods' rows come
    from the `rerun` files only (methods run again after a change), the others' from
    `paths` only. docs/compression.md's table:
        python -c 'from bench.training import seed_table as t; print(t([...]))'"""
    def read(files, keep):
        out = []
        for p in files:
            with open(p, newline="") as f:
                out += [r for r in csv.DictReader(f) if keep(r["method"])]
        return out
    rows = read(paths, lambda m: m not in replaced) + read(rerun, lambda m: m in replaced)
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["method"]), {})[int(r["seed"])] = r
    out = ["| model | method | test acc (%), mean (min..max) | vs gloo, same seed | "
           "bytes/link/step | vs gloo's bytes | step ms | seeds |", "|---" * 8 + "|"]

    def spread(xs: list[float], sign: str = "") -> str:
        return f"{statistics.fmean(xs):{sign}.2f} ({min(xs):{sign}.2f}..{max(xs):{sign}.2f})"

    order = {m: i for i, m in enumerate(METHODS)}
    def place(item):
        (model, method), _ = item
        return model, order.get(method, len(order))

    for (model, method), seeds in sorted(by.items(), key=place):
        gloo = by.get((model, "gloo"), {})
        acc = [float(r["final_acc"]) for r in seeds.values()]
        diff = [float(r["final_acc"]) - float(gloo[s]["final_acc"]) for s, r in seeds.items()
                if s in gloo]
        sent = statistics.fmean(int(r["bytes_per_link"]) for r in seeds.values())
        gsent = statistics.fmean(int(r["bytes_per_link"]) for r in gloo.values()) if gloo else 0
        step = statistics.fmean(float(r["time_us"]) for r in seeds.values()) / 1e3
        out.append(f"| {model} | {method} | {spread(acc)} | {spread(diff, '+')} | "
                   f"{sent / 1e3:,.1f} kB | {100 * sent / gsent:.2f}% | {step:.1f} | "
                   f"{', '.join(map(str, sorted(seeds)))} |")
    return "\n".join(out)
