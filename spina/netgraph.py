"""A topology file (spina/topology.py) in network namespaces: `Graph`, the one builder of every
namespace network: the benchmarks', the tests', the BMv2 target's ports (bench/topologies/
holds the files). In spina/ so that every layer that builds a network may import it.

A namespace per host and per switch, a veth per link with tbf at both ends (full-duplex: each
direction limited, as a real port), addresses per link, and the topology's own routes in every
namespace (Topology.next_hop: the packets take exactly the paths the planner prices). The
aggregating switch's namespace holds SpINA's software switch (on its first link's address) and
forwards IPv4 for gloo's TCP, so both methods cross the same links. Both veth ends are created
directly inside their namespaces, so nothing is added to the root namespace; deleting the
namespaces removes the links and qdiscs with them. A link's `latency` is priced by the planner
but not emulated here (this kernel has no netem); loss is (`Graph.set_loss`: iptables).

An `l2` or `bridge` switch (the format's segments) gets no addresses and no routes: its ports
(`port_if`) are left for a switch process to open with raw sockets (an `l2` one: SpINA's software
switch in L2 mode, BMv2), or enslaved to a Linux bridge; in the root namespace when the file says
`root: true`. The nodes on its ports take the segment's addresses and MACs and know each other's
and the switch's as static neighbours (no ARP crosses our switches); offloads are off on an l2
switch's links (the switch must see MTU-sized frames with their checksums).

Run as root. `Graph` is a context manager: everything it made is removed on exit, also when the
body raises (spina.netns.Network; every primitive it uses is spina/netns.py's).
"""
from __future__ import annotations

from spina import netns
from spina.topology import Topology, parse_rate


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


