"""The planner: topology files (spina/topology.py), the cost model (collectives/plan.py)
and `spina plan` (spina_cli/plan.py).

Run just this file: python -m pytest tests/test_plan.py

Predictions are checked against the model's formulas worked out by hand on small
topologies; every bad input is one line naming the field (exit status 2 from the command).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from collectives import plan
from collectives.plan import CostParams, tcp_wire_bytes, udp_wire_bytes
from spina import topology
from spina.topology import TopologyError, from_dict

ROOT = Path(__file__).resolve().parents[1]
TOPOS = ROOT / "bench" / "topologies"
QUIET = CostParams(alpha=0.0, cpu_per_byte=0.0)


def star(n=4, rate="1gbit", latency="10us", aggregate=False, burst=None):
    link = dict(rate=rate, latency=latency, **({"burst": burst} if burst else {}))
    return from_dict(dict(hosts=[f"h{r}" for r in range(n)],
                          switches={"s": {"aggregate": aggregate}},
                          links=[dict(ends=[f"h{r}", "s"], **link) for r in range(n)]), "star")


# ----------------------------------------------------------------------------- topologies
def test_example_topologies_load_with_their_routes():
    """The bench's three files: ranks, groups, and routes (fewest hops, then names)."""
    two = topology.load(str(TOPOS / "two_groups.yaml"))
    assert two.ranks == ("h0", "h1", "h2", "h3") and two.groups == ((0, 1), (2, 3))
    assert [two.link_end(h) for h in two.path("h0", "h3")] == [
        ("h0", "sa"), ("sa", "sb"), ("sb", "h3")]
    torus = topology.load(str(TOPOS / "torus2x2.yaml"))
    assert [torus.link_end(h) for h in torus.path("h11", "h00")] == [
        ("h11", "h01"), ("h01", "h00")]  # two 2-hop routes: h01 < h10 breaks the tie
    assert [torus.link_end(h) for h in torus.path("h00", "h11")] == [
        ("h00", "h01"), ("h01", "h11")]
    pkg = topology.load(str(TOPOS / "package4.yaml"))
    assert pkg.groups is None and len(pkg.links) == 6
    assert {ln.burst for ln in pkg.links} == {128 << 10} and pkg.mtu == 9000


def test_the_larger_validation_topologies_route_and_plan():
    """torus4x4: 16 hosts, 32 links, rings closing around (h00 to h03 is one hop, h00 to h22
    four); leafspine: every route between the racks crosses one spine, the same one both
    ways. The planner's picks there (docs/collectives.md measured them within 10% of the
    best): 2-D at 1 MiB and up."""
    torus = topology.load(str(TOPOS / "torus4x4.yaml"))
    assert len(torus.ranks) == 16 and len(torus.links) == 32 and len(torus.groups) == 4
    assert [torus.link_end(h) for h in torus.path("h00", "h03")] == [("h00", "h03")]
    assert len(torus.path("h00", "h22")) == 4
    assert plan.plan(torus, "all_reduce", 4 << 20, QUIET).best in ("2d-ring", "2d-direct")
    ls = topology.load(str(TOPOS / "leafspine.yaml"))
    there = [ls.link_end(h) for h in ls.path("h0", "h3")]
    back = [ls.link_end(h) for h in ls.path("h3", "h0")]
    assert len(there) == 4 and there[1][1] in ("s0", "s1") and back[1][1] == there[1][1]
    assert plan.plan(ls, "all_reduce", 8 << 20, QUIET).best in ("2d-ring", "2d-direct")

