"""A topology file (collectives/topology.py) in network namespaces: `Graph`, the one builder of
the benchmarks' routed networks (every WHAT of the harness given -t).

A namespace per host and per switch, a veth per link with tbf at both ends (full-duplex: each
direction limited, as a real port), addresses per link, and the topology's own routes in every
namespace (Topology.next_hop: the packets take exactly the paths the planner prices). The
aggregating switch's namespace holds SpINA's software switch (on its first link's address) and
forwards IPv4 for gloo's TCP, so both methods cross the same links. Both veth ends are created
directly inside their namespaces, so nothing is added to the root namespace; deleting the
namespaces removes the links and qdiscs with them. A link's `latency` is priced by the planner
but not emulated here (this kernel has no netem); loss is (`Graph.set_loss`: iptables).

Run as root. `Graph` is a context manager: everything it made is removed on exit, also when the
body raises (spina.netns.Network; every primitive it uses is spina/netns.py's).
"""
from __future__ import annotations

from collectives.topology import Topology, parse_rate  # the one parser of tc's rate units
from spina import netns

WORKER_IF = "eth0"  # a host's first link (Graph.ifname): where dev_bytes counts


def tbf_params(rate: str, mtu: int) -> dict:
    """tbf's burst and queue for a link of `rate`.

    burst: one millisecond at line rate, and never less than 128 KiB: tbf drops (or, for GSO
    packets, segments) anything larger than its bucket, and veth hands TCP segments of up to
    64 KiB to the qdisc. A 1 ms burst lets the link run at most 1 ms ahead of its rate,
    negligible against transfers of 0.1-0.5 s.
    latency (queue): 20 ms at line rate, 2.5 MB at 1 Gbit/s: more than SpINA's window
    (16 slots x 57 KB per worker, 0.9 MB) so the switch side never drops a result burst, and
    the port buffer of a real shallow-buffered switch is of that order.
    """
    bps = parse_rate(rate)
    burst = max(int(bps / 8 * 1e-3), 128 << 10, 2 * mtu)
    return dict(rate=rate, burst=burst, latency_ms=20)


