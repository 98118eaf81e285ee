"""Mininet topologies with SpINA switch nodes, and the tables each switch needs.

single: one switch, N hosts (ports 1..N); the switch aggregates.
leafspine: L leaves with H hosts each, S spines, every leaf linked to every spine (several
paths between leaves). Host-to-host traffic is spread over the spines: each remote host by
one fixed spine (default), or with `spray=True` every frame to a remote host by the next
spine in turn (l2 entries with `ports`, per-packet spraying; reorders TCP, so off unless
asked). Flat (default): the
first spine aggregates (it owns the INA endpoint address); leaves and the other spines only
forward. Two-level (`two_level=True`, docs/scale_out.md): each leaf aggregates its rack (its
hosts) and sends one partial per round to the spine owning the slot, the job's slots sharded
over all spines; the testbed writes the whole network as one desired state with a `fabric:`
section (`FabricTestbed.desired_state`, saved as YAML) and `controller.Controller(state)
.deploy()` programs every switch node over P4Runtime gRPC.
Nodes are named h<tag>n<i>, s<tag>n1, sp<tag>n<j>, lf<tag>n<i> (tag: process id mod 10000).
Both networks are topology documents of spina/topology.py's format (`single_topology`,
`leafspine_topology`: the sizes are the command's), which `build` turns into mininet nodes and
links; tests/test_testbed_topos.py checks what it builds without mininet.

Hosts: h<i> at 10.0.0.<i+1>/24, MAC 02:00:00:00:01:<i>; the flat INA endpoint is 10.0.0.100
with MAC 02:00:00:00:00:64; in two-level mode leaf i's INA address is 10.0.0.<201+i> (MAC
02:00:00:00:02:<i>) and spine j's 10.0.0.<241+j>. Static ARP on every host; the switches do
not answer ARP.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from spina import netns, spec
from testbed.mn import import_mininet, switch_classes

SWITCH_IP, SWITCH_MAC = "10.0.0.100", "02:00:00:00:00:64"
# Node names make the root-namespace interface names (<node>-eth<N>, at most 15 characters):
# a per-process tag keeps two testbeds (two CI runs) from taking each other's interfaces.
TAG = netns.unique_tag("", 10000)
WORKER_UDP_BASE = 50000
# the jobs' sizes: the P4 program's block and lanes (spina.spec), 8 slots
JOB_SIZES = {"nslots": 8, "block_size": spec.P4_SIZES["BLOCK_SIZE"],
             "nlanes": spec.P4_SIZES["NLANES"]}


MAX_HOSTS = 99  # hosts 10.0.0.1..99: below the flat INA endpoint 10.0.0.100


def host_ip(i: int) -> str:
    return f"10.0.0.{i + 1}"


def host_mac(i: int) -> str:
    return f"02:00:00:00:01:{i:02x}"


def leaf_ip(i: int) -> str:
    return f"10.0.0.{201 + i}"


def leaf_mac(i: int) -> str:
    return f"02:00:00:00:02:{i:02x}"


def spine_ip(j: int) -> str:
    return f"10.0.0.{241 + j}"


def drop_program(probability: float) -> str:
    """A classic BPF program for `tc filter ... bpf bytecode`: matches a frame with the given
    probability (the kernel's per-packet random number below probability * 2^32). The kernel
    here has no netem and no gact; a matched frame is redirected to a device that is down,
    which drops it."""
    threshold = round(probability * (1 << 32))
    rand = (1 << 32) - 0x1000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM
    # ld rand; jge threshold -> no match; ret match (-1: the default class); ret no match
    return f"4,32 0 0 {rand},53 1 0 {threshold},6 0 0 {(1 << 32) - 1},6 0 0 0"


@dataclass
class Testbed:
    """A built (not yet started) network: `start()`, run things on `hosts`, `stop()`."""
    net: object
    hosts: list
    aggregator: object
    switches: list
    # per host index: the aggregating switch's port that reaches it
    agg_ports: list[int] = field(default_factory=list)
    spines: list = field(default_factory=list)  # leafspine: the spine nodes
    _blackhole: str | None = None  # the down veth that random drops are redirected to
    _made: netns.Network = field(default_factory=netns.Network)  # links outside mininet

    def switch_of(self, i: int, jd: dict) -> tuple[dict, tuple[str, int]]:
        """(the job as host i's agent sees it, its switch's INA address and UDP port)."""
        return jd, (SWITCH_IP, 47000)

    def job_config(self, job: int = 1, **fields) -> dict:
        """A JobConfig dict for all hosts (P4 sizes unless overridden)."""
        d = {"job": job, **JOB_SIZES, **fields}
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
        try:
            self.net.stop()
        finally:
            self._made.close()
            self._blackhole = None

    def spine_links(self) -> list[str]:
        """The spines' interfaces (root namespace): every leaf-spine link once."""
        return [intf.name for sp in self.spines for intf in sp.intfList() if intf.name != "lo"]

    def drop_randomly(self, probability: float) -> None:
        """Drop `probability` of the frames on every link, each direction once (after
        `start`): a host's sends by iptables in its namespace (statistic match), a switch
        node's sends by a tc filter on each of its interfaces (a switch node's raw sockets
        bypass netfilter; see drop_program)."""
        for h in self.hosts:
            out = h.cmd(f"iptables -A OUTPUT -o {h.defaultIntf()} -m statistic --mode random "
                        f"--probability {probability} -j DROP && echo added")
            if "added" not in out:
                raise RuntimeError(f"{h.name}: iptables failed: {out.strip()}")
        self._blackhole = f"bh{TAG}a"
        self._made.veth(self._blackhole, f"bh{TAG}b")
        for sw in self.switches:
            for intf in sw.intfList():
                if intf.name == "lo":
                    continue
                for cmd in (["tc", "qdisc", "add", "dev", intf.name, "clsact"],
                            ["tc", "filter", "add", "dev", intf.name, "egress", "bpf",
                             "bytecode", drop_program(probability), "action", "mirred",
                             "egress", "redirect", "dev", self._blackhole]):
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode != 0:
                        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def dropped_frames(self) -> tuple[int, int]:
        """(frames the hosts' iptables rules dropped, frames the switch nodes' tc filters
        dropped) since `drop_randomly`."""
        hosts = 0
        for h in self.hosts:
            for line in h.cmd("iptables -L OUTPUT -v -n -x").splitlines():
                fields = line.split()
                if len(fields) > 2 and fields[2] == "DROP" and "statistic" in line:
                    hosts += int(fields[0])
        switches = 0
        for sw in self.switches:
            for intf in sw.intfList():
                if intf.name == "lo":
                    continue
                out = subprocess.run(["tc", "-s", "filter", "show", "dev", intf.name, "egress"],
                                     capture_output=True, text=True).stdout
                m = re.search(r"Sent \d+ bytes (\d+) pkt", out)  # the mirred action's count
                switches += int(m.group(1)) if m else 0
        return hosts, switches


def _network(switch: str):
    mininet = import_mininet()
    soft, bmv2 = switch_classes()
    cls = {"soft": soft, "bmv2": bmv2}[switch]
    net = mininet.net.Mininet(switch=cls, controller=None, autoSetMacs=False,
                              autoStaticArp=False, build=False, waitConnected=False)
    return net


# ----------------------------------------------------------------------------- networks
# The testbed's networks are topology documents (spina/topology.py: the format every namespace
# network's file is written in, bench/topologies/), made for the sizes asked and built into
# mininet by build(); the node names are mininet's.
_L2 = {"kind": "l2", "subnet": "10.0.0.0/24"}
_LINK = {"rate": "1gbit", "latency": "0us"}  # mininet's links are not shaped: for the planner


def single_topology(nhosts: int):
    """One switch s<tag>n1, hosts h<tag>n<i> on its ports 1..n at host_ip(i), host_mac(i)."""
    from spina.topology import from_dict
    hosts = [f"h{TAG}n{i}" for i in range(nhosts)]
    sw = f"s{TAG}n1"
    return from_dict({"hosts": hosts,
                      "switches": {sw: dict(_L2, aggregate=True, host_macs=host_mac(0))},
                      "links": [dict(_LINK, ends=[h, sw]) for h in hosts]}, "testbed single")


def leafspine_topology(leaves: int, spines: int, hosts_per_leaf: int):
    """Spines sp<tag>n<j+1>, leaves lf<tag>n<i+1>, hosts h<tag>n<k>: host k on leaf
    k // hosts_per_leaf at port k % hosts_per_leaf + 1 (at host_ip(k), host_mac(k): the leaves
    share the /24, each counting from its first host), spine j on leaf i's port
    hosts_per_leaf + 1 + j and leaf i on spine j's port i + 1."""
    from spina.topology import from_dict
    h = hosts_per_leaf
    hosts = [f"h{TAG}n{k}" for k in range(leaves * h)]
    sp = [f"sp{TAG}n{j + 1}" for j in range(spines)]
    lf = [f"lf{TAG}n{i + 1}" for i in range(leaves)]
    switches = {s: {"kind": "l2"} for s in sp}
    switches.update({leaf: dict(_L2, host_addresses=host_ip(i * h), host_macs=host_mac(i * h))
                     for i, leaf in enumerate(lf)})
    links = [dict(_LINK, ends=[host, lf[k // h]]) for k, host in enumerate(hosts)]
    links += [dict(_LINK, ends=[leaf, spine]) for leaf in lf for spine in sp]
    return from_dict({"hosts": hosts, "switches": switches, "links": links},
                     "testbed leafspine")


def build(net, topo) -> dict:
    """`topo` (l2 switches, each host on one of them) as mininet nodes of `net`: a host with
    its segment's address and MAC, a switch node per switch, a link per link on the file's
    ports (a host's end: its first interface). {name: node}."""
    nodes = {}
    for h in topo.hosts:
        sw, (i, _) = topo.neighbours(h)[0]
        port = topo.port_of(sw, i)
        nodes[h] = net.addHost(h, ip=f"{topo.segment_address(sw, port)}/"
                                     f"{topo.segment_prefix(sw)}",
                               mac=topo.segment_mac(sw, port))
    for s in topo.switches:
        nodes[s] = net.addSwitch(s)
    for i, ln in enumerate(topo.links):
        net.addLink(nodes[ln.a], nodes[ln.b],
                    port1=topo.port_of(ln.a, i) if ln.a in topo.segments else None,
                    port2=topo.port_of(ln.b, i) if ln.b in topo.segments else None)
    return nodes


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
    topo = single_topology(nhosts)
    nodes = build(net, topo)
    hosts, s1 = [nodes[h] for h in topo.hosts], nodes[topo.switches[0]]
    net.build()
    s1.spina_config = {"endpoints": [SWITCH_IP],
                       "l2": [{"mac": host_mac(i), "port": i + 1} for i in range(nhosts)]}
    return Testbed(net, hosts, s1, [s1], [i + 1 for i in range(nhosts)])


@_stop_on_error
def leafspine(net, leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 2,
              two_level: bool = False, spray: bool = False) -> Testbed:
    """L leaves (hosts on ports 1..H, spine j on port H+1+j), S spines (leaf i on port i+1).
    Flat: the first spine aggregates. Two-level: a FabricTestbed, each leaf aggregates its
    hosts, the spines their shares of the slots (`switch=` soft or bmv2). `spray`: a leaf
    sprays the frames to remote hosts over every spine, per packet (remote_l2_entry)."""
    n = leaves * hosts_per_leaf
    topo = leafspine_topology(leaves, spines, hosts_per_leaf)
    nodes = build(net, topo)
    hosts = [nodes[h] for h in topo.hosts]
    sp, lf = [nodes[s] for s in topo.switches[:spines]], [nodes[s] for s in topo.switches[spines:]]
    leaf_of = [i // hosts_per_leaf for i in range(n)]
    net.build()
    if two_level:
        for node in sp + lf:
            node.serve_p4runtime = True
        return FabricTestbed(net, hosts, None, sp + lf, spines=sp, leaves=lf,
                             hosts_per_leaf=hosts_per_leaf, spray=spray)
    for i, leaf in enumerate(lf):
        l2 = []
        for k in range(n):
            if leaf_of[k] == i:
                l2.append({"mac": host_mac(k), "port": k % hosts_per_leaf + 1})
            else:
                l2.append(remote_l2_entry(k, i, hosts_per_leaf, spines, spray))
        l2.append({"mac": SWITCH_MAC, "port": hosts_per_leaf + 1})  # INA to the first spine
        leaf.spina_config = {"l2": l2}
    for spine in sp:
        spine.spina_config = {"l2": [{"mac": host_mac(k), "port": leaf_of[k] + 1}
                                     for k in range(n)]}
    sp[0].spina_config["endpoints"] = [SWITCH_IP]
    return Testbed(net, hosts, sp[0], sp + lf, [leaf_of[k] + 1 for k in range(n)], spines=sp)


def remote_l2_entry(k: int, leaf: int, hosts_per_leaf: int, spines: int, spray: bool) -> dict:
    """Leaf `leaf`'s l2 entry for host k of another rack: one spine per remote host, spread
    over the spines (several paths between leaves), or with `spray` every spine in turn,
    per packet (spine j on port hosts_per_leaf + 1 + j)."""
    if spray:
        return {"mac": host_mac(k), "ports": [hosts_per_leaf + 1 + j for j in range(spines)]}
    return {"mac": host_mac(k), "port": hosts_per_leaf + 1 + (k + leaf) % spines}


@dataclass
class FabricTestbed(Testbed):
    """leafspine in two-level mode. `add_job` makes a job of every host, its racks the leaves,
    its slots sharded over the spines in contiguous ranges; `start` starts the switch nodes
    (P4Runtime servers without tables), writes `desired_state()` to `state_path` and deploys
    it with the controller, which also writes each rank's assignment into `agents_dir`."""
    leaves: list = field(default_factory=list)
    hosts_per_leaf: int = 1
    spray: bool = False  # leaves spray frames to remote hosts over the spines per packet
    jobs: list[dict] = field(default_factory=list)
    reports: list = field(default_factory=list)  # the controller's deploy reports, per switch
    workdir: pathlib.Path = field(default_factory=lambda: pathlib.Path(
        tempfile.mkdtemp(prefix=f"spina-fabric{TAG}-")))

    @property
    def state_path(self) -> pathlib.Path:
        return self.workdir / "spina.yaml"

    @property
    def agents_dir(self) -> pathlib.Path:
        return self.workdir / "agents"

    def add_job(self, jd: dict) -> None:
        """A two-level job of all hosts (before `start`; the controller writes it)."""
        self.jobs.append(dict(jd))

    def switch_of(self, i: int, jd: dict) -> tuple[dict, tuple[str, int]]:
        """Host i's assignment as the controller wrote it: the job, and its rack's leaf."""
        from spina.config import Assignment, job_to_dict
        a = Assignment.load(self.agents_dir / f"job{jd['job']}-rank{i}.json")
        return job_to_dict(a.job), a.switch

    def shards(self, jd: dict) -> list[dict]:
        """The job's slots in contiguous ranges, one per spine (the first ones one larger
        when the spines do not divide them)."""
        base, n, s = jd.get("slot_base", 0), jd["nslots"], len(self.spines)
        if n < s:
            raise ValueError(f"job {jd['job']}: {n} slots cannot be sharded over {s} spines")
        out = []
        for j, spine in enumerate(self.spines):
            k = n // s + (j < n % s)
            out.append({"spine": spine.name, "slot_base": base, "nslots": k})
            base += k
        return out

    def desired_state(self) -> dict:
        """The whole network as the controller's desired state (controller/README.md,
        docs/scale_out.md): switches with their gRPC addresses and forwarding, the hosts as
        workers on their leaves, the fabric (racks = leaves, spines, the jobs sharded over the
        spines, every leaf-spine link's ports and MACs as mininet made them)."""
        h, nleaves, nspines = self.hosts_per_leaf, len(self.leaves), len(self.spines)
        n = len(self.hosts)
        switches = []
        for i, leaf in enumerate(self.leaves):
            # local hosts: the controller adds their l2 entries (workers); remote hosts are
            # spread over the spines (or sprayed), as in flat mode
            remote = [remote_l2_entry(k, i, h, nspines, self.spray)
                      for k in range(n) if k // h != i]
            switches.append({"name": leaf.name, **leaf.p4runtime_fields(),
                             "address": leaf_ip(i), "ports": list(range(1, h + nspines + 1)),
                             "l2": remote})
        for j, spine in enumerate(self.spines):
            switches.append({"name": spine.name, **spine.p4runtime_fields(),
                             "address": spine_ip(j), "ports": list(range(1, nleaves + 1)),
                             "l2": [{"mac": host_mac(k), "port": k // h + 1} for k in range(n)]})
        workers = [{"name": f"w{k}", "ip": host_ip(k), "udp_port": WORKER_UDP_BASE + k,
                    "switch_port": k % h + 1, "mac": host_mac(k),
                    "switch": self.leaves[k // h].name} for k in range(n)]
        racks = [{"name": f"rack{i}", "leaf": leaf.name,
                  "workers": [f"w{k}" for k in range(i * h, (i + 1) * h)]}
                 for i, leaf in enumerate(self.leaves)]
        jobs = []
        for jd in self.jobs:
            if [w["port"] for w in jd["workers"]] != [WORKER_UDP_BASE + k for k in range(n)]:
                raise ValueError(f"job {jd['job']}: two-level jobs have every host as a worker "
                                 "(job_config())")
            jobs.append({"id": jd["job"], "racks": [r["name"] for r in racks],
                         "slot_base": jd.get("slot_base", 0), "nslots": jd["nslots"],
                         "block_size": jd["block_size"], "nlanes": jd["nlanes"],
                         "epoch": jd.get("epoch", 1), "shards": self.shards(jd)})
        links = [{"leaf": leaf.name, "leaf_port": h + 1 + j,
                  "leaf_mac": leaf.intfs[h + 1 + j].MAC(), "spine": spine.name,
                  "spine_port": i + 1, "spine_mac": spine.intfs[i + 1].MAC()}
                 for i, leaf in enumerate(self.leaves) for j, spine in enumerate(self.spines)]
        return {"switches": switches, "workers": workers, "agents_dir": "agents",
                "fabric": {"racks": racks, "spines": [s.name for s in self.spines],
                           "jobs": jobs, "links": links}}

    def start(self) -> None:
        import yaml

        from controller.controller import Controller
        from controller.state import load
        super().start()
        for k, host in enumerate(self.hosts):
            i = k // self.hosts_per_leaf
            host.cmd(f"ip neigh replace {leaf_ip(i)} lladdr {leaf_mac(i)} "
                     f"dev {host.defaultIntf()} nud permanent")
        self.state_path.write_text(yaml.safe_dump(self.desired_state(), sort_keys=False))
        with Controller(load(self.state_path), timeout=20.0) as ctl:
            self.reports = ctl.deploy()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def link_bytes(intfs: list[str]) -> int:
    """Bytes sent plus received so far on these root-namespace interfaces (their kernel
    counters: each frame on a link counts once, at the end it leaves or enters by)."""
    total = 0
    for name in intfs:
        for d in ("tx_bytes", "rx_bytes"):
            total += int(pathlib.Path(f"/sys/class/net/{name}/statistics/{d}").read_text())
    return total