def test_an_l2_switch_numbers_its_ports_and_gives_their_nodes_its_segment():
    """l2_star8.yaml: s0's ports are its links in file order, host h<r> on port r+1 with the
    subnet's address r+1 and MAC host_macs + r; the switch's own address and MAC; the first 3
    hosts keep their ports; mgmt8.yaml's bridge has an address and no MACs."""
    t = topology.load(str(TOPOS / "l2_star8.yaml"))
    seg = t.segments["s0"]
    assert (seg.kind, seg.root, seg.address, seg.mac) == ("l2", True, "10.0.0.100",
                                                          "02:00:00:00:00:64")
    assert t.ports("s0") == {r + 1: (r, f"h{r}") for r in range(8)} and t.aggregating == ("s0",)
    assert [t.segment_address("s0", p) for p in (1, 8)] == ["10.0.0.1", "10.0.0.8"]
    assert [t.segment_mac("s0", p) for p in (1, 8)] == ["02:00:00:00:01:00",
                                                        "02:00:00:00:01:07"]
    three = topology.first_hosts(t, 3)
    assert three.hosts == three.ranks == ("h0", "h1", "h2") and len(three.links) == 3
    assert three.ports("s0") == {1: (0, "h0"), 2: (1, "h1"), 3: (2, "h2")}
    assert [three.link_end(h) for h in three.path("h2", "h0")] == [("h2", "s0"), ("s0", "h0")]
    with pytest.raises(TopologyError, match="field 'hosts': the first 9 of 8 hosts"):
        topology.first_hosts(t, 9)
    m = topology.load(str(TOPOS / "mgmt8.yaml"))
    assert (m.segments["m0"].kind, m.segments["m0"].address) == ("bridge", "10.9.0.100")
    assert m.segment_address("m0", 2) == "10.9.0.2" and m.segment_mac("m0", 2) is None


def test_a_gateway_leaf_gives_each_port_a_subnet_routed_by_its_gateway():
    """dlcp_leaf16.yaml with 2 workers and the background sender: ports in file order (the
    core's last), port p's node at .2 of the p-th /24, the core at every .1 of them (its
    address: port 1's), MACs from host_macs; a leaf with a gateway is refused an address."""
    t = topology.first_hosts(topology.load(str(TOPOS / "dlcp_leaf16.yaml")), 2, keep=("bg",))
    assert t.hosts == ("w0", "w1", "bg") and t.segments["leaf"].gateway == "core"
    assert t.ports("leaf") == {1: (0, "w0"), 2: (1, "w1"), 3: (2, "bg"), 4: (3, "core")}
    assert [t.segment_address("leaf", p) for p in (1, 2, 3, 4)] == [
        "10.210.1.2", "10.210.2.2", "10.210.3.2", "10.210.1.1"]
    assert t.gateway_addresses("leaf") == ["10.210.1.1", "10.210.2.1", "10.210.3.1"]
    assert t.segment_prefix("leaf") == 24 and t.segment_mac("leaf", 4) == "02:00:00:00:02:03"
    bad = dict(hosts=["h0"], switches={"l": {"kind": "l2", "subnet": "10.1.0.0/16",
                                             "gateway": "r", "address": "10.1.0.9",
                                             "mac": "02:00:00:00:00:09"}, "r": {}},
               links=[dict(ends=["h0", "l"], rate="1gbit", latency="1us"),
                      dict(ends=["l", "r"], rate="1gbit", latency="1us")])
    with pytest.raises(TopologyError, match="'switches.l.gateway': needs a subnet with a /24"):
        from_dict(bad)
    bad["switches"]["l"] = {"kind": "l2", "subnet": "10.1.0.0/16", "gateway": "h9"}
    with pytest.raises(TopologyError, match="'switches.l.gateway': 'h9' is on none of its"):
        from_dict(bad)


