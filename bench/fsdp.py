"""fsdp: FSDP2 training where the network is the limit: FSDP2's own gloo collectives against
its all-gather and reduce-scatter through SpINA (dense, and block top-k of the gradients),
stepped side by side in the same processes.

    python -m bench fsdp -t bench/topologies/star4.yaml --rates 1gbit              # root
    python -m bench fsdp -t bench/topologies/star4.yaml --rates 1gbit -b 280K -e 280K \
        --max-steps 3 --min-steps 3 --out /tmp/f                    # a smoke run (tests)

The network, the processes and the task are bench/training.py's (a star topology file in
namespaces, tbf both ways on every link, the software switch in the aggregating switch's
namespace, a worker per host; the MLP 1024-w-w-10 whose float32 gradient is the point's
size, on digits upsampled to 32x32; SGD with momentum, the same batches for every method).
Each method's model is sharded by FSDP2 (`fully_shard` on each Linear and on the model, one
gloo group of the ranks on their eth0):

  gloo     FSDP2's own collectives (gloo's all_gather_single and reduce_scatter_single)
  spina    host_agent/hooks/fsdp.py shard_on_spina: every module's all-gather through
           Agent.allgather, its reduce-scatter through Agent.reduce_scatter, dense
  topk     the same, each module's gradient cut to its top --ratio of 256-element blocks
           with error feedback (no DGC momentum: the optimiser keeps its own)

A round runs one step of each method, the order rotating; each step between two barriers,
only the step timed (the forward's all-gathers, backward with its all-gathers and
reduce-scatters, the optimiser step). After every round each method's test accuracy (each rank
a share of the test set, the counts summed over gloo; not timed); time to accuracy, stopping
rules, the columns and curves.csv/curves.png are bench/training.py's: a method stops once
it has reached --target and run --min-steps steps, or after --max-steps. `wrong` counts the
ranks whose gathered parameters (crc32 of every full_tensor) or accuracies differ from rank
0's at the end. agent_bytes_per_step is what the agent sent for both collectives (UDP
payload), blocks_fraction top-k's, compress_s_per_step its compressor's time.
"""
from __future__ import annotations

import time
import zlib

from bench import training
from bench.net_topo import dev_bytes
from bench.paired import proc_cpu, rotation
from bench.procs import cpu_seconds

METHODS = ("gloo", "spina", "topk")
GLOO_PORT = 29501
DESCRIPTION = ("FSDP2 training over a topology's links: its gloo collectives vs its "
               "all-gather and reduce-scatter through SpINA, dense and top-k (root)")
DEFAULTS = dict(training.DEFAULTS, methods=",".join(METHODS), rates="1gbit")
EXTRA_COLUMNS = training.EXTRA_COLUMNS
CURVE_COLUMNS = training.CURVE_COLUMNS
check_options = training.check_options
finish = training.finish


def add_options(ap) -> None:
    from spina import cli
    ap.add_argument("--target", type=cli.positive_float, default=90.0,
                    help="test accuracy (%%) to reach (default %(default)s)")
    ap.add_argument("--max-steps", type=cli.int_range(1, 100_000), default=60,
                    help="rounds at most (default %(default)s)")
    ap.add_argument("--min-steps", type=cli.int_range(1, 100_000), default=10,
                    help="steps every method runs, for its step time (default %(default)s)")
    ap.add_argument("--ratio", type=cli.fraction, default=0.05,
                    help="top-k: fraction of 256-element blocks each rank sends (default "
                    "%(default)s)")
    training.add_ddp_options(ap, batch=32, lr=0.05)


class FsdpRun:
    """One method's FSDP2 model, optimiser and counters at one rank (training.Run's
    interface: next_batch, step, correct, weights_crc)."""

    def __init__(self, method: str, req: training.TrainRequest, agent, rank: int, data):
        import torch
        from torch.distributed.fsdp import fully_shard

        from bench.train_models import FAMILIES
        from host_agent.hooks.fsdp import shard_on_spina

        self.method, self.xtr, self.ytr = method, data[0], data[1]
        torch.manual_seed(req.seed)  # the same initial weights for every method
        self.module = FAMILIES[req.model].build(req.width)  # the MLP: a Sequential
        self.params = sum(p.numel() for p in self.module.parameters())
        for layer in self.module:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(self.module)
        self.model = self.module
        self.opt = torch.optim.SGD(self.module.parameters(), lr=req.lr, momentum=req.momentum)
        self.state = None
        if method != "gloo":
            compression = {"method": "topk", "ratio": req.ratio} if method == "topk" else None
            self.state = shard_on_spina(self.module, agent, compression=compression)
        self.gen = torch.Generator().manual_seed(1000 * req.seed + rank)  # same for every method
        self.batch = req.batch

    next_batch = training.Run.next_batch
    step = training.Run.step
    correct = training.Run.correct

    def weights_crc(self) -> int:
        """crc32 of the full parameters (gathered over gloo: every rank's shards)."""
        crc = 0
        for p in self.module.parameters():
            crc = zlib.crc32(p.full_tensor().detach().numpy().tobytes(), crc)
        return crc


