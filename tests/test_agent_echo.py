"""bench/agent_echo.py: the agent against an echo switch, beside another checkout's agent.

Run just this file: .venv/bin/python -m pytest tests/test_agent_echo.py
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "bench.agent_echo", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_compares_with_a_baseline_checkout_and_checks_the_sums():
    """Against this very checkout as the baseline: both agents' sums agree bit for bit (else it
    exits non-zero) and the report has both agents' CPU and their ratio."""
    p = run("--elements", "3e5", "--densities", "0.05,1", "--repeats", "2",
            "--baseline", str(ROOT))
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    for d in ("0.05", "1"):
        assert set(report[d]) == {"old", "new", "packets", "new_over_old"}
        assert len(report[d]["old"]["cpu_s"]) == len(report[d]["new"]["cpu_s"]) == 2
        assert report[d]["new_over_old"] > 0
    # Every block non-zero: per slot a setup round plus its busiest lane's blocks.
    per_lane = np.bincount(np.arange(300_000 // 256) % (16 * 56), minlength=16 * 56)
    assert report["1"]["packets"] == int((1 + per_lane.reshape(16, 56).max(axis=1)).sum())


@pytest.mark.parametrize("args, field", [(["--repeats", "0"], "--repeats"),
                                         (["--densities", "0.5,x"], "--densities"),
                                         (["--densities", "1.5"], "--densities"),
                                         (["--baseline", "/nonexistent"], "--baseline")])
def test_bad_arguments_are_one_line(args, field):
    """Bad input: one line naming the option, exit status 2."""
    p = run(*args)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1
    assert p.stderr.startswith(f"bench.agent_echo: error: argument {field}")
