"""Smoke test of examples/fsdp_gather.py (sharded parameters gathered before each forward pass
through the switch's all-gather).

Run just this file: python -m pytest tests/test_fsdp_example.py
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_fsdp_gather_example_trains_with_identical_gathered_parameters(tmp_path):
    """2 ranks, one digits epoch: every step's gathered parameters the same on both ranks, each
    rank sending its shard once per step (one chunk header beside it) and receiving the
    other's, and the MLP learns (the run is deterministic: 0.62 test accuracy here)."""
    out = tmp_path / "fsdp.json"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "fsdp_gather.py"), "--workers",
                        "2", "--epochs", "1", "--json", str(out)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["gathered_identical_every_step"] is True
    assert rep["steps"] == 22 and rep["params"] == 9610
    assert rep["test_accuracy"] > 0.5
    shard = rep["shard_bytes"]
    assert shard <= rep["allgather_bytes_sent_per_rank_step"] < 1.05 * shard
    sent = rep["allgather_bytes_sent_per_rank_step"]
    assert rep["allgather_bytes_received_per_rank_step"] == sent
    assert rep["ring_bytes_sent_per_rank_step"] == shard


def test_train_fsdp_shards_21m_parameters_over_4_ranks_through_the_switch(tmp_path):
    """examples/train_fsdp.py under torchrun, 4 ranks, 2 steps, topk 5%: the 21,253,130
    parameters of the MLP sharded by FSDP2, every layer gathered through the switch before
    its forward and its backward (and once more for the test set's forward) and its
    gradient reduce-scattered through it (about 5% of the blocks); every rank ends with the
    same parameters, nothing went to gloo."""
    out = tmp_path / "fsdp.json"
    torchrun = str(pathlib.Path(sys.executable).parent / "torchrun")
    r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "4",
                        str(ROOT / "examples" / "train_fsdp.py"), "--steps", "2",
                        "--compression", "topk:0.05", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["params"] == 21_253_130 and rep["world"] == 4 and rep["steps"] == 2
    assert rep["parameters_identical_across_ranks"] is True
    assert len(rep["loss"]) == 2 and all(0 < v < 10 for v in rep["loss"])
    c = rep["counters"]
    layers = 4
    assert c["gather_calls"] == layers * 2 * 2 + layers
    assert c["scatter_calls"] == layers * 2 and c["gloo_calls"] == 0
    assert c["blocks_total"] > 0
    assert c["blocks_sent"] <= 0.05 * c["blocks_total"] + c["scatter_calls"]
    shard_bytes = 4 * 21_253_130 / 4  # this rank's quarter of the parameters
    assert c["gather_bytes_sent"] >= 5 * shard_bytes  # 2 x 2 gathers a step, + the test's
