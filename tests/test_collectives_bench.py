"""Smoke test of the collectives benchmark (bench/collectives_bench.py) at its tiniest size.

Run just this file: python -m pytest tests/test_collectives_bench.py   (needs root, ip, tc)

Two hosts joined by one tbf link, 16 KiB, one repeat: end to end through the real command
line, then the outputs and the machine are checked (no namespace left behind).
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.collectives_bench import COLUMNS
from spina.netns import removing_leftovers, why_no_namespaces

ROOT = Path(__file__).resolve().parents[1]
PAIR = """\
hosts: [a, b]
links:
  - {ends: [a, b], rate: 100mbit, latency: 20us, burst: 128KiB}
mtu: 9000
"""


def test_collectives_bench_smoke(tmp_path):
    """2 hosts over a 100 Mbit/s link: every algorithm measured, checked and predicted."""
    why = why_no_namespaces()
    if why:
        print(f"skipping: {why}")
        pytest.skip(why)
    topo = tmp_path / "pair.yaml"
    topo.write_text(PAIR)
    tag = f"scbt{os.getpid() % 100000}"
    with removing_leftovers(f"{tag}0") as left:  # the first topology's namespaces
        subprocess.run([sys.executable, "-m", "bench.collectives_bench", "--topologies",
                        str(topo), "--sizes", "16KiB", "--repeats", "1",
                        "--calibration-repeats", "1", "--tag", tag, "--out", str(tmp_path)],
                       cwd=ROOT, check=True, timeout=120, capture_output=True)
    assert left == [], f"namespaces left behind: {left}"
    with open(tmp_path / "collectives.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == COLUMNS
    assert [r["algorithm"] for r in rows] == ["ring", "halving-doubling", "direct", "gloo"]
    for r in rows:
        assert r["topology"] == "pair" and int(r["bytes"]) == 16 << 10
        assert float(r["measured_min_s"]) <= float(r["measured_median_s"]) > 0
        if r["algorithm"] != "gloo":
            # 2 ranks: one exchange each way to reduce-scatter, one to all-gather
            assert int(r["steps"]) == 2 and float(r["predicted_s"]) > 0
            assert r["bottleneck"] in ("a->b", "b->a", "cpu")
    text = (tmp_path / "summary.md").read_text()
    assert "| pair | 16 KiB | " in text and "planner's pick" in text
    assert (tmp_path / "collectives.png").stat().st_size > 0
