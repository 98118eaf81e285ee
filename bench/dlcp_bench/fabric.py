"""The namespaces of the package docstring's drawing, built from their topology file
(bench/topologies/dlcp_leaf16.yaml) by spina/netgraph.py's `Graph`: the leaf, the core, the
workers and the background sender, their addresses, links and tbf limits; `Fabric` builds and
removes them."""
from __future__ import annotations

from pathlib import Path

from spina import netns
from spina.netgraph import Graph, tbf_params
from spina.topology import first_hosts, load

FILE = Path(__file__).resolve().parents[1] / "topologies" / "dlcp_leaf16.yaml"
BLACKHOLE = "10.210.254.1"  # the background's destination: its /24 the core's blackhole
WORKER_PORT, GLOO_PORT = 50000, 29500
NLANES = 8                        # 8 x 1 KiB blocks + header < 9000 (the file's MTU): no IP
                                  # fragmentation, one SpINA datagram of 8 blocks a frame


class Fabric(Graph):
    """The file's first n workers, the background sender, the leaf and the core in namespaces
    named `tag`-...; the worker and background links at `rate` (tbf both ways, tbf_params'
    queue). A context manager that removes all it made."""

    def __init__(self, n: int, tag: str, rate: str):
        topo = load(str(FILE))
        most = sum(h.startswith("w") for h in topo.hosts)
        if not 1 <= n <= most:
            raise ValueError(f"workers: need 1..{most} ({FILE.name}), got {n}")
        super().__init__(first_hosts(topo, n, keep=("bg",)), tag,
                         queue_ms=tbf_params(rate, topo.mtu)["latency_ms"])
        self.n, self.fabric_rate = n, rate
        self.leaf, self.core, self.bg = self.ns("leaf"), self.ns("core"), self.ns("bg")
        self.core_ip = self.node_ip("core")  # SpINA's aggregator
        self.bg_ip = self.host_ip("bg")
        self.uplink = next(p for p, (_, node) in self.topo.ports("leaf").items()
                           if node == "core")

    def worker_ns(self, r: int) -> str:
        return self.ns(f"w{r}")

    def worker_ip(self, r: int) -> str:
        return self.host_ip(f"w{r}")

    def l2_entries(self) -> dict[str, int]:
        """dst MAC -> leaf port: the node on each port."""
        return {self.topo.segment_mac("leaf", p): p for p in self.topo.ports("leaf")}

    def create(self) -> "Fabric":
        super().create()
        with self.building():
            netns.ip("route", "add", "blackhole", BLACKHOLE.rsplit(".", 1)[0] + ".0/24",
                     ns=self.core)
            self.set_rate(self.fabric_rate, {i for p, (i, node) in
                                             self.topo.ports("leaf").items() if node != "core"})
        return self