def train_point(rank: int, req: training.TrainRequest, agent, dist, torch, barrier,
                floor=None) -> dict:
    """This worker's side of one comparison: {method: record} as training.train_point's."""
    n = agent.job.nworkers
    from bench.train_models import FAMILIES
    xtr, ytr, xte, yte = FAMILIES[req.model].data(req.seed, req.width)
    runs = {m: FsdpRun(m, req, agent, rank, (xtr, ytr)) for m in req.methods}
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
            run.step(x, y)
            dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
            barrier.wait()
            tx1, rx1 = dev_bytes() if req.count_dev else (0, 0)
            s1 = proc_cpu(req.switch_pid) if req.switch_pid and rank == 0 else 0.0
            for key, v in (("times", dt), ("cpu", dc), ("tx", tx1 - tx0), ("rx", rx1 - rx0),
                           ("switch_cpu", s1 - s0)):
                r[key].append(v)
        step += 1
        # not timed; every rank evaluates every active method (FSDP gathers in the forward)
        counts = torch.tensor([runs[m].correct(mine_x, mine_y) for m in active],
                              dtype=torch.int64)
        dist.all_reduce(counts)
        for m, c in zip(active, counts.tolist()):
            rec[m]["acc"].append(100.0 * c / len(yte))
            reached[m] = reached[m] or rec[m]["acc"][-1] >= req.target
        active = [m for m in active if step < req.min_steps or not reached[m]]
    for m, run in runs.items():
        r = rec[m]
        r["crc"] = run.weights_crc()
        if run.state is not None:
            c = run.state
            r.update(agent_bytes=c.gather_bytes_sent + c.scatter_bytes_sent,
                     resends=c.resends, calls=c.gather_calls + c.scatter_calls,
                     agent_s=c.gather_seconds + c.scatter_seconds)
            if m == "topk":
                r.update(blocks_fraction=c.blocks_sent / max(1, c.blocks_total),
                         compress_s=c.compress_seconds)
    rec["params"] = runs[req.methods[0]].params
    return rec


def run(a, log):
    """Per rate and size (a model width) one comparison in one cluster on the star (as
    training.run, the workers serving train_point)."""
    import os

    from bench.net_topo import Graph, kernel_losses_total
    from bench.paired import Cluster, star_places
    n = a.workers[0]
    a.curves = []
    with Graph(a.topo, a.tag, queue_ms=20) as graph:
        places, gloo = star_places(graph, GLOO_PORT)
        with Cluster(n, nslots=a.nslots, block_size=256, nlanes=a.nlanes,
                     agent_kw=dict(rto=0.2), gloo=gloo, serve=train_point, **places) as cl:
            for rate in a.rates or [None]:
                if rate is not None:
                    graph.set_rate(rate)
                for size in a.sizes:
                    w = training.width_for(size)
                    req = training.TrainRequest(
                        methods=tuple(a.methods), width=w, batch=a.batch, lr=a.lr,
                        momentum=a.momentum, ratio=a.ratio, target=a.target,
                        max_steps=a.max_steps, min_steps=a.min_steps, seed=a.seed,
                        switch_pid=cl.switch_pid)
                    load0, drops0 = os.getloadavg()[0], graph.tbf_drops()
                    k0 = kernel_losses_total(cl.pids)
                    recs = cl.ask(req, f"{n} workers, {graph.file_rate()}, width {w}")
                    k1 = kernel_losses_total(cl.pids)
                    common = dict(tbf_drops=graph.tbf_drops() - drops0,
                                  **{k: k1[k] - k0[k] for k in k0})
                    params = training.params_of(w)
                    point = dict(size=4 * params, elements=params, dtype="float32",
                                 density=1.0, workers=n, lane_bits=32, rate=graph.file_rate())
                    rows, curves = training.make_rows(
                        recs, req, point, a.what, f"{load0:.2f}-{os.getloadavg()[0]:.2f}",
                        common)
                    a.curves += curves
                    yield rows