def link_ifnames(topo: Topology, tag: str = "", prefix: str = "eth",
                 in_root: frozenset = frozenset()) -> dict[tuple[int, str], str]:
    """{(link index, node): interface}: eth<k> (`prefix`<k>) for a node's k-th link in file
    order; a segment switch's port p: p<p>, or <tag>s<j>p<p> in the root namespace (j: the
    switch's index in the file; names there must be unique on the machine); a host in the
    root namespace (`in_root`): <tag><host>e<k>."""
    out: dict[tuple[int, str], str] = {}
    count: dict[str, int] = {}
    for i, ln in enumerate(topo.links):
        for end in (ln.a, ln.b):
            k = count.get(end, 0)
            seg = topo.segments.get(end)
            if end in in_root:
                out[i, end] = f"{tag}{end}e{k}"
            elif seg is None:
                out[i, end] = f"{prefix}{k}"
            else:
                out[i, end] = f"{tag}s{topo.switches.index(end)}p{k + 1}" if seg.root \
                    else f"p{k + 1}"
            count[end] = k + 1
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
    `at` ({host: namespace name or process id; None: the root namespace, its interfaces
    <tag><host>e<k>}) builds the file's links onto namespaces that exist already (a mininet
    host's, another Graph's), with interfaces `if_prefix`<k> so they do not clash with those
    there; a link needs an end that this Graph made or in the root
    namespace (close() removes the links through those). Each link is limited by tbf at its
    rate in both directions, with the link's `burst` as
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

    def __init__(self, topo: Topology, tag: str, queue_ms: float = 2.0,
                 at: dict | None = None, if_prefix: str = "eth"):
        if max(topo.devices) != 1:
            raise ValueError("devices: namespaces stand for hosts of one device each")
        if len(topo.links) > 250:
            raise ValueError(f"links: at most 250 in namespaces, got {len(topo.links)}")
        self.at = dict(at or {})
        if not set(self.at) <= set(topo.hosts):
            raise ValueError(f"at: {sorted(set(self.at) - set(topo.hosts))} not hosts of "
                             f"{topo.source}")
        self._ifs = link_ifnames(topo, tag, if_prefix,
                                 frozenset(h for h, ns in self.at.items() if ns is None))
        too_long = [n for n in self._ifs.values() if len(n) > 15]
        if too_long:
            raise ValueError(f"tag: {tag!r} makes interface names of more than 15 characters "
                             f"({too_long[0]})")
        for i, ln in enumerate(topo.links):
            need = tbf_params(ln.rate_text, topo.mtu)["burst"]
            if ln.burst < need:
                raise ValueError(f"{topo.source}: field 'links[{i}].burst': tbf needs at least "
                                 f"{need} bytes here (give it, so the planner knows), got "
                                 f"{ln.burst}")
        super().__init__()
        self.topo, self.tag, self.queue_ms = topo, tag, queue_ms
        self._first = {}
        for i, ln in enumerate(topo.links):
            for end in (ln.a, ln.b):
                self._first.setdefault(end, i)
        self.rate: str | None = None  # set_rate's: every link at one rate

    def ns(self, node: str) -> str | int | None:
        """The namespace of `node` (None: the root one, a segment switch with `root: true`; a
        host given in `at`: the namespace it names there)."""
        if node in self.at:
            return self.at[node]
        seg = self.topo.segments.get(node)
        return None if seg is not None and seg.root else f"{self.tag}-{node}"

    def _segment_end(self, i: int, node: str) -> tuple[str, int] | None:
        """(segment switch, port) when link i joins `node` to a segment switch's port."""
        ln = self.topo.links[i]
        other = ln.b if ln.a == node else ln.a
        if other in self.topo.segments and node not in self.topo.segments:
            return other, self.topo.port_of(other, i)
        return None

    def _addr(self, i: int, node: str) -> str | None:
        """`node`'s address on link i: a segment's port address, none on a segment switch's
        own ports, else 10.201.<i>.1 at the link's first end and .2 at the other."""
        if node in self.topo.segments:
            return None
        on = self._segment_end(i, node)
        if on is not None:
            return self.topo.segment_address(*on)
        return f"10.201.{i}.{1 if self.topo.links[i].a == node else 2}"

    def _prefix(self, i: int, node: str) -> int:
        on = self._segment_end(i, node)
        return 24 if on is None else self.topo.segment_prefix(on[0])

    def _gateway_of(self, i: int, node: str) -> str | None:
        """The gateway's address for `node` when link i puts it on a gateway leaf's port."""
        on = self._segment_end(i, node)
        if on is None or self.topo.segments[on[0]].gateway in (None, node):
            return None
        return str(self.topo.port_net(*on).network_address + 1)

    def node_ip(self, node: str) -> str | None:
        """The address of a host or switch: the one on its first link (a segment switch's:
        its own `address`)."""
        if node in self.topo.segments:
            return self.topo.segments[node].address
        return self._addr(self._first[node], node)

    def mac(self, i: int, node: str) -> str | None:
        """The MAC of `node`'s end of link i, if the file gives it (a segment's port)."""
        on = self._segment_end(i, node)
        return None if on is None else self.topo.segment_mac(*on)

    def ports(self, switch: str) -> dict[int, str]:
        """A segment switch's {port: interface} (BMv2's `-i N@intf`, an L2Switch's)."""
        return {p: self.ifname(i, switch) for p, (i, _) in self.topo.ports(switch).items()}

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

    def set_rate(self, rate: str, links=None) -> None:
        """Every link (or those of index in `links`) at `rate` instead of the file's (tbf's
        bucket: the link's burst, or tbf_params' if that is larger at this rate)."""
        for i, ln in enumerate(self.topo.links):
            if links is not None and i not in links:
                continue
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

    def each_rate(self, rates):
        """Every link at each of `rates` in turn (none given: the file's own, once); yields
        the links' rate (file_rate) for each."""
        for rate in rates or [None]:
            if rate is not None:
                self.set_rate(rate)
            yield self.file_rate()

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
        routed = [n for n in t.hosts + t.switches if n not in t.segments]  # IP nodes
        with self.building():
            for node in routed:
                if node in self.at:
                    continue  # a namespace someone else made and set
                # no redirects: a gateway sends its leaf's traffic back out of the port it
                # came in by, and its nodes must keep going through it
                netns.sysctl(self.namespace(self.ns(node)), "net.ipv4.ip_forward=1",
                             "net.ipv4.conf.all.rp_filter=0",
                             "net.ipv4.conf.default.rp_filter=0",
                             "net.ipv4.conf.all.send_redirects=0",
                             "net.ipv4.conf.default.send_redirects=0",
                             "net.ipv4.tcp_congestion_control=reno")
            for s, seg in t.segments.items():
                if not seg.root:
                    self.namespace(self.ns(s))
                if seg.kind == "bridge":
                    self.bridge(self._bridge(s), self.ns(s), mtu=t.mtu)
                    if seg.mac is not None:
                        netns.set_link(self._bridge(s), self.ns(s), address=seg.mac, up=False)
                    if seg.address is not None:
                        netns.add_addr(self._bridge(s),
                                       f"{seg.address}/{seg.subnet.prefixlen}", self.ns(s))
                    netns.set_link(self._bridge(s), self.ns(s))
            for i, ln in enumerate(t.links):
                self.veth(self.ifname(i, ln.a), self.ifname(i, ln.b), a_ns=self.ns(ln.a),
                          b_ns=self.ns(ln.b))
                for end in (ln.a, ln.b):
                    self._end(i, ln, end)
            for s, seg in t.segments.items():
                self._neighbours(s, seg)
            for node in routed:
                for h in t.hosts + t.aggregating:
                    if h != node and h not in t.segments:
                        self._add_route(node, h)
        return self

    def _bridge(self, switch: str) -> str:
        seg = self.topo.segments[switch]
        return f"{self.tag}br{self.topo.switches.index(switch)}" if seg.root else "br0"

    def _end(self, i: int, ln, end: str) -> None:
        """Link i's interface at `end`: MTU, MAC and address, bridge or offloads, tbf."""
        t, ns, ifc = self.topo, self.ns(end), self.ifname(i, end)
        seg = t.segments.get(end)
        on = self._segment_end(i, end)
        l2 = t.segments[on[0]] if on else seg
        if ns is None:
            netns.no_ipv6(ifc)  # no router solicitations on a root-namespace port
        netns.set_link(ifc, ns, mtu=t.mtu, address=self.mac(i, end),
                       master=self._bridge(end) if seg is not None and seg.kind == "bridge"
                       else None)
        on = self._segment_end(i, end)
        if on is not None and t.segments[on[0]].gateway == end:
            addrs = t.gateway_addresses(on[0])  # one per port of the leaf: all on this one
        else:
            addrs = [a for a in (self._addr(i, end),) if a is not None]
        for addr in addrs:
            netns.add_addr(ifc, f"{addr}/{self._prefix(i, end)}", ns)
        if l2 is not None and l2.kind == "l2":
            # a raw-socket switch must see MTU-sized frames with their checksums
            netns.offload_off(ifc, ns, ("tx", "tso", "gso", "gro"))
        netns.tbf(ifc, ln.rate_text, ln.burst, self.queue_ms, ns)

    def _neighbours(self, switch: str, seg) -> None:
        """Static neighbours on a segment: every node on a port knows the addresses and MACs
        of the others and of the switch itself (no ARP crosses an L2 switch); on a gateway's
        leaf, a node knows the gateway at its .1 (and its default route goes there), the
        gateway every node."""
        t = self.topo
        known = [(t.segment_address(switch, p), t.segment_mac(switch, p), p, node)
                 for p, (_, node) in t.ports(switch).items()
                 if node not in t.segments]  # another L2 switch on a port has no address
        if seg.address is not None:
            known.append((seg.address, seg.mac, None, None))
        gw = {node: mac for _, mac, _, node in known if node == seg.gateway}
        for p, (i, node) in t.ports(switch).items():
            if node in t.segments:
                continue
            ifc, ns = self.ifname(i, node), self.ns(node)
            if seg.gateway is not None and node != seg.gateway:
                via = self._gateway_of(i, node)
                if gw[seg.gateway] is not None:
                    netns.static_arp(ifc, via, gw[seg.gateway], ns, replace=True)
                netns.add_route("default", ns, via=via, dev=ifc, replace=True)
                continue
            for addr, mac, q, _ in known:
                if addr is not None and mac is not None and q != p:
                    netns.static_arp(ifc, addr, mac, ns, replace=True)

    def _add_route(self, node: str, host: str) -> None:
        """A /32 route at `node` to `host` along the topology's route, via the first IP node
        on the way (segment switches are crossed, not routed by)."""
        nb, (i, _) = self.topo.next_hop(node, host)
        if self._gateway_of(i, node) is not None:
            return  # on a gateway's leaf: its default route goes there
        via, j = nb, i
        while via in self.topo.segments:
            via, (j, _) = self.topo.next_hop(via, host)
        gateway = self._addr(j, via)
        if gateway is None or (via == host and gateway == self.host_ip(host)):
            return  # on the segment: its connected route reaches it
        netns.add_route(f"{self.host_ip(host)}/32", self.ns(node), via=gateway,
                        dev=self.ifname(i, node), replace=True,
                        src=self.host_ip(node) if node in self.topo.hosts else None)
