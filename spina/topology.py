"""Topology descriptions for the planner: hosts, their local devices, switches, links, groups.

A YAML (or JSON) file, e.g. two groups of two hosts joined by a slower link:

    hosts: [h0, h1, h2, h3]          # or a mapping: {h0: {devices: 4, local: {...}}, ...}
    switches: {s0: {}, s1: {}, s2: {aggregate: true}}
    links:                           # full duplex, the rate each way
      - {ends: [h0, s0], rate: 1gbit, latency: 20us}
      - {ends: [h1, s0], rate: 1gbit, latency: 20us}
      - {ends: [h2, s1], rate: 1gbit, latency: 20us}
      - {ends: [h3, s1], rate: 1gbit, latency: 20us}
      - {ends: [s0, s1], rate: 100mbit, latency: 100us}
    groups: [[h0, h1], [h2, h3]]     # for the 2d algorithms (default: one group per host
                                     # when hosts have several devices, else none)
    mtu: 9000                        # of every link (default 1500)

Ranks are the hosts' devices in file order (host h0's devices first). A host with `devices:
d` > 1 is a node of its own (its NIC, where its links attach) with d device nodes, each
linked to every other and to the NIC by `local` links (`{rate, latency}`, default 100gbit and
1us): several accelerators per host on fast links. Rates use tc's units (kbit, mbit, gbit,
tbit: bits per second), latencies ns, us, ms or s (one way). `burst` (optional, bytes:
64KiB, 1MB, ...) is a token bucket: an idle link sends that much at once, then its rate, as
tc's tbf does (the namespace links of spina/netgraph.py; real links have none: default 0).

A switch is a router by default (`kind: router`: spina/netgraph.py gives it a namespace that
forwards IPv4 along the routes below). `kind: l2` is a switch process on raw sockets (SpINA's
software switch in L2 mode, BMv2) and `kind: bridge` a Linux bridge: their links end in ports
numbered 1, 2, ... in file order (BMv2's `-i N@intf`), unaddressed, and the nodes on their ports
share one Ethernet segment:

    switches:
      s0: {kind: l2, aggregate: true, subnet: 10.0.0.0/24, address: 10.0.0.100,
           mac: "02:00:00:00:00:64", host_macs: "02:00:00:00:01:00", root: true}

`subnet` (optional): the node on port p has the subnet's address p (10.0.0.1 on port 1), or
counting up from `host_addresses` (optional: port 1's node's address; several switches share a
subnet so, as the leaves of one L2 fabric: leaf 1's hosts from 10.0.0.1, leaf 2's from 10.0.0.3);
`address` (optional): the switch's own, where its nodes reach it (an L2 SpINA switch's
aggregator; a bridge's address in the namespace that holds it) with its `mac` (an l2 switch's
is required; a bridge has its own); `host_macs`
(optional): the MAC of port 1's node, port p's counting up from it. There is no ARP across
these switches: the builder writes the segment's addresses and MACs as static neighbours.
`root: true`: its ports are interfaces of the root namespace (where a test's switch, a
benchmark's or simple_switch_grpc opens them), not of a namespace of its own. `gateway: NODE`
(a router on one of its ports; no `address` then): a leaf whose nodes reach everything, each
other too, through that router, as a rack behind its core: port p's node has the p-th /24 of
`subnet` to itself, at .2, with the gateway at .1 (every such address on the gateway's one
port) as its default route, so all its traffic crosses the gateway's link.

Routes are fixed shortest paths: fewest hops, then the lowest latency, then node names in
order; per destination one tree, so a node forwards everything for a destination the same way
(spina/netgraph.py installs exactly these routes in its namespaces). Every error names the
file and the field, on one line.
"""
from __future__ import annotations

import heapq
import ipaddress
import json
import re
from dataclasses import dataclass, field

import yaml

_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10 ** 3,
               "MB": 10 ** 6, "GB": 10 ** 9}
