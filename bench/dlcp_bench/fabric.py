"""The namespaces of the package docstring's drawing: the leaf, the core, the workers and the
background sender, their addresses, links and tbf limits; `Fabric` builds and removes them."""
from __future__ import annotations

from bench import net_topo
from bench.net_topo import add_namespace, tbf_params

NET = "10.210"
CORE_IP = f"{NET}.255.1"          # the aggregator's address (on the core's lo)
BG_NET, BLACKHOLE = 250, f"{NET}.254.1"
CORE_MAC = "02:00:00:00:03:00"
UPLINK = 100                      # the leaf's port toward the core
WORKER_PORT, GLOO_PORT = 50000, 29500
MTU = 9000                        # jumbo frames: one SpINA datagram of 8 blocks of 256 per frame
NLANES = 8                        # 8 x 1 KiB blocks + header < 9000: no IP fragmentation

_run = net_topo._run


def worker_ip(r: int) -> str:
    return f"{NET}.{r}.2"


def worker_mac(r: int) -> str:
    return f"02:00:00:00:02:{r:02x}"


BG_IP, BG_MAC = f"{NET}.{BG_NET}.2", "02:00:00:00:02:fe"


class Fabric:
    """The namespaces of the package docstring; a context manager that removes all it made."""

    def __init__(self, n: int, tag: str, rate: str):
        if not 1 <= n <= 200:
            raise ValueError(f"workers: need 1..200, got {n}")
        self.n, self.tag, self.rate = n, tag, rate
        self.leaf, self.core, self.bg = f"{tag}-leaf", f"{tag}-core", f"{tag}-bg"
        self.made: list[str] = []

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
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def _add_ns(self, ns: str) -> None:
        add_namespace(ns, self.made)

    @staticmethod
    def _plain(ns: str, ifc: str) -> None:
        """No offloads: the leaf reads frames with raw sockets and must see MTU-sized frames
        (TSO/GSO/GRO would hand it 64 KB super-frames it cannot send on), with checksums."""
        _run("ip", "netns", "exec", ns, "ethtool", "-K", ifc, "tx", "off", "tso", "off", "gso",
             "off", "gro", "off", check=False)

    def _tbf(self, ns: str, ifc: str) -> None:
        p = tbf_params(self.rate, MTU)
        _run("tc", "-n", ns, "qdisc", "replace", "dev", ifc, "root", "tbf", "rate", self.rate,
             "burst", str(p["burst"]), "latency", f"{p['latency_ms']}ms")

    def _host(self, ns: str, leaf_if: str, ip: str, mac: str, subnet: int) -> None:
        """A host namespace with eth0 on leaf port `leaf_if`, the core as its gateway."""
        self._add_ns(ns)
        _run("ip", "link", "add", "name", leaf_if, "netns", self.leaf, "type", "veth",
             "peer", "name", "eth0", "netns", ns)
        _run("ip", "-n", ns, "link", "set", "eth0", "address", mac, "mtu", str(MTU), "up")
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        gw = f"{NET}.{subnet}.1"
        _run("ip", "-n", ns, "neigh", "add", gw, "lladdr", CORE_MAC, "dev", "eth0",
             "nud", "permanent")
        _run("ip", "-n", ns, "route", "add", "default", "via", gw)
        _run("ip", "-n", self.leaf, "link", "set", leaf_if, "mtu", str(MTU), "up")
        for where, ifc in ((ns, "eth0"), (self.leaf, leaf_if)):
            self._plain(where, ifc)
            self._tbf(where, ifc)
        # the core: this host's subnet, its MAC (no ARP crosses the leaf: static entries)
        _run("ip", "-n", self.core, "addr", "add", f"{gw}/24", "dev", "up0")
        _run("ip", "-n", self.core, "neigh", "replace", ip, "lladdr", mac, "dev", "up0",
             "nud", "permanent")

    def _build(self) -> None:
        self._add_ns(self.leaf)
        self._add_ns(self.core)
        core = self.core
        _run("ip", "link", "add", "name", "pup", "netns", self.leaf, "type", "veth",
             "peer", "name", "up0", "netns", core)
        _run("ip", "-n", self.leaf, "link", "set", "pup", "mtu", str(MTU), "up")
        _run("ip", "-n", core, "link", "set", "up0", "address", CORE_MAC, "mtu", str(MTU), "up")
        self._plain(self.leaf, "pup")
        self._plain(core, "up0")
        _run("ip", "-n", core, "addr", "add", f"{CORE_IP}/32", "dev", "lo")
        for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                    "net.ipv4.conf.up0.send_redirects=0", "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.up0.rp_filter=0"):
            _run("ip", "netns", "exec", core, "sysctl", "-qw", key)
        # the background's destination: dropped silently by the core's routing
        _run("ip", "-n", core, "route", "add", "blackhole", f"{NET}.254.0/24")
        for r in range(self.n):
            self._host(self.worker_ns(r), f"p{r}", worker_ip(r), worker_mac(r), r)
        self._host(self.bg, "pbg", BG_IP, BG_MAC, BG_NET)

    def destroy(self) -> None:
        while self.made:
            _run("ip", "netns", "del", self.made.pop(), check=False)
