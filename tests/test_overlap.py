"""Priority overlap (host_agent/hooks/overlap.py): the priority send queue and DDP's overlap scheme.

Run just these tests:  .venv/bin/python -m pytest tests/test_overlap.py

The sender tests run 2 agents on threads (LocalCluster) or a fake agent that records its
calls; the DDP test spawns 2 training processes around a software switch in this process.
The jobs have 2 slots x 2 lanes of 256: a lane span of 1024 elements, so small tensors
already go in several chunks.
"""
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from host_agent.hooks import PriorityOverlap, PrioritySender, lane_span, slot_exponents
from host_agent.launch import local_job
from host_agent.local import LocalCluster
from softswitch.udp import UdpSwitch
from spina.config import ConfigError, JobFile
from tests.test_torch_hook import finish_worker

WORLD = 2
SMALL = dict(nslots=2, nlanes=2)  # lane span 1024
SIZES = (5000, 300, 2600)  # 5, 1 and 3 chunks of 1024


def _tensors(rank: int) -> list[np.ndarray]:
    """Per key a tensor whose magnitude differs from lane span to lane span (so a chunk's own
    exponent would differ from the whole tensor's), with zero blocks and a NaN-free mix."""
    g = np.random.default_rng(10 + rank)
    out = []
    for n in SIZES:
        x = g.standard_normal(n).astype(np.float32)
        x *= np.float32(2.0) ** np.repeat(np.arange(-(-n // 1024)) * 3 - 4, 1024)[:n]
        x[256:768] = 0  # zero blocks at every rank (never sent)
        out.append(x)
    return out


def _submit(sender, xs, delay: float) -> list:
    """Hand the tensors over in key order (as DDP does), `delay` seconds apart."""
    futs = []
    for key, x in enumerate(xs):
        futs.append(sender.submit(key, x.copy(), priority=len(xs) - key,
                                  last=key == len(xs) - 1))
        time.sleep(delay)
    return futs


@pytest.mark.parametrize("order", ["priority", "fifo"])
def test_sums_bit_identical_to_one_call_per_tensor(order):
    """Chunked sends, in either order and with different hand-over times per rank, give the
    sums of one plain call per tensor bit for bit, on every rank, in the same call order."""
    with LocalCluster(WORLD, **SMALL) as c:
        assert lane_span(c.job) == 1024
        xs = [_tensors(r) for r in range(WORLD)]
        whole = [c.allreduce([xs[0][k], xs[1][k]]) for k in range(len(SIZES))]
        senders = [PrioritySender(a, chunk_elements=1, order=order, trace=True)
                   for a in c.agents]
        futs = [None] * WORLD
        threads = [threading.Thread(target=lambda r=r: futs.__setitem__(
            r, _submit(senders[r], xs[r], 0.0 if r == 0 else 0.05))) for r in range(WORLD)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [[f.result(timeout=20) for f in futs[r]] for r in range(WORLD)]
        for s in senders:
            s.close()
    for k in range(len(SIZES)):
        for r in range(WORLD):
            assert got[r][k].tobytes() == whole[k][r].tobytes(), (k, r)
    calls = [[(e.kind, e.key, e.chunk) for e in s.events] for s in senders]
    assert calls[0] == calls[1]
    chunks = [(k, i) for kind, k, i in calls[0] if kind == "chunk"]
    assert sorted(chunks) == [(k, i) for k, n in enumerate(SIZES) for i in range(-(-n // 1024))]
    if order == "fifo":
        assert chunks == sorted(chunks) and len(calls[0]) == len(chunks)  # no negotiation


def test_whole_tensor_exponents_are_what_makes_chunks_exact():
    """Without the whole tensor's slot exponents a chunk is quantized more finely: the
    sums differ from one call's (so the test above can fail)."""
    with LocalCluster(WORLD, **SMALL) as c:
        xs = [_tensors(r)[0] for r in range(WORLD)]
        whole = c.allreduce(xs)[0]
        ex = [slot_exponents(x, c.job) for x in xs]
        assert ex[0].shape == (2,) and ex[0].dtype == np.int32
        span = slice(1024, 2048)
        plain = c.allreduce([x[span] for x in xs])[0]
        pool = c._pool
        floor = [pool.submit(a.allreduce, x[span], False, None, None, None, e)
                 for a, x, e in zip(c.agents, xs, ex)]
        floored = floor[0].result()
    assert floored.tobytes() == whole[span].tobytes()
    assert plain.tobytes() != whole[span].tobytes()


class FakeAgent:
    """One rank alone (nworkers 1): records every call; the first chunk call waits at a gate."""

    def __init__(self):
        self.job = local_job(1, **SMALL)
        self.calls = []
        self.started, self.gate = threading.Event(), threading.Event()

    def allreduce(self, x, inplace=False, layer=None, slot_exponents=None):
        if x.dtype == np.int32:
            self.calls.append("negotiate")
            return x.copy()
        self.calls.append((int(x[0]) // 100, int(x[0]) % 100))  # (key, chunk) from the data
        if not self.started.is_set():
            self.started.set()
            assert self.gate.wait(10)
        return x


@pytest.mark.parametrize("order,expected", [
    ("priority", [(0, 0), (5, 0), (0, 1), (0, 2), (0, 3)]),
    ("fifo", [(0, 0), (0, 1), (0, 2), (0, 3), (5, 0)])])
def test_urgent_small_tensor_goes_between_chunks_of_a_large_one(order, expected):
    """A large back-layer tensor (4 chunks) is in flight when a small front-layer one
    arrives: by priority it goes right after the chunk on the wire; fifo keeps arrival."""
    agent = FakeAgent()
    sender = PrioritySender(agent, chunk_elements=1024, order=order)
    big = (np.repeat(np.arange(4), 1024)).astype(np.float32)  # key 0: chunk i holds i
    small = np.full(200, 500, np.float32)                      # key 5: 5*100 + chunk 0
    f0 = sender.submit(0, big, priority=9)
    assert agent.started.wait(10)
    f5 = sender.submit(5, small, priority=4)
    agent.gate.set()
    f0.result(10), f5.result(10)
    sender.close()
    chunks = [c for c in agent.calls if c != "negotiate"]
    assert chunks == expected
    negotiations = agent.calls.count("negotiate")
    assert negotiations == (len(expected) if order == "priority" else 0)


def test_no_negotiation_once_the_last_key_is_everywhere():
    """Once the group's last key is queued at every rank nothing can preempt: the rest goes
    in priority order without negotiating (here: 2 negotiations, not 5)."""
    agent = FakeAgent()
    sender = PrioritySender(agent, chunk_elements=1024)
    f0 = sender.submit(0, np.repeat(np.arange(4), 1024).astype(np.float32), priority=9)
    assert agent.started.wait(10)
    f5 = sender.submit(5, np.full(200, 500, np.float32), priority=4, last=True)
    agent.gate.set()
    f0.result(10), f5.result(10)
    sender.close()
    assert agent.calls == ["negotiate", (0, 0), "negotiate", (5, 0), (0, 1), (0, 2), (0, 3)]


def test_ranks_that_disagree_on_a_priority_fail_naming_the_key():
    """Every queued future fails with an error naming the key the ranks disagree on."""
    with LocalCluster(WORLD, timeout=5, **SMALL) as c:
        senders = [PrioritySender(a) for a in c.agents]
        futs = [s.submit(3, np.ones(100, np.float32), priority=p)
                for s, p in zip(senders, (1, 2))]
        for f in futs:
            with pytest.raises(ValueError, match="key 3: the ranks disagree on its priority, "):
                f.result(10)
        for s in senders:
            s.close()


def test_bad_parameters_are_refused_naming_the_field():
    """Sender, overlap and agent parameters out of range: refused, the field named."""
    agent = FakeAgent()
    for kw, field in ((dict(order="lifo"), "order"), (dict(chunk_elements=0), "chunk_elements"),
                      (dict(chunk_elements=2.5), "chunk_elements"), (dict(keys=0), "keys")):
        with pytest.raises(ConfigError, match=f"field '{field}'"):
            PrioritySender(agent, **kw)
    agent.job = local_job(1, lane_bits=16, **SMALL)
    with pytest.raises(ConfigError, match="field 'lane_bits'"):
        PrioritySender(agent)
    agent.job = local_job(1, **SMALL)
    sender = PrioritySender(agent, chunk_elements=1500)
    assert sender.chunk == 2048  # rounded up to whole lane spans
    for args, field in (((256, np.ones(4, np.float32)), "key"),
                        ((1, np.ones(4, np.float32), -1), "priority"),
                        ((1, np.ones(4, np.float64)), "flat"),
                        ((1, np.ones((2, 2), np.float32)), "flat")):
        with pytest.raises(ValueError, match=f"^{field}: "):
            sender.submit(*args)
    sender.close()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="field 'optimizer_class'"):
        PriorityOverlap(model, agent, torch.optim.SGD(model.parameters(), lr=0.1))
    with LocalCluster(1, **SMALL) as c:
        with pytest.raises(ValueError, match="^slot_exponents: need 2 int32"):
            c.agents[0].allreduce(np.ones(4, np.float32), slot_exponents=np.zeros(3, np.int32))


# ----------------------------------------------------------------------------- DDP
STEPS = 5


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def _ddp_worker(rank, tmp):
    """STEPS steps of plain DDP + SpINA hook + SGD, then STEPS of PriorityOverlap with the same
    data; both models' weights, and every rank's, compared bit for bit."""
    from host_agent.assignment import agent_from_env
    from host_agent.hooks import SpinaHookState, spina_allreduce_hook
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=WORLD)
    agent = agent_from_env(f"{tmp}/job.json", rank=rank, timeout=20)
    gen = torch.Generator().manual_seed(100 + rank)
    data = [(torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen))
            for _ in range(STEPS)]
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=1e-3)
    loss = torch.nn.functional.cross_entropy
    plain = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.01)
    plain.register_comm_hook(SpinaHookState(agent), spina_allreduce_hook)
    opt = torch.optim.SGD(plain.parameters(), **sgd)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss(plain(x), y).backward()
        opt.step()
    lapped = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.01)
    ov = PriorityOverlap(lapped, agent, torch.optim.SGD, chunk_elements=1, trace=True, **sgd)
    for x, y in data:
        loss(lapped(x), y).backward()  # no step: the next forward's pre-hooks apply it
    ov.close()
    a = torch.cat([p.detach().reshape(-1) for p in plain.module.parameters()])
    b = torch.cat([p.detach().reshape(-1) for p in lapped.module.parameters()])
    theirs = [torch.empty_like(b) for _ in range(WORLD)]
    dist.all_gather(theirs, b)
    chunks = [e for e in ov.sender.events if e.kind == "chunk"]
    finish_worker(rank, tmp, agent, {
        "identical": bool(torch.equal(a, b)), "ranks_identical": all(
            torch.equal(t, theirs[0]) for t in theirs),
        "moved": float((a - torch.cat([p.detach().reshape(-1) for p in _model().parameters()]))
                       .abs().max()),
        "chunks": len(chunks), "keys": len({e.key for e in chunks}),
        "steps": sum(e.kind == "step" for e in ov.events)})


def test_ddp_overlap_gives_plain_ddps_weights(tmp_path):
    """2-rank DDP: after 5 steps PriorityOverlap (chunked, priority order, per-parameter SGD
    in forward pre-hooks) holds exactly the weights of plain DDP with the SpINA hook."""
    job = local_job(WORLD, **SMALL)
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        JobFile(job, sw.address).write(tmp_path / "job.json")
        mp.start_processes(_ddp_worker, args=(str(tmp_path),), nprocs=WORLD, join=True,
                           start_method="spawn")
    report = json.loads(Path(tmp_path, "report.json").read_text())
    assert report["identical"] and report["ranks_identical"] and report["moved"] > 1e-3
    assert report["keys"] >= 3 and report["chunks"] > STEPS * report["keys"]
    assert report["steps"] > STEPS  # buckets applied in pre-hooks (DDP rebuilds them after step 1)


# ----------------------------------------------------------------------------- the benchmark
def test_overlap_bench_smoke(tmp_path):
    """`python -m bench overlap` with 2 ranks over a 1 Gbit/s namespace star, a warm-up and 1
    round of 2 steps: a row per method, ddp's and both overlaps' weights identical (wrong
    0), every method's bytes about the model's, the trace and the timeline written."""
    import csv

    from bench import harness
    from bench.overlap import EXTRA_COLUMNS, METHODS
    from tests.netns import run_bench
    star = tmp_path / "star2.yaml"  # two hosts on one aggregating switch, 1 Gbit/s links
    star.write_text("hosts: [h0, h1]\nswitches: {s0: {aggregate: true}}\nlinks:\n"
                    + "".join(f"  - {{ends: [h{i}, s0], rate: 1gbit, latency: 20us, "
                              "burst: 128KiB}\n" for i in range(2)) + "mtu: 9000\n")
    params = 1024 * 64 + 64 + 2 * (64 * 64 + 64) + 64 * 10 + 10  # width 64, depth 2
    run_bench("bench", "sovt",
              ["overlap", "-t", str(star), "-g", "2", "-b", str(4 * params), "-e",
               str(4 * params), "--depth", "2", "--batch", "8", "-n", "1", "--steps", "2",
               "--chunk", "1", "--nslots", "2", "--nlanes", "2", "--out", str(tmp_path)],
              timeout=180)
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["method"]: r for r in reader}
    assert tuple(reader.fieldnames) == harness.COLUMNS + EXTRA_COLUMNS
    assert sorted(rows) == sorted(METHODS)
    for r in rows.values():
        assert (r["workers"], r["rate"], r["params"], r["layers"], r["width"]) == (
            "2", "1gbit", str(params), "4", "64")
        assert r["wrong"] == "0" and r["size"] == str(4 * params)
    tx = {m: float(r["bytes_per_link"]) for m, r in rows.items()}
    # SpINA sends each non-zero block once (ReLU zeros: fewer), headers on top; chunks of one
    # lane span add their calls' setup rounds, priority order a negotiation per chunk
    assert tx["compute"] < 1000
    for m in ("ddp", "overlap_fifo"):
        assert 0.3 * 4 * params < tx[m] < 1.5 * 4 * params, (m, tx)
    assert tx["overlap_fifo"] < tx["overlap"] < 3 * 4 * params, tx
    assert float(rows["ddp"]["vs_ddp"]) == 1.0
    trace = json.loads((tmp_path / "overlap_trace.json").read_text())["2 workers, 1gbit"]
    kinds = {m: {e[0] for e in trace[m]["comm"]} for m in ("ddp", "overlap", "overlap_fifo")}
    assert kinds == dict(ddp={"chunk"}, overlap={"chunk", "negotiate"}, overlap_fifo={"chunk"})
    assert (tmp_path / "overlap_timeline_2w_1gbit.png").stat().st_size > 10000
    assert "priority overlap's step" in (tmp_path / "overlap_summary.md").read_text()
