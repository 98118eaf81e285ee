"""fsdp: FSDP2 training where the network is the limit: FSDP2's own gloo collectives against
its all-gather and reduce-scatter through SpINA (dense, and block top-k of the gradients),
stepped side by side in the same processes.

    python -m bench fsdp -t bench/topologies/star4.yaml --rates 1gbit              # root
    python -m bench fsdp -t bench/topologies/star4.yaml --rates 1gbit --no-reshard # 1 gather
    python -m bench fsdp -t bench/topologies/star4.yaml --rates 1gbit -b 280K -e 280K \
        --max-steps 3 --min-steps 3 --out /tmp/f                    # a smoke run (tests)

The network, the processes and the task are bench/training.py's (a star topology file in
namespaces, tbf both ways on every link, the software switch in the aggregating switch's
namespace, a worker per host; the MLP 1024-w-w-10 whose float32 gradient is the point's
size, on digits upsampled to 32x32; SGD with momentum, the same batches for every method).
Each method's model is sharded by FSDP2 (`fully_shard` on each Linear and on the model, one
gloo group of the ranks on their eth0), with FSDP2's default reshard_after_forward=True (each
module's parameters gathered for its forward and again for its backward) or, --no-reshard,
False (gathered once a step, kept unsharded from forward to backward: memory for one
all-gather; docs/collectives.md "FSDP2 on SpINA" has the arithmetic of both):

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
payload), agent_s_per_step the time in them, gather_s_per_step and scatter_s_per_step that
time's two parts (all of them the timed steps' only: the evaluation gathers too),
blocks_fraction top-k's, compress_s_per_step its compressor's time.
"""
from __future__ import annotations

import zlib

from bench import training

METHODS = ("gloo", "spina", "topk")
GLOO_PORT = 29501
DESCRIPTION = ("FSDP2 training over a topology's links: its gloo collectives vs its "
               "all-gather and reduce-scatter through SpINA, dense and top-k (root)")
DEFAULTS = dict(training.DEFAULTS, methods=",".join(METHODS), rates="1gbit")
EXTRA_COLUMNS = training.EXTRA_COLUMNS + ("reshard_after_forward", "gather_s_per_step",
                                           "scatter_s_per_step")
CURVE_COLUMNS = training.CURVE_COLUMNS
check_options = training.check_options
finish = training.finish


def add_options(ap) -> None:
    training.add_run_options(ap, target=90.0, max_steps=60, min_steps=10)
    ap.add_argument("--no-reshard", action="store_true",
                    help="FSDP2's reshard_after_forward=False: each module gathered once a step "
                    "(default: True, FSDP2's, twice)")
    training.add_ddp_options(ap, batch=32, lr=0.05)
    # training.run's request reads them: FsdpRun shards the MLP's Linear layers, no PowerSGD
    ap.set_defaults(model="mlp", powersgd_start=None)


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
        self.reshard = req.reshard_after_forward
        for layer in self.module:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, reshard_after_forward=self.reshard)
        fully_shard(self.module, reshard_after_forward=self.reshard)
        self.model = self.module
        self.opt = torch.optim.SGD(self.module.parameters(), lr=req.lr, momentum=req.momentum)
        self.state, self.timed = None, {}
        if method != "gloo":
            compression = {"method": "topk", "ratio": req.ratio} if method == "topk" else None
            self.state = shard_on_spina(self.module, agent, compression=compression)
        self.gen = torch.Generator().manual_seed(1000 * req.seed + rank)  # same for every method
        self.batch = req.batch

    next_batch = training.Run.next_batch

    def step(self, x, y):
        """training.Run's; the change of the SpINA counters kept in `timed` (the timed steps'
        alone: the evaluation's forward gathers too)."""
        if self.state is None:
            return training.Run.step(self, x, y)
        before = self.state.as_dict()
        loss = training.Run.step(self, x, y)
        for k, v in self.state.as_dict().items():
            self.timed[k] = self.timed.get(k, 0) + v - before[k]
        return loss

    def correct(self, x, y) -> int:
        """training.Run's; without resharding after forward the evaluation's forward leaves
        the parameters gathered: reshard them, so the next timed step gathers as any other."""
        from host_agent.hooks.fsdp import fsdp_modules
        got = training.Run.correct(self, x, y)
        if not self.reshard:
            for m in fsdp_modules(self.module):
                m.reshard()
        return got

    def weights_crc(self) -> int:
        """crc32 of the full parameters (gathered over gloo: every rank's shards)."""
        crc = 0
        for p in self.module.parameters():
            crc = zlib.crc32(p.full_tensor().detach().numpy().tobytes(), crc)
        return crc


def train_point(rank: int, req: training.TrainRequest, agent, dist, torch, barrier,
                floor=None) -> dict:
    """This worker's side of one comparison: {method: record} as training.train_point's."""
    runs, rec = training.train_loop(rank, req, agent, dist, torch, barrier, FsdpRun)
    for m, run in runs.items():
        r = rec[m]
        r["crc"] = run.weights_crc()
        if run.state is not None:  # the timed steps' counters
            c = run.timed
            r.update(agent_bytes=c["gather_bytes_sent"] + c["scatter_bytes_sent"],
                     resends=c["resends"], calls=c["gather_calls"] + c["scatter_calls"],
                     agent_s=c["gather_seconds"] + c["scatter_seconds"],
                     per_step=dict(gather_s=c["gather_seconds"], scatter_s=c["scatter_seconds"]))
            if m == "topk":
                r.update(blocks_fraction=c["blocks_sent"] / max(1, c["blocks_total"]),
                         compress_s=c["compress_seconds"])
    rec["params"] = runs[req.methods[0]].params
    return rec


def run(a, log):
    """Per rate and size (a model width) one comparison in one cluster on the star:
    training.run, the workers serving train_point."""
    reshard = not a.no_reshard
    for rows in training.run(a, log, serve=train_point, gloo_port=GLOO_PORT,
                             reshard_after_forward=reshard):
        yield [dict(r, reshard_after_forward=reshard) for r in rows]
