"""Smoke test of the benchmark at a tiny size. Run just this: python -m pytest tests/test_bench_smoke.py"""
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.allreduce_bench import COLUMNS, METHODS

ROOT = Path(__file__).resolve().parents[1]


def test_bench_smoke(tmp_path):
    """One point (2 workers, 64K elements) end to end: CSV columns, all methods, SpINA verified."""
    subprocess.run([sys.executable, "-m", "bench.allreduce_bench", "--sweeps", "base",
                    "--base-workers", "2", "--base-elements", "65536", "--repeats", "1",
                    "--no-plots", "--out", str(tmp_path)], cwd=ROOT, check=True, timeout=120)
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == COLUMNS
    assert sorted(r["method"] for r in rows) == sorted(METHODS)
    spina = next(r for r in rows if r["method"] == "spina")
    assert spina["verified"] == "True" and float(spina["median_s"]) > 0
    assert 0 < float(spina["bytes_per_worker"]) < 65536 * 4  # 1% dense: far below the tensor
    assert (tmp_path / "summary.md").read_text().count("SpINA/gloo_allreduce") == 1


def test_bench_loss_sweep_smoke(tmp_path):
    """The loss sweep at a tiny size: namespaces built and removed, iptables drops, results exact."""
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("iptables")):
        pytest.skip("the loss sweep needs root, iproute2 and iptables (network namespaces)")
    subprocess.run([sys.executable, "-m", "bench.allreduce_bench", "--sweeps", "loss",
                    "--methods", "spina", "--loss-elements", "65536", "--losses", "0,0.1",
                    "--loss-densities", "1", "--repeats", "2", "--no-plots", "--out",
                    str(tmp_path)], cwd=ROOT, check=True, timeout=120)
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["sweep"], float(r["loss"])) for r in rows] == [("loss", 0.0), ("loss", 0.1)]
    assert all(r["verified"] == "True" for r in rows)
    assert int(rows[0]["dropped"]) == 0 < int(rows[1]["dropped"])
    assert "## loss" in (tmp_path / "summary.md").read_text()
