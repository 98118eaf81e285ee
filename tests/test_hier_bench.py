"""Smoke test of the hierarchical-reduction benchmark's namespace mode (bench/hier_bench.py
--topology, a star file) at its tiniest size.

Run just this file: python -m pytest tests/test_hier_bench.py   (needs root, `ip` and `tc`)

2 hosts (namespaces, 1 Gbit/s links) x 2 training processes, 64K elements, 3 calls, through
the real CLI; the rto is long so no timer resend blurs the exact counts. Checked: every count
of `hier` is exactly 1/2 of `flat`'s, the veth counters see the agents' bytes plus headers,
nothing dropped, no namespace left.
"""
from __future__ import annotations

from tests.netns import run_bench


def rows(stdout: str) -> dict[str, list[str]]:
    """The table's cells by mode."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("flat", "hier"):
            out[cells[0]] = cells[1:]
    return out


def test_hier_bench_netns_smoke(tmp_path):
    """flat (4 ranks) vs hier (2 ranks x 2 local): the switch's datagrams and bytes and each
    host's link bytes halve exactly; the veth carries those bytes plus headers."""
    star = tmp_path / "star2.yaml"  # two hosts on one aggregating switch, 1 Gbit/s links
    star.write_text("hosts: [h0, h1]\nswitches: {s0: {aggregate: true}}\nlinks:\n"
                    + "".join(f"  - {{ends: [h{i}, s0], rate: 1gbit, latency: 20us, "
                              "burst: 128KiB}\n" for i in range(2)) + "mtu: 9000\n")
    out = run_bench("bench.hier_bench", "shb", [
        "--topology", str(star), "--local", "2", "--elements", "65536",
        "--calls", "3", "--rto", "2", "--timeout", "60"], timeout=120)
    t = rows(out.stdout)
    assert sorted(t) == ["flat", "hier"], out.stdout
    (fp, fb, fhost, fveth, fdrops, fres, fms), (hp, hb, hhost, hveth, hdrops, hres, hms) = (
        t["flat"], t["hier"])
    assert (fdrops, hdrops, fres, hres) == ("0 / 0", "0 / 0", "0", "0"), out.stdout
    assert int(fp) == 2 * int(hp) > 0 and int(fb) == 2 * int(hb) > 0
    fhost, hhost = ([int(b) for b in x.split(", ")] for x in (fhost, hhost))
    fveth, hveth = ([int(b) for b in x.split(", ")] for x in (fveth, hveth))
    assert fhost == [2 * b for b in hhost] and sum(hhost) == int(hb)  # every byte via the switch
    for agent, veth in zip(fhost + hhost, fveth + hveth):
        # UDP payload + Ethernet/IP/UDP headers of each datagram's fragments (and a few ARP)
        assert agent < veth < 1.02 * agent
    assert float(fms) > 0 and float(hms) > 0
    assert "namespaces of " in out.stdout and ", 1gbit links" in out.stdout
    assert "load average" in out.stdout