def test_local_devices_become_ranks_on_a_local_mesh():
    """devices: 2 -> ranks h/0, h/1 linked to each other and to the host's NIC; one group
    per host by default."""
    t = from_dict(dict(hosts={"a": {"devices": 2}, "b": {"devices": 2}}, switches=["s"],
                       links=[dict(ends=["a", "s"], rate="1gbit", latency="1us"),
                              dict(ends=["b", "s"], rate="1gbit", latency="1us")],
                       local={"rate": "400gbit"}))
    assert t.ranks == ("a/0", "a/1", "b/0", "b/1") and t.groups == ((0, 1), (2, 3))
    assert [t.link_end(h) for h in t.path("a/0", "a/1")] == [("a/0", "a/1")]
    assert [t.link_end(h) for h in t.path("a/0", "b/1")] == [
        ("a/0", "a"), ("a", "s"), ("s", "b"), ("b", "b/1")]
    assert t.links[t.path("a/0", "a/1")[0][0]].rate == 400e9


@pytest.mark.parametrize("change, msg", [
    (dict(extra=1), "field 'extra': unknown field"),
    (dict(links=[dict(ends=["h0", "s"], rate="1gbt", latency="1us")]),
     "field 'links[0].rate': '1gbt' is not a rate"),
    (dict(links=[dict(ends=["h0", "s"], rate="1gbit")]), "field 'links[0].latency': is required"),
    (dict(links=[dict(ends=["h0", "s"], rate="1gbit", latency="1 hour")]),
     "field 'links[0].latency': '1 hour' is not a latency"),
    (dict(links=[dict(ends=["h0", "x"], rate="1gbit", latency="1us")]),
     "field 'links[0].ends': 'x' is neither a host nor a switch"),
    (dict(links=[dict(ends=["h0", "s"], rate="1gbit", latency="1us")] * 2),
     "field 'links[1].ends': a second link between h0 and s"),
    (dict(links=[dict(ends=["h0", "s"], rate="1gbit", latency="1us", burst="lots")]),
     "field 'links[0].burst': 'lots' is not a size"),
    (dict(links=[dict(ends=["h0", "s"], rate="1gbit", latency="1us")]),
     "field 'links': no path from h0 to h1"),
    (dict(groups=[["h0"], ["h9"]]), "field 'groups[1]': 'h9' is not a host"),
    (dict(groups=[["h0"], ["h1", "h2", "h3"]]), "field 'groups': every group needs the same"),
    (dict(groups=[["h0", "h1"]]), "field 'groups': must hold every host exactly once"),
    (dict(mtu=100), "field 'mtu': must be an integer in 576..65535"),
    (dict(hosts={"h0": {"devices": 0}}), "field 'hosts.h0.devices': must be an integer"),
    (dict(switches={"s": {"aggregate": "yes"}}), "field 'switches.s.aggregate': must be true"),
    (dict(hosts=["h0", "h1", "h2", "h1"]), "field 'hosts[3]': 'h1' is also hosts[1]"),
    (dict(switches=["s", "s"]), "field 'switches[1]': 's' is also switches[0]"),
    (dict(switches={"s": {"kind": "hub"}}), "field 'switches.s.kind': must be one of router, "),
    (dict(switches={"s": {"subnet": "10.0.0.0/24"}}),
     "field 'switches.s.subnet': is a field of an l2 or bridge switch"),
    (dict(switches={"s": {"kind": "l2", "subnet": "10.0.0.0/30"}}),
     "field 'switches.s.subnet': 10.0.0.0/30 has no address for each of its 4 ports"),
    (dict(switches={"s": {"kind": "l2", "subnet": "10.0.0"}}), "field 'switches.s.subnet': "),
    (dict(switches={"s": {"kind": "l2", "subnet": "10.0.0.0/24", "address": "10.0.0.4",
                          "mac": "02:00:00:00:00:64"}}),
     "field 'switches.s.address': 10.0.0.4 must be in 10.0.0.0/24 above its ports' addresses"),
    (dict(switches={"s": {"kind": "l2", "subnet": "10.0.0.0/24", "address": "10.0.0.100"}}),
     "field 'switches.s.mac': is required with an l2 switch's address"),
    (dict(switches={"s": {"kind": "bridge", "mac": "02:00:00:00:00:64"}}),
     "field 'switches.s.address': is required with its mac"),
    (dict(switches={"s": {"kind": "l2", "host_macs": "02:00:00:00:01"}}),
     "field 'switches.s.host_macs': '02:00:00:00:01' is not a MAC"),
    (dict(switches={"s": {"kind": "l2", "host_macs": "ff:ff:ff:ff:ff:fe"}}),
     "field 'switches.s.host_macs': ff:ff:ff:ff:ff:fe has no room for 4 ports"),
    (dict(switches={"s": {"kind": "bridge", "root": "yes"}}),
     "field 'switches.s.root': must be true or false"),
])
def test_bad_topologies_name_the_field(change, msg):
    """Each mistake is a TopologyError naming the file and the field, on one line."""
    d = dict(hosts=["h0", "h1", "h2", "h3"], switches=["s"],
             links=[dict(ends=[f"h{r}", "s"], rate="1gbit", latency="1us") for r in range(4)])
    d.update(change)
    with pytest.raises(TopologyError) as e:
        from_dict(d, "t.yaml")
    assert str(e.value).startswith("t.yaml: ") and msg in str(e.value)
    assert "\n" not in str(e.value)


