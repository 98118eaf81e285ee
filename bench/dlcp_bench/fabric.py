"""The namespaces of the package docstring's drawing: the leaf, the core, the workers and the
background sender, their addresses, links and tbf limits; `Fabric` builds and removes them."""
from __future__ import annotations

from bench.net_topo import tbf_params
from spina import netns

NET = "10.210"
CORE_IP = f"{NET}.255.1"          # the aggregator's address (on the core's lo)
BG_NET, BLACKHOLE = 250, f"{NET}.254.1"
CORE_MAC = "02:00:00:00:03:00"
UPLINK = 100                      # the leaf's port toward the core
WORKER_PORT, GLOO_PORT = 50000, 29500
MTU = 9000                        # jumbo frames: one SpINA datagram of 8 blocks of 256 per frame
NLANES = 8                        # 8 x 1 KiB blocks + header < 9000: no IP fragmentation


def worker_ip(r: int) -> str:
    return f"{NET}.{r}.2"


def worker_mac(r: int) -> str:
    return f"02:00:00:00:02:{r:02x}"


BG_IP, BG_MAC = f"{NET}.{BG_NET}.2", "02:00:00:00:02:fe"


class Fabric(netns.Network):
    """The namespaces of the package docstring; a context manager that removes all it made."""

    def __init__(self, n: int, tag: str, rate: str):
        if not 1 <= n <= 200:
            raise ValueError(f"workers: need 1..200, got {n}")
        super().__init__()
        self.n, self.tag, self.rate = n, tag, rate
        self.leaf, self.core, self.bg = f"{tag}-leaf", f"{tag}-core", f"{tag}-bg"

    def worker_ns(self, r: int) -> str:
        return f"{self.tag}-w{r}"

    def ports(self) -> dict[int, str]:
        """The leaf's ports: worker r on r+1, the background sender on n+1, the uplink."""
        p = {r + 1: f"p{r}" for r in range(self.n)}
        p[self.n + 1] = "pbg"
        p[UPLINK] = "pup"
        return p

    def l2_entries(self) -> dict[str, int]:
        """dst MAC -> leaf port."""
        e = {worker_mac(r): r + 1 for r in range(self.n)}
        e[BG_MAC] = self.n + 1
        e[CORE_MAC] = UPLINK
        return e

    def __enter__(self) -> "Fabric":
        with self.building():
            self._build()
        return self

    @staticmethod
    def _plain(ns: str, ifc: str) -> None:
        """No offloads: the leaf reads frames with raw sockets and must see MTU-sized frames
        (TSO/GSO/GRO would hand it 64 KB super-frames it cannot send on), with checksums."""
        netns.offload_off(ifc, ns, ("tx", "tso", "gso", "gro"))

    def _tbf(self, ns: str, ifc: str) -> None:
        p = tbf_params(self.rate, MTU)
        netns.tbf(ifc, self.rate, p["burst"], p["latency_ms"], ns)

    def _host(self, ns: str, leaf_if: str, ip: str, mac: str, subnet: int) -> None:
        """A host namespace with eth0 on leaf port `leaf_if`, the core as its gateway."""
        self.namespace(ns)
        self.veth(leaf_if, "eth0", a_ns=self.leaf, b_ns=ns)
        netns.set_link("eth0", ns, address=mac, mtu=MTU)
        netns.add_addr("eth0", f"{ip}/24", ns)
        gw = f"{NET}.{subnet}.1"
        netns.static_arp("eth0", gw, CORE_MAC, ns)
        netns.add_route("default", ns, via=gw)
        netns.set_link(leaf_if, self.leaf, mtu=MTU)
        for where, ifc in ((ns, "eth0"), (self.leaf, leaf_if)):
            self._plain(where, ifc)
            self._tbf(where, ifc)
        # the core: this host's subnet, its MAC (no ARP crosses the leaf: static entries)
        netns.add_addr("up0", f"{gw}/24", self.core)
        netns.static_arp("up0", ip, mac, self.core, replace=True)

    def _build(self) -> None:
        self.namespace(self.leaf)
        core = self.namespace(self.core)
        self.veth("pup", "up0", a_ns=self.leaf, b_ns=core)
        netns.set_link("pup", self.leaf, mtu=MTU)
        netns.set_link("up0", core, address=CORE_MAC, mtu=MTU)
        self._plain(self.leaf, "pup")
        self._plain(core, "up0")
        netns.add_addr("lo", f"{CORE_IP}/32", core)
        netns.sysctl(core, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                     "net.ipv4.conf.up0.send_redirects=0", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.up0.rp_filter=0")
        # the background's destination: dropped silently by the core's routing
        netns.ip("route", "add", "blackhole", f"{NET}.254.0/24", ns=core)
        for r in range(self.n):
            self._host(self.worker_ns(r), f"p{r}", worker_ip(r), worker_mac(r), r)
        self._host(self.bg, "pbg", BG_IP, BG_MAC, BG_NET)
