"""Smoke test of bench/l2_rate.py (the L2 mode's lossless INA frame rate).

Run just this test:  .venv/bin/python -m pytest tests/test_l2_rate.py
"""
import os
import shutil

import pytest

from bench.l2_rate import run_rate


def test_l2_rate_smoke():
    """4 namespaced workers offer 2000 INA frames/s for 1 s: every round completes, every
    frame is aggregated once, and the namespaces are gone afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    before = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    r = run_rate(2000, 1.0)
    assert r["rounds"] == 500 and r["results_min"] == 500 and r["lossless"]
    assert r["aggregated"] == 4 * 500 and r["stale"] == 0 and r["held"] == 0
    assert r["datapath"] == "compiled" and r["frames_in"] == 2000
    assert r["slot_window_ms"] == 128.0 and 0 <= r["sender_skew_ms"] < 128.0
    after = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    assert after <= before
