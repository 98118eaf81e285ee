"""The ranks of tests/test_collectives.py, as processes on loopback gloo: each runs every
collective case and saves what it got to OUT/rank<R>.npz (the test compares with numpy).

    python tests/collectives_worker.py WORLD PORT OUT
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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

    from collectives.hooks import CollectiveHookState, collective_allreduce_hook
    model, x = model_and_input(rank)
    ddp = DDP(model, bucket_cap_mb=0.002)
    state = CollectiveHookState(algorithm, groups)
    ddp.register_comm_hook(state, collective_allreduce_hook)
    grads(ddp, x)
    model.zero_grad()
    first = state.calls
    return grads(ddp, x), state.calls - first


def run_rank(rank: int, world: int, port: int, out: str) -> None:
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
    import ctypes
    import signal
    import traceback

    import torch.distributed  # before the fork: imported once for all ranks
    if world == 4:  # DDP's constructor loads torch._dynamo: seconds of CPU
        import torch._dynamo  # noqa: F401
    children = []
    for rank in range(1, world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                run_rank(rank, world, port, out)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    try:
        run_rank(0, world, port, out)
    finally:
        failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
