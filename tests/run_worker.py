"""One rank of a test program, as a separate process: all-reduces `--value` `--calls` times
and prints what it got as JSON. Used by tests/test_run_identity.py to run the same job twice
from new processes, through each way a program finds its job, and by tests/test_seams.py.

    python -m tests.run_worker --via jobfile|assignment|daemon|ddp FILE --rank R --value V
    python -m tests.run_worker --via assignment FILE --rank R --seed S --nranks N [--die-after K]

With --seed, each call all-reduces rank R's own random tensor (int32 at 30% block density,
then float32 dense, alternating), which every rank can rebuild for every rank: the worker
checks its result against numpy's sum of all N ranks' tensors and prints, per call, whether
an int32 sum is exact, a float32 sum's largest error against the quantization bound of
docs/aggregation.md, and a digest of the result's bytes (bit-identity across ranks).
--die-after K: exit at once, without closing anything, after K calls (a killed worker).
--later-timeout S: the agent's timeout from the second call on (the others' call that a killed
worker never joins fails after S seconds; the join and first call keep --timeout).
"""
import argparse
import hashlib
import json
import math
import os

import numpy as np

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
    ap.add_argument("--seed", type=int, help="random tensors checked against numpy (above)")
    ap.add_argument("--nranks", type=int, default=2, help="the job's ranks (--seed)")
    ap.add_argument("--die-after", type=int, help="exit abruptly after this many calls")
    ap.add_argument("--later-timeout", type=float,
                    help="the agent's timeout (s) from the second call on (--seed)")
    ap.add_argument("--length", type=int, default=N,
                    help="elements per tensor (--seed; a multiple of 250)")
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
            from host_agent.daemon.client import DaemonClient
            agent = DaemonClient(args.file, args.rank, args.socket)
        if args.seed is not None:
            out["checks"] = checked(agent, args)
        else:
            x = np.full(N, args.value, args.dtype)
            got = []
            for _ in range(args.calls):
                r = agent.allreduce(x)
                got.append([float(r.min()), float(r.max())])
            out["results"] = got
        agent.close()
    print(json.dumps(out), flush=True)


def tensor(seed: int, call: int, rank: int, n: int = N) -> np.ndarray:
    """Rank `rank`'s tensor of call `call`: int32 with 30% of its 256-blocks non-zero on even
    calls, dense float32 on odd ones."""
    rng = np.random.default_rng([seed, call, rank])
    if call % 2 == 0:
        x = rng.integers(-1000, 1000, n).astype(np.int32)
        x.reshape(-1, 250)[rng.random(n // 250) > 0.3] = 0
        return x
    return rng.standard_normal(n).astype(np.float32) * 10 ** rng.uniform(-2, 2)


def checked(agent, args) -> list[dict]:
    """Each call's result against numpy's sum of every rank's tensor (module doc)."""
    out = []
    for call in range(args.calls):
        if args.die_after is not None and call == args.die_after:
            os._exit(9)  # killed: no close, no goodbye
        if call == 1 and args.later_timeout is not None:
            agent.timeout = args.later_timeout
        xs = [tensor(args.seed, call, r, args.length) for r in range(args.nranks)]
        got = agent.allreduce(xs[args.rank])
        item = {"digest": hashlib.sha256(got.tobytes()).hexdigest()[:16], "dtype": str(got.dtype)}
        if got.dtype == np.int32:
            item["exact"] = bool(np.array_equal(got, np.sum(xs, axis=0, dtype=np.int32)))
        else:
            want = np.sum(np.array(xs, np.float64), axis=0)
            # docs/aggregation.md: N * 2^(-S-1) + ulp/2 with S = 30 - ceil(log2 N) - E, E the
            # slot's exponent; the tensor's largest exponent bounds every slot's.
            e = math.ceil(math.log2(max(float(np.abs(x).max()) for x in xs)))
            n = args.nranks
            s = 30 - math.ceil(math.log2(n)) - e
            bound = n * 2.0 ** (-s - 1) + float(np.spacing(np.float32(np.abs(want).max()))) / 2
            item["error"] = float(np.abs(got - want).max())
            item["bound"] = bound
        out.append(item)
    return out


def ddp(args) -> dict:
    """A DDP step whose gradient is `value` everywhere at this rank: SpINA's average."""
    import torch
    import torch.distributed as dist

    from host_agent.assignment import agent_from_env
    from host_agent.hooks import SpinaHookState, spina_allreduce_hook
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