DEFAULT_LOCAL = {"rate": "100gbit", "latency": "1us"}
DEFAULT_MTU = 1500
# Header bytes a link carries besides the payload (the host planner's and SpINA's pricing)
TCP_HEADERS = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps: per segment
UDP_HEADERS = 14 + 20       # per IPv4 fragment of a datagram (plus 8 for UDP, once)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
SWITCH_KINDS = ("router", "l2", "bridge")  # see the module docstring
_SEGMENT_FIELDS = ("subnet", "address", "mac", "host_macs", "host_addresses", "root", "gateway")


class TopologyError(ValueError):
    """A bad topology description; the message names the field."""


def parse_rate(rate: str) -> float:
    """'1gbit', '10gbit', '500mbit' (tc's units) -> bits per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)bit\s*", str(rate).lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{rate!r} is not a rate: expected a positive number with kbit, mbit, "
                         "gbit or tbit (tc's units)")
    return float(m.group(1)) * _RATE_UNITS[m.group(2)]


def parse_time(text) -> float:
    """'20us', '1.5ms', '0s' -> seconds (>= 0)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s)\s*", str(text).lower())
    if not m:
        raise ValueError(f"{text!r} is not a latency: expected a number with ns, us, ms or s")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


def parse_size(text) -> int:
    """'64KiB', '4MiB', '1MB', '1000' -> bytes (> 0)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]i?B|B)?\s*", str(text))
    if not m or float(m.group(1)) <= 0 or float(m.group(1)) * _SIZE_UNITS[m.group(2) or ""] < 1:
        raise ValueError(f"{text!r} is not a size: expected a number of bytes, optionally "
                         "with B, KiB, MiB, GiB, KB, MB or GB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or ""])


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    rate: float      # bits per second, each way
    latency: float   # seconds, one way
    rate_text: str   # as written (tc takes it as is)
    burst: int = 0   # bytes the link may send at once above its rate when idle (token bucket)


@dataclass(frozen=True)
class Segment:
    """An `l2` or `bridge` switch's segment (the module docstring): its subnet, its own
    address and MAC, the MAC of port 1's node (an int, port p's: + p - 1), where its ports are."""
    kind: str
    subnet: ipaddress.IPv4Network | None
    address: str | None
    mac: str | None
    host_macs: int | None
    root: bool
    gateway: str | None = None
    first: int = 1  # port 1's node's address, as an offset into the subnet (host_addresses)


@dataclass(frozen=True)
class Topology:
    """A validated description: see the module docstring. `ranks[r]` is rank r's node;
    `links` are undirected; a directed link is (link index, 0 for a->b or 1 for b->a)."""
    hosts: tuple[str, ...]
    devices: tuple[int, ...]
    switches: tuple[str, ...]
    aggregating: tuple[str, ...]
    links: tuple[Link, ...]
    groups: tuple[tuple[int, ...], ...] | None
    mtu: int
    ranks: tuple[str, ...]
    source: str = "topology"
    segments: dict = field(default_factory=dict)  # switch -> Segment: its l2 and bridge ones
    _next: dict = field(default=None, compare=False, repr=False)  # set by _route
    _adj: dict = field(default=None, compare=False, repr=False)

    @property
    def world(self) -> int:
        return len(self.ranks)

    def neighbours(self, node: str):
        """(neighbour, directed link) of every link at `node`."""
        return self._adj[node]

    def path(self, src: str, dst: str) -> list[tuple[int, int]]:
        """The directed links from node `src` to node `dst` (the fixed route)."""
        out, node = [], src
        while node != dst:
            nxt, hop = self._next[dst][node]
            out.append(hop)
            node = nxt
        return out

    def next_hop(self, node: str, dst: str) -> tuple[str, tuple[int, int]]:
        """(neighbour, directed link) that `node` forwards to for destination `dst`."""
        return self._next[dst][node]

    def ports(self, switch: str) -> dict[int, tuple[int, str]]:
        """{port: (link index, the node on it)} of an l2 or bridge switch: its links in file
        order, from port 1."""
        links = [(i, ln.b if ln.a == switch else ln.a) for i, ln in enumerate(self.links)
                 if switch in (ln.a, ln.b)]
        return {p: il for p, il in enumerate(links, 1)}

    def port_of(self, switch: str, link: int) -> int:
        """The port of `switch` that link `link` ends in."""
        return next(p for p, (i, _) in self.ports(switch).items() if i == link)

    def segment_address(self, switch: str, port: int) -> str | None:
        """The address of the node on `port` of a segment switch (None: no subnet; a
        gateway's: the .1 of port 1's /24, or port 2's if the gateway is on port 1)."""
        seg = self.segments[switch]
        if seg.subnet is None:
            return None
        if seg.gateway is None:
            return str(seg.subnet.network_address + seg.first + port - 1)
        if self.ports(switch)[port][1] == seg.gateway:
            return self.gateway_addresses(switch)[0]
        return str(self.port_net(switch, port).network_address + 2)

    def segment_prefix(self, switch: str) -> int:
        """The prefix length of the addresses on a segment's ports (a gateway's leaf: 24)."""
        seg = self.segments[switch]
        return 24 if seg.gateway is not None else seg.subnet.prefixlen

    def port_net(self, switch: str, port: int) -> ipaddress.IPv4Network:
        """A gateway leaf's /24 of `port`: the p-th of its subnet."""
        net = self.segments[switch].subnet
        return ipaddress.IPv4Network((int(net.network_address) + (port << 8), 24))

    def gateway_addresses(self, switch: str) -> list[str]:
        """A gateway leaf's router addresses, .1 of every other port's /24, in port order."""
        gw = self.segments[switch].gateway
        return [str(self.port_net(switch, p).network_address + 1)
                for p, (_, node) in self.ports(switch).items() if node != gw]

    def segment_mac(self, switch: str, port: int) -> str | None:
        """The MAC of the node on `port` of a segment switch (None: the file gives none)."""
        base = self.segments[switch].host_macs
        return None if base is None else _mac_text(base + port - 1)

    def link_end(self, hop: tuple[int, int]) -> tuple[str, str]:
        """(sender, receiver) of a directed link."""
        ln = self.links[hop[0]]
        return (ln.a, ln.b) if hop[1] == 0 else (ln.b, ln.a)


def _fail(src: str, where: str, msg: str):
    raise TopologyError(f"{src}: field '{where}': {msg}")


def _mapping(v, src, where, known):
    if v is None:
        return {}
    if not isinstance(v, dict):
        _fail(src, where, f"must be a mapping, got {v!r}")
    for k in v:
        if k not in known:
            _fail(src, f"{where}.{k}" if where else k,
                  f"unknown field (known: {', '.join(sorted(known))})")
    return v


def _named(v, src, where, what) -> dict:
    """A list of names or a mapping name -> fields, as {name: fields}."""
    if isinstance(v, list) and all(isinstance(n, str) for n in v):
        for i, n in enumerate(v):
            if n in v[:i]:  # a dict would keep one: a plan for fewer ranks, silently
                _fail(src, f"{where}[{i}]", f"{n!r} is also {where}[{v.index(n)}]")
        v = {n: {} for n in v}
    if not isinstance(v, dict):
        _fail(src, where, f"must be a list of {what} names or a mapping of them, got {v!r}")
    for name in v:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            _fail(src, where, f"{name!r} is not a name (letters, digits, _ . -; at most 32)")
    return v


def _mac_text(v: int) -> str:
    return ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))


