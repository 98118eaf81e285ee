"""The ranks of tests/test_collectives.py, as processes on loopback gloo: each runs every
collective case and saves what it got to OUT/rank<R>.npz (the test compares with numpy).

    python -m tests.collectives_worker WORLD PORT OUT [SWITCH_PORT,UDP_PORTS...]

With the last argument (the test's software switch and 4 + 2 free UDP ports), 4 ranks also
run the all-gathers through the switch (switch_jobs: the flat job and the leaders' job).
"""
import os
import sys

import numpy as np

LENGTHS = (1, 3, 5, 37, 1001)  # shorter than, and not divisible by, the world sizes


def case_input(rank: int, n: int, dtype: str, seed: int) -> np.ndarray:
    """Rank `rank`'s input: int32 in +-1000; float32 of magnitudes 1e-3..1e3 (so the order of
    the sums shows in the bits)."""
    rng = np.random.default_rng([seed, rank, n])
    if dtype == "int32":
        return rng.integers(-1000, 1000, n).astype(np.int32)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)


def cases(world: int):
    """(key, group ranks or None, algorithm, groups) of every case a world of `world` runs."""
    out = []

    def add(name, ranks, p):
        for alg in ("ring", "halving-doubling", "direct"):
            out.append((f"{name}-{alg}", ranks, alg, None))
        for g in range(2, p):
            if p % g == 0:
                for alg in ("2d-ring", "2d-direct"):
                    out.append((f"{name}-{alg}-g{g}", ranks, alg, g))
    add("world", None, world)
    if world == 8:  # sub-groups: group ranks -> global ranks, world sizes not a power of two
        add("sub6", list(range(6)), 6)
        add("sub3", [5, 6, 7], 3)
    return out


SWITCH_GROUPS = ((0, 2), (1, 3))  # the leader-switch grouping: leaders 0 and 1, blocks apart


def gather_cases(world: int):
    """(key, group ranks or None, algorithm, groups) of the all-gather-only cases."""
    out = [(f"world-leader-ring-g{g}", None, "leader-ring", g)
           for g in range(1, world + 1) if world % g == 0]
    if world == 4:
        out.append(("world-leader-ring-apart", None, "leader-ring", [list(g) for g in
                                                                      SWITCH_GROUPS]))
    if world == 8:
        out += [("sub6-leader-ring-g3", list(range(6)), "leader-ring", 3),
                ("sub6-leader-ring-g2", list(range(6)), "leader-ring", 2)]
    return out


SWITCH_CASES = (("switch", None), ("leader-switch", SWITCH_GROUPS))


def switch_jobs(ports):
    """The flat job (worker r: rank r, ports[r]) and the leaders' job (worker i: the leader of
    SWITCH_GROUPS[i], ports[4 + i]) of the 4-rank switch cases."""
    from spina.config import JobConfig, WorkerAddr
    flat = JobConfig(job=1, workers=tuple(WorkerAddr(r, "127.0.0.1", ports[r]) for r in range(4)))
    leaders = JobConfig(job=2, slot_base=flat.nslots,  # the switch's slots beside job 1's
                        workers=tuple(WorkerAddr(i, "127.0.0.1", ports[4 + i])
                                      for i in range(len(SWITCH_GROUPS))))
    return flat.validate(), leaders.validate()


def switch_gathers(rank: int, switch_port: int, ports, group_call) -> dict:
    """This rank's results of SWITCH_CASES, its agents on the given ports."""
    import socket

    import torch

    import collectives
    from host_agent.agent import Agent
    from spina.net import bind_retrying, grow_buffers

    def agent(job, r, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        bind_retrying(s, ("127.0.0.1", port))
        grow_buffers(s)
        return Agent(job, r, ("127.0.0.1", switch_port), sock=s, timeout=30.0)

    flat, lead = switch_jobs(ports)
    mine = agent(flat, rank, ports[rank])
    leaders = [g[0] for g in SWITCH_GROUPS]
    leader = agent(lead, leaders.index(rank), ports[4 + leaders.index(rank)]) \
        if rank in leaders else None
    res = {}
    try:
        group_call()  # every rank's agents exist before any sends
        for alg, groups in SWITCH_CASES:
            a = mine if alg == "switch" else leader
            for n in LENGTHS:
                m = len(np.array_split(np.arange(n), 4)[rank])
                x = torch.from_numpy(case_input(rank, n, "float32", 3)[:m].copy())
                res[f"{alg}/ag/float32/{n}"] = collectives.all_gather(
                    x, n, alg, None, groups, agent=a).numpy()
            m = len(np.array_split(np.arange(37), 4)[rank])
            xi = torch.from_numpy(case_input(rank, 37, "int32", 3)[:m].copy())
            res[f"{alg}/ag/int32/37"] = collectives.all_gather(xi, 37, alg, None, groups,
                                                               agent=a).numpy()
    finally:
        mine.close()
        if leader is not None:
            leader.close()
    return res


def model_and_input(rank: int):
    """A small two-layer model and rank `rank`'s batch. Integer weights and inputs: every
    gradient sum is exact in float32, whatever its order."""
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(600, 450, bias=True), torch.nn.ReLU(),
                                torch.nn.Linear(450, 5, bias=False))
    with torch.no_grad():
        for i, prm in enumerate(model.parameters()):
            prm.copy_(torch.arange(prm.numel()).reshape(prm.shape) % (5 + i) - 2.0)
    x = torch.from_numpy(case_input(rank, 4 * 600, "int32", 7) % 7).float().reshape(4, 600)
    return model, x


