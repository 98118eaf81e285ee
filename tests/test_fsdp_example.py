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