def _segment(spec: dict, kind: str, on_ports: list[str], src: str, where: str) -> Segment:
    """An l2 or bridge switch's segment fields, checked against the nodes on its ports."""
    nports = len(on_ports)
    net = addr = mac = base = None
    first = 1
    if "host_addresses" in spec:
        if "subnet" not in spec or "gateway" in spec:
            _fail(src, f"{where}.host_addresses", "needs the switch's subnet and no gateway")
        first_addr = _convert(lambda v: ipaddress.IPv4Address(str(v)), spec["host_addresses"],
                              src, f"{where}.host_addresses")
    if "subnet" in spec:
        net = _convert(lambda v: ipaddress.IPv4Network(str(v)), spec["subnet"], src,
                       f"{where}.subnet")
        if "host_addresses" in spec:
            first = int(first_addr) - int(net.network_address)
            if not 0 < first < net.num_addresses - 1:
                _fail(src, f"{where}.host_addresses", f"{first_addr} is not a host address "
                                                      f"of {net}")
        if first + nports - 1 >= net.num_addresses - 1:
            _fail(src, f"{where}.subnet", f"{net} has no address for each of its {nports} "
                                          f"ports (port p's node takes address {first} + p - 1)")
    if "mac" in spec and "address" not in spec:
        _fail(src, f"{where}.address", "is required with its mac")
    if kind == "l2" and "address" in spec and "mac" not in spec:
        _fail(src, f"{where}.mac", "is required with an l2 switch's address (its nodes know "
                                   "it as a static neighbour: no ARP crosses the switch)")
    if "address" in spec:
        if net is None:
            _fail(src, f"{where}.address", "needs the switch's subnet")
        addr = _convert(lambda v: ipaddress.IPv4Address(str(v)), spec["address"], src,
                        f"{where}.address")
        if addr not in net or not first + nports - 1 < int(addr) - int(net.network_address) \
                < net.num_addresses - 1:
            _fail(src, f"{where}.address", f"{addr} must be in {net} above its ports' "
                                           f"addresses ({first}..{first + nports - 1}) and "
                                           "not its broadcast")
        addr = str(addr)
    for k in ("mac", "host_macs"):
        if k in spec:
            v = str(spec[k]).lower()
            if not _MAC.fullmatch(v):
                _fail(src, f"{where}.{k}", f"{spec[k]!r} is not a MAC (six hex bytes with :)")
            if k == "mac":
                mac = v
            else:
                base = int(v.replace(":", ""), 16)
                if base + nports > 1 << 48:
                    _fail(src, f"{where}.host_macs", f"{v} has no room for {nports} ports")
    root = spec.get("root", False)
    if not isinstance(root, bool):
        _fail(src, f"{where}.root", f"must be true or false, got {root!r}")
    gateway = spec.get("gateway")
    if gateway is not None:
        if gateway not in on_ports:
            _fail(src, f"{where}.gateway", f"{gateway!r} is on none of its ports")
        if net is None or addr is not None or net.prefixlen > 24 or \
                (nports + 1) << 8 > net.num_addresses:
            _fail(src, f"{where}.gateway", "needs a subnet with a /24 for each port (port p's "
                                           "is the p-th) and no address of the switch")
    return Segment(kind, net, addr, mac, base, root, gateway, first)


