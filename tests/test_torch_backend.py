"""The "spina" torch.distributed backend (host_agent/torch_backend.py).

Run just these tests:  .venv/bin/python -m pytest tests/test_torch_backend.py

Spawns 2 processes that init_process_group("spina") against a software switch running on a
thread of this test process (file:// rendezvous in a temp dir).
"""
import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina.config import JobFile
from tests.test_torch_hook import leave_worker

WORLD = 2


def _worker(rank, tmp):
    """DDP without a hook on the spina process group; collectives checked against exact values;
    the process group's timeout is the agent's per-call timeout."""
    import host_agent.torch_backend  # noqa: F401  (registers "spina")
    torch.set_num_threads(1)
    os.environ["SPINA_JOB_FILE"] = f"{tmp}/job.json"
    dist.init_process_group("spina", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=17))
    pg = dist.distributed_c10d._get_default_group()
    assert pg.agent.timeout == 17.0, "init_process_group(timeout=) bounds each SpINA call"
    t = torch.full((1000,), rank + 1.0, dtype=torch.bfloat16)
    dist.all_reduce(t)  # SpINA
    assert torch.equal(t, torch.full((1000,), 3.0, dtype=torch.bfloat16))
    m = torch.tensor([rank])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)  # gloo
    assert m.item() == 1
    b = torch.full((3,), float(rank))
    dist.broadcast(b, 1)  # gloo
    assert torch.equal(b, torch.ones(3))
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(20, 4))
    calls = pg.spina_calls
    for _ in range(3):
        model(torch.randn(8, 20)).pow(2).sum().backward()  # DDP's bucket all-reduce: SpINA
        g = model.module.weight.grad.reshape(-1).clone()
        every = [torch.empty_like(g) for _ in range(WORLD)]
        dist.all_gather(every, g)
        assert torch.equal(every[0], every[1]), "gradients differ across ranks"
        model.zero_grad()
    assert pg.spina_calls >= calls + 3
    if rank == 0:
        Path(tmp, "done.json").write_text(json.dumps({"spina_calls": pg.spina_calls}))
    dist.barrier()
    pg.agent.close()
    dist.destroy_process_group()
    leave_worker()


def test_spina_backend_allreduce_and_ddp(tmp_path):
    """Float SUM all-reduce and DDP's buckets go through SpINA, other collectives through gloo."""
    job = local_job(WORLD)
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        JobFile(job, sw.address).write(tmp_path / "job.json")
        mp.start_processes(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True,
                           start_method="spawn")
        assert sw.packets_in > 0
    assert json.loads((tmp_path / "done.json").read_text())["spina_calls"] >= 4
