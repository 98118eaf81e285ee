"""Parameter-server mode (issue 17): the staleness bound, exactly-once updates, a crashed
shard named in bounded time, policy configuration errors naming the field.

Run just these tests:  .venv/bin/python -m pytest tests/test_ps.py

No test asserts a duration: slow workers are slowed by sleeping, and every bound checked is
in clocks, bytes or weights.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from host_agent.compression import kernels
from ps.client import CoordinatorError, PSClient, ShardError
from ps.config import PolicyConfig
from ps.local import LocalPS
from ps.server import Coordinator, ShardServer, shard_ranges
from ps.topk import BlockTopK, gdtopk_ratios, group_by_speed, scatter
from spina.config import ConfigError
from spina.procs import stop_process

ROOT = Path(__file__).resolve().parents[1]


def _run_workers(ps: LocalPS, steps: dict[int, int], body, slow: dict[int, float]) -> dict:
    """Each worker w: tick(0), then `steps[w]` iterations of pull, sleep slow[w], body(w, k,
    client), tick(k); leave. Returns what each worker's body returned, per worker."""
    out = {w: [] for w in steps}

    def run(w):
        with ps.client(w) as c:
            c.tick(0)
            for k in range(1, steps[w] + 1):
                c.pull()
                time.sleep(slow.get(w, 0.0))
                out[w].append(body(w, k, c))
            c.leave()

    with concurrent.futures.ThreadPoolExecutor(len(steps)) as ex:
        for f in [ex.submit(run, w) for w in steps]:
            f.result(timeout=120)
    return out


@pytest.mark.parametrize("policy,s", [("bsp", 0), ("ssp", 2)])
def test_staleness_never_exceeds_bound(policy, s):
    """With one worker slowed, no worker ever starts clock c before every shard applied the
    slow worker's clock c - s (checked on the shards, not on the coordinator's own log)."""
    N = 4
    cfg = PolicyConfig(policy=policy, staleness=s, lr=1.0, block_size=4, timeout=30)
    seen = []

    with LocalPS(np.zeros(16, np.float32), N, cfg, nshards=2) as ps:
        def body(w, k, c):
            c.push(k, np.ones(16, np.float32))
            c.tick(k)  # returns when clock k + 1 may start
            slowest = min(sh.applied.get(v, 0) for sh in ps.shards for v in range(N))
            seen.append((k + 1) - 1 - slowest)  # iterations ahead of the slowest worker's pushes
            return k

        _run_workers(ps, {w: 12 for w in range(N)}, body, slow={3: 0.03})
        assert max(seen) <= s, f"a worker ran {max(seen)} clocks ahead, bound {s}"
        assert max(seen) == s, "the slow worker never held anyone back: the test proved nothing"
        assert ps.coordinator.max_staleness() <= s


def test_gssp_bound_within_group_groups_async():
    """GSSP groups the two slow workers apart; within a group the bound holds, while the fast
    group runs ahead of the slow one by more than the bound."""
    N, s = 4, 1
    cfg = PolicyConfig(policy="gssp", staleness=s, warmup=8, regroup_every=0, lr=1.0, block_size=4)
    ahead = []
    with LocalPS(np.zeros(16, np.float32), N, cfg, nshards=1) as ps:
        def body(w, k, c):
            c.push(k, np.ones(16, np.float32))
            c.tick(k, {"t": 0.04 if w >= 2 else 0.004, "push": 0.001, "ratio": 1.0})
            if w < 2 and k == 30:
                ahead.append(k - max(ps.shards[0].applied.get(v, 0) for v in (2, 3)))
            return k

        _run_workers(ps, {0: 30, 1: 30, 2: 12, 3: 12}, body, slow={2: 0.04, 3: 0.04})
        co = ps.coordinator
        assert co.group == [0, 0, 1, 1]
        assert co.max_staleness() <= s
        assert all(a > s for a in ahead), f"fast group held back by the slow one: {ahead}"