def _convert(fn, v, src, where):
    try:
        return fn(v)
    except ValueError as e:
        _fail(src, where, str(e))


def from_dict(d, source: str = "topology") -> Topology:
    """Validate a parsed description; TopologyError naming the field on any problem."""
    src = source
    d = _mapping(d, src, "", {"hosts", "switches", "links", "groups", "mtu", "local"})
    if "hosts" not in d or "links" not in d:
        _fail(src, "hosts" if "hosts" not in d else "links", "is required")
    mtu = d.get("mtu", DEFAULT_MTU)
    if not isinstance(mtu, int) or isinstance(mtu, bool) or not 576 <= mtu <= 65535:
        _fail(src, "mtu", f"must be an integer in 576..65535, got {mtu!r}")
    default_local = _mapping(d.get("local"), src, "local", {"rate", "latency"})
    hosts_in = _named(d["hosts"], src, "hosts", "host")
    if not hosts_in:
        _fail(src, "hosts", "needs at least one host")
    hosts, devices, links, ranks = [], [], [], []
    for h, spec in hosts_in.items():
        where = f"hosts.{h}"
        spec = _mapping(spec, src, where, {"devices", "local"})
        n = spec.get("devices", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1024:
            _fail(src, f"{where}.devices", f"must be an integer in 1..1024, got {n!r}")
        hosts.append(h)
        devices.append(n)
        if n == 1:
            ranks.append(h)
            continue
        loc = {**DEFAULT_LOCAL, **default_local,
               **_mapping(spec.get("local"), src, f"{where}.local", {"rate", "latency"})}
        rate = _convert(parse_rate, loc["rate"], src, f"{where}.local.rate")
        lat = _convert(parse_time, loc["latency"], src, f"{where}.local.latency")
        devs = [f"{h}/{i}" for i in range(n)]
        ranks += devs
        for i, dv in enumerate(devs):
            links.append(Link(h, dv, rate, lat, str(loc["rate"])))
            links += [Link(dv, o, rate, lat, str(loc["rate"])) for o in devs[i + 1:]]
    sw_in = _named(d.get("switches") or {}, src, "switches", "switch")
    switches, aggregating, segment_specs = [], [], {}
    for s, spec in sw_in.items():
        where = f"switches.{s}"
        spec = _mapping(spec, src, where, {"aggregate", "kind", *_SEGMENT_FIELDS})
        if s in hosts_in:
            _fail(src, where, "is also a host's name")
        agg = spec.get("aggregate", False)
        if not isinstance(agg, bool):
            _fail(src, f"{where}.aggregate", f"must be true or false, got {agg!r}")
        kind = spec.get("kind", "router")
        if kind not in SWITCH_KINDS:
            _fail(src, f"{where}.kind", f"must be one of {', '.join(SWITCH_KINDS)}, got {kind!r}")
        if kind == "router":
            for k in _SEGMENT_FIELDS:
                if k in spec:
                    _fail(src, f"{where}.{k}", "is a field of an l2 or bridge switch")
        else:
            segment_specs[s] = (kind, spec)  # checked once its ports are known
        switches.append(s)
        if agg:
            aggregating.append(s)
    nodes = set(hosts) | set(switches)
    if not isinstance(d["links"], list):
        _fail(src, "links", f"must be a list of {{ends, rate, latency}}, got {d['links']!r}")
    seen = {frozenset((ln.a, ln.b)) for ln in links}
    for i, spec in enumerate(d["links"]):
        where = f"links[{i}]"
        spec = _mapping(spec, src, where, {"ends", "rate", "latency", "burst"})
        ends = spec.get("ends")
        if not (isinstance(ends, list) and len(ends) == 2 and ends[0] != ends[1]):
            _fail(src, f"{where}.ends", f"must be two different node names, got {ends!r}")
        for e in ends:
            if e not in nodes:
                _fail(src, f"{where}.ends", f"{e!r} is neither a host nor a switch")
        if frozenset(ends) in seen:
            _fail(src, f"{where}.ends", f"a second link between {ends[0]} and {ends[1]}")
        seen.add(frozenset(ends))
        for k in ("rate", "latency"):
            if k not in spec:
                _fail(src, f"{where}.{k}", "is required")
        rate = _convert(parse_rate, spec["rate"], src, f"{where}.rate")
        lat = _convert(parse_time, spec["latency"], src, f"{where}.latency")
        burst = _convert(parse_size, spec["burst"], src, f"{where}.burst") \
            if "burst" in spec else 0
        links.append(Link(ends[0], ends[1], rate, lat, str(spec["rate"]), burst))
    groups = _groups(d.get("groups"), src, hosts, devices, ranks)
    segments = {s: _segment(spec, kind, [ln.b if ln.a == s else ln.a for ln in links
                                         if s in (ln.a, ln.b)], src, f"switches.{s}")
                for s, (kind, spec) in segment_specs.items()}
    topo = Topology(tuple(hosts), tuple(devices), tuple(switches), tuple(aggregating),
                    tuple(links), groups, mtu, tuple(ranks), source, segments)
    _route(topo, src)
    return topo


def _groups(v, src, hosts, devices, ranks):
    first = {h: sum(devices[:i]) for i, h in enumerate(hosts)}
    if v is None:
        if max(devices) == 1 or len(set(devices)) != 1:
            return None
        return tuple(tuple(range(first[h], first[h] + n)) for h, n in zip(hosts, devices))
    if not isinstance(v, list) or not v or not all(isinstance(g, list) and g for g in v):
        _fail(src, "groups", f"must be a list of lists of host names, got {v!r}")
    out = []
    for i, g in enumerate(v):
        for h in g:
            if h not in first:
                _fail(src, f"groups[{i}]", f"{h!r} is not a host")
        out.append(tuple(r for h in g for r in range(first[h], first[h] + devices[hosts.index(h)])))
    if sorted(r for g in out for r in g) != list(range(len(ranks))):
        _fail(src, "groups", "must hold every host exactly once")
    if len({len(g) for g in out}) != 1:
        _fail(src, "groups", f"every group needs the same number of ranks, got "
                             f"{[len(g) for g in out]}")
    return tuple(out)


def _route(topo: Topology, src: str) -> None:
    """Per destination, every node's next hop: fewest hops, lowest latency, then names."""
    adj: dict[str, list] = {n: [] for n in topo.hosts + topo.switches}
    for ln in topo.links:
        adj.setdefault(ln.a, [])
        adj.setdefault(ln.b, [])
    for i, ln in enumerate(topo.links):
        adj[ln.a].append((ln.b, (i, 0)))
        adj[ln.b].append((ln.a, (i, 1)))
    nxt = {}
    for dst in adj:
        best = {dst: (0, 0, ())}
        heap = [(0, 0, (), dst)]
        hop = {}
        while heap:
            h, lat, names, node = heapq.heappop(heap)
            if best.get(node) != (h, lat, names):
                continue
            for nb, (i, direction) in adj[node]:
                # nb forwards to node over link i in the opposite direction
                # latency in whole ns: equal sums compare equal, names break the tie
                key = (h + 1, lat + round(topo.links[i].latency * 1e9), (node,) + names)
                if nb not in best or key < best[nb]:
                    best[nb] = key
                    hop[nb] = (node, (i, 1 - direction))
                    heapq.heappush(heap, (*key, nb))
        nxt[dst] = hop
    for r in topo.ranks:
        for d in topo.ranks:
            if r != d and r not in nxt[d]:
                raise TopologyError(f"{src}: field 'links': no path from {r} to {d}")
    object.__setattr__(topo, "_next", nxt)
    object.__setattr__(topo, "_adj", adj)


def first_hosts(topo: Topology, n: int, keep: tuple[str, ...] = ()) -> Topology:
    """`topo` with its first `n` hosts only, and the hosts named in `keep` (hosts of one
    device; no groups): the other hosts' links gone, everything else as the file has it (a
    switch's ports keep the order of its remaining links). A file of the most hosts a network
    shape takes, for a run of fewer."""
    if max(topo.devices) != 1 or not 1 <= n <= len(topo.hosts) or \
            not set(keep) <= set(topo.hosts):
        raise TopologyError(f"{topo.source}: field 'hosts': the first {n} of "
                            f"{len(topo.hosts)} hosts of one device each (and "
                            f"{', '.join(keep) or 'no other'}) cannot be taken")
    hosts = tuple(h for i, h in enumerate(topo.hosts) if i < n or h in keep)
    gone = set(topo.hosts) - set(hosts)
    out = Topology(hosts, (1,) * len(hosts), topo.switches, topo.aggregating,
                   tuple(ln for ln in topo.links if ln.a not in gone and ln.b not in gone),
                   None, topo.mtu, hosts, topo.source, topo.segments)
    _route(out, topo.source)
    return out


def load(path: str) -> Topology:
    """Read and validate a YAML or JSON topology file."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise TopologyError(f"topology {path}: {e.strerror}") from None
    try:
        d = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise TopologyError(f"topology {path}: not YAML/JSON ({' '.join(str(e).split())})") \
            from None
    return from_dict(d, path)
