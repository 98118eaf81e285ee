"""Integration: host agents on mininet hosts, software switch nodes (L2 mode) between them.

Run just this file: python -m pytest tests/test_mininet.py   (needs root and Debian's mininet)

Each test builds its topology, starts the switch processes, runs one worker process per host,
and stops everything it started (net.stop(), switch processes by their handles).
"""
from __future__ import annotations

import os
import sys
import time

import pytest

try:
    from testbed import topos
    from testbed.__main__ import run_allreduce
    from testbed.mn import import_mininet
    import_mininet()
    WHY = None if os.geteuid() == 0 else "needs root"
except ImportError as e:
    WHY = str(e)

pytestmark = pytest.mark.skipif(WHY is not None, reason=f"mininet testbed unavailable: {WHY}")


def _udp_reaches(src, dst, port=40000) -> bool:
    """A datagram from host `src` arrives at host `dst` (not an INA packet)."""
    recv = dst.popen([sys.executable, "-c",
                      "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                      f"s.bind(('{dst.IP()}', {port})); s.settimeout(5); "
                      "print(s.recvfrom(100)[0].decode())"])
    try:
        time.sleep(0.3)
        src.cmd(f"{sys.executable} -c \"import socket; socket.socket(socket.AF_INET, "
                f"socket.SOCK_DGRAM).sendto(b'hello', ('{dst.IP()}', {port}))\"")
        out, _ = recv.communicate(timeout=10)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return out.decode().strip() == "hello"


def _check(reports, nhosts):
    assert len(reports) == nhosts
    assert all(r["ints_exact"] for r in reports), reports
    assert len({r["ints"] for r in reports}) == 1
    assert len({r["floats"] for r in reports}) == 1
    assert max(r["float_err"] for r in reports) < 1e-3


def test_single_switch_allreduce():
    """Three hosts on one software switch get exact sums."""
    tb = topos.single(3)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        _check(run_allreduce(tb, jd, n=6000), 3)
    finally:
        tb.stop()


def test_leaf_spine_allreduce_and_forwarding():
    """Two leaves, two spines: spine1 aggregates; hosts on different leaves reach each other."""
    tb = topos.leafspine(2, 2, 2)
    jd = tb.job_config()
    tb.add_job(jd)
    try:
        tb.start()
        assert _udp_reaches(tb.hosts[0], tb.hosts[3])  # ordinary forwarding across leaves
        assert _udp_reaches(tb.hosts[3], tb.hosts[1])
        _check(run_allreduce(tb, jd, n=6000), 4)
    finally:
        tb.stop()
