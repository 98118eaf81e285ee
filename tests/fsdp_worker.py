"""The ranks of tests/test_fsdp.py, as processes on loopback gloo: per case, two copies of one
small model, each under FSDP2 (`fully_shard` per layer and the root), train side by side on
the same batches, one on gloo (the reference) and one through SpINA (`shard_on_spina`); each
rank saves both copies' full parameters after every step to OUT/rank<R>.npz.

    python -m tests.fsdp_worker WORLD GLOO_PORT OUT JOB_FILE[,JOB_FILE...] CASE[,CASE...] \
        [DAEMON_SOCKET]

A case is MODE/DATA/STEPS: MODE gather (SpINA all-gather, gloo reduce-scatter), dense,
narrow (the second job file's 16-bit lanes), topk1 (block top-k keeping every block),
topk (ratio 0.25) or daemon (dense, through the daemon at DAEMON_SOCKET: a DaemonClient of
the third job file's); DATA float (normal inputs and initial weights) or int (small integers,
dyadic weights: every gradient on the quantization grid, so a dense sum is exact). Rank 0
also saves, per case, the largest |gradient| any rank fed the reference's first
reduce-scatter (the quantization bound's scale) and the SpINA copy's counters.
"""
import os
import sys

import numpy as np

LR = 2.0 ** -6  # dyadic: an SGD step of dyadic gradients stays on the grid
BATCH, DIN, HIDDEN, DOUT = 8, 12, 40, 6


def model(data: str):
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(DIN, HIDDEN), torch.nn.ReLU(),
                            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                            torch.nn.Linear(HIDDEN, DOUT))
    if data == "int":
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randint(-2, 3, p.shape) / 8.0)
    return m


def batch(rank: int, step: int, data: str):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    if data == "int":
        return torch.randint(-3, 4, (BATCH, DIN), generator=g).float()
    return torch.randn(BATCH, DIN, generator=g)


class Recording:
    """gloo's reduce-scatter, recording the largest |input| (the reference's gradients)."""

    def __init__(self):
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

        outer = self

        class RS(ReduceScatter):
            def allocate(self, size, *, dtype, device):
                import torch
                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                outer.absmax = max(outer.absmax, float(input_tensor.abs().max()))
                dist.reduce_scatter_single(output=output_tensor, input=input_tensor, op=op,
                                           group=group)
        self.absmax = 0.0
        self.comm = RS()


def sharded(data: str):
    from torch.distributed.fsdp import fully_shard
    m = model(data)
    for layer in m:
        if len(list(layer.parameters())):
            fully_shard(layer)
    fully_shard(m)
    return m


def full(m) -> np.ndarray:
    return np.concatenate([p.full_tensor().detach().numpy().reshape(-1)
                           for p in m.parameters()])


def run_case(rank: int, agents, case: str, res: dict) -> None:
    import torch
    import torch.distributed as dist

    from host_agent.hooks.fsdp import fsdp_modules, shard_on_spina
    mode, data, steps = case.split("/")
    ref, net = sharded(data), sharded(data)
    rec = Recording()
    for m in fsdp_modules(ref):
        m.set_custom_reduce_scatter(rec.comm)
    agent = agents[{"narrow": 1, "daemon": 2}.get(mode, 0)]
    compression = {"topk1": {"method": "topk", "ratio": 1.0},
                   "topk": {"method": "topk", "ratio": 0.25}}.get(mode)
    counters = shard_on_spina(net, agent, compression=compression,
                              reduce_scatter=mode != "gather")
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (ref, net)]
    for step in range(int(steps)):
        x = batch(rank, step, data)
        for m, opt in zip((ref, net), opts):
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
            res[f"{case}/{'ref' if m is ref else 'spina'}/{step}"] = full(m)
        if step == 0:
            top = torch.tensor([rec.absmax])
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            res[f"{case}/absmax"] = top.numpy()
    for k, v in counters.as_dict().items():
        res[f"{case}/counters/{k}"] = np.array(v)


def run_rank(rank: int, world: int, port: int, out: str, job_files, cases,
             daemon: str | None = None) -> None:
    import torch.distributed as dist

    from host_agent.assignment import agent_from_env
    from host_agent.daemon import DaemonClient
    from spina.net import init_loopback_gloo
    init_loopback_gloo(rank, world, port, timeout=120)
    agents = [agent_from_env(f, rank, timeout=30.0) for f in job_files[:2]]
    if daemon is not None:
        agents.append(DaemonClient(job_files[2], rank, daemon))
    res = {}
    try:
        for case in cases:
            run_case(rank, agents, case, res)
    finally:
        for a in agents:
            a.close()
    np.savez(os.path.join(out, f"rank{rank}.npz"), **res)
    dist.destroy_process_group()


def main() -> int:
    """Import torch once, then fork the other ranks (collectives_worker.fork_ranks)."""
    world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    job_files, cases = sys.argv[4].split(","), sys.argv[5].split(",")
    daemon = sys.argv[6] if len(sys.argv) > 6 else None
    import torch.distributed.fsdp  # noqa: F401  (before the fork: imported once for all)

    from tests.collectives_worker import fork_ranks
    return fork_ranks(world, lambda rank: run_rank(rank, world, port, out, job_files, cases,
                                                   daemon))


if __name__ == "__main__":
    sys.exit(main())
