"""Mininet topologies with SpINA switch nodes, and the tables each switch needs.

single: one switch, N hosts (ports 1..N); the switch aggregates.
leafspine: L leaves with H hosts each, S spines, every leaf linked to every spine (several
paths between leaves). The first spine aggregates (it owns the INA endpoint address); leaves
and the other spines only forward. Host-to-host traffic is spread over the spines.
(Two-level aggregation, leaves summing their racks first, runs on UDP-mode software switches
only so far, not in this testbed: docs/scale_out.md.)
Nodes are named h<tag>n<i>, s<tag>n1, sp<tag>n<j>, lf<tag>n<i> (tag: process id mod 10000).

Hosts: h<i> at 10.0.0.<i+1>/24, MAC 02:00:00:00:01:<i>; the INA endpoint is 10.0.0.100 with
MAC 02:00:00:00:00:64 (static ARP on every host; the switches do not answer ARP).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from testbed.mn import import_mininet, switch_classes

SWITCH_IP, SWITCH_MAC = "10.0.0.100", "02:00:00:00:00:64"
# Node names make the root-namespace interface names (<node>-eth<N>, at most 15 characters):
# a per-process tag keeps two testbeds (two CI runs) from taking each other's interfaces.
TAG = os.getpid() % 10000
WORKER_UDP_BASE = 50000


def host_ip(i: int) -> str:
    return f"10.0.0.{i + 1}"


def host_mac(i: int) -> str:
    return f"02:00:00:00:01:{i:02x}"


@dataclass
class Testbed:
    """A built (not yet started) network: `start()`, run things on `hosts`, `stop()`."""
    net: object
    hosts: list
    aggregator: object
    switches: list
    # per host index: the aggregating switch's port that reaches it
    agg_ports: list[int] = field(default_factory=list)

    def job_config(self, job: int = 1, **fields) -> dict:
        """A JobConfig dict for all hosts (P4 sizes unless overridden)."""
        d = {"job": job, "nslots": 8, "block_size": 32, "nlanes": 4, **fields}
        d["workers"] = [{"host": host_ip(i), "port": WORKER_UDP_BASE + i}
                        for i in range(len(self.hosts))]
        return d

    def add_job(self, jd: dict) -> None:
        """Admit a job on the aggregating switch (before `start`; the controller writes it)."""
        jd = dict(jd)
        jd["workers"] = [dict(w, mac=host_mac(i), switch_port=self.agg_ports[i])
                         for i, w in enumerate(jd["workers"])]
        self.aggregator.spina_config.setdefault("jobs", []).append(jd)

    def start(self) -> None:
        self.net.start()
        self.net.staticArp()
        for h in self.hosts:
            h.cmd(f"ip neigh replace {SWITCH_IP} lladdr {SWITCH_MAC} dev {h.defaultIntf()} "
                  "nud permanent")
            h.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
            h.cmd(f"ethtool -K {h.defaultIntf()} tx off")

    def stop(self) -> None:
        self.net.stop()


def _network(switch: str):
    mininet = import_mininet()
    soft, bmv2 = switch_classes()
    cls = {"soft": soft, "bmv2": bmv2}[switch]
    net = mininet.net.Mininet(switch=cls, controller=None, autoSetMacs=False,
                              autoStaticArp=False, build=False, waitConnected=False)
    return net


def _add_hosts(net, n: int):
    return [net.addHost(f"h{TAG}n{i}", ip=f"{host_ip(i)}/24", mac=host_mac(i)) for i in range(n)]


def _stop_on_error(build):
    """Stop whatever part of the network a failing builder has created."""
    def wrapper(*args, **kw):
        net = _network(kw.pop("switch", "soft"))
        try:
            return build(net, *args, **kw)
        except BaseException:
            net.stop()
            raise
    wrapper.__doc__, wrapper.__name__ = build.__doc__, build.__name__
    return wrapper


@_stop_on_error
def single(net, nhosts: int = 3) -> Testbed:
    """One switch s1, hosts h0..h(n-1) on ports 1..n (`switch=` soft or bmv2)."""
    hosts = _add_hosts(net, nhosts)
    s1 = net.addSwitch(f"s{TAG}n1")
    for i, h in enumerate(hosts):
        net.addLink(h, s1, port2=i + 1)
    net.build()
    s1.spina_config = {"endpoints": [SWITCH_IP],
                       "l2": [{"mac": host_mac(i), "port": i + 1} for i in range(nhosts)]}
    return Testbed(net, hosts, s1, [s1], [i + 1 for i in range(nhosts)])


@_stop_on_error
def leafspine(net, leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 2) -> Testbed:
    """L leaves (hosts on ports 1..H, spine j on port H+1+j), S spines (leaf i on port i+1);
    the first spine aggregates (`switch=` soft or bmv2)."""
    n = leaves * hosts_per_leaf
    hosts = _add_hosts(net, n)
    sp = [net.addSwitch(f"sp{TAG}n{j + 1}") for j in range(spines)]
    lf = [net.addSwitch(f"lf{TAG}n{i + 1}") for i in range(leaves)]
    leaf_of = [i // hosts_per_leaf for i in range(n)]
    for i, h in enumerate(hosts):
        net.addLink(h, lf[leaf_of[i]], port2=i % hosts_per_leaf + 1)
    for i, leaf in enumerate(lf):
        for j, spine in enumerate(sp):
            net.addLink(leaf, spine, port1=hosts_per_leaf + 1 + j, port2=i + 1)
    net.build()
    for i, leaf in enumerate(lf):
        l2 = []
        for k in range(n):
            if leaf_of[k] == i:
                l2.append({"mac": host_mac(k), "port": k % hosts_per_leaf + 1})
            else:  # spread remote hosts over the spines: several paths between leaves
                l2.append({"mac": host_mac(k), "port": hosts_per_leaf + 1 + (k + i) % spines})
        l2.append({"mac": SWITCH_MAC, "port": hosts_per_leaf + 1})  # INA to the first spine
        leaf.spina_config = {"l2": l2}
    for j, spine in enumerate(sp):
        spine.spina_config = {"l2": [{"mac": host_mac(k), "port": leaf_of[k] + 1}
                                     for k in range(n)]}
    sp[0].spina_config["endpoints"] = [SWITCH_IP]
    return Testbed(net, hosts, sp[0], sp + lf, [leaf_of[k] + 1 for k in range(n)])