def grads(model, x) -> list[np.ndarray]:
    model(x).sum().backward()
    return [prm.grad.numpy().copy() for prm in model.parameters()]


def ddp_grads(rank: int, algorithm: str, groups):
    """The model's gradients under DDP with the collective hook, and the hook's calls, in the
    second step: DDP's first step uses one bucket, then rebuilds them (small caps: two)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from host_agent.hooks import CollectiveHookState, collective_allreduce_hook
    model, x = model_and_input(rank)
    ddp = DDP(model, bucket_cap_mb=0.002)
    state = CollectiveHookState(algorithm, groups)
    ddp.register_comm_hook(state, collective_allreduce_hook)
    grads(ddp, x)
    model.zero_grad()
    first = state.calls
    return grads(ddp, x), state.calls - first


def run_rank(rank: int, world: int, port: int, out: str, switch=None) -> None:
    import torch
    import torch.distributed as dist

    import collectives
    from spina.net import init_loopback_gloo
    init_loopback_gloo(rank, world, port, timeout=120)
    res = {}
    for key, ranks, alg, groups in cases(world):
        group = dist.new_group(ranks) if ranks is not None else None  # every rank calls it
        if ranks is not None and rank not in ranks:
            continue
        for n in LENGTHS:
            for dtype in ("int32", "float32"):
                x = torch.from_numpy(case_input(rank, n, dtype, 1))
                res[f"{key}/ar/{dtype}/{n}"] = collectives.all_reduce(
                    x.clone(), alg, group, groups).numpy()
            x = torch.from_numpy(case_input(rank, n, "float32", 1))
            mine = collectives.reduce_scatter(x, alg, group, groups)
            res[f"{key}/rs/float32/{n}"] = mine.numpy()
            res[f"{key}/ag/float32/{n}"] = collectives.all_gather(
                torch.from_numpy(case_input(rank, n, "float32", 3))[:mine.numel()].clone(),
                n, alg, group, groups).numpy()
    for key, ranks, alg, groups in gather_cases(world):
        group = dist.new_group(ranks) if ranks is not None else None
        if ranks is not None and rank not in ranks:
            continue
        for n in LENGTHS:
            m = len(np.array_split(np.arange(n), len(ranks or range(world)))[
                (ranks or list(range(world))).index(rank)])
            res[f"{key}/ag/float32/{n}"] = collectives.all_gather(
                torch.from_numpy(case_input(rank, n, "float32", 3)[:m].copy()), n, alg, group,
                groups).numpy()
    if switch is not None:
        res.update(switch_gathers(rank, switch[0], switch[1:], dist.barrier))
    if world == 4:
        for alg, groups in (("ring", None), ("halving-doubling", None), ("direct", None),
                            ("2d-ring", 2), ("2d-direct", [[0, 2], [1, 3]])):
            got, calls = ddp_grads(rank, alg, groups)
            for i, g in enumerate(got):
                res[f"ddp/{alg}/{i}"] = g
            res[f"ddp/{alg}/calls"] = np.array(calls)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **res)
    dist.destroy_process_group()


def main() -> int:
    """Import torch once, then fork the other ranks (torch's import is most of a rank's
    start-up here); this process is rank 0 and waits for the others. A rank dies with it."""
    world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    switch = [int(v) for v in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    import torch.distributed  # before the fork: imported once for all ranks
    if world == 4:  # DDP's constructor loads torch._dynamo: seconds of CPU
        import torch._dynamo  # noqa: F401
    return fork_ranks(world, lambda rank: run_rank(rank, world, port, out, switch))


def fork_ranks(world: int, run) -> int:
    """run(rank) in this process as rank 0 and in a forked child for each other rank (a child
    dies with this process); waits for them all. 1 if any rank failed."""
    import ctypes
    import signal
    import traceback
    children = []
    for rank in range(1, world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                run(rank)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    try:
        run(0)
    finally:
        failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
