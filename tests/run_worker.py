"""One rank of a test program, as a separate process: all-reduces `--value` `--calls` times
and prints what it got as JSON. Used by tests/test_run_identity.py to run the same job twice
from new processes, through each way a program finds its job.

    python tests/run_worker.py --via jobfile|assignment|daemon|ddp FILE --rank R --value V
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N = 50_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--via", required=True, choices=["jobfile", "assignment", "daemon", "ddp"])
    ap.add_argument("file")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--value", type=float, required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--socket", help="daemon socket (--via daemon)")
    ap.add_argument("--world", type=int, default=2, help="ranks (--via ddp)")
    ap.add_argument("--pg", help="file:// rendezvous path of the gloo group (--via ddp)")
    ap.add_argument("--timeout", type=float, default=20.0, help="the agent's timeout (s)")
    args = ap.parse_args()
    out = {"rank": args.rank}
    if args.via == "ddp":
        out.update(ddp(args))
    else:
        if args.via == "jobfile":
            from host_agent.agent import Agent
            from spina.config import JobFile
            jf = JobFile.load(args.file)
            agent = Agent(jf.job, args.rank, jf.switch, timeout=args.timeout,
                          rendezvous=jf.rendezvous)
        elif args.via == "assignment":
            from host_agent.assignment import connect
            agent = connect(args.file, timeout=args.timeout)
        else:
            from host_agent.daemon import DaemonClient
            agent = DaemonClient(args.file, args.rank, args.socket)
        x = np.full(N, args.value, args.dtype)
        got = []
        for _ in range(args.calls):
            r = agent.allreduce(x)
            got.append([float(r.min()), float(r.max())])
        agent.close()
        out["results"] = got
    print(json.dumps(out), flush=True)


def ddp(args) -> dict:
    """A DDP step whose gradient is `value` everywhere at this rank: SpINA's average."""
    import torch
    import torch.distributed as dist
    from host_agent.torch_hook import SpinaHookState, agent_from_env, spina_allreduce_hook
    dist.init_process_group("gloo", init_method=f"file://{args.pg}", rank=args.rank,
                            world_size=args.world)
    agent = agent_from_env(args.file, rank=args.rank, timeout=args.timeout)
    lin = torch.nn.Linear(1000, 1, bias=False)
    model = torch.nn.parallel.DistributedDataParallel(lin)
    model.register_comm_hook(SpinaHookState(agent), spina_allreduce_hook)
    got = []
    for _ in range(args.calls):
        model.zero_grad()
        (model(torch.full((1, 1000), args.value)).sum()).backward()  # grad = value per weight
        g = lin.weight.grad
        got.append([float(g.min()), float(g.max())])
    agent.close()
    dist.destroy_process_group()
    return {"results": got}


if __name__ == "__main__":
    main()
