"""Smoke test of `python -m bench l2` (bench/l2.py: the L2 mode's lossless INA frame rate).

Run just this test:  .venv/bin/python -m pytest tests/test_l2_rate.py   (needs root)
"""
import csv
import os
import shutil

import pytest

from bench import harness
from bench.l2 import EXTRA_COLUMNS, run_rate


def test_l2_rate_smoke():
    """4 namespaced workers offer 2000 INA frames/s for 1 s: every round completes, every
    frame is aggregated once, every result holds the 4 workers' sum, and the namespaces are
    gone afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    before = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    r = run_rate(2000, 1.0)
    assert r["rounds"] == r["results_min"] == r["completed"] == 500 and r["lossless"], r
    assert r["aggregated"] == 4 * 500 and r["stale"] == 0 and r["held"] == 0
    assert r["datapath"] == "compiled" and r["frames_in"] == 2000 and r["wrong"] == 0
    assert r["slot_window_ms"] == 128.0 and 0 <= r["sender_skew_ms"] < 128.0
    after = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    assert after <= before


def test_l2_through_the_harness(tmp_path):
    """The same through the harness, both data paths at one offered rate: a row each in the
    common columns, every result received right (wrong 0), the rounds lost counted (whether
    any are is a measurement: on a loaded machine a sender falls behind the slot window)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    assert harness.main(["l2", "-g", "2", "-m", "compiled,python", "--offered", "1000",
                         "--seconds", "1", "--no-plots", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["method"]: r for r in reader}
    assert tuple(reader.fieldnames) == harness.COLUMNS + EXTRA_COLUMNS
    assert sorted(rows) == ["compiled", "python"]
    for r in rows.values():
        assert r["wrong"] == "0" and (r["rounds"], r["size"]) == ("500", "512")
        c = {k: int(r[k]) for k in ("frames_in", "results_min", "completed", "lost_rounds",
                                    "aggregated", "stale", "held")}
        # the rounds the workers miss are exactly the rounds the switch did not complete
        # (its job_results), and every frame it took is counted once: aggregated, or dropped
        # by the hold or as stale (the senders never resend: no duplicates)
        assert c["results_min"] == c["completed"] == 500 - c["lost_rounds"], c
        assert c["aggregated"] + c["stale"] + c["held"] == c["frames_in"], c
        # a lost round aggregated at most one of its two contributions and dropped the other
        assert 2 * c["completed"] <= c["aggregated"] <= 2 * c["completed"] + c["lost_rounds"], c
        assert c["stale"] + c["held"] >= c["lost_rounds"], c
        assert r["lossless"] == str(c["lost_rounds"] == 0)
