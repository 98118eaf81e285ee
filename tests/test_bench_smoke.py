"""Smoke test of the loopback benchmark at a tiny size, and its report's arithmetic.

Run just this: python -m pytest tests/test_bench_smoke.py
"""
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.allreduce_bench import COLUMNS, QUICK, parse_args
from bench.paired import METHODS, paired_ratios, rotation

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, timeout=180,
                          capture_output=True, text=True, **kw)


def test_bench_smoke(tmp_path):
    """One point (2 workers, 64K elements) end to end: every method paired, verified, load kept."""
    done = _run("bench.allreduce_bench", "--sweeps", "base", "--base-workers", "2",
                "--base-elements", "65536", "--repeats", "2", "--no-plots", "--out",
                str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == COLUMNS
    assert sorted(r["method"] for r in rows) == sorted(METHODS)
    for r in rows:
        assert r["verified"] == "True" and r["repeats"] == "2"
        assert len(r["times_s"].split()) == 2  # one time per paired repeat
        assert len(r["load_start"].split()) == 3 and len(r["load_end"].split()) == 3
    spina = next(r for r in rows if r["method"] == "spina")
    assert 0 < float(spina["bytes_per_worker"]) < 65536 * 4  # 1% dense: far below the tensor
    # on loopback nothing is lost: every resend counts as spurious
    assert int(spina["spurious_resends"]) == int(spina["resends"]) >= 0
    hinted = next(r for r in rows if r["method"] == "spina_blocks")  # the caller's blocks
    assert hinted["payload_bytes_per_worker"] == spina["payload_bytes_per_worker"]
    gloo = next(r for r in rows if r["method"] == "gloo_allreduce")
    assert float(gloo["bytes_per_worker"]) == 65536 * 4  # ring, 2 workers: 2(n-1)/n = 1 tensor
    floor = next(r for r in rows if r["method"] == "floor")  # dense: 5 chunks of 56 x 256
    assert (float(floor["bytes_per_worker"]), float(floor["packets_per_worker"])) == (
        65536 * 4 + 5 * 4, 5)
    assert int(floor["switch_packets_in"]) == 2 * 3 * 5  # its relay: 2 workers, 3 calls
    text = (tmp_path / "summary.md").read_text()
    assert text.count("| SpINA/gloo_allreduce |") == 1
    assert text.count("| SpINA/floor |") == text.count("| floor/gloo_allreduce |") == 1
    assert "100% density, SpINA/floor ≤ 1.2×: not measured" in text  # the base point is 1%
    assert "target ≤ 0.2×" in text  # the base point is at 1%: its target is judged
    assert (tmp_path / "meta.json").exists()


def test_fixed_nnz_pair_is_measured_interleaved(tmp_path):
    """The scaling target's two points (the fixed_nnz sweep's nearest to 25M and its longest)
    are measured again alternating repeat by repeat, SpINA methods only, and the target line
    takes their per-repeat ratio instead of two points minutes apart."""
    done = _run("bench.allreduce_bench", "--sweeps", "fixed_nnz", "--base-workers", "2",
                "--base-elements", "65536", "--sizes", "65536,262144", "--methods",
                "spina,spina_blocks,gloo_allreduce", "--repeats", "2", "--no-plots",
                "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    paired_rows = [r for r in rows if r["sweep"] == "fixed_nnz_paired"]
    assert sorted((int(r["elements"]), r["method"]) for r in paired_rows) == [
        (65536, "spina"), (65536, "spina_blocks"), (262144, "spina"), (262144, "spina_blocks")]
    assert all(r["verified"] == "True" and len(r["times_s"].split()) == 2 for r in paired_rows)
    text = (tmp_path / "summary.md").read_text()
    assert text.count("the two points alternating repeat by repeat in one cluster") == 2
    assert "not paired" not in text
    assert "## fixed_nnz, interleaved" in text


def test_bench_on_two_switch_threads(tmp_path):
    """--switch-threads 2: a dense point through a switch of 2 data-path threads, verified,
    every datagram the workers sent served once (no loss on loopback), and the two loads of
    bench.switch_profile that compare 1 and 2 threads."""
    done = _run("bench.allreduce_bench", "--sweeps", "base", "--base-workers", "2",
                "--base-elements", "65536", "--base-density", "1", "--repeats", "2",
                "--methods", "spina", "--switch-threads", "2", "--no-plots", "--out",
                str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "results.csv", newline="") as f:
        (spina,) = list(csv.DictReader(f))
    assert spina["verified"] == "True"
    assert json.loads((tmp_path / "meta.json").read_text())["switch_threads"] == 2
    done = _run("bench.switch_profile", "--loads", "udp,udp-2t", "--shapes", "full",
                "--rounds", "1", "--repeats", "1", "--inner", "1")
    assert done.returncode == 0, done.stderr
    assert [ln.split()[:2] for ln in done.stdout.splitlines()[1:]] == [["udp", "full"],
                                                                       ["udp-2t", "full"]]


def test_report_regenerates_doc(tmp_path):
    """bench.report --doc: the generated part of a doc replaced, the rest kept, CSV copied."""
    out = tmp_path / "out"
    done = _run("bench.allreduce_bench", "--sweeps", "base", "--base-workers", "2",
                "--base-elements", "65536", "--repeats", "1", "--methods",
                "spina,gloo_allreduce", "--no-plots", "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = tmp_path / "docs" / "benchmark.md"
    doc.parent.mkdir()
    doc.write_text(f"# Reading\n\nprose\n\n{report.BEGIN}\nold table\n{report.END}\n\nafter\n")
    done = _run("bench.report", str(out / "results.csv"), "--doc", str(doc), "--no-plots")
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert text.startswith("# Reading\n\nprose\n\n" + report.BEGIN)
    assert text.endswith(report.END + "\n\nafter\n") and "old table" not in text
    assert "## Generated summary" in text and "### base point" in text
    assert (doc.parent / "benchmark.csv").read_bytes() == (out / "results.csv").read_bytes()


def test_report_bad_input(tmp_path):
    """A missing CSV or a doc without markers: one error line naming it, exit 2."""
    done = _run("bench.report", str(tmp_path / "nope.csv"))
    assert done.returncode == 2 and "error: csv: no such file" in done.stderr
    assert "Traceback" not in done.stderr
    empty, doc = tmp_path / "results.csv", tmp_path / "benchmark.md"
    empty.write_text(",".join(COLUMNS) + "\n")
    doc.write_text("# no generated part\n")
    done = _run("bench.report", str(empty), "--doc", str(doc), "--no-plots")
    assert done.returncode == 2 and "no generated part" in done.stderr
    assert done.stderr.count("\n") == 1 and doc.read_text() == "# no generated part\n"


def test_rotation_and_paired_ratio():
    """Each method goes first once every len(methods) repeats; ratios pair repeat i with i."""
    m = ("spina", "gloo_allreduce", "gloo_allgather")
    assert [rotation(m, i) for i in range(4)] == [
        m, ("gloo_allreduce", "gloo_allgather", "spina"),
        ("gloo_allgather", "spina", "gloo_allreduce"), m]
    assert rotation(("spina", "gloo"), 1) == ("gloo", "spina")
    assert paired_ratios([1.0, 3.0], [2.0, 1.5]) == [0.5, 2.0]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])
    a, b = {"times_s": "1.0 3.0 0.5"}, {"times_s": "2.0 1.5 1.0"}
    assert report.paired(a, b) == (0.5, 0.5, 2.0)  # median, min, max of 0.5, 2.0, 0.5


def test_quick_and_bad_args(capsys):
    """--quick is the density sweep of SpINA against the floor and gloo all_reduce; bad
    values exit 2."""
    a = parse_args(["--quick"])
    assert a.sweeps == QUICK["sweeps"].split(",") == ["density"]
    assert a.methods == ["spina", "floor", "gloo_allreduce"]
    for bad, name in ((["--sweeps", "speed"], "--sweeps"), (["--repeats", "0"], "--repeats"),
                      (["--methods", "mpi"], "--methods")):
        with pytest.raises(SystemExit) as e:
            parse_args(bad)
        assert e.value.code == 2 and name in capsys.readouterr().err


def test_bench_loss_sweep_smoke(tmp_path):
    """The loss sweep at a tiny size: namespaces built and removed, iptables drops, results
    exact."""
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("iptables")):
        pytest.skip("the loss sweep needs root, iproute2 and iptables (network namespaces)")
    done = _run("bench.allreduce_bench", "--sweeps", "loss", "--methods", "spina",
                "--loss-elements", "65536", "--losses", "0,0.1", "--loss-densities", "1",
                "--repeats", "2", "--no-plots", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["sweep"], float(r["loss"])) for r in rows] == [("loss", 0.0), ("loss", 0.1)]
    assert all(r["verified"] == "True" for r in rows)
    assert int(rows[0]["dropped"]) == 0 < int(rows[1]["dropped"])
    assert "## loss" in (tmp_path / "summary.md").read_text()


def test_switch_profile_smoke_and_bad_input():
    """bench.switch_profile: a tiny run reports both loads and shapes; bad options are one line."""
    done = _run("bench.switch_profile", "--rounds", "1", "--repeats", "1", "--inner", "1")
    assert done.returncode == 0, done.stderr
    lines = [ln.split()[:2] for ln in done.stdout.splitlines()[1:]]
    assert lines == [["pipeline", "full"], ["pipeline", "sparse"], ["udp", "full"],
                     ["udp", "sparse"]]
    for args, name in ((["--repeats", "0"], "--repeats"), (["--loads", "foo"], "--loads"),
                       (["--shapes", "x"], "--shapes"), (["--trees", ".,/nonexistent"], "--trees")):
        bad = _run("bench.switch_profile", *args)
        assert bad.returncode == 2 and bad.stdout == ""
        assert bad.stderr.count("\n") == 1 and f"argument {name}" in bad.stderr, bad.stderr
