"""`python -m bench agent` (bench/agent.py): the agent against an echo switch, beside another
checkout's agent.

Run just this file: .venv/bin/python -m pytest tests/test_agent_echo.py
"""
import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import harness
from bench.agent import EXTRA_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "bench", "agent", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_compares_with_a_baseline_checkout_and_checks_the_sums(tmp_path):
    """Against this very checkout as the baseline: both agents' sums right and alike bit for
    bit (wrong 0), both agents' CPU per call and new's over old's per repeat."""
    p = run("-b", "1200000", "-e", "1200000", "-d", "0.05,1", "-n", "2", "--baseline",
            str(ROOT), "--no-plots", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {(float(r["density"]), r["method"]): r for r in reader}
    assert tuple(reader.fieldnames) == harness.COLUMNS + EXTRA_COLUMNS
    assert sorted(rows) == [(0.05, "new"), (0.05, "old"), (1.0, "new"), (1.0, "old")]
    for (_, m), r in rows.items():
        assert r["wrong"] == "0" and r["repeats"] == "2" and float(r["time_us"]) > 0
        assert (r["vs_old"] != "") == (m == "new")
    # Every block non-zero: per slot a setup round plus its busiest lane's blocks.
    per_lane = np.bincount(np.arange(300_000 // 256) % (16 * 56), minlength=16 * 56)
    assert rows[1.0, "new"]["packets"] == str(int((1 + per_lane.reshape(16, 56).max(
        axis=1)).sum()))


@pytest.mark.parametrize("args, field", [(["-n", "0"], "-n/--repeats"),
                                         (["-d", "0.5,x"], "-d/--densities"),
                                         (["-d", "1.5"], "-d/--densities"),
                                         (["-g", "2"], "-g/--workers"),
                                         (["-m", "old"], "-m/--methods"),
                                         (["--baseline", "/nonexistent"], "--baseline")])
def test_bad_arguments_are_one_line(args, field):
    """Bad input: one line naming the option, exit status 2."""
    p = run(*args)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1
    assert p.stderr.startswith(f"python -m bench agent: error: argument {field}"), p.stderr
