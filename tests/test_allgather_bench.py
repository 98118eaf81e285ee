"""Smoke test of the all-gather benchmark (bench/allgather_bench.py) at its tiniest size.

Run just this file: python -m pytest tests/test_allgather_bench.py   (needs root, `ip`, `tc`)

Three workers in namespaces, one 16 KiB shard each, one repeat: end to end through the CLI
(every result checked bit for bit there), then the outputs and the machine are checked (no
namespace left).
"""
from __future__ import annotations

import csv

from bench.allgather_bench import COLUMNS
from tests.netns import run_bench


def test_allgather_bench_smoke(tmp_path):
    """SpINA and gloo timed over a 1 Gbit/s star of 3; each SpINA worker sends its shard
    once (plus headers) where gloo's ring sends it twice, and both receive two shards."""
    run_bench("bench.allgather_bench", "sagb", ["--workers", "3", "--sizes", "16KiB",
                                                "--repeats", "1", "--out", str(tmp_path)],
              timeout=120)
    with open(tmp_path / "allgather.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["method"]: r for r in reader}
    assert tuple(reader.fieldnames) == COLUMNS
    assert sorted(rows) == ["gloo", "spina"]
    shard = 16384
    spina, gloo = rows["spina"], rows["gloo"]
    assert shard <= int(spina["tx_bytes_per_worker"]) < 1.2 * shard
    assert 2 * shard <= int(gloo["tx_bytes_per_worker"]) < 2.5 * shard
    for r in (spina, gloo):
        assert 2 * shard <= int(r["rx_bytes_per_worker"]) < 2.5 * shard
        assert float(r["median_s"]) > 0
        assert min(int(r[k]) for k in ("tbf_drops", "udp_drops", "tcp_retrans")) >= 0
    assert (tmp_path / "summary.md").read_text().count("| 3 | 1gbit | 16384 |") == 2
    assert (tmp_path / "allgather.png").stat().st_size > 0
