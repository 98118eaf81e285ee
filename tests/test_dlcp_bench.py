"""Smoke test of the DLCP congestion experiment (`python -m bench dlcp`, bench/dlcp.py and
bench/dlcp_bench/) at a tiny size.

Run just this file: python -m pytest tests/test_dlcp_bench.py   (needs root, `ip`, `tc`)

Two workers in namespaces behind the L2 leaf whose uplink (a port shaper, the default) is
congested by the benchmark's own background traffic, a 256-256-10 MLP's gradient (2 calls
per step), two repeats of every configuration: end to end through the harness, then the CSVs
are checked (results identical on every rank, losses only in bounded modes and within the
bound, the switch's congestion stage in the path exactly when the job has a bound) and no
namespace is left behind. Further runs keep BMv2's per-queue model (`--uplink bmv2`) and the
training mode (`--train`) working.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness
from bench.dlcp import EXTRA_COLUMNS
from bench.dlcp_bench import CONFIGS
from tests.netns import run_bench

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _run_bench(tmp_path, prefix: str, *args: str) -> None:
    """Run the bench in namespaces tagged `prefix`+pid (skipping, with the reason printed, where
    it cannot run); it must exit 0 and leave no namespace behind."""
    run_bench("bench", prefix, ["dlcp", "-g", "2", *args, "--out", str(tmp_path), "--no-plots"],
              timeout=120)


def test_dlcp_bench_smoke(tmp_path):
    """Every configuration runs: SpINA results bit-identical on both ranks every step, exact
    modes exact, bounded modes within their bound, the congestion entry only with a bound."""
    _run_bench(tmp_path, "dlbt", "--model", "256,256,10", "-n", str(STEPS))
    steps = _read(tmp_path / "dlcp_steps.csv")
    by = {c.name: c for c in CONFIGS}
    assert sorted(r["config"] for r in steps) == sorted(list(by) * STEPS)
    # blocks per step: 256*256+256 = 65792 -> 257 blocks, 256*10+10 = 2570 -> 11 blocks
    assert {int(r["blocks"]) for r in steps} == {268}
    for r in steps:
        cfg = by[r["config"]]
        assert float(r["step_s"]) > 0 and r["within_bound"] == "True", r
        allowed = [int(x) for x in r["allowed"].split()]
        assert allowed == [int(cfg.bounded_loss * nb + 1e-9) for nb in (11, 257)]
        assert int(r["wrong_blocks_max_call"]) <= max(allowed)
        if cfg.method == "spina":
            crcs = r["crcs"].split()
            assert len(crcs) == 2 and len(set(crcs)) == 1, r  # identical on every rank
        if cfg.bounded_loss == 0:  # exact: nothing lost, nothing off, no congestion entry
            assert (r["blocks_lost"], r["wrong_blocks"], r["partial_rounds"]) == ("0", "0", "0")
            assert (r["congestion_seen"], r["congestion_drops"]) == ("0", "0"), r
        else:  # the job's entry is installed: the leaf's congestion stage sees its packets
            assert int(r["congestion_seen"]) > 0, r
            # the flush deadline: the fixed --loss-deadline, or auto's from the round latency
            if cfg.loss_deadline == "auto":
                assert 2.0 <= float(r["loss_deadline_ms"]) <= 50.0, r
            else:
                assert float(r["loss_deadline_ms"]) == 30.0, r
            assert int(r["congestion_drops"]) <= int(r["congestion_seen"]) * cfg.bounded_loss + 4
    marked = {c: sum(int(r["loss_tolerant_packets"]) for r in steps if r["config"] == c)
              for c in by}
    assert marked["b10%/fixed"] > 0 and marked["b10%/layer"] > 0  # 12 blocks each may go
    assert marked["exact/fixed"] == marked["exact/layer"] == 0
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert [r["method"] for r in rows] == [c.name for c in CONFIGS]
    assert tuple(reader.fieldnames) == harness.COLUMNS + EXTRA_COLUMNS
    for r in rows:
        assert r["wrong"] == "0" and r["within_bound"] == "True" and r["repeats"] == "2"
        assert float(r["time_min_us"]) <= float(r["time_us"]) <= float(r["time_max_us"])
        assert float(r["time_us"]) <= 1e6 * float(r["p99_s"]) * 1.0001
        assert r["workers"] == "2" and r["elements"] == str(65792 + 2570)
        assert r["size"] == str(4 * (65792 + 2570))
    assert {r["method"]: r["vs_gloo"] for r in rows}["gloo"] == ""
    text = (tmp_path / "command.txt").read_text()
    assert "python -m bench dlcp -g 2 --model 256,256,10 -n 2" in text
    text = (tmp_path / "dlcp_summary.md").read_text()
    assert "target <= 0.5x" in text and "priority fixed" in text
    assert "a port shaper of 400mbit (one rate for the port, strict priority" in text


def test_dlcp_bench_bmv2_uplink_model(tmp_path):
    """`--uplink bmv2` (BMv2's per-queue rates, the first documented run) still runs: one
    exact and one bounded configuration, identical results on both ranks, the bound kept."""
    _run_bench(tmp_path, "dlbq", "--model", "256,256,10", "-n", "1", "--uplink", "bmv2",
               "--bg-size", "1000", "-m", "exact/fixed,b10%/layer")
    steps = _read(tmp_path / "dlcp_steps.csv")
    assert [r["config"] for r in steps] in (["exact/fixed", "b10%/layer"],
                                            ["b10%/layer", "exact/fixed"])
    for r in steps:
        assert r["within_bound"] == "True" and len(set(r["crcs"].split())) == 1, r
    assert "each priority queue drained at 8000 frames/s on its own" in \
        (tmp_path / "dlcp_summary.md").read_text()


def test_dlcp_bench_training_mode(tmp_path):
    """`--train`: digits trained through the congested fabric, per configuration a curve, the
    same final weights on every rank, losses only with a bound, the time to accuracy column."""
    _run_bench(tmp_path, "dlbr", "--train", "4", "--eval-every", "2", "--train-model",
               "64,32,10", "--target-accuracy", "1", "-m", "exact/fixed,b10%/layer")
    curves = _read(tmp_path / "dlcp_train_curves.csv")
    assert [(r["config"], r["step"]) for r in curves] == [
        ("exact/fixed", "2"), ("exact/fixed", "4"), ("b10%/layer", "2"), ("b10%/layer", "4")]
    rows = {r["method"]: r for r in _read(tmp_path / "results.csv")}
    assert set(rows) == {"exact/fixed", "b10%/layer"}
    for r in rows.values():  # wrong 0: the same final weights on every rank
        assert r["wrong"] == "0" and r["steps_to_target"] == "2" and r["repeats"] == "1", r
        assert r["size"] == str(4 * (64 * 32 + 32 + 32 * 10 + 10))
    assert (rows["exact/fixed"]["blocks_lost_per_call"],
            rows["exact/fixed"]["partial_rounds_per_step"]) == ("0", "0")


@pytest.mark.parametrize("args, says", [(["-m", "b5%/fixed"], "b5%/fixed"),
                                        (["--port-rate", "400"], "'400'"),
                                        (["--uplink", "tofino"], "'tofino'"),
                                        (["--train", "2", "--train-model", "784,10"],
                                         "784,10")])
def test_dlcp_bench_bad_option_is_one_line(args, says):
    """A bad option: exit 2 and one line naming it, before anything is built."""
    out = subprocess.run([sys.executable, "-m", "bench", "dlcp", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert args[0] in lines[0] and says in lines[0]
