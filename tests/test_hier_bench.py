"""Smoke test of the hierarchical-reduction benchmark (`python -m bench hier`, bench/hier.py)
at its tiniest size, on loopback and in namespaces of a star file.

Run just this file: python -m pytest tests/test_hier_bench.py   (the namespace case needs
root, `ip` and `tc`)

2 hosts x 2 training processes, 64K elements, 2 calls after a first; the rto is long so no
timer resend blurs the exact counts. Checked: every count of `hier` is exactly 1/2 of
`flat`'s, every sum right (wrong 0), in namespaces the veth counters see the agents' bytes
plus headers, nothing dropped, no namespace left.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from bench import harness
from bench.hier import EXTRA_COLUMNS
from tests.netns import run_bench

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["-g", "4", "--local", "2", "-b", "256K", "-e", "256K", "-n", "2", "--rto", "2",
        "--timeout", "60", "--no-plots"]


def halves(out: Path) -> dict[str, dict]:
    """The run's rows by mode, after the checks both runs share."""
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = {r["method"]: r for r in reader}
    assert tuple(reader.fieldnames) == harness.COLUMNS + EXTRA_COLUMNS
    f, h = rows["flat"], rows["hier"]
    for r in (f, h):
        assert r["wrong"] == "0" and r["resends"] == "0" and float(r["time_us"]) > 0
        assert (r["workers"], r["hosts"], r["local"]) == ("4", "2", "2")
    assert int(f["switch_packets_per_call"]) == 2 * int(h["switch_packets_per_call"]) > 0
    assert int(f["switch_bytes_per_call"]) == 2 * int(h["switch_bytes_per_call"]) > 0
    fhost, hhost = ([int(b) for b in r["host_bytes_per_call"].split()] for r in (f, h))
    assert fhost == [2 * b for b in hhost]
    assert sum(hhost) == int(h["switch_bytes_per_call"])  # every byte via the switch
    return rows


def test_hier_bench_loopback(tmp_path):
    """flat (4 ranks) vs hier (2 ranks x 2 local) on loopback: exact halves."""
    done = subprocess.run([sys.executable, "-m", "bench", "hier", *ARGS, "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = halves(tmp_path)
    assert rows["flat"]["rate"] == "" and rows["flat"]["veth_bytes_per_call"] == ""


def test_hier_bench_netns_smoke(tmp_path):
    """The same over a 1 Gbit/s star of 2 hosts: the veth carries the agents' bytes plus
    headers, nothing dropped."""
    star = tmp_path / "star2.yaml"  # two hosts on one aggregating switch, 1 Gbit/s links
    star.write_text("hosts: [h0, h1]\nswitches: {s0: {aggregate: true}}\nlinks:\n"
                    + "".join(f"  - {{ends: [h{i}, s0], rate: 1gbit, latency: 20us, "
                              "burst: 128KiB}\n" for i in range(2)) + "mtu: 9000\n")
    out = tmp_path / "out"
    run_bench("bench", "shb", ["hier", "-t", str(star), *ARGS, "--out", str(out)],
              timeout=200)
    rows = halves(out)
    for r in rows.values():
        assert r["rate"] == "1gbit" and (r["tbf_drops"], r["udp_drops"]) == ("0", "0")
        agents = [int(b) for b in r["host_bytes_per_call"].split()]
        veths = [int(b) for b in r["veth_bytes_per_call"].split()]
        for agent, veth in zip(agents, veths):
            # UDP payload + Ethernet/IP/UDP headers of each datagram's fragments (and ARP)
            assert agent < veth < 1.02 * agent
