"""FSDP2 on SpINA (host_agent/hooks/fsdp.py): a `fully_shard` model whose all-gather and
reduce-scatter go through the switch computes the parameters FSDP2 on gloo computes.

Run just these tests:  .venv/bin/python -m pytest tests/test_fsdp.py

The ranks are processes on loopback gloo (tests/fsdp_worker.py); the software switch runs on
a thread of the test process. Each case trains two copies of one small model side by side on
the same batches, one on gloo and one through SpINA, and compares them step by step.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina.config import JobFile
from spina.net import free_port
from tests.test_daemon import ROOT, _env


def run_world(world: int, tmp_path, cases: list[str]) -> list[dict]:
    """Every case on `world` ranks, with a 32-bit job and a 16-bit-lane job on one switch:
    each rank's results."""
    with UdpSwitch(port=0) as sw:
        files = []
        for job, bits in ((1, 32), (2, 16)):
            cfg = local_job(world, job=job, slot_base=16 * (job - 1), lane_bits=bits)
            sw.add_job(cfg)
            files.append(str(tmp_path / f"job{job}.json"))
            JobFile(cfg, sw.address).write(files[-1])
        r = subprocess.run([sys.executable, "-m", "tests.fsdp_worker", str(world),
                            str(free_port()), str(tmp_path), ",".join(files), ",".join(cases)],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [dict(np.load(tmp_path / f"rank{i}.npz")) for i in range(world)]


def steps(res: dict, case: str) -> int:
    return sum(1 for k in res if k.startswith(f"{case}/ref/"))


@pytest.mark.parametrize("world", [2, 4])
def test_parameters_through_the_switch_are_gloos_bit_for_bit(tmp_path, world):
    """SpINA's all-gather (gloo reduce-scatter): after every step each rank's parameters
    are the gloo copy's bit for bit; the all-gathers went through the switch (counted)."""
    cases = ["gather/float/3"]
    res = run_world(world, tmp_path, cases)
    for case in cases:
        assert steps(res[0], case) == 3
        for r in range(world):
            for s in range(3):
                ref, got = res[r][f"{case}/ref/{s}"], res[r][f"{case}/spina/{s}"]
                assert got.tobytes() == ref.tobytes(), (case, r, s)
            assert res[r][f"{case}/ref/2"].tobytes() != res[r][f"{case}/ref/0"].tobytes()
        c = {k.rsplit("/", 1)[1]: int(v) for k, v in res[0].items()
             if k.startswith(f"{case}/counters/")}
        # 3 layers: gathered for forward and again for backward, 3 steps
        assert c["gather_calls"] == 3 * 3 * 2, c
        assert c["gather_bytes_sent"] > 0
        assert c["scatter_calls"] == (0 if case.startswith("gather") else 3 * 3), c
        assert c["gloo_calls"] == 0
