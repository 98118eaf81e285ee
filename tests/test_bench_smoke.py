"""Smoke test of the benchmark at a tiny size. Run just this: python -m pytest tests/test_bench_smoke.py"""
import csv
import subprocess
import sys
from pathlib import Path

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