def dev_bytes(iface: str = WORKER_IF, pid: int | None = None) -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of `iface` in the calling thread's namespace, or in the one process
    `pid` lives in (link-layer bytes: Ethernet + IP + UDP/TCP headers included, as
    /sys/class/net/*/statistics count them)."""
    with open(f"/proc/{pid}/net/dev" if pid else "/proc/thread-self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                v = rest.split()
                return int(v[8]), int(v[0])
    raise OSError(f"no interface {iface} in this namespace")


def kernel_losses(pid: int) -> dict:
    """Loss counters of the namespace process `pid` lives in (/proc/<pid>/net/snmp):
    udp_drops = UDP datagrams dropped on receive (InErrors: full buffer, bad checksum) +
    IP reassemblies that failed (a fragment lost); tcp_retrans = TCP segments resent."""
    with open(f"/proc/{pid}/net/snmp") as f:
        lines = [ln.split() for ln in f]
    v = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        v.update({f"{head[0]}{k}": int(x) for k, x in zip(head[1:], vals[1:])})
    return dict(udp_drops=v.get("Udp:InErrors", 0) + v.get("Ip:ReasmFails", 0),
                tcp_retrans=v.get("Tcp:RetransSegs", 0))


def kernel_losses_total(pids) -> dict:
    """kernel_losses summed over processes, one in each namespace of interest."""
    out = dict(udp_drops=0, tcp_retrans=0)
    for pid in pids:
        for k, v in kernel_losses(pid).items():
            out[k] += v
    return out


def link_ifnames(topo: Topology) -> dict[tuple[int, str], str]:
    """{(link index, node): interface}: eth<k> for a node's k-th link in file order."""
    out: dict[tuple[int, str], str] = {}
    count: dict[str, int] = {}
    for i, ln in enumerate(topo.links):
        for end in (ln.a, ln.b):
            out[i, end] = f"eth{count.get(end, 0)}"
            count[end] = count.get(end, 0) + 1
    return out


class Graph(netns.Network):
    """A namespace per host and switch of `topo`, a veth per link, tbf on both ends.

    Link i joins interface eth<k> in each end's namespace, k counting that node's links in
    file order (`ifname`: a host's first link is its eth0, as on a real host):
    10.201.<i>.1/24 at its first end, .2 at the other (at most 250 links). A host's address
    (`host_ip`) is the one on its first link, and gloo binds that interface (`host_if`,
    eth0); an aggregating switch's address
    (`node_ip`, where the software switch listens) likewise. Every node gets a /32 route to
    every host and aggregating switch along the topology's route (Topology.next_hop, so the
    packets take exactly the paths the planner prices); a host's routes carry its own
    address as source, so replies need no other routes. Every namespace forwards IPv4
    (hosts forward in a torus); reverse-path filtering is off (routes may be asymmetric).
    Each link is limited by tbf at its rate in both directions, with the link's `burst` as
    tbf's bucket, so that the planner prices the bucket the links have; it must be at least
    tbf_params' burst.

    The queue is `queue_ms` at line rate, 2 ms by default, not tbf_params' 20 ms: in an
    exchange both directions of a link carry data, so each flow's ACKs wait behind the
    other's queue; with 20 ms the windows grew so slowly that halving-doubling and direct
    all-reduces of 8 MiB took 16% and 50-80% longer than the model's link time, with 2 ms 0%
    and 8% (4 hosts, 200 Mbit/s, BBR). TCP runs Reno here: with this kernel's default, BBR,
    three flows into one host's port (a direct all-reduce on a 4-host star) took twice
    Reno's time behind the shallow queue (1096 against 552 ms); only Reno and BBR may be
    chosen in a namespace. docs/collectives.md has the measurements.
    """

    def __init__(self, topo: Topology, tag: str, queue_ms: float = 2.0):
        if max(topo.devices) != 1:
            raise ValueError("devices: namespaces stand for hosts of one device each")
        if len(topo.links) > 250:
            raise ValueError(f"links: at most 250 in namespaces, got {len(topo.links)}")
        for i, ln in enumerate(topo.links):
            need = tbf_params(ln.rate_text, topo.mtu)["burst"]
            if ln.burst < need:
                raise ValueError(f"{topo.source}: field 'links[{i}].burst': tbf needs at least "
                                 f"{need} bytes here (give it, so the planner knows), got "
                                 f"{ln.burst}")
        super().__init__()
        self.topo, self.tag, self.queue_ms = topo, tag, queue_ms
        self._first, self._ifs = {}, link_ifnames(topo)
        for i, ln in enumerate(topo.links):
            for end in (ln.a, ln.b):
                self._first.setdefault(end, i)
        self.rate: str | None = None  # set_rate's: every link at one rate

    def ns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def _addr(self, i: int, node: str) -> str:
        return f"10.201.{i}.{1 if self.topo.links[i].a == node else 2}"

    def node_ip(self, node: str) -> str:
        """The address of a host or switch: the one on its first link."""
        return self._addr(self._first[node], node)

    host_ip = node_ip

    def ifname(self, i: int, node: str) -> str:
        """The interface of link i in `node`'s namespace."""
        return self._ifs[i, node]

    def host_if(self, host: str) -> str:
        return self.ifname(self._first[host], host)

    def endpoints(self):
        """(namespace, interface) of both ends of every link: the tbf'd egress points."""
        for i, ln in enumerate(self.topo.links):
            for end in (ln.a, ln.b):
                yield self.ns(end), self.ifname(i, end)

    def set_rate(self, rate: str) -> None:
        """Every link at `rate` instead of the file's (tbf's bucket: the link's burst, or
        tbf_params' if that is larger at this rate)."""
        for i, ln in enumerate(self.topo.links):
            burst = max(ln.burst, tbf_params(rate, self.topo.mtu)["burst"])
            for end in (ln.a, ln.b):
                netns.tbf(self.ifname(i, end), rate, burst, self.queue_ms, self.ns(end))
        self.rate = rate

    def set_loss(self, p: float) -> None:
        """Drop UDP datagrams at random with probability `p` each way at every host
        (iptables in the host's namespace: this kernel has no netem)."""
        for h in self.topo.hosts:
            netns.random_drop(self.ns(h), p, flush=True)

    def dropped(self) -> int:
        """Datagrams set_loss's rules discarded since they were set, all hosts, both ways."""
        return sum(netns.random_drops(self.ns(h)) for h in self.topo.hosts)

    def file_rate(self) -> str:
        """The links' rate: set_rate's, else the file's if it has one, else 'file'."""
        rates = {ln.rate_text for ln in self.topo.links}
        return self.rate or (rates.pop() if len(rates) == 1 else "file")

    def tbf_drops(self) -> int:
        """Packets dropped so far by every link's tbf."""
        return sum(netns.qdisc_drops(ifc, ns) for ns, ifc in self.endpoints())

    def __enter__(self) -> "Graph":
        return self.create()  # which removes all it made if it fails

    def create(self) -> "Graph":
        t = self.topo
        with self.building():
            for node in t.hosts + t.switches:
                netns.sysctl(self.namespace(self.ns(node)), "net.ipv4.ip_forward=1",
                             "net.ipv4.conf.all.rp_filter=0",
                             "net.ipv4.conf.default.rp_filter=0",
                             "net.ipv4.tcp_congestion_control=reno")
            for i, ln in enumerate(t.links):
                self.veth(self.ifname(i, ln.a), self.ifname(i, ln.b), a_ns=self.ns(ln.a),
                          b_ns=self.ns(ln.b))
                for end in (ln.a, ln.b):
                    ns, ifc = self.ns(end), self.ifname(i, end)
                    netns.set_link(ifc, ns, mtu=t.mtu)
                    netns.add_addr(ifc, f"{self._addr(i, end)}/24", ns)
                    netns.tbf(ifc, ln.rate_text, ln.burst, self.queue_ms, ns)
            for node in t.hosts + t.switches:
                for h in t.hosts + t.aggregating:
                    if h != node:
                        self._add_route(node, h)
        return self

    def _add_route(self, node: str, host: str) -> None:
        nb, (i, _) = self.topo.next_hop(node, host)
        netns.add_route(f"{self.host_ip(host)}/32", self.ns(node), via=self._addr(i, nb),
                        dev=self.ifname(i, node), replace=True,
                        src=self.host_ip(node) if node in self.topo.hosts else None)


# ----------------------------------------------------------------------------- stars
def star_of(topo: Topology) -> tuple[str, list[str]] | str:
    """(the aggregating switch, the hosts) of a star topology, or why it is not one."""
    if len(topo.aggregating) != 1 or max(topo.devices) != 1:
        return "needs one aggregating switch and hosts of one device"
    sw = topo.aggregating[0]
    if sorted(tuple(sorted((ln.a, ln.b))) for ln in topo.links) != sorted(
            tuple(sorted((h, sw))) for h in topo.hosts):
        return f"needs one link from every host to {sw} and no other"
    return sw, list(topo.hosts)


def check_star(a) -> str | None:
    """A harness option error if -t is not a star of -g hosts or namespaces cannot be built."""
    star = star_of(a.topo)
    if isinstance(star, str):
        return f"argument -t/--topology: {a.topology}: {star}"
    if a.workers != [len(star[1])]:
        return (f"argument -g/--workers: {a.topology} has {len(star[1])} hosts (give -g "
                f"{len(star[1])} or another file)")
    why = netns.why_no_namespaces()
    return f"argument -t/--topology: {why}" if why else None
