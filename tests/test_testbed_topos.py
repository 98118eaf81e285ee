"""The mininet testbed's networks as topology documents (testbed/topos.py single_topology,
leafspine_topology) and the adapter that builds them into mininet (build), without mininet: a
stand-in `net` records the hosts, switches and links build() asks for, which must be the
network the testbed built by hand before (the addresses, MACs and ports its tables and
desired state assume).

Run just this file: python -m pytest tests/test_testbed_topos.py

Not covered here: mininet itself (its nodes, interfaces, the switch processes on them):
tests/test_mininet.py and the mininet rows of tests/test_seams.py run that, as root.
"""
from __future__ import annotations

import pytest

from testbed import topos
from testbed.topos import TAG, host_ip, host_mac


class RecordingNet:
    """What build() asks of mininet's Mininet, in order; a node is its name."""

    def __init__(self):
        self.calls = []

    def addHost(self, name, ip, mac):  # mininet.net.Mininet's names
        self.calls.append(("host", name, ip, mac))
        return name

    def addSwitch(self, name):
        self.calls.append(("switch", name))
        return name

    def addLink(self, a, b, port1=None, port2=None):
        self.calls.append(("link", a, b, port1, port2))


@pytest.mark.parametrize("n", [1, 3, 32])
def test_single_builds_hosts_on_ports_one_to_n(n):
    """single: host i at 10.0.0.(i+1)/24 with MAC 02:00:00:00:01:<i> on port i + 1 of s1."""
    net = RecordingNet()
    nodes = topos.build(net, topos.single_topology(n))
    s1 = f"s{TAG}n1"
    assert net.calls == (
        [("host", f"h{TAG}n{i}", f"10.0.0.{i + 1}/24", f"02:00:00:00:01:{i:02x}")
         for i in range(n)]
        + [("switch", s1)]
        + [("link", f"h{TAG}n{i}", s1, None, i + 1) for i in range(n)])
    assert list(nodes) == [f"h{TAG}n{i}" for i in range(n)] + [s1]


@pytest.mark.parametrize(("leaves", "spines", "per_leaf"),
                         [(2, 2, 2), (2, 1, 2), (3, 2, 1), (2, 2, 4), (4, 14, 24)])
def test_leafspine_builds_the_racks_and_the_spine_links(leaves, spines, per_leaf):
    """leafspine: host k on leaf k // H at port k % H + 1, with host_ip(k) and host_mac(k);
    every leaf i linked to every spine j, on the leaf's port H + 1 + j and the spine's i + 1;
    spines made before leaves (the testbed's switch order)."""
    net = RecordingNet()
    topos.build(net, topos.leafspine_topology(leaves, spines, per_leaf))
    n = leaves * per_leaf
    lf = [f"lf{TAG}n{i + 1}" for i in range(leaves)]
    sp = [f"sp{TAG}n{j + 1}" for j in range(spines)]
    assert net.calls == (
        [("host", f"h{TAG}n{k}", f"{host_ip(k)}/24", host_mac(k)) for k in range(n)]
        + [("switch", s) for s in sp + lf]
        + [("link", f"h{TAG}n{k}", lf[k // per_leaf], None, k % per_leaf + 1)
           for k in range(n)]
        + [("link", lf[i], sp[j], per_leaf + 1 + j, i + 1)
           for i in range(leaves) for j in range(spines)])


def test_the_largest_testbed_fits_the_format():
    """The CLI's largest two-level network (99 hosts, 14 spines) is a valid document: every
    host's address below the flat INA endpoint's 10.0.0.100."""
    topo = topos.leafspine_topology(3, 14, 33)
    last = topo.hosts[-1]
    sw, (i, _) = topo.neighbours(last)[0]
    assert topo.segment_address(sw, topo.port_of(sw, i)) == host_ip(98) == "10.0.0.99"