@pytest.mark.parametrize("policy,ratio", [("asp", 1.0), ("ssp", 1.0), ("bsp", 0.5), ("ssp", 0.25)])
def test_updates_exactly_once(policy, ratio):
    """Integer gradients make every order of applying them exact: the final weights equal the
    initial ones minus lr/N times every gradient sent (minus what top-k still holds back),
    with a resend of every 5th push acknowledged and not applied."""
    N, n, T = 4, 203, 10
    cfg = PolicyConfig(policy=policy, staleness=2, lr=4.0, block_size=8)  # lr/N = 1: exact
    rng = np.random.default_rng(1)
    grads = rng.integers(-8, 9, size=(N, T + 1, n)).astype(np.float32)
    init = rng.integers(-100, 100, size=n).astype(np.float32)
    with LocalPS(init, N, cfg, nshards=3) as ps:
        clients = {}

        def body(w, k, c):
            clients[w] = c
            c.push(k, grads[w, k], ratio)
            if k % 5 == 0:
                c.resend_last()  # the same bytes again: the shards must not apply them twice
            c.tick(k)
            return k

        _run_workers(ps, {w: T for w in range(N)}, body, slow={})
        held = sum(c.compressor.residual[:n] for c in clients.values())
        expected = init - (grads[:, 1:].sum(axis=(0, 1)) - held)
        np.testing.assert_array_equal(ps.weights(), expected)
        assert all(sh.updates == N * T and sh.duplicates == N * 2 for sh in ps.shards)


def test_lost_push_is_an_error_naming_the_clocks():
    """A push that skips a clock is refused by the shard, naming the worker and lost clocks."""
    cfg = PolicyConfig(block_size=4, lr=1.0)
    with LocalPS(np.zeros(8, np.float32), 1, cfg, nshards=1) as ps, ps.client(0) as c:
        c.push(1, np.ones(8, np.float32))
        with pytest.raises(ShardError,
                           match=r"shard 0.*worker 0 pushed clock 4.*clocks 2\.\.3 were lost"):
            c.push(4, np.ones(8, np.float32))
        np.testing.assert_array_equal(ps.weights(), -np.ones(8))