def test_leaves_of_one_fabric_share_a_subnet_by_their_host_addresses():
    """host_addresses: two L2 leaves on one /24, each port's node counting up from its leaf's
    first address (leaf b's from 10.0.0.3), the switches' own addresses above them, a spine
    between the leaves; a first address outside the subnet, or one that leaves no room for
    the ports, names the field."""
    leaf = dict(kind="l2", root=True, subnet="10.0.0.0/24", mac="02:00:00:00:00:64")
    d = dict(hosts=["h0", "h1", "h2", "h3"],
             switches=dict(la=dict(leaf, address="10.0.0.201", host_addresses="10.0.0.1"),
                           lb=dict(leaf, address="10.0.0.202", host_addresses="10.0.0.3"),
                           sp=dict(kind="l2", root=True)),
             links=[dict(ends=[f"h{r}", "la" if r < 2 else "lb"], rate="1gbit", latency="1us")
                    for r in range(4)]
             + [dict(ends=[x, "sp"], rate="1gbit", latency="1us") for x in ("la", "lb")])
    t = from_dict(d, "f.yaml")
    assert [t.segment_address(s, p) for s in ("la", "lb") for p in (1, 2)] == [
        "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert t.ports("la")[3] == (4, "sp") and t.ports("sp") == {1: (4, "la"), 2: (5, "lb")}
    for change, msg in (
            (dict(host_addresses="10.0.1.1"), "field 'switches.la.host_addresses': 10.0.1.1 is "
                                              "not a host address of 10.0.0.0/24"),
            (dict(host_addresses="10.0.0.253"), "field 'switches.la.subnet': 10.0.0.0/24 has "
                                                "no address for each of its 3 ports"),
            (dict(address="10.0.0.2"), "field 'switches.la.address': 10.0.0.2 must be in "
                                       "10.0.0.0/24 above its ports' addresses (1..3)"),
            (dict(gateway="h0"), "field 'switches.la.host_addresses': needs the switch's "
                                 "subnet and no gateway")):
        bad = dict(d, switches=dict(d["switches"], la=dict(d["switches"]["la"], **change)))
        with pytest.raises(TopologyError) as e:
            from_dict(bad, "f.yaml")
        assert msg in str(e.value), str(e.value)


def test_bad_files(tmp_path):
    """A missing file and a file that is not YAML are one-line errors naming the file."""
    with pytest.raises(TopologyError, match="No such file"):
        topology.load(str(tmp_path / "none.yaml"))
    (tmp_path / "bad.yaml").write_text("hosts: [a\nlinks: {")
    with pytest.raises(TopologyError, match="bad.yaml: not YAML/JSON") as e:
        topology.load(str(tmp_path / "bad.yaml"))
    assert "\n" not in str(e.value)


def test_units():
    """Rates in tc's units, latencies and sizes with their suffixes; bad ones name the text."""
    assert topology.parse_rate("200mbit") == 200e6 and topology.parse_rate("1.5Gbit") == 1.5e9
    assert topology.parse_time("20us") == pytest.approx(20e-6)
    assert topology.parse_size("64KiB") == 65536 and topology.parse_size("1MB") == 10 ** 6
    for bad in ("0mbit", "5", "1 gbps"):
        with pytest.raises(ValueError, match="is not a rate"):
            topology.parse_rate(bad)
    with pytest.raises(ValueError, match="is not a size"):
        topology.parse_size("8Mb")  # megabits? sizes are bytes: refused, not guessed


# ----------------------------------------------------------------------------- the model
def test_wire_bytes():
    """TCP: 66 header bytes per MSS (MTU - 52) segment; UDP: 34 per IPv4 fragment + 8."""
    assert tcp_wire_bytes(8948, 9000) == 8948 + 66
    assert tcp_wire_bytes(8949, 9000) == 8949 + 2 * 66
    assert udp_wire_bytes(1000, 1500) == 1000 + 8 + 34
    assert udp_wire_bytes(57616, 9000) == 57616 + 8 + 7 * 34  # 7 fragments of <= 8976 bytes


def test_ring_and_direct_on_a_star_by_hand():
    """Star, 4 hosts: a ring step crosses two links carrying one chunk each; a direct step
    puts three chunks on every uplink."""
    t = star(rate="1gbit", latency="10us")
    n = 4 * 4 * 10000  # bytes of float32, 4 chunks of 40000 bytes
    chunk = tcp_wire_bytes(n // 4, t.mtu) * 8 / 1e9
    p = CostParams(alpha=1e-4, cpu_per_byte=0.0)
    ring = plan.predict(t, "all_reduce", n, "ring", p)
    assert len(ring.steps) == 6
    assert ring.seconds == pytest.approx(6 * (1e-4 + 20e-6 + chunk), rel=1e-12)
    direct = plan.predict(t, "all_reduce", n, "direct", p)
    assert direct.seconds == pytest.approx(2 * (1e-4 + 20e-6 + 3 * chunk), rel=1e-12)
    rs = plan.predict(t, "reduce_scatter", n, "ring", p)
    assert rs.seconds == pytest.approx(ring.seconds / 2, rel=1e-12)
    assert ring.bottleneck in {f"h{r}->s" for r in range(4)} | {f"s->h{r}" for r in range(4)}


def test_token_bucket_of_a_link():
    """Two hosts, one link with a burst: the first step sends the bucket at once, the second
    (the other direction is another bucket, this direction refilled for alpha only)."""
    t = from_dict(dict(hosts=["a", "b"], links=[dict(ends=["a", "b"], rate="100mbit",
                                                     latency="0s", burst="30000")]))
    n = 2 * 40000
    w = tcp_wire_bytes(40000, t.mtu)
    p = CostParams(alpha=1e-3, cpu_per_byte=0.0)
    got = plan.predict(t, "all_reduce", n, "ring", p)  # RS: a<->b, AG: a<->b
    first = (w - 30000) * 8 / 100e6
    refill = 1e-3 * 100e6 / 8  # 12500 bytes gained during the second step's alpha
    second = (w - refill) * 8 / 100e6
    assert [s.seconds for s in got.steps] == pytest.approx([1e-3 + first, 1e-3 + second])


def test_cpu_term_when_links_are_fast():
    """With 1 Pbit/s links the busiest rank's bytes in plus out, times cpu_per_byte, rule."""
    t = star(rate="1000tbit", latency="0s")
    n = 4 * 4 * 1000
    got = plan.predict(t, "all_reduce", n, "direct", CostParams(alpha=0.0, cpu_per_byte=1e-9))
    assert got.seconds == pytest.approx(2 * 2 * 3 * (n // 4) * 1e-9)
    assert {s.bottleneck for s in got.steps} == {"cpu"}


def test_ina_by_hand():
    """SpINA through the aggregating switch: max of the link, switch and agent terms. 10
    full datagrams' values per rank fill 10 of the 16 slots and take 20 rounds (a setup
    round and one data round in each slot in use): 20 datagrams each way, 28,944 bytes on
    average (20 IPv4 fragments at the star's MTU of 1500)."""
    t = star(rate="1gbit", latency="10us", aggregate=True)
    p = CostParams(alpha=0.0, cpu_per_byte=0.0, ina_call_s=1e-3, ina_switch_packet_s=17.6e-6,
                   ina_agent_packet_s=28e-6)
    n = 4 * 14336 * 10  # exactly 10 full datagrams' values per rank
    wire = n + 20 * (p.ina_overhead + 8 + 20 * 34)
    link = wire * 8 / 1e9
    switch = 4 * 20 * p.ina_switch_packet_s
    agent = 2 * 20 * p.ina_agent_packet_s
    got = plan.predict(t, "all_reduce", n, "ina", p)
    assert got.seconds == pytest.approx(1e-3 + 2 * 10e-6 + max(link, switch, agent))
    assert got.bottleneck == "h0->s"  # 593 KB: 4.7 ms at 1 Gbit/s
    fast = plan.predict(star(rate="100gbit", aggregate=True), "all_reduce", n, "ina", p)
    assert fast.bottleneck == "switch s CPU"  # 80 datagrams in x 17.6 us: 1.4 ms
    assert fast.seconds == pytest.approx(1e-3 + 2 * 10e-6 + switch)
    sparse = plan.predict(t, "all_reduce", n, "ina", plan.with_params(p, density=0.1))
    assert sparse.seconds < got.seconds
    with pytest.raises(ValueError, match="algorithm: ina needs an all_reduce"):
        plan.predict(t, "all_gather", n, "ina", p)
    # by default the switch's CPU is the calibration's: per datagram in, fragment and byte
    from collectives.ina_model import Assumptions
    a, cal = Assumptions(), CostParams(alpha=0.0, cpu_per_byte=0.0, ina_call_s=1e-3)
    got = plan.predict(star(rate="100gbit", aggregate=True), "all_reduce", n, "ina", cal)
    assert got.bottleneck == "switch s CPU"
    assert got.seconds == pytest.approx(1e-3 + 2 * 10e-6 + 4 * 20 * (
        a.switch_s_per_datagram + 20 * a.switch_s_per_fragment) + 4 * n * a.switch_s_per_byte)


def two_groups_switch(host="1gbit", slow="100mbit"):
    """h0, h1 on sa and h2, h3 on sb (fast links); sa and sb each on the aggregating s0 (slow
    links); no latency, no token bucket: the hand-worked times below are bytes over rates."""
    return from_dict(dict(
        hosts=["h0", "h1", "h2", "h3"],
        switches={"sa": {}, "sb": {}, "s0": {"aggregate": True}},
        links=[*(dict(ends=[h, s], rate=host, latency="0s") for h, s in
                 (("h0", "sa"), ("h1", "sa"), ("h2", "sb"), ("h3", "sb"))),
               dict(ends=["sa", "s0"], rate=slow, latency="0s"),
               dict(ends=["sb", "s0"], rate=slow, latency="0s")],
        groups=[["h0", "h1"], ["h2", "h3"]]), "two groups, a switch above")


def test_all_gathers_through_the_switch_by_hand():
    """"switch": every rank's shard up once, the other 3 down to each rank, so a group's slow
    downlink carries 2 x 3 shards. "leader-switch": the full mesh inside the groups (one TCP
    shard over a fast link each way), the leaders' multicast (a group's 2 shards up, the
    other group's 2 down: a third of the flat downlink's bytes), the leader's 2 outside
    shards to its member. Only with an aggregating switch; leader-* only with groups."""
    t = two_groups_switch()
    p = CostParams(alpha=0.0, cpu_per_byte=0.0, gather_call_s=1e-3, gather_copy_s=58e-6,
                   ina_agent_packet_s=28e-6)
    per = 14336 * 4  # bytes of a full datagram's data
    n = 4 * per * 10  # a shard of exactly 10 full datagrams
    d = udp_wire_bytes(per + p.ina_overhead, t.mtu)
    flat = plan.predict(t, "all_gather", n, "switch", p)
    assert flat.seconds == pytest.approx(1e-3 + 2 * 3 * 10 * d * 8 / 100e6)
    assert flat.bottleneck == "s0->sa"
    lead = plan.predict(t, "all_gather", n, "leader-switch", p)
    fast = tcp_wire_bytes(per * 10, t.mtu) * 8 / 1e9  # one shard over a fast link
    assert len(lead.steps) == 3
    assert lead.steps[0].seconds == pytest.approx(fast)
    assert lead.steps[1].seconds == pytest.approx(1e-3 + 20 * d * 8 / 100e6)
    assert lead.steps[1].bottleneck == "sa->s0"  # up and down carry the same 20 datagrams
    assert lead.steps[2].seconds == pytest.approx(tcp_wire_bytes(2 * per * 10, t.mtu) * 8 / 1e9)
    assert lead.seconds < flat.seconds / 2
    # the switch's CPU: 4 x 10 datagrams in, each sent to 3 others
    cpu = plan.predict(two_groups_switch("100gbit", "100gbit"), "all_gather", n, "switch", p)
    assert cpu.seconds == pytest.approx(1e-3 + 4 * 10 * 3 * p.gather_copy_s)
    assert cpu.bottleneck == "switch s0 CPU"
    assert plan.algorithms(t, "all_gather")[-3:] == ["leader-ring", "switch", "leader-switch"]
    assert "switch" not in plan.algorithms(t, "all_reduce")
    assert plan.algorithms(star(aggregate=True), "all_gather")[-1] == "switch"
    assert "leader-ring" not in plan.algorithms(star(), "all_gather")
    pl = plan.plan(t, "all_gather", 8 << 20, QUIET)
    assert pl.seconds["leader-switch"] < pl.seconds["switch"]
    with pytest.raises(ValueError, match="algorithm: switch needs an all_gather"):
        plan.predict(t, "all_reduce", n, "switch", p)


def test_leader_ring_by_hand():
    """leader-ring on two groups of 2: the full mesh inside (one shard each way per fast
    link), the leaders' ring (2 shards each way, over sa->s0->sb: the slow link rules),
    the leader's 2 outside shards to its member."""
    t = two_groups_switch()
    n = 4 * 1000 * 4
    got = plan.predict(t, "all_gather", n, "leader-ring", QUIET)
    one, two = (tcp_wire_bytes(b, t.mtu) * 8 for b in (4000, 8000))  # a group's 2 shards
    assert [s.seconds for s in got.steps] == pytest.approx([one / 1e9, two / 100e6, two / 1e9])
    assert got.steps[1].bottleneck == "sa->s0"


def test_ina_defaults_follow_spina():
    """The ina datagram defaults are SpINA's: JobConfig's lanes and blocks, wire's header."""
    from spina import wire
    from spina.config import JobConfig
    job = JobConfig(job=1, workers=())
    d = CostParams()
    assert d.ina_elements == job.nlanes * job.block_size
    assert d.ina_overhead == wire.HEADER_LEN + job.nlanes * 4


def test_planner_picks():
    """The hierarchical algorithm across the slow link, the full mesh in the package, and
    the candidates: no 2d without groups, ina only with an aggregating switch."""
    two = topology.load(str(TOPOS / "two_groups.yaml"))
    pl = plan.plan(two, "all_reduce", 8 << 20, QUIET)
    assert pl.best == "2d-ring" and pl.seconds["2d-ring"] < pl.seconds["ring"]
    assert pl.seconds["2d-ring"] == pl.seconds["2d-direct"]  # groups of 2: the same steps
    pkg = topology.load(str(TOPOS / "package4.yaml"))
    assert plan.plan(pkg, "all_reduce", 8 << 20, QUIET).best == "direct"
    assert plan.algorithms(pkg, "all_reduce") == ["ring", "halving-doubling", "direct"]
    assert plan.algorithms(star(aggregate=True), "all_reduce")[-1] == "ina"
    assert "ina" not in plan.algorithms(star(aggregate=True), "reduce_scatter")
    torus = topology.load(str(TOPOS / "torus2x2.yaml"))
    pl = plan.plan(torus, "all_reduce", 8 << 20, QUIET)
    assert max(pl.seconds, key=pl.seconds.get) == "ring"  # two of its four hops are 2 hops
    with pytest.raises(ValueError, match="algorithms: '2d-ring' is not available"):
        plan.plan(pkg, "all_reduce", 1 << 20, QUIET, candidates=["2d-ring"])
    with pytest.raises(ValueError, match="size: need at least one element"):
        plan.plan(pkg, "all_reduce", 2, QUIET)
    with pytest.raises(ValueError, match="alpha: must be a number >= 0"):
        plan.plan(pkg, "all_reduce", 1 << 20, CostParams(alpha=-1.0))


# ----------------------------------------------------------------------------- spina plan
def spina(*args):
    return subprocess.run([sys.executable, "-m", "spina_cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_spina_plan_prints_and_picks():
    """`spina plan FILE --size` prints every algorithm's prediction and the pick; --json."""
    r = spina("plan", str(TOPOS / "two_groups.yaml"), "--size", "8MiB")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "pick: 2d-ring"
    for a in ("ring", "halving-doubling", "direct", "2d-ring", "2d-direct"):
        assert f"  {a} " in r.stdout
    r = spina("plan", str(TOPOS / "torus2x2.yaml"), "--size", "1GiB", "--collective",
              "all_gather", "--dtype", "bfloat16", "--alpha", "0", "--json")
    out = json.loads(r.stdout)
    assert out["bytes"] == 1 << 30 and out["collective"] == "all_gather"
    assert set(out["predictions"]) == {"ring", "halving-doubling", "direct", "2d-ring",
                                       "2d-direct", "leader-ring"}
    assert out["pick"] == min(out["predictions"], key=lambda a: out["predictions"][a]["seconds"])
    assert math.isfinite(out["predictions"]["ring"]["seconds"])


def test_spina_plan_help_and_bad_input(tmp_path):
    """--help explains the file and the model; bad input exits 2 with one line naming it."""
    r = spina("plan", "--help")
    assert r.returncode == 0 and "topology file" in r.stdout and "alpha" in r.stdout
    assert "plan" in spina("--help").stdout
    bad = tmp_path / "t.yaml"
    bad.write_text("hosts: [a, b]\nlinks: [{ends: [a, b], rate: fast, latency: 1us}]\n")
    for args, msg in (((str(bad), "--size", "1MiB"), "field 'links[0].rate'"),
                      ((str(TOPOS / "package4.yaml"), "--size", "lots"), "argument --size"),
                      ((str(TOPOS / "package4.yaml"),), "--size"),
                      ((str(TOPOS / "package4.yaml"), "--size", "1MiB", "--density", "2"),
                       "argument --density"),
                      ((str(TOPOS / "package4.yaml"), "--size", "1MiB", "--algorithms", "ina"),
                       "algorithms: 'ina' is not available")):
        r = spina("plan", *args)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("spina plan: error: ") and r.stderr.count("\n") == 1
