"""The training benchmark (bench/train_bench.py): a tiny end-to-end run and its bookkeeping.

Run just this file: python -m pytest tests/test_train_bench.py   (the smoke run needs root,
`ip` and `tc`; the other tests need neither)

The smoke run trains a 71k-parameter MLP for 4 steps per method with 2 workers over a
1 Gbit/s namespace star, through the real CLI, then checks the outputs and that no namespace
is left behind.
"""
from __future__ import annotations

import csv

import pytest

from bench.paired import BenchError
from bench.train_bench import (
    COLUMNS,
    CURVE_COLUMNS,
    METHODS,
    TrainRequest,
    make_rows,
    time_to_target,
)
from tests.netns import run_bench

PARAMS = 1024 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10  # MLP 1024-64-64-10


def test_train_bench_smoke(tmp_path):
    """2 workers, every method 4 steps: rows and curves as promised, weights identical on
    both ranks, each method's bytes on the wire what its algorithm sends."""
    run_bench("bench.train_bench", "stbt", ["--workers", "2", "--rates", "1gbit", "--width",
                                            "64", "--max-steps", "4", "--min-steps", "4",
                                            "--out", str(tmp_path)], timeout=120)
    with open(tmp_path / "train_results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["method"]: r for r in reader}
    assert tuple(reader.fieldnames) == COLUMNS
    assert sorted(rows) == sorted(METHODS)
    size = 4 * PARAMS
    for m, r in rows.items():
        assert (r["workers"], r["rate"], r["params"], r["steps"]) == ("2", "1gbit",
                                                                      str(PARAMS), "4")
        assert float(r["step_median_s"]) > 0
        assert r["weights_identical"] == ("" if m == "compute" else "True")
    # 2 workers: the ring sends 2(n-1)/n = one gradient per step, SpINA each non-zero
    # block once, top-k 5% of the blocks; headers on top (a few hundred bytes either side:
    # TCP's ACKs and segments at the edges of the measured window), and what was sent
    # again: the agents' resends (a datagram of up to 57 KB each) and TCP's retransmits
    steps = 4
    spare = (int(rows["spina"]["resends"]) + int(rows["topk"]["resends"])) * 58_000 / steps
    tcp = int(rows["gloo"]["tcp_retrans"]) * 66_000 / steps
    tx = {m: float(r["tx_bytes_per_step"]) for m, r in rows.items()}
    assert 0.99 * size <= tx["gloo"] < 1.2 * size + tcp, (tx, rows["gloo"])
    assert 0.5 * size < tx["spina"] < 1.2 * size + spare, (tx, rows["spina"])
    assert 0 < tx["topk"] < 0.2 * size + spare, (tx, rows["topk"])
    assert tx["compute"] < 1000  # nothing but a stray ACK of the step before
    assert 0.05 <= float(rows["topk"]["blocks_fraction"]) < 0.06, rows["topk"]
    assert float(rows["gloo"]["step_ratio_median"]) == 1.0
    with open(tmp_path / "train_curves.csv", newline="") as f:
        reader = csv.DictReader(f)
        curves = list(reader)
    assert tuple(reader.fieldnames) == CURVE_COLUMNS
    for m in METHODS:
        pts = [c for c in curves if c["method"] == m]
        assert [int(c["step"]) for c in pts] == [1, 2, 3, 4]
        assert float(pts[-1]["cum_s"]) == pytest.approx(sum(float(c["step_s"]) for c in pts))
        if m != "compute":
            assert float(pts[-1]["test_acc"]) == float(rows[m]["final_acc"])
    text = (tmp_path / "train_summary.md").read_text()
    assert "target <= 0.75x" in text and "2 workers" in text
    assert (tmp_path / "train.png").stat().st_size > 0


def test_time_to_target():
    """The summed step times up to the first step at the target; None if never reached."""
    assert time_to_target([1.0, 2.0, 4.0, 8.0], [50.0, 96.0, 90.0, 97.0], 95.0) == (2, 3.0)
    assert time_to_target([1.0, 2.0], [95.0, 99.0], 95.0) == (1, 1.0)
    assert time_to_target([1.0, 2.0], [50.0, 94.9], 95.0) == (None, None)


def _rec(crc: int, acc: list[float]) -> dict:
    k = len(acc)
    return dict(times=[0.1] * k, tx=[10] * k, rx=[10] * k, cpu=[0.05] * k,
                switch_cpu=[0.0] * k, acc=acc, crc=crc)


def test_rows_refuse_weights_that_differ():
    """A method whose ranks end with different weights (or accuracies) stops the run."""
    req = TrainRequest(methods=("gloo",), width=64, batch=4, lr=0.1, momentum=0.9, ratio=0.05,
                       target=95.0, max_steps=2, min_steps=1, seed=0)
    common = dict(mtu=9000, workers=2, rate="1gbit")
    good = [dict(gloo=_rec(7, [90.0, 96.0]), params=10) for _ in range(2)]
    rows, curves = make_rows(good, req, common)
    assert (rows[0]["steps_to_target"], rows[0]["time_to_target_s"]) == (2, pytest.approx(0.2))
    assert len(curves) == 2
    with pytest.raises(BenchError, match="gloo's weights differ across ranks"):
        make_rows([good[0], dict(gloo=_rec(8, [90.0, 96.0]), params=10)], req, common)
    with pytest.raises(BenchError, match="different test accuracies"):
        make_rows([good[0], dict(gloo=_rec(7, [90.0, 95.0]), params=10)], req, common)