def test_crashed_shard_is_named_in_bounded_time(tmp_path):
    """Kill -9 a shard process: the worker's next pull fails with ShardError naming shard 1
    (after at most the policy timeout, here 2 s; the test gives it 60 s before calling it a
    hang)."""
    cfg = PolicyConfig(block_size=4, timeout=2.0)
    ranges = shard_ranges(16, 2, 4)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"block_size": 4, "timeout": 2.0}))
    proc = subprocess.Popen([sys.executable, "-m", "ps", "shard", "--index", "1",
                             "--lo", str(ranges[1][0]), "--size", str(ranges[1][1] - ranges[1][0]),
                             "--nworkers", "1", "--policy", str(policy)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    shard0 = ShardServer(0, 0, np.zeros(8, np.float32), 1, cfg).start()
    coord = Coordinator(1, cfg).start()
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening "), f"shard process said {line!r}"
        client = PSClient(0, [shard0.address, line.split()[1]], ranges, coord.address, cfg)
        assert len(client.pull()) == 16
        proc.kill()
        proc.wait()
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            f = ex.submit(client.pull)
            with pytest.raises(ShardError, match="server shard 1 at 127.0.0.1") as e:
                f.result(timeout=60)
        assert e.value.shard == 1
        client.close()
    finally:
        stop_process(proc)
        proc.stdout.close()
        shard0.stop(0)
        coord.stop(0)


def test_waiting_on_a_missing_worker_names_it():
    """Under BSP a worker whose peer never reports fails within the timeout naming the peer."""
    cfg = PolicyConfig(policy="bsp", block_size=4, timeout=1.0)
    with LocalPS(np.zeros(8, np.float32), 2, cfg, nshards=1) as ps, ps.client(0) as c:
        c.tick(0)
        c.push(1, np.ones(8, np.float32))
        with pytest.raises(CoordinatorError,
                           match=r"worker 0 at clock 1 waited 1.0 s for workers \[1\]"):
            c.tick(1)


@pytest.mark.parametrize("fields,name", [
    ({"policy": "bulk"}, "policy"),
    ({"staleness": -1}, "staleness"),
    ({"staleness": 1.5}, "staleness"),
    ({"ngroups": 0}, "ngroups"),
    ({"split_ratio": 1.0}, "split_ratio"),
    ({"lr": 0}, "lr"),
    ({"topk_ratio": 0}, "topk_ratio"),
    ({"topk_ratio": 1.5}, "topk_ratio"),
    ({"policy": "ssp", "gdtopk": True}, "gdtopk"),
    ({"gdtopk": "yes"}, "gdtopk"),
    ({"policy": "gssp", "gdtopk": True, "min_ratio": 0.5, "max_ratio": 0.2}, "max_ratio"),
    ({"timeout": -1}, "timeout"),
])
def test_bad_policy_rejected_naming_field(fields, name):
    """Each bad value is a ConfigError naming its field, from data and at a server's start."""
    with pytest.raises(ConfigError, match=f"'{name}'"):
        PolicyConfig.from_dict(fields)
    with pytest.raises(ConfigError, match=f"'{name}'"):
        Coordinator(2, PolicyConfig(**fields))


def test_unknown_policy_field_rejected():
    """A misspelt field is a ConfigError naming it and listing the known ones."""
    with pytest.raises(ConfigError, match="unknown field 'stalenes' .*staleness"):
        PolicyConfig.from_dict({"stalenes": 2})


def test_block_topk_error_feedback_loses_nothing():
    """What top-k sent plus what it holds back equals every gradient given to it."""
    rng = np.random.default_rng(0)
    c = BlockTopK(101, 8)
    total, sent = np.zeros(101, np.float32), np.zeros(101, np.float32)
    for _ in range(20):
        g = rng.integers(-5, 6, 101).astype(np.float32)
        total += g
        idx, vals = c.compress(g, 0.2)
        assert len(idx) == 3  # ceil(0.2 * 13 blocks)
        sent += scatter(101, 8, idx, vals)
    np.testing.assert_array_equal(sent + c.residual[:101], total)


def test_block_topk_selects_as_the_compression_kernels():
    """The parameter server's top-k is host_agent/compression's top_blocks: the k largest
    norms, ties to the lower block index; importing it loads no torch."""
    g = np.array([1, 0, 0, 1, 1, 0, 3, 0, 0, 0], np.float32)  # norms 1, 1, 1, 9, 0
    idx, vals = BlockTopK(10, 2).compress(g, 0.6)
    assert idx.tolist() == [0, 1, 3]
    assert vals.tolist() == [1, 0, 0, 1, 3, 0]
    rng = np.random.default_rng(1)
    c = BlockTopK(1000, 4)
    g = rng.integers(-2, 3, 1000).astype(np.float32)  # many ties
    score = (g.reshape(250, 4) ** 2).sum(1)
    assert c.compress(g, 0.1)[0].tolist() == kernels.top_blocks(score, 25).tolist()
    probe = "import sys, ps.topk; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"


def test_grouping_and_gdtopk_ratios():
    """Speed groups cut at large jumps only; GDTopK gives the fastest group the largest ratio
    and a slower group the ratio that would match the fastest group's iteration time."""
    assert group_by_speed([0.1, 0.1, 0.12, 0.11], 2, 1.5) == [0, 0, 0, 0]
    assert group_by_speed([0.1, 0.3, 0.1, 0.9], 3, 1.5) == [0, 1, 0, 2]
    # group 1: 0.1 s without the push, a dense push costs 0.2 s; the fast group iterates in 0.15 s
    r = gdtopk_ratios({0: {"t": 0.15, "push": 0.05, "ratio": 1.0},
                       1: {"t": 0.3, "push": 0.2, "ratio": 1.0}}, {0: 1.0, 1: 1.0}, 0.05, 1.0,
                      smoothing=1.0)
    assert r == {0: 1.0, 1: pytest.approx(0.25)}


@pytest.mark.parametrize("task,policies", [("digits", "bsp,gssp+gdtopk"), ("seq2seq", "ssp")])
def test_example_smoke(task, policies, tmp_path):
    """examples/ps_train.py runs tiny (2 workers, 1 straggler, 3 s per policy) and writes its
    JSON and plot, every worker having trained and pushed."""
    out = tmp_path / "run"
    subprocess.run([sys.executable, str(ROOT / "examples" / "ps_train.py"), "--task", task,
                    "--policies", policies, "--workers", "2", "--stragglers", "1", "--seconds", "3",
                    "--eval-every", "1", "--out", str(out)],
                   check=True, timeout=120, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    d = json.loads(out.with_suffix(".json").read_text())
    assert set(d["runs"]) == set(policies.split(","))
    for r in d["runs"].values():
        assert all(s > 0 for s in r["steps"]) and all(b > 0 for b in r["bytes_pushed"])
        assert len(r["evals"]) >= 2
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.parametrize("spec,name", [(dict(worker=5, factor=3.0), "worker"),
                                       (dict(worker=1, factor=0.5), "factor"),
                                       (dict(worker=1, factor=2.0, uplink_mbps=0), "uplink_mbps")])
def test_bad_straggler_rejected_naming_field(spec, name):
    """The straggler injector refuses a bad slowdown naming the field."""
    import torch  # noqa: F401  (installed by make setup)

    from ps.train import Straggler, StragglerInjector
    with pytest.raises(ConfigError, match=f"straggler: field '{name}'"):
        StragglerInjector(4, (Straggler(**spec),))
